"""Snapshot building: the scheduling state at one instant, as frozen rows.

Pure functions of the state and two readings of the clock (monotonic milliseconds for deadlines
and run times, wall-clock time for the timestamps shown), so they are tested without a running
orchestrator and cost only the rows they build. :meth:`Orchestrator.snapshot` calls
:func:`orchestrator_snapshot` with the state it owns.

The row types live in :mod:`lorenz.model.snapshots` (every surface reads them); they are
re-exported here for the orchestrator's callers.
"""

from __future__ import annotations

import datetime

from lorenz.model import ReservationRecord, RetryEntry, RunningEntry, SlotKey, UsageTotals
from lorenz.model.snapshots import (
    BlockedRow,
    OrchestratorSnapshot,
    ReservingRow,
    RetryRow,
    RunIdentity,
    RunningRow,
    WaitingRow,
)
from lorenz.orchestrator.state import BlockedEntry, OrchestratorState

__all__ = [
    "BlockedRow",
    "OrchestratorSnapshot",
    "ReservingRow",
    "RetryRow",
    "RunIdentity",
    "RunningRow",
    "blocked_row",
    "orchestrator_snapshot",
    "reserving_row",
    "retry_row",
    "run_identities",
    "running_row",
    "totals_with_running",
]


def running_row(key: SlotKey, entry: RunningEntry, *, now_ms: float) -> RunningRow:
    """A running slot; its run time is measured on the monotonic clock (never negative)."""
    return RunningRow(
        slot_key=key,
        issue_id=entry.issue.id,
        identifier=entry.issue.identifier,
        slot_index=entry.slot_index,
        state=entry.issue.state,
        url=entry.issue.url,
        host=entry.host,
        workspace_path=entry.workspace_path,
        session_id=entry.session_id,
        agent_pid=entry.agent_pid,
        attempt=entry.attempt,
        retry_kind=entry.retry_kind.value if entry.retry_kind else None,
        turn_count=entry.turn_count,
        last_agent_event=entry.last_agent_event,
        last_agent_message=entry.last_agent_message,
        last_agent_at=entry.last_agent_at,
        started_at=entry.started_at,
        runtime_seconds=max(now_ms - entry.started_at_ms, 0.0) / 1000.0,
        usage=entry.usage,
        cost_usd=entry.cost_usd,
        title=entry.issue.title,
        agent_kind=entry.agent_kind,
    )


def reserving_row(
    key: SlotKey, reservation: ReservationRecord, *, now_ms: float, wall: datetime.datetime
) -> ReservingRow:
    """A reserved slot; its expiry both as a wall-clock time and as milliseconds from now."""
    return ReservingRow(
        slot_key=key,
        issue_id=reservation.issue.id,
        identifier=reservation.issue.identifier,
        slot_index=reservation.slot_index,
        state=reservation.issue.state,
        attempt=reservation.attempt,
        reserved_at=reservation.reserved_at,
        expires_at=wall + datetime.timedelta(milliseconds=reservation.expires_at_ms - now_ms),
        expires_in_ms=max(reservation.expires_at_ms - now_ms, 0.0),
        title=reservation.issue.title,
    )


def retry_row(key: SlotKey, retry: RetryEntry, *, now_ms: float) -> RetryRow:
    """A pending retry; ``due_in_ms`` is ``0`` once it is due."""
    return RetryRow(
        slot_key=key,
        issue_id=retry.issue_id,
        identifier=retry.identifier,
        slot_index=retry.slot_index,
        attempt=retry.attempt,
        kind=retry.kind.value,
        due_at=retry.due_at,
        due_in_ms=max(retry.due_at_ms - now_ms, 0.0),
        error=retry.error,
        host=retry.host,
        workspace_path=retry.workspace_path,
    )


def blocked_row(key: SlotKey, blocked: BlockedEntry) -> BlockedRow:
    """A blocked slot, with why it waits and where its terminal action stands."""
    return BlockedRow(
        slot_key=key,
        issue_id=blocked.issue_id,
        identifier=blocked.identifier,
        error=blocked.error,
        blocked_at=blocked.blocked_at,
        slot_index=blocked.slot_index,
        reason=blocked.reason.value,
        failures=blocked.failures,
        attempt=blocked.attempt,
        terminal_action=blocked.action.value,
        action_done=blocked.action_done,
        action_error=blocked.action_error,
        workspace_path=blocked.workspace_path,
    )


