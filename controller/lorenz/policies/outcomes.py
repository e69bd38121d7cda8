"""Whether a settled run says something bad about the worker host it ran on.

A worker pool settles each run as *healthy* (the host can take more work) or *poison* (take the
host out). Only errors the host itself caused poison it: an SSH timeout, a failed remote home
lookup, a failed remote workspace preparation, or a workspace hook that exited non-zero on the
host. The match is on the error's *prefix*, so ``invalid_ssh_timeout: ...`` or a message that
merely mentions a hook failure stays healthy. A stall-finished run always poisons, whatever the
runner returned: its host stopped reporting.
"""

from __future__ import annotations

import enum

POISON_WORKER_ERROR_PREFIXES: tuple[str, ...] = (
    "ssh_timeout:",
    "remote_home_lookup_failed:",
    "workspace_prepare_failed:",
    "workspace hook failed with status ",
)


class WorkerHealth(enum.StrEnum):
    HEALTHY = "healthy"
    POISON = "poison"


def classify_worker_outcome(error: str | None, *, stalled: bool = False) -> WorkerHealth:
    """``poison`` for a stall or a host-caused error (by prefix); ``healthy`` otherwise."""
    if stalled:
        return WorkerHealth.POISON
    if error is not None and error.startswith(POISON_WORKER_ERROR_PREFIXES):
        return WorkerHealth.POISON
    return WorkerHealth.HEALTHY
