"""Is the process that wrote a lease still the one running under that pid?

A bare pid cannot answer it: pids are reused. The lease records the pid *and* the process start
time, and a same-host holder counts as dead when the pid is gone (ESRCH), is a zombie, or now
belongs to a process that started at another time. Anything we cannot check (another host,
permission denied) is *unknown*, never dead.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket

import psutil

START_TIME_TOLERANCE_S = 0.05
"""psutil start times on Linux have 10 ms resolution; differences below this are the same."""

BOOT_TIME_STEP_LIMIT_S = 2
"""How many whole seconds the kernel's boot time may have moved between two readings of one
process's start time (see :func:`same_start_time`)."""


def same_start_time(observed: float, recorded: float) -> bool:
    """Whether a start time read now (``observed``) is the one ``recorded`` earlier.

    NB: Linux keeps a process's start in clock ticks since boot; psutil turns it into epoch
    seconds by adding the boot time of ``/proc/stat`` (``btime``), which is whole seconds and
    is re-derived from the wall clock: when the wall clock is stepped or slewed across a second
    (a VM paused and resynced, NTP), ``btime`` moves by a whole second, and the *same* process
    then reads one second off. Seen: two live Lorenz processes declared each other dead at
    once and took each other's claims. So a difference of a whole number of seconds (up to
    :data:`BOOT_TIME_STEP_LIMIT_S`, within the 10 ms resolution) is the same process; a reused
    pid's start differs by an arbitrary fraction, and pids do not wrap within two seconds.
    """
    difference = observed - recorded
    steps = round(difference)
    return (
        abs(steps) <= BOOT_TIME_STEP_LIMIT_S
        and abs(difference - steps) <= START_TIME_TOLERANCE_S
    )


class Liveness(enum.Enum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process incarnation: host, pid and start time."""

    host: str
    pid: int
    started_at: float
    """Epoch seconds (psutil ``create_time``)."""

    @property
    def holder(self) -> str:
        return f"{self.host}:{self.pid}:{self.started_at:.2f}"


def current_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(
        host=socket.gethostname(), pid=pid, started_at=psutil.Process(pid).create_time()
    )


def local_liveness(pid: int | None, started_at: float | None) -> Liveness:
    """Whether the process ``pid`` that started at ``started_at`` still runs on this host."""
    if pid is None or pid <= 0:
        return Liveness.UNKNOWN
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return Liveness.DEAD
        created = process.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return Liveness.DEAD
    except psutil.AccessDenied:
        return Liveness.UNKNOWN
    if started_at is None:
        return Liveness.UNKNOWN
    if not same_start_time(created, started_at):
        return Liveness.DEAD  # the pid was reused by another process
    return Liveness.ALIVE
