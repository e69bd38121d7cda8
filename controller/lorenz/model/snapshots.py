"""What the runtime shows at one instant: lanes of rows, the poll block, recent events, history.

These are the typed shapes every surface reads (the HTTP API, the event stream, the dashboard,
the terminal view, metrics, the daemon's status, the operator's Workflow status). Inside the
process they stay objects; ``to_dict()`` turns them into JSON-safe dicts only where they leave
it (an HTTP response, a Kubernetes status): ISO-8601 wall-clock timestamps, and for deadlines
both the wall-clock time and the milliseconds from now (what a countdown wants).

NB: frozen dataclasses with ``__slots__``, not pydantic models: a snapshot is built on every
change the runtime sees (each agent update included) and most of them are never serialized, so
building one must cost no more than the object allocations (see docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any, Literal

from lorenz.model.clocks import iso_or_none
from lorenz.model.events import RuntimeEvent
from lorenz.model.lifecycle import RunOutcome
from lorenz.model.spending import BudgetSnapshot
from lorenz.model.usage import TokenUsage, UsageTotals


@dataclasses.dataclass(frozen=True, slots=True)
class RunningRow:
    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    state: str
    url: str | None
    host: str | None
    workspace_path: str | None
    session_id: str | None
    agent_pid: int | None
    attempt: int | None
    retry_kind: str | None
    turn_count: int
    last_agent_event: str | None
    last_agent_message: str | None
    last_agent_at: datetime.datetime | None
    started_at: datetime.datetime
    runtime_seconds: float
    usage: TokenUsage
    cost_usd: float
    title: str | None = None
    """The issue title, for the dashboard and terminal view (tracker text: escape it)."""
    agent_kind: str | None = None
    """The ``agents.<kind>`` running the slot (``None``: a run recovered from a store)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "title": self.title,
            "slot_index": self.slot_index,
            "state": self.state,
            "url": self.url,
            "agent_kind": self.agent_kind,
            "host": self.host,
            "workspace_path": self.workspace_path,
            "session_id": self.session_id,
            "agent_pid": self.agent_pid,
            "attempt": self.attempt,
            "retry_kind": self.retry_kind,
            "turn_count": self.turn_count,
            "last_agent_event": self.last_agent_event,
            "last_agent_message": self.last_agent_message,
            "last_agent_at": iso_or_none(self.last_agent_at),
            "started_at": iso_or_none(self.started_at),
            "runtime_seconds": self.runtime_seconds,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost_usd,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ReservingRow:
    """A slot waiting for a worker host: host-less by design, shown in its own lane."""

    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    state: str
    attempt: int | None
    reserved_at: datetime.datetime
    expires_at: datetime.datetime
    expires_in_ms: float
    title: str | None = None
    """The issue title (tracker text: escape it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "title": self.title,
            "slot_index": self.slot_index,
            "state": self.state,
            "attempt": self.attempt,
            "reserved_at": iso_or_none(self.reserved_at),
            "expires_at": iso_or_none(self.expires_at),
            "expires_in_ms": self.expires_in_ms,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RetryRow:
    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    attempt: int
    kind: str
    due_at: datetime.datetime
    due_in_ms: float
    """Milliseconds until the retry is due; ``0`` once it is (never negative)."""
    error: str | None
    host: str | None
    workspace_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot_index": self.slot_index,
            "attempt": self.attempt,
            "kind": self.kind,
            "due_at": iso_or_none(self.due_at),
            "due_in_ms": self.due_in_ms,
            "error": self.error,
            "host": self.host,
            "workspace_path": self.workspace_path,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class BlockedRow:
    """A slot that stopped retrying until a refresh or a change of its issue (the retry
    budget was used up, or the agent asked for input or approval; see ``policies.retries``)."""

    slot_key: str
    issue_id: str
    identifier: str
    error: str | None
    """The last run's error, or the agent's question."""
    blocked_at: datetime.datetime
    slot_index: int = 0
    reason: str = "retry_budget_exhausted"
    """A :class:`~lorenz.model.lifecycle.BlockReason` value: ``retry_budget_exhausted``,
    ``input_required``, ``approval_required`` or ``continuation_limit``."""
    failures: int = 0
    """Consecutive failed runs when it was blocked."""
    attempt: int = 0
    terminal_action: str = "block"
    """``block``, ``escalate`` or ``cancel``."""
    action_done: bool = True
    """Whether the terminal action has been applied (always for ``block``)."""
    action_error: str | None = None
    """Why the last attempt at the terminal action failed (tried again every poll)."""
    workspace_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot_index": self.slot_index,
            "reason": self.reason,
            "error": self.error,
            "failures": self.failures,
            "attempt": self.attempt,
            "terminal_action": self.terminal_action,
            "action_done": self.action_done,
            "action_error": self.action_error,
            "workspace_path": self.workspace_path,
            "blocked_at": iso_or_none(self.blocked_at),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class WaitingRow:
    """A slot waiting for the answer to its agent's question (the ``waiting`` lane): it holds
    no concurrency and is not retried; an answer resumes the question's session."""

    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    question: str
    options: tuple[str, ...]
    session_id: str | None
    """The session an answer resumes (``None``: a new one starts)."""
    turn: int
    asked_at: datetime.datetime
    posted: bool
    """Whether the question is on the tracker yet."""
    workspace_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot_index": self.slot_index,
            "question": self.question,
            "options": list(self.options),
            "session_id": self.session_id,
            "turn": self.turn,
            "asked_at": iso_or_none(self.asked_at),
            "posted": self.posted,
            "workspace_path": self.workspace_path,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RunIdentity:
    """Which issue, slot and session one in-flight slot key belongs to — nothing else.

    What the log's run context follows (a slot running, reserved or waiting for its retry),
    read without building a whole snapshot: see ``LorenzRuntime.run_identities()``.
    """

    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    session_id: str | None = None
    """The agent session of a running slot (``None`` before it has one, and when not running)."""


