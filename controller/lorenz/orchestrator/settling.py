"""Settling a run's exit: what a slot becomes when its run ends (a retry, or a block).

Why a module of its own: the end of a run is where the retry budget, the continuation limit,
a recovered streak's recorded budget and an agent's question meet, and the order they are
applied in is the behaviour (:func:`~lorenz.policies.retries.settle_decision` decides; this
applies the decision to the state). :class:`~lorenz.orchestrator.scheduling.Orchestrator`
takes the run off its slot, calls :func:`settle_run` under its lock, and writes the row and
the checkpoint it returns.
"""

from __future__ import annotations

import dataclasses
import datetime

from lorenz.config import TerminalAction, WorkflowSettings
from lorenz.model import RetryEntry, RetryKind, RunningEntry, SlotKey
from lorenz.model.questions import AgentQuestion
from lorenz.orchestrator.state import BlockedEntry, OrchestratorState, RetryBudget
from lorenz.policies.retries import QUESTION_CODES, settle_decision, terminal_action_key


def settle_run(
    state: OrchestratorState,
    entry: RunningEntry,
    *,
    key: SlotKey,
    settings: WorkflowSettings,
    normal: bool,
    error: str | None,
    failure_code: str | None,
    count_continuation: bool,
    question: AgentQuestion | None,
    now_ms: float,
    wall: datetime.datetime,
) -> BlockedEntry | RetryEntry:
    """Schedule the retry of a run that ended (already off its slot), or block its slot.

    Clean exit: continuation retry, attempt 1, 1000 ms. Fault: failure retry, the entry's
    attempt plus one (a first run counts as 0), ``10000 * 2**(attempt-1)`` ms capped by
    ``retry.backoff``.

    A failure that uses up ``retry.max_attempts`` consecutive failures, or whose
    ``failure_code`` says the agent asked for input or approval, writes no retry: the slot is
    blocked (a :class:`BlockedEntry`) until a refresh or a change of its issue. So is a clean
    exit past ``agent.max_continuation_runs`` clean runs of the slot in a row
    (``policies.continuations``): its agent keeps stopping without moving the issue.
    ``count_continuation=False`` is for a clean end the agent did not choose (the runtime
    shutting down): the continuation is written, and the count neither grows nor blocks.
    A ``question`` (the run ended because the agent asked) makes the blocked slot *waiting*
    (:attr:`BlockedEntry.waiting`): no failure is counted, no terminal action is taken, and an
    answer resumes the question's session.

    Updates the slot's failure and continuation streaks and retry budget in ``state`` and
    records the retry (in ``retry_attempts``) or the block (in ``blocked``); the caller
    persists it.
    """
    retry_settings = settings.retry
    recorded = state.restored_budgets.get(key)
    if recorded is not None:
        # NB: a streak recovered at start-up keeps the limit and action it was decided
        # under, not a WORKFLOW.md changed across the restart.
        retry_settings = retry_settings.model_copy(
            update={
                "max_attempts": recorded.max_attempts,
                "terminal_action": recorded.terminal_action,
            }
        )
    decision = settle_decision(
        normal=normal,
        failure_code=failure_code,
        previous_attempt=entry.attempt,
        previous_failures=state.failure_streaks.get(key, 0),
        retry=retry_settings,
        previous_continuations=state.continuation_streaks.get(key, 0),
        max_continuation_runs=(settings.agent.max_continuation_runs if count_continuation else 0),
        on_budget_exhausted=settings.budget.on_exhausted,
    )
    if decision.failures:
        state.failure_streaks[key] = decision.failures
        state.retry_budgets[key] = RetryBudget(
            max_attempts=retry_settings.max_attempts,
            terminal_action=retry_settings.terminal_action,
            failure_code=failure_code,
        )
    else:
        state.failure_streaks.pop(key, None)
        state.retry_budgets.pop(key, None)
        state.restored_budgets.pop(key, None)
    if normal and not count_continuation:
        pass  # NB: not the agent's choice: the count stays as it was
    elif decision.continuations and decision.blocked is None:
        state.continuation_streaks[key] = decision.continuations
    else:
        state.continuation_streaks.pop(key, None)
    waiting = question is not None and decision.blocked in QUESTION_CODES.values()
    if waiting:
        # NB: a question is not a failure: the streak stays as it was before this run.
        decision = dataclasses.replace(
            decision,
            failures=state.failure_streaks.get(key, 0),
            action=TerminalAction.BLOCK,
        )
    if decision.blocked is not None:
        assert decision.action is not None
        blocked = BlockedEntry(
            issue_id=entry.issue.id,
            identifier=entry.issue.identifier,
            slot_index=entry.slot_index,
            reason=decision.blocked,
            error=error,
            failures=decision.failures,
            attempt=decision.attempt,
            blocked_at=wall,
            action=decision.action,
            action_key=terminal_action_key(
                issue_id=entry.issue.id,
                slot_index=entry.slot_index,
                blocked_at=wall,
                reason=decision.blocked,
            ),
            action_done=decision.action is TerminalAction.BLOCK,
            host=entry.host,
            workspace_path=entry.workspace_path,
            error_code=failure_code,
            question=question if waiting else None,
            waiting=waiting,
        )
        state.blocked[key] = blocked
        state.failure_streaks.pop(key, None)  # kept in the entry; an unblock starts at 0
        state.retry_budgets.pop(key, None)
        state.restored_budgets.pop(key, None)
        return blocked
    kind = decision.kind or RetryKind.FAILURE
    attempt, delay = decision.attempt, decision.delay_ms
    retry = RetryEntry(
        issue_id=entry.issue.id,
        identifier=entry.issue.identifier,
        slot_index=entry.slot_index,
        attempt=attempt,
        kind=kind,
        due_at_ms=now_ms + delay,
        due_at=wall + datetime.timedelta(milliseconds=delay),
        error=error,
        error_code=failure_code,
        host=entry.host,
        workspace_path=entry.workspace_path,
    )
    state.retry_attempts[key] = retry
    return retry
