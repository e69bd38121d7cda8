"""The retry budget: after a run ends, retry it, or stop and apply the terminal action.

Only *consecutive failures* of a slot count against ``retry.max_attempts``: a clean exit (a
continuation) is not a failure, resets the count and never consumes the budget. When a failure
uses up the budget the slot is not retried; it goes to the ``blocked`` lane and
``retry.terminal_action`` decides what else happens (``block``: nothing; ``escalate``: one
comment and/or label on the issue; ``cancel``: the issue moves to ``retry.cancel_state``).

A run whose worker never started (failure code ``worker_never_started``: its controller was
killed while launching it, and the successor found no trace of a worker) is not a failure of
the agent: it is *compensated* — retried as the same attempt after the continuation delay,
without counting against the budget (seed 004's ``compensated`` spawn phase).

An agent that asks for input or approval (failure codes ``input_required`` and
``approval_required``) is blocked at once, whatever the budget: retrying would only ask again.
Its question is what the lane shows. ``cancel`` does not apply to it (an agent with a question
is not a broken issue); ``escalate`` does, so the question reaches the tracker.

A run stopped at a spend cap (failure code ``budget_exhausted``) is blocked at once too: running
it again would spend past the cap. Its terminal action is ``budget.on_exhausted``, not
``retry.terminal_action``.

Everything here is pure and deterministic. The idempotency key of a terminal action is derived
from the persisted block record alone, so replaying an action after a crash (before its receipt
was written) finds the same key and the tracker adapter can see that it already happened.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib

from lorenz.codes import ErrorCode
from lorenz.config import RetrySettings, TerminalAction
from lorenz.model import BlockReason, Issue, RetryKind
from lorenz.policies.backoff import CONTINUATION_DELAY_MS, retry_plan
from lorenz.policies.continuations import continuation_limit_reached, next_continuation_streak

QUESTION_CODES: dict[str, BlockReason] = {
    ErrorCode.INPUT_REQUIRED: BlockReason.INPUT_REQUIRED,
    "approval_required": BlockReason.APPROVAL_REQUIRED,
}
"""Run failure codes that mean "the agent is waiting for a person", not "the run is broken"."""

BUDGET_EXHAUSTED_CODE = ErrorCode.BUDGET_EXHAUSTED
"""The failure code of a run stopped at a spend cap: blocked at once, never retried."""

NEVER_STARTED_CODE = ErrorCode.WORKER_NEVER_STARTED
"""The failure code of a run whose worker never started (a controller killed mid-launch)."""

INFRASTRUCTURE_CODES: frozenset[str] = frozenset({
    ErrorCode.WORKER_LAUNCH_FAILED,
    ErrorCode.WORKER_LAUNCH_TIMEOUT,
    ErrorCode.WORKER_STATE_ERROR,
    ErrorCode.WORKER_CONTROLLED_ELSEWHERE,
    ErrorCode.CLAIM_STORE_WRITE_FAILED,
})
"""Run failure codes that say the host failed the run, not the agent: the launcher could not
start a worker (a full or read-only state root, a stopped launcher), or another live controller
still follows the slot's worker. Such a failure is retried with backoff but never counted
against ``retry.max_attempts`` and never leads to a terminal action: cancelling an issue
because a disk was full would lose work that no agent ever started."""


HOST_FAULT_CODES: frozenset[str] = frozenset({
    ErrorCode.WORKER_LAUNCH_FAILED,
    ErrorCode.WORKER_LAUNCH_TIMEOUT,
    ErrorCode.WORKER_STATE_ERROR,
    ErrorCode.PLACEMENT_FAILED,
})
"""Run failure codes that say *this host* cannot start runs now (a full or read-only state
root, a stopped launcher, runs that cannot be placed): besides not counting (see
:data:`INFRASTRUCTURE_CODES`), one pauses dispatch until a probe run's worker starts."""


