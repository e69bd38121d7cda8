"""The records the orchestrator keeps per slot, and the persisted form claim stores hold.

In-process records carry monotonic deadlines; :class:`ClaimRecord` is what crosses a restart or
a process boundary, so it carries wall-clock times instead (monotonic time does not survive a
restart) and the owner that holds the slot.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from lorenz.model.issues import Issue
from lorenz.model.lifecycle import ClaimPhase, RetryKind, SpawnPhase
from lorenz.model.slots import SlotKey
from lorenz.model.usage import TokenUsage


@dataclasses.dataclass(frozen=True, slots=True)
class SpawnIntent:
    """The worker a claim is about: recorded before the worker starts, updated as it runs."""

    handle: str
    """The deterministic worker handle (workflow, issue key, slot, attempt, generation)."""
    phase: SpawnPhase
    generation: int | None = None
    """The controller generation that recorded the intent (``None``: not leading)."""
    last_seq: int = 0
    """The newest journal record the controller collected (re-attach after it)."""
    placement: str | None = None
    """Where the worker runs: ``None`` for this host, else the ``worker.ssh_hosts`` entry."""
    updated_at: datetime.datetime | None = None
    """When the intent was last written, by the store's clock."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "handle": self.handle,
            "phase": self.phase.value,
            "generation": self.generation,
            "last_seq": self.last_seq,
            "placement": self.placement,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpawnIntent:
        generation = data.get("generation")
        updated = data.get("updated_at")
        return cls(
            handle=str(data["handle"]),
            phase=SpawnPhase(data["phase"]),
            generation=int(generation) if generation is not None else None,
            last_seq=int(data.get("last_seq") or 0),
            placement=data.get("placement"),
            updated_at=datetime.datetime.fromisoformat(updated) if updated else None,
        )


@dataclasses.dataclass(slots=True)
class RunningEntry:
    """A slot with a bound run: the agent is (about to be) working on the issue."""

    issue: Issue
    slot_index: int
    attempt: int | None
    """``None`` for a first run; the retry's attempt number for a retry or continuation."""
    started_at_ms: float
    started_at: datetime.datetime
    host: str | None = None
    """The worker host; ``None`` is the local machine."""
    workspace_path: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    turn_id: str | None = None
    agent_pid: int | None = None
    last_agent_event: str | None = None
    last_agent_message: str | None = None
    last_agent_timestamp_ms: float | None = None
    last_agent_at: datetime.datetime | None = None
    turn_count: int = 0
    usage: TokenUsage = dataclasses.field(default_factory=TokenUsage)
    """Tokens this run has used so far (sum over its sessions)."""
    last_reported: TokenUsage = dataclasses.field(default_factory=TokenUsage)
    """The running totals of the current session as last reported, for delta accounting."""
    cost_usd: float = 0.0
    last_reported_cost_usd: float = 0.0
    retry_kind: RetryKind | None = None
    """The kind of retry that led to this run, if any."""
    agent_kind: str | None = None
    """The ``agents.<kind>`` the run uses (chosen when the slot was claimed); ``None`` when not
    recorded (a run recovered from a store): the issue's current choice then counts."""
    resume: SpawnIntent | None = None
    """The worker of an earlier controller this run adopts instead of starting one (from the
    retry it was dispatched from; see :attr:`RetryEntry.resume`)."""

    @property
    def key(self) -> SlotKey:
        from lorenz.model.slots import slot_key

        return slot_key(self.issue.id, self.slot_index)


@dataclasses.dataclass(slots=True)
class ReservationRecord:
    """A slot claimed while a worker pool looks for a host: it counts toward every cap."""

    issue: Issue
    slot_index: int
    token: str
    """The ABA guard: bind and cancel with any other token are no-ops."""
    attempt: int | None
    reserved_at_ms: float
    expires_at_ms: float
    reserved_at: datetime.datetime
    consumed_retry: RetryEntry | None = None
    """The retry entry this reservation consumed; a cancel puts it back untouched."""
    agent_kind: str | None = None
    """The ``agents.<kind>`` the run will use (counts toward that kind's cap meanwhile)."""

    @property
    def key(self) -> SlotKey:
        from lorenz.model.slots import slot_key

        return slot_key(self.issue.id, self.slot_index)


