"""The single authoritative scheduling state, as plain data.

:class:`OrchestratorState` is what the orchestrator writes and everybody else reads (the runtime
for dispatch and timers, the snapshot for the UIs). It is deliberately dumb: maps keyed by slot
key, no behaviour beyond counting. The invariants that make it meaningful are kept by
:class:`~lorenz.orchestrator.Orchestrator`:

* ``claimed`` is exactly ``running`` plus ``reserved`` — never a retrying slot;
* no slot key is both claimed and in ``retry_attempts``;
* occupancy (running plus reserved) never grows past a cap.

* a ``blocked`` slot is in neither: it waits for a person (a refresh or a change of its issue),
  not for a deadline, and it is persisted as a pending retry row plus its checkpoint entry.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import Any

from lorenz.config import TerminalAction
from lorenz.model import (
    BlockReason,
    Issue,
    ReservationRecord,
    RetryEntry,
    RunningEntry,
    SlotKey,
    UsageTotals,
)
from lorenz.model.questions import AgentQuestion, SessionResume


@dataclasses.dataclass(slots=True)
class ForeignClaim:
    """A slot another owner holds: we do not try to claim it again before ``recheck_at_ms``."""

    owner: str | None
    """The holder, when known (from hydration); ``None`` when only a failed acquire told us."""
    recheck_at_ms: float
    """Monotonic time after which a claim attempt may go to the store again."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryBudget:
    """The retry budget a slot's failure streak was decided under, kept in the checkpoint.

    A restarted controller decides the rest of a recovered streak with it (limit and terminal
    action as recorded), not with a possibly changed WORKFLOW.md; a reload while running
    (``update_settings``) applies from the next failure, as before.
    """

    max_attempts: int
    """``retry.max_attempts`` when the last failure was decided."""
    terminal_action: TerminalAction
    """``retry.terminal_action`` when the last failure was decided."""
    failure_code: str | None = None
    """The failure class (stable code) of the streak's last failure, when it has one."""


@dataclasses.dataclass(slots=True)
class BlockedEntry:
    """A slot that stopped retrying: its budget is used up, or its agent asked a question."""

    issue_id: str
    identifier: str
    slot_index: int
    reason: BlockReason
    error: str | None
    """The last run's error, or the agent's question."""
    failures: int
    """Consecutive failures when it was blocked."""
    attempt: int
    """The attempt a retry would have had; an unblocked slot's retry carries it."""
    blocked_at: datetime.datetime
    action: TerminalAction
    action_key: str
    """Idempotency key of the terminal action (see ``policies.retries``)."""
    action_done: bool = False
    """The terminal action's receipt: applied (or nothing to apply, for ``block``)."""
    action_error: str | None = None
    """Why the last attempt at the terminal action failed (it is tried again each poll)."""
    issue_version: str | None = None
    """The issue's version first seen after the action; another version unblocks the slot."""
    host: str | None = None
    workspace_path: str | None = None
    error_code: str | None = None
    """The stable code of the failure in ``error``, when it has one."""
    question: AgentQuestion | None = None
    """What the agent asked, when it asked (``input_required``)."""
    waiting: bool = False
    """The slot waits for an answer (the ``waiting`` lane): no terminal action yet, no
    unblocking on a change of the issue; an answer resumes the question's session. Past
    ``input.timeout_ms`` it stops waiting and takes the terminal action like any block."""
    question_posted: bool = False
    """The question is on the tracker (posted once, under ``action_key``)."""

    @property
    def key(self) -> SlotKey:
        from lorenz.model import slot_key

        return slot_key(self.issue_id, self.slot_index)


@dataclasses.dataclass(slots=True)
class OrchestratorState:
    """Everything in flight, keyed by slot key."""

    running: dict[SlotKey, RunningEntry] = dataclasses.field(default_factory=dict)
    reserved: dict[SlotKey, ReservationRecord] = dataclasses.field(default_factory=dict)
    claimed: set[SlotKey] = dataclasses.field(default_factory=set)
    """Running and reserved slot keys, never retrying ones."""
    retry_attempts: dict[SlotKey, RetryEntry] = dataclasses.field(default_factory=dict)
    completed: set[str] = dataclasses.field(default_factory=set)
    """Issue ids that finished at least one run (bookkeeping only, never gates dispatch)."""
    usage_totals: UsageTotals = dataclasses.field(default_factory=UsageTotals)
    """Usage of *ended* runs; live runs are added on top by the snapshot."""
    rate_limits: Mapping[str, Any] | None = None
    """The latest rate-limit payload any agent reported."""
    foreign: dict[SlotKey, ForeignClaim] = dataclasses.field(default_factory=dict)
    """Slots held by other live owners of the same claim store."""
    blocked: dict[SlotKey, BlockedEntry] = dataclasses.field(default_factory=dict)
    """Slots that stopped retrying until a refresh or a change of their issue."""
    failure_streaks: dict[SlotKey, int] = dataclasses.field(default_factory=dict)
    """Consecutive failed runs per slot (absent = 0): what ``retry.max_attempts`` counts."""
    retry_budgets: dict[SlotKey, RetryBudget] = dataclasses.field(default_factory=dict)
    """The budget each slot's failure streak was last decided under (beside its streak)."""
    restored_budgets: dict[SlotKey, RetryBudget] = dataclasses.field(default_factory=dict)
    """Budgets recovered at start-up: they decide those slots' streaks until the streak ends
    or the settings are reloaded (a restart never applies a changed WORKFLOW.md to them)."""
    resumes: dict[SlotKey, SessionResume] = dataclasses.field(default_factory=dict)
    """Answered questions whose slot's next run continues the session (persisted in the
    checkpoint until that run ends)."""
    continuation_streaks: dict[SlotKey, int] = dataclasses.field(default_factory=dict)
    """Clean runs in a row per slot (absent = 0): what ``agent.max_continuation_runs`` counts
    (memory only: a restart starts every count again)."""

    def occupied(self) -> int:
        """Running plus reserved slots: what every cap counts."""
        return len(self.running) + len(self.reserved)

    def occupied_in_state(self, state_key: str) -> int:
        """Occupied slots whose issue is currently in the normalized state ``state_key``."""
        count = 0
        for entry in self.running.values():
            if entry.issue.state_key == state_key:
                count += 1
        for reservation in self.reserved.values():
            if reservation.issue.state_key == state_key:
                count += 1
        return count

    def occupied_of_kind(self, kind: str, *, chosen: Callable[[Issue], str]) -> int:
        """Occupied slots run by agent kind ``kind``; ``chosen`` gives the kind of a slot that
        did not record one (recovered from a store)."""
        count = 0
        for entry in self.running.values():
            if (entry.agent_kind or chosen(entry.issue)) == kind:
                count += 1
        for reservation in self.reserved.values():
            if (reservation.agent_kind or chosen(reservation.issue)) == kind:
                count += 1
        return count

    def host_load(self) -> dict[str, int]:
        """Running slots per worker host (local runs, host ``None``, are not counted)."""
        load: dict[str, int] = {}
        for entry in self.running.values():
            if entry.host is not None:
                load[entry.host] = load.get(entry.host, 0) + 1
        return load

    def tracked_issue_ids(self) -> set[str]:
        """Issues with a slot reserving, running or waiting to retry."""
        ids = {entry.issue.id for entry in self.running.values()}
        ids.update(reservation.issue.id for reservation in self.reserved.values())
        ids.update(retry.issue_id for retry in self.retry_attempts.values())
        ids.update(blocked.issue_id for blocked in self.blocked.values())
        return ids
