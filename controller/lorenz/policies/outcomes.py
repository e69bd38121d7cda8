"""Whether a settled run says something bad about the worker host it ran on.

A worker pool settles each run as *healthy* (the host can take more work) or *poison* (take the
host out). Only errors the host itself caused poison it: an SSH timeout, a failed remote home
lookup, a failed remote workspace preparation, or a workspace hook that exited non-zero on the
host. The decision reads the failure's stable *code*, never its text, so a message that merely
mentions a hook failure stays healthy. A stall-finished run always poisons, whatever the runner
returned: its host stopped reporting.
"""

from __future__ import annotations

import enum

from lorenz.codes import ErrorCode
from lorenz.model import RunFailure

POISON_WORKER_ERROR_CODES: frozenset[str] = frozenset(
    {
        "ssh_timeout",
        "remote_home_lookup_failed",
        "workspace_prepare_failed",
        ErrorCode.WORKSPACE_HOOK_FAILED,
    }
)
"""Failure codes that take a worker host out of the pool."""


class WorkerHealth(enum.StrEnum):
    HEALTHY = "healthy"
    POISON = "poison"


def classify_worker_outcome(failure: RunFailure | None, *, stalled: bool = False) -> WorkerHealth:
    """``poison`` for a stall or a host-caused failure (by code); ``healthy`` otherwise."""
    if stalled:
        return WorkerHealth.POISON
    if failure is not None and failure.code in POISON_WORKER_ERROR_CODES:
        return WorkerHealth.POISON
    return WorkerHealth.HEALTHY
