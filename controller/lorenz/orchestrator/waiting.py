"""Blocked slots: the wait for a person, a question's answer, and the terminal action.

Why a module of its own: a blocked slot leaves the retry loop until someone acts (a refresh, a
change of its issue, an answer to the agent's question, or a question's timeout that turns the
wait into the terminal action), and those rules are the same whichever of the
:class:`~lorenz.orchestrator.scheduling.Orchestrator`'s methods applies them. They are plain
functions of the state here; the orchestrator calls them under its lock and does the store
writes and checkpoints they call for, in the order its methods document.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from lorenz.config import TerminalAction
from lorenz.model import BlockReason, Issue, RetryEntry, RetryKind
from lorenz.model.questions import SessionResume
from lorenz.orchestrator.state import BlockedEntry, OrchestratorState
from lorenz.policies.retries import issue_version, terminal_action_key


def blocked_retry(blocked: BlockedEntry, *, now_ms: float) -> RetryEntry:
    """The retry a blocked slot becomes when it is unblocked: due at once, same attempt."""
    return RetryEntry(
        issue_id=blocked.issue_id,
        identifier=blocked.identifier,
        slot_index=blocked.slot_index,
        attempt=blocked.attempt,
        kind=(
            RetryKind.CONTINUATION
            if blocked.reason is BlockReason.CONTINUATION_LIMIT
            else RetryKind.FAILURE
        ),
        due_at_ms=now_ms,
        due_at=blocked.blocked_at,
        error=blocked.error,
        error_code=blocked.error_code,
        host=blocked.host,
        workspace_path=blocked.workspace_path,
    )


def review_blocked(
    state: OrchestratorState, issues: Sequence[Issue], eligible_ids: set[str], *, span: int
) -> tuple[list[BlockedEntry], list[BlockedEntry], bool]:
    """On a full candidate list: ``(to unblock, released, noted)``.

    Blocked slots whose issue is no longer eligible (or whose index is beyond ``span``) are
    removed from the state with their budgets (their rows are the caller's to release); a
    slot whose terminal action is done gets its issue's version noted (``noted``), and one
    whose issue has changed since is returned to unblock. A waiting slot is left as it is.
    """
    ids = {blocked.issue_id for blocked in state.blocked.values()}
    by_id = {issue.id: issue for issue in issues if issue.id in ids}
    unblocked: list[BlockedEntry] = []
    released: list[BlockedEntry] = []
    noted = False
    for key, blocked in list(state.blocked.items()):
        issue = by_id.get(blocked.issue_id)
        if issue is None or blocked.issue_id not in eligible_ids or blocked.slot_index >= span:
            del state.blocked[key]
            state.failure_streaks.pop(key, None)
            state.retry_budgets.pop(key, None)
            state.restored_budgets.pop(key, None)
            released.append(blocked)
            continue
        if blocked.waiting:
            continue  # NB: an answer ends the wait, not a change (the question is one).
        version = issue_version(issue)
        if blocked.issue_version is None:
            if blocked.action_done:
                blocked.issue_version = version
                noted = True
        elif version != blocked.issue_version:
            unblocked.append(blocked)
    return unblocked, released, noted


def unblock_slot(
    state: OrchestratorState, blocked: BlockedEntry, *, now_ms: float, wall: datetime.datetime
) -> RetryEntry:
    """Turn a blocked slot into a failure retry due at once, with a fresh retry budget."""
    key = blocked.key
    state.blocked.pop(key, None)
    # NB: a person looked at it: the budget starts again.
    state.failure_streaks.pop(key, None)
    state.retry_budgets.pop(key, None)
    state.restored_budgets.pop(key, None)
    retry = blocked_retry(blocked, now_ms=now_ms)
    retry.due_at = wall
    state.retry_attempts[key] = retry
    return retry


def waiting_slots(state: OrchestratorState) -> tuple[BlockedEntry, ...]:
    """Slots waiting for an answer, oldest question first."""
    return tuple(
        sorted(
            (b for b in state.blocked.values() if b.waiting),
            key=lambda b: (b.blocked_at, b.key),
        )
    )


def pending_terminal_actions(state: OrchestratorState) -> tuple[BlockedEntry, ...]:
    """Blocked slots whose escalation or cancel has not been applied yet (oldest first)."""
    return tuple(
        sorted(
            (b for b in state.blocked.values() if not b.action_done),
            key=lambda b: (b.blocked_at, b.key),
        )
    )


def waiting_for(blocked: BlockedEntry | None, *, action_key: str) -> BlockedEntry | None:
    """``blocked`` if it is still the wait ``action_key`` names, else ``None`` (it is over)."""
    if blocked is None or not blocked.waiting or blocked.action_key != action_key:
        return None
    return blocked


def answer_slot(
    state: OrchestratorState,
    blocked: BlockedEntry,
    *,
    resume: SessionResume,
    now_ms: float,
    wall: datetime.datetime,
) -> RetryEntry:
    """End a wait with its answer: a continuation retry due at once, same attempt, that
    resumes the question's session; the failure streak is the one before the question."""
    key = blocked.key
    del state.blocked[key]
    retry = blocked_retry(blocked, now_ms=now_ms)
    retry.kind = RetryKind.CONTINUATION
    retry.due_at = wall
    state.retry_attempts[key] = retry
    state.resumes[key] = resume
    if blocked.failures:
        state.failure_streaks[key] = blocked.failures
    return retry


def stop_waiting_slot(
    blocked: BlockedEntry, *, action: TerminalAction, wall: datetime.datetime
) -> None:
    """End an unanswered wait: the slot stays blocked and takes the terminal action
    (``cancel`` counts as ``block``, as for any question)."""
    if action is TerminalAction.CANCEL:
        action = TerminalAction.BLOCK
    blocked.waiting = False
    blocked.action = action
    blocked.action_key = terminal_action_key(
        issue_id=blocked.issue_id,
        slot_index=blocked.slot_index,
        blocked_at=wall,
        reason=blocked.reason,
    )
    blocked.action_done = action is TerminalAction.BLOCK
    blocked.action_error = None