def waiting_row(key: SlotKey, blocked: BlockedEntry) -> WaitingRow:
    """A slot waiting for an answer, with its question."""
    question = blocked.question
    return WaitingRow(
        slot_key=key,
        issue_id=blocked.issue_id,
        identifier=blocked.identifier,
        slot_index=blocked.slot_index,
        question=question.text if question is not None else (blocked.error or ""),
        options=question.options if question is not None else (),
        session_id=question.session_id if question is not None else None,
        turn=question.turn if question is not None else 1,
        asked_at=blocked.blocked_at,
        posted=blocked.question_posted,
        workspace_path=blocked.workspace_path,
    )


def totals_with_running(totals: UsageTotals, running: tuple[RunningRow, ...]) -> UsageTotals:
    """Ended runs' totals plus the usage, cost and run time of the runs still going."""
    input_tokens, output_tokens, total_tokens = (
        totals.input_tokens, totals.output_tokens, totals.total_tokens
    )
    seconds, cost = totals.seconds_running, totals.cost_usd
    for row in running:
        input_tokens += row.usage.input_tokens
        output_tokens += row.usage.output_tokens
        total_tokens += row.usage.total_tokens
        seconds += row.runtime_seconds
        cost += row.cost_usd
    return UsageTotals(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        seconds_running=seconds,
        cost_usd=cost,
    )


def run_identities(state: OrchestratorState) -> tuple[RunIdentity, ...]:
    """The slots running, reserved and waiting for a retry (in that order), each with its issue
    and (running) its session: the part of a snapshot the log's run context reads, at the cost
    of one small object per slot instead of a snapshot's rows, totals and projections."""
    running = [
        RunIdentity(key, entry.issue.id, entry.issue.identifier, entry.slot_index, entry.session_id)
        for key, entry in state.running.items()
    ]
    reserved = [
        RunIdentity(key, held.issue.id, held.issue.identifier, held.slot_index)
        for key, held in state.reserved.items()
    ]
    retrying = [
        RunIdentity(key, retry.issue_id, retry.identifier, retry.slot_index)
        for key, retry in state.retry_attempts.items()
    ]
    return (*running, *reserved, *retrying)


def orchestrator_snapshot(
    state: OrchestratorState, *, now_ms: float, wall: datetime.datetime
) -> OrchestratorSnapshot:
    """The lanes of ``state`` at ``now_ms`` (monotonic) / ``wall`` (the same instant, UTC).

    Retries are ordered by due time (then slot key): the next one due comes first; blocked
    slots by when they were blocked.
    """
    running = tuple(running_row(key, entry, now_ms=now_ms) for key, entry in state.running.items())
    return OrchestratorSnapshot(
        generated_at=wall,
        running=running,
        reserving=tuple(
            reserving_row(key, reservation, now_ms=now_ms, wall=wall)
            for key, reservation in state.reserved.items()
        ),
        retrying=tuple(
            retry_row(key, retry, now_ms=now_ms)
            for key, retry in sorted(
                state.retry_attempts.items(), key=lambda item: (item[1].due_at_ms, item[0])
            )
        ),
        blocked=tuple(
            blocked_row(key, blocked)
            for key, blocked in sorted(
                state.blocked.items(), key=lambda item: (item[1].blocked_at, item[0])
            )
            if not blocked.waiting
        ),
        waiting=tuple(
            waiting_row(key, blocked)
            for key, blocked in sorted(
                state.blocked.items(), key=lambda item: (item[1].blocked_at, item[0])
            )
            if blocked.waiting
        ),
        usage_totals=totals_with_running(state.usage_totals, running),
        rate_limits=dict(state.rate_limits) if state.rate_limits is not None else None,
        claimed_elsewhere=tuple(
            key for key, held in state.foreign.items() if held.recheck_at_ms > now_ms
        ),
    )
