"""Who holds a claim: an owner id that names one *process incarnation*, not one pid.

A pid alone is reused by the OS, and a restarted Lorenz must never inherit the claims of its
crashed predecessor as if they were its own — those are recovered as failure retries (attempt
incremented) through ``take_over``. So the id carries the process start time as well: the same
pid restarted is a new owner.
"""

from __future__ import annotations

import dataclasses
import os
import socket

import psutil


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """The facts about this process that an owner row records."""

    host: str
    pid: int
    started_at: float
    """Process start time, epoch seconds (psutil ``create_time``)."""

    @property
    def owner_id(self) -> str:
        return f"{self.host}:{self.pid}:{self.started_at:.2f}"


def current_process() -> ProcessIdentity:
    """The identity of the calling process."""
    pid = os.getpid()
    return ProcessIdentity(
        host=socket.gethostname(),
        pid=pid,
        started_at=psutil.Process(pid).create_time(),
    )


def default_owner_id() -> str:
    """``<hostname>:<pid>:<process start time>`` of this process."""
    return current_process().owner_id
