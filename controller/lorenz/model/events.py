"""The runtime's events: their vocabulary, the run outcomes, and the typed event itself.

Events feed the ring buffer behind the dashboard, the log file, Kubernetes Events and metrics;
keeping the names here means a typo is a type error rather than a silently unseen event, and
keeping the fields typed (:class:`RuntimeEvent`) means a listener reads ``event.reason``, not
``event.get("reason")`` of an untyped dict.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import TYPE_CHECKING, Any, TypedDict

from lorenz.model.lifecycle import ActionOutcome, RetryKind, RunOutcome

if TYPE_CHECKING:
    from collections.abc import Sequence

    from lorenz.model.usage import TokenUsage


class EventType(enum.StrEnum):
    POLL_COMPLETED = "poll_completed"
    POLL_ERROR = "poll_error"
    DRY_RUN = "dry_run"
    DISPATCH_SKIPPED = "dispatch_skipped"
    DISPATCH_PAUSED = "dispatch_paused"
    """A fault of the host pauses dispatch (its code in the event and in the snapshot's
    ``poll.dispatch_paused``): the claim store refuses writes (``claim_store_write_failed``:
    nothing is dispatched until a heartbeat is written again), or workers cannot be launched
    or placed (``worker_launch_failed`` …: one probe run at a time until one starts)."""
    DISPATCH_RESUMED = "dispatch_resumed"
    """The fault cleared (the store accepts writes, a probe run's worker started): dispatch
    goes on."""
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
    """A pending retry was dropped: its issue stopped, left the candidates, or its slot is gone."""
    RESERVATION_EXPIRED = "reservation_expired"
    """A reservation outlived its worker acquire and was swept (a consumed retry is restored)."""
    PLACEMENT_FAILED = "placement_failed"
    """A run could not be placed (unschedulable, image pull, quota): its reservation was given
    back with the reason, and the slot waits for placement (no attempt counted)."""
    WORKSPACE_CLEANUP = "workspace_cleanup"
    WORKSPACE_PRESERVED = "workspace_preserved"
    """A terminal issue's worktree was kept on purpose (uncommitted work, or not ours)."""
    STARTUP_WORKSPACE_CLEANUP = "startup_workspace_cleanup"
    STARTUP_WORKSPACE_CLEANUP_FAILED = "startup_workspace_cleanup_failed"
    RECONCILE_REFRESH_FAILED = "reconcile_refresh_failed"
    WORKFLOW_RELOADED = "workflow_reloaded"
    WORKFLOW_RELOAD_FAILED = "workflow_reload_failed"
    LEADERSHIP_LOST = "leadership_lost"
    SLOT_BLOCKED = "slot_blocked"
    """A slot stopped retrying (budget used up, or the agent asked for input or approval)."""
    SLOT_UNBLOCKED = "slot_unblocked"
    """A blocked slot retries again (refresh, issue changed) or was released."""
    TERMINAL_ACTION = "terminal_action"
    """An ``escalate`` or ``cancel`` was applied to a blocked slot's issue (or failed)."""
    INPUT_REQUESTED = "input_requested"
    """An agent asked a question: its slot waits (the ``waiting`` lane) for an answer."""
    INPUT_ANSWERED = "input_answered"
    """A waiting slot got its answer (``reason``: ``tracker``, ``cli``, ``api``,
    ``dashboard``): its next run resumes the session; ``duration_ms`` is the time to answer."""
    REFRESH_REQUESTED = "refresh_requested"
    BUDGET_WARNING = "budget_warning"
    """A run's, its issue's or the day's spend reached ``budget.warn_at`` of a cap."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """A run crossed a spend cap and is being stopped (``budget_exhausted``)."""
    RUN_SPEND = "run_spend"
    """What a run spent, when it ends (only while a ``budget`` cap is set)."""
    BUDGET_HELD = "budget_held"
    """An issue was not dispatched: its spend, or the day's, is at a cap (the ``budget`` lane)."""
    STOPPING = "stopping"


EVENT_TYPES: tuple[str, ...] = tuple(e.value for e in EventType)


RUN_OUTCOMES: tuple[str, ...] = tuple(o.value for o in RunOutcome)


class EventDetails(TypedDict, total=False):
    """The optional fields of an event, as keyword arguments of the runtime's ``event()``."""

    issue_id: str
    identifier: str
    attempt: int | None
    host: str | None
    outcome: RunOutcome | ActionOutcome
    reason: str
    code: str
    retry_kind: RetryKind
    due_at: datetime.datetime
    delay_ms: int
    error: str | None
    grace_ms: int
    duration_ms: float
    candidates: int
    eligible: int
    fields: Sequence[str]
    kept: Sequence[str]
    removed: Sequence[str]
    aborted: int
    tokens: int
    usd: float


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """One thing the runtime did, at one wall-clock instant.

    Which fields are set depends on the type: runs name their issue and slot, ends their
    ``outcome``, stops their ``reason``, failures their ``code``, retries their kind and due
    time; ``run_update`` (for listeners only, never recorded) names the slot key, the agent's
    event and its usage. ``to_dict()`` leaves out the unset ones.
    """

    type: EventType
    at: datetime.datetime
    issue_id: str | None = None
    identifier: str | None = None
    slot: int | None = None
    message: str | None = None
    attempt: int | None = None
    host: str | None = None
    outcome: RunOutcome | ActionOutcome | None = None
    """How a run ended (``run_*`` events), or how a terminal action went (``terminal_action``)."""
    reason: str | None = None
    code: str | None = None
    retry_kind: RetryKind | None = None
    due_at: datetime.datetime | None = None
    delay_ms: int | None = None
    error: str | None = None
    grace_ms: int | None = None
    duration_ms: float | None = None
    candidates: int | None = None
    eligible: int | None = None
    fields: tuple[str, ...] | None = None
    """The issue fields that hold a value no process can be given (``dispatch_skipped``)."""
    kept: tuple[str, ...] | None = None
    """Workspace paths left in place on purpose."""
    removed: tuple[str, ...] | None = None
    """Workspaces removed (paths, or identifiers for the startup sweep)."""
    aborted: int | None = None
    """Runs aborted because their claims were lost."""
    tokens: int | None = None
    """Tokens spent (``run_spend``: by the run; ``budget_*``: what the cap counts)."""
    usd: float | None = None
    """USD spent (``run_spend``: by the run)."""
    slot_key: str | None = None
    """``run_update``: the slot whose agent reported."""
    agent_event: str | None = None
    """``run_update``: the agent's own event name."""
    usage: TokenUsage | None = None
    """``run_update``: the session's running token totals, if the update carried them."""
    run_usage: TokenUsage | None = None
    """``run_update``: the run's tokens so far as the orchestrator counts them (not on the
    wire: listeners in the process read it)."""
    agent_at: datetime.datetime | None = None
    """``run_update``: when the agent last reported (not on the wire)."""

    def __post_init__(self) -> None:
        # NB: a wire string (a decoded document) is made the enum; the fields are the enums
        # either way, so listeners compare members, not spellings.
        outcome: object = self.outcome
        if outcome is not None and not isinstance(outcome, RunOutcome | ActionOutcome):
            typed = (
                ActionOutcome(str(outcome))
                if self.type is EventType.TERMINAL_ACTION
                else RunOutcome(str(outcome))
            )
            object.__setattr__(self, "outcome", typed)
        retry_kind: object = self.retry_kind
        if retry_kind is not None and not isinstance(retry_kind, RetryKind):
            object.__setattr__(self, "retry_kind", RetryKind(str(retry_kind)))

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe form: ``type`` and ``at`` first, then every field that is set."""
        if self.type is EventType.RUN_UPDATE:
            return {
                "type": self.type.value,
                "at": self.at.isoformat(),
                "slot_key": self.slot_key,
                "event": self.agent_event,
                "usage": self.usage.to_dict() if self.usage is not None else None,
            }
        document: dict[str, Any] = {"type": self.type.value, "at": self.at.isoformat()}
        for name in _WIRE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, datetime.datetime):
                value = value.isoformat()
            elif isinstance(value, enum.Enum):
                value = value.value
            document[name] = value
        return document


_WIRE_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(RuntimeEvent)
    if f.name not in {"type", "at", "slot_key", "agent_event", "usage", "run_usage", "agent_at"}
)
"""The fields ``to_dict()`` writes after ``type`` and ``at``, in this order."""