@dataclasses.dataclass(frozen=True, slots=True)
class OrchestratorSnapshot:
    """The scheduling lanes at one instant, plus usage and rate limits."""

    generated_at: datetime.datetime
    running: tuple[RunningRow, ...]
    reserving: tuple[ReservingRow, ...]
    retrying: tuple[RetryRow, ...]
    blocked: tuple[BlockedRow, ...]
    usage_totals: UsageTotals
    """Ended runs plus the usage and elapsed time of the runs still going."""
    rate_limits: Mapping[str, Any] | None
    claimed_elsewhere: tuple[str, ...] = ()
    """Slot keys other live owners hold (durable stores only)."""
    waiting: tuple[WaitingRow, ...] = ()
    """Slots waiting for an answer to their agent's question, oldest first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "generated_at": iso_or_none(self.generated_at),
            "running": [row.to_dict() for row in self.running],
            "reserving": [row.to_dict() for row in self.reserving],
            "retrying": [row.to_dict() for row in self.retrying],
            "blocked": [row.to_dict() for row in self.blocked],
            "waiting": [row.to_dict() for row in self.waiting],
            "usage_totals": self.usage_totals.to_dict(),
            "rate_limits": dict(self.rate_limits) if self.rate_limits is not None else None,
            "claimed_elsewhere": list(self.claimed_elsewhere),
        }


class AppStatus(enum.StrEnum):
    """Where the runtime is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DispatchPause:
    """Why nothing new is dispatched right now: a fault of the host, not of any issue.

    The claim store refuses writes (``claim_store_write_failed``), or workers cannot be
    launched or placed (``worker_launch_failed``, ``worker_launch_timeout``,
    ``worker_state_error``, ``placement_failed``). Runs under way go on; dispatch resumes by
    itself once the fault clears (a heartbeat written, a probe run's worker started).
    """

    code: str
    """The stable code of the fault."""
    message: str
    """What failed (scrubbed), and what to do."""
    since: datetime.datetime
    """When the pause began."""

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "since": self.since.isoformat()}


