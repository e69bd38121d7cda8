"""The runtime's event vocabulary and run outcomes, as constants every surface shares.

Events feed the ring buffer behind the dashboard, the log file, Kubernetes Events and metrics;
keeping the names here means a typo is a type error rather than a silently unseen event.
"""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    POLL_COMPLETED = "poll_completed"
    POLL_ERROR = "poll_error"
    DRY_RUN = "dry_run"
    DISPATCH_SKIPPED = "dispatch_skipped"
    RUN_RESERVING = "run_reserving"
    RUN_STARTED = "run_started"
    RUN_UPDATE = "run_update"
    RUN_FINISHED = "run_finished"
    RUN_FAILED = "run_failed"
    RUN_STALLED = "run_stalled"
    RUN_CANCELED = "run_canceled"
    RUN_FINISHING = "run_finishing"
    """The issue turned terminal while a turn was in progress: the turn may finish (grace)."""
    RUN_RECONCILED = "run_reconciled"
    RETRY_SCHEDULED = "retry_scheduled"
    RETRY_RELEASED = "retry_released"
    RESERVATION_EXPIRED = "reservation_expired"
    WORKSPACE_CLEANUP = "workspace_cleanup"
    WORKSPACE_PRESERVED = "workspace_preserved"
    """A terminal issue's worktree was kept on purpose (uncommitted work, or not ours)."""
    STARTUP_WORKSPACE_CLEANUP = "startup_workspace_cleanup"
    STARTUP_WORKSPACE_CLEANUP_FAILED = "startup_workspace_cleanup_failed"
    RECONCILE_REFRESH_FAILED = "reconcile_refresh_failed"
    WORKFLOW_RELOADED = "workflow_reloaded"
    WORKFLOW_RELOAD_FAILED = "workflow_reload_failed"
    CLAIMS_RECOVERED = "claims_recovered"
    LEADERSHIP_ACQUIRED = "leadership_acquired"
    LEADERSHIP_LOST = "leadership_lost"
    REFRESH_REQUESTED = "refresh_requested"
    STOPPING = "stopping"


EVENT_TYPES: tuple[str, ...] = tuple(e.value for e in EventType)


class RunOutcome(enum.StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    STALLED = "stalled"
    CANCELED = "canceled"
    """Reconciliation (or a deleted Claim) stopped the run; recorded, unlike in the seed."""


RUN_OUTCOMES: tuple[str, ...] = tuple(o.value for o in RunOutcome)
