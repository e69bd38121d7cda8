"""Who holds a claim: an owner id that names one *process incarnation*, not one pid.

A pid alone is reused by the OS, and a restarted Lorenz must never inherit the claims of its
crashed predecessor as if they were its own — those are recovered as failure retries (attempt
incremented) through ``take_over``. So the id carries the process start time as well: the same
pid restarted is a new owner.

The same id is what lets any process on the owner's host *prove* it dead at once — its pid is
gone, a zombie, or now belongs to a process that started at another time — instead of waiting
for its heartbeat to go stale (:func:`owner_liveness`).

NB: the claim owner id and the daemon lease holder are the same string by design (the daemon
declares exactly its dead predecessor's claims recoverable), so both come from the one
:class:`~lorenz.leadership.ProcessIdentity`.
"""

from __future__ import annotations

import dataclasses
import socket

from lorenz.leadership.processes import (
    Liveness,
    ProcessIdentity,
    current_process,
    local_liveness,
)

__all__ = [
    "Liveness",
    "OwnerId",
    "ProcessIdentity",
    "current_process",
    "default_owner_id",
    "owner_liveness",
]


def default_owner_id() -> str:
    """``<hostname>:<pid>:<process start time>`` of this process."""
    return current_process().holder


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerId:
    """A parsed owner id: ``<host>:<pid>:<process start time>``."""

    host: str
    pid: int
    started_at: float

    @classmethod
    def parse(cls, text: str) -> OwnerId | None:
        """The parts of ``text``, or ``None`` when it is not of that form (a custom owner)."""
        host, _, rest = text.rpartition(":")
        host, _, pid = host.rpartition(":")
        if not host:
            return None
        try:
            return cls(host=host, pid=int(pid), started_at=float(rest))
        except ValueError:
            return None


def owner_liveness(owner: str, *, host: str | None = None) -> Liveness:
    """Whether the process ``owner`` names still runs, as far as this host can tell.

    ``DEAD`` or ``ALIVE`` only for an owner on this host (``host``, default this hostname)
    whose pid we may inspect; ``UNKNOWN`` for another host's owner, an owner id that is not
    ``<host>:<pid>:<start time>``, or a process we may not look at.
    """
    parsed = OwnerId.parse(owner)
    if parsed is None or parsed.host != (host or socket.gethostname()):
        return Liveness.UNKNOWN
    return local_liveness(parsed.pid, parsed.started_at)