@dataclasses.dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do with a slot whose run just ended."""

    failures: int
    """Consecutive failures of the slot after this run (``0`` after a clean exit)."""
    kind: RetryKind | None = None
    """The retry to write, when the slot is retried."""
    attempt: int = 0
    """Its attempt number (or, when blocked, the attempt a retry would have had)."""
    delay_ms: int = 0
    blocked: BlockReason | None = None
    """Set when the slot is not retried but blocked."""
    action: TerminalAction | None = None
    """The terminal action to apply, when blocked."""
    continuations: int = 0
    """Clean runs of the slot in a row after this run (see :mod:`.continuations`)."""


def settle_decision(
    *,
    normal: bool,
    failure_code: str | None,
    previous_attempt: int | None,
    previous_failures: int,
    retry: RetrySettings,
    previous_continuations: int = 0,
    max_continuation_runs: int = 0,
    on_budget_exhausted: TerminalAction = TerminalAction.BLOCK,
) -> RetryDecision:
    """The decision for a run that ended cleanly (``normal``) or failed with ``failure_code``.

    ``previous_continuations`` clean runs in a row came before this one; past
    ``max_continuation_runs`` of them a clean exit blocks the slot (``continuation_limit``)
    instead of scheduling a continuation (``0``: never). A run stopped at a spend cap is
    blocked with ``on_budget_exhausted`` (``budget.on_exhausted``) as its terminal action.
    """
    if normal:
        attempt, delay = retry_plan(
            kind=RetryKind.CONTINUATION, previous_attempt=previous_attempt, max_backoff_ms=0
        )
        streak = next_continuation_streak(previous_continuations, kind=RetryKind.CONTINUATION)
        if continuation_limit_reached(streak, limit=max_continuation_runs):
            # NB: like a question, not a broken issue: ``cancel`` does not apply, ``escalate``
            # does (someone should look at why the agent keeps stopping short).
            action = (
                TerminalAction.ESCALATE
                if retry.terminal_action is TerminalAction.ESCALATE
                else TerminalAction.BLOCK
            )
            return RetryDecision(failures=0, attempt=attempt, continuations=streak,
                                 blocked=BlockReason.CONTINUATION_LIMIT, action=action)
        return RetryDecision(failures=0, kind=RetryKind.CONTINUATION, attempt=attempt,
                             delay_ms=delay, continuations=streak)
    if failure_code == NEVER_STARTED_CODE:
        # NB: nothing ran, so nothing failed: the same attempt again (``0`` for a first run),
        # the failure count unchanged. The short delay keeps a controller that crashes at every
        # launch from spinning; each crash costs a restart anyway.
        return RetryDecision(
            failures=max(previous_failures, 0),
            kind=RetryKind.FAILURE,
            attempt=previous_attempt or 0,
            delay_ms=CONTINUATION_DELAY_MS,
        )
    backoff = retry.backoff
    attempt, delay = retry_plan(
        kind=RetryKind.FAILURE,
        previous_attempt=previous_attempt,
        max_backoff_ms=backoff.max_ms,
        initial_ms=backoff.initial_ms,
        multiplier=backoff.multiplier,
    )
    if failure_code in INFRASTRUCTURE_CODES:
        # NB: the attempt number still grows, so the backoff does too (a fault that lasts is
        # not hammered); only the failure streak, which the budget reads, stays where it was.
        return RetryDecision(failures=max(previous_failures, 0), kind=RetryKind.FAILURE,
                             attempt=attempt, delay_ms=delay)
    failures = max(previous_failures, 0) + 1
    if failure_code == BUDGET_EXHAUSTED_CODE:
        return RetryDecision(failures=failures, attempt=attempt,
                             blocked=BlockReason.BUDGET_EXHAUSTED, action=on_budget_exhausted)
    question = QUESTION_CODES.get(failure_code or "")
    if question is not None:
        action = (
            TerminalAction.ESCALATE
            if retry.terminal_action is TerminalAction.ESCALATE
            else TerminalAction.BLOCK
        )
        return RetryDecision(failures=failures, attempt=attempt, blocked=question, action=action)
    if failures >= retry.max_attempts:
        return RetryDecision(
            failures=failures,
            attempt=attempt,
            blocked=BlockReason.RETRY_BUDGET_EXHAUSTED,
            action=retry.terminal_action,
        )
    return RetryDecision(failures=failures, kind=RetryKind.FAILURE, attempt=attempt,
                         delay_ms=delay)


def terminal_action_key(
    *, issue_id: str, slot_index: int, blocked_at: datetime.datetime, reason: BlockReason
) -> str:
    """The idempotency key of one block's terminal action: the same for every replay of it,
    different for the next time the slot is blocked."""
    material = f"{issue_id}\x00{slot_index}\x00{blocked_at.isoformat()}\x00{reason.value}"
    return "lz-" + hashlib.sha256(material.encode()).hexdigest()[:20]


ESCALATION_TEXT_LIMIT = 2000
"""Characters of the agent's error or question quoted in an escalation comment."""


def escalation_body(
    *, identifier: str, reason: BlockReason, failures: int, detail: str | None
) -> str:
    """The text of an escalation comment (without the idempotency marker)."""
    if reason is BlockReason.RETRY_BUDGET_EXHAUSTED:
        head = (
            f"Lorenz stopped retrying {identifier} after {failures} consecutive failed "
            "runs. Fix the cause, then change the issue or refresh Lorenz to try again."
        )
    elif reason is BlockReason.CONTINUATION_LIMIT:
        head = (
            f"The agent working on {identifier} kept ending its runs cleanly while the issue "
            "stayed active (agent.max_continuation_runs), so Lorenz stopped running it. Move "
            "the issue on, or change it (or refresh Lorenz) to run the agent again."
        )
    elif reason is BlockReason.BUDGET_EXHAUSTED:
        head = (
            f"Lorenz stopped the agent working on {identifier}: it reached a spend cap "
            "(budget). Raise the cap, or wait for the UTC day to turn for the daily one, then "
            "change the issue or refresh Lorenz to run it again."
        )
    elif reason is BlockReason.INPUT_REQUIRED:
        head = (
            f"The agent working on {identifier} asked a question and is waiting. Answer it in "
            "the issue (or change the prompt), then change the issue or refresh Lorenz."
        )
    else:
        head = (
            f"The agent working on {identifier} asked for an approval Lorenz does not give. "
            "Adjust the agent's approvals or the issue, then change the issue or refresh Lorenz."
        )
    if not detail:
        return head
    text = detail if len(detail) <= ESCALATION_TEXT_LIMIT else detail[:ESCALATION_TEXT_LIMIT] + "…"
    quoted = "\n".join(f"> {line}" for line in text.splitlines() or [text])
    return f"{head}\n\n{quoted}"


def issue_version(issue: Issue) -> str:
    """What "the issue changed in the tracker" compares: its ``updated_at`` when the tracker
    gives one, else its state, labels, title and description."""
    if issue.updated_at is not None:
        stamp = issue.updated_at
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return stamp.astimezone(datetime.UTC).isoformat()
    material = "\x00".join(
        (issue.state_key, ",".join(sorted(issue.labels)), issue.title, issue.description or "")
    )
    return "h:" + hashlib.sha256(material.encode()).hexdigest()[:20]