@dataclasses.dataclass(slots=True)
class RetryEntry:
    """A slot waiting for its backoff to pass before it may be dispatched again."""

    issue_id: str
    identifier: str
    slot_index: int
    attempt: int
    """The attempt number of the run this retry dispatches; ``0`` when that run is the slot's
    first run again (an ``adoption`` of a first run, or a first run retried without counting
    because it never started), whose attempt is ``None`` (see :attr:`run_attempt`)."""
    kind: RetryKind
    due_at_ms: float
    """Monotonic deadline in this process."""
    due_at: datetime.datetime
    """The same deadline on the wall clock, for persistence and display."""
    error: str | None = None
    error_code: str | None = None
    """The stable code of the failure in ``error`` (``None``: a clean exit, or no code)."""
    host: str | None = None
    """The host the last run used; a retry prefers it (see ``policies.retry_host``)."""
    workspace_path: str | None = None
    resume: SpawnIntent | None = None
    """A live (or finished, uncollected) worker of a lost controller that this slot's next run
    adopts: re-attach after ``resume.last_seq`` instead of starting the agent again. Set only
    by hydration, for a recovered running claim whose spawn intent has something to probe;
    never persisted (the claim row keeps the intent itself until the slot is claimed again)."""

    @property
    def key(self) -> SlotKey:
        from lorenz.model.slots import slot_key

        return slot_key(self.issue_id, self.slot_index)

    @property
    def run_attempt(self) -> int | None:
        """The attempt the dispatched run carries: :attr:`attempt`, ``None`` for ``0``.

        NB: a first run's attempt is ``None`` (the prompt's ``attempt``, the handle, the next
        failure's number all start from it); a run adopted across a restart keeps it, so its
        failure retry is numbered as it would have been without the restart.
        """
        return self.attempt or None


@dataclasses.dataclass(slots=True)
class ClaimRecord:
    """One claimed slot as a claim store persists it (one row, or one ``Claim`` resource)."""

    slot_key: SlotKey
    issue_id: str
    identifier: str
    slot_index: int
    phase: ClaimPhase
    owner: str
    """The identity of the process (or operator replica) that holds the slot."""
    attempt: int | None = None
    retry_kind: RetryKind | None = None
    due_at: datetime.datetime | None = None
    """Wall-clock due time of a pending retry."""
    reservation_token: str | None = None
    host: str | None = None
    workspace_path: str | None = None
    started_at: datetime.datetime | None = None
    last_agent_at: datetime.datetime | None = None
    turn_count: int = 0
    usage: TokenUsage = dataclasses.field(default_factory=TokenUsage)
    last_error: str | None = None
    session_id: str | None = None
    updated_at: datetime.datetime | None = None
    generation: int | None = None
    """The controller generation of the last write (stamped by the store; ``None``: the
    writer did not lead, e.g. a plain run without a daemon)."""
    intent: SpawnIntent | None = None
    """The spawn intent of the slot's worker, while one is recorded (see :class:`SpawnPhase`).
    Written only through the store's ``record_intent``; ``save`` leaves it as it is."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe form (timestamps as ISO strings)."""

        def iso(value: datetime.datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot_index": self.slot_index,
            "phase": self.phase.value,
            "owner": self.owner,
            "attempt": self.attempt,
            "retry_kind": self.retry_kind.value if self.retry_kind else None,
            "due_at": iso(self.due_at),
            "reservation_token": self.reservation_token,
            "host": self.host,
            "workspace_path": self.workspace_path,
            "started_at": iso(self.started_at),
            "last_agent_at": iso(self.last_agent_at),
            "turn_count": self.turn_count,
            "usage": self.usage.to_dict(),
            "last_error": self.last_error,
            "session_id": self.session_id,
            "updated_at": iso(self.updated_at),
            "generation": self.generation,
            "intent": self.intent.to_dict() if self.intent is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClaimRecord:
        """The inverse of :meth:`to_dict`."""

        def ts(value: Any) -> datetime.datetime | None:
            return datetime.datetime.fromisoformat(value) if value else None

        usage = data.get("usage") or {}
        return cls(
            slot_key=SlotKey(data["slot_key"]),
            issue_id=data["issue_id"],
            identifier=data["identifier"],
            slot_index=int(data["slot_index"]),
            phase=ClaimPhase(data["phase"]),
            owner=data["owner"],
            attempt=data.get("attempt"),
            retry_kind=RetryKind(data["retry_kind"]) if data.get("retry_kind") else None,
            due_at=ts(data.get("due_at")),
            reservation_token=data.get("reservation_token"),
            host=data.get("host"),
            workspace_path=data.get("workspace_path"),
            started_at=ts(data.get("started_at")),
            last_agent_at=ts(data.get("last_agent_at")),
            turn_count=int(data.get("turn_count") or 0),
            usage=TokenUsage(
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
                total_tokens=int(usage.get("total_tokens", 0)),
            ),
            last_error=data.get("last_error"),
            session_id=data.get("session_id"),
            updated_at=ts(data.get("updated_at")),
            generation=data.get("generation"),
            intent=SpawnIntent.from_dict(data["intent"]) if data.get("intent") else None,
        )
