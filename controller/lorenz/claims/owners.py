"""Who holds a claim: an owner id that names one *process incarnation*, not one pid.

A pid alone is reused by the OS, and a restarted Lorenz must never inherit the claims of its
crashed predecessor as if they were its own — those are recovered as failure retries (attempt
incremented) through ``take_over``. So the id carries the process start time as well: the same
pid restarted is a new owner.

NB: the claim owner id and the daemon lease holder are the same string by design (the daemon
declares exactly its dead predecessor's claims recoverable), so both come from the one
:class:`~lorenz.leadership.ProcessIdentity`.
"""

from __future__ import annotations

from lorenz.leadership.processes import ProcessIdentity, current_process

__all__ = ["ProcessIdentity", "current_process", "default_owner_id"]


def default_owner_id() -> str:
    """``<hostname>:<pid>:<process start time>`` of this process."""
    return current_process().holder