@dataclasses.dataclass(frozen=True, slots=True)
class PollStatus:
    """The poll loop: whether a tick is under way, what the last one saw, when the next is due."""

    status: Literal["polling", "idle"]
    interval_ms: int
    candidates: int
    """Issues the tracker returned in the last tick."""
    eligible: int
    """Slots of them that passed eligibility (before capacity)."""
    last_poll_at: datetime.datetime | None
    next_poll_at: datetime.datetime | None
    last_error: str | None
    """The last tick's error (scrubbed), ``None`` once a tick succeeds."""
    count: int
    """Ticks started since the runtime started."""
    dispatch_paused: DispatchPause | None = None
    """Set while dispatch is paused by a fault of the host (see :class:`DispatchPause`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "interval_ms": self.interval_ms,
            "candidates": self.candidates,
            "eligible": self.eligible,
            "last_poll_at": iso_or_none(self.last_poll_at),
            "next_poll_at": iso_or_none(self.next_poll_at),
            "last_error": self.last_error,
            "count": self.count,
            "dispatch_paused": (
                self.dispatch_paused.to_dict() if self.dispatch_paused is not None else None
            ),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigError:
    """Why reloads of the workflow fail now (the runtime keeps the last good one)."""

    code: str
    message: str
    since: datetime.datetime
    """When reloads began to fail (the first failure of this streak)."""

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "since": self.since.isoformat()}


@dataclasses.dataclass(frozen=True, slots=True)
class RunRecord:
    """One ended run, as the run history keeps it."""

    issue_id: str
    identifier: str
    slot: int
    attempt: int | None
    outcome: RunOutcome
    error: str | None
    started_at: datetime.datetime
    finished_at: datetime.datetime
    duration_ms: int
    host: str | None
    session_id: str | None
    turn_count: int
    usage: TokenUsage

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot": self.slot,
            "attempt": self.attempt,
            "outcome": self.outcome.value,
            "error": self.error,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "duration_ms": self.duration_ms,
            "host": self.host,
            "session_id": self.session_id,
            "turn_count": self.turn_count,
            "usage": self.usage.to_dict(),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeSnapshot:
    """The whole runtime at one instant: its status, the poll block, the lanes, the projections.

    ``to_dict()`` is the document ``GET /api/v1/state`` and each SSE ``snapshot`` event carry.
    """

    app_status: AppStatus
    workflow_path: str
    poll: PollStatus
    lanes: OrchestratorSnapshot
    """The scheduling lanes, usage totals and rate limits (the orchestrator's part)."""
    recent_events: tuple[RuntimeEvent, ...]
    """Newest first."""
    run_history: tuple[RunRecord, ...]
    """Newest first."""
    log_file: str | None
    config_error: ConfigError | None
    budget: BudgetSnapshot | None = None
    """Spend control (``budget`` in the document): present while a ``budget`` cap is set."""

    @property
    def generated_at(self) -> datetime.datetime:
        return self.lanes.generated_at

    def to_dict(self) -> dict[str, Any]:
        lanes = self.lanes.to_dict()
        # NB: the key order is part of the wire shape (tests/server/test_wire_shape.py).
        document = {
            "generated_at": lanes.pop("generated_at"),
            "app_status": self.app_status.value,
            "workflow_path": self.workflow_path,
            "poll": self.poll.to_dict(),
            **lanes,
            "recent_events": [event.to_dict() for event in self.recent_events],
            "run_history": [record.to_dict() for record in self.run_history],
            "log_file": self.log_file,
            "config_error": self.config_error.to_dict() if self.config_error else None,
        }
        if self.budget is not None:
            document["budget"] = self.budget.to_dict()
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class RefreshReceipt:
    """The answer to a refresh request (``POST /api/v1/refresh``, ``lorenz refresh``)."""

    queued: bool
    """A poll and reconcile pass was queued (``False``: the runtime is stopped)."""
    coalesced: bool
    """It merged with a tick already under way."""
    requested_at: datetime.datetime
    operations: tuple[str, ...]
    """What the pass does (``poll``, ``reconcile``); empty when nothing was queued."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "coalesced": self.coalesced,
            "requested_at": self.requested_at.isoformat(),
            "operations": list(self.operations),
        }
