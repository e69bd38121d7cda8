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
    if abs(created - started_at) > START_TIME_TOLERANCE_S:
        return Liveness.DEAD  # the pid was reused by another process
    return Liveness.ALIVE
