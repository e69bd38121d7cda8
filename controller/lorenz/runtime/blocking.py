"""Blocked slots at run time: their events, their terminal actions and their unblocking.

The orchestrator decides that a slot stops retrying (``policies.retries``) and keeps it in its
``blocked`` lane; this part of the runtime does what that decision asks of the outside world.
An ``escalate`` or ``cancel`` is applied right after the block, and again on every poll while
it has no receipt (the tracker was down, the process died in between): the action's
idempotency key makes a replay post nothing twice. A refresh (API, ``lorenz refresh``)
unblocks every blocked slot before the tick that follows it reads the board.

A *waiting* slot (its agent asked a question) is blocked too, but its business is
:mod:`.questions`: posting the question and reading the answer, on the same passes.
"""

from __future__ import annotations

import asyncio

from lorenz.codes import ErrorCode
from lorenz.config import TerminalAction
from lorenz.model import ActionOutcome, EventType, LorenzError
from lorenz.orchestrator import EligibilityReport
from lorenz.orchestrator.state import BlockedEntry
from lorenz.policies.retries import escalation_body
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.questions import Questions
from lorenz.runtime.reporting import describe_error
from lorenz.trackers.writes import IssueWriter


class TerminalActionUnsupported(LorenzError):
    """The configured tracker cannot apply ``escalate`` or ``cancel``."""

    code = ErrorCode.TERMINAL_ACTION_UNSUPPORTED


class Blocking:
    """Applies terminal actions and reports blocked and unblocked slots.

    An unblocked slot wants a dispatch pass; this module does not start one (dispatch sits above
    it): :meth:`honour_refresh` and :meth:`after_eligibility` say whether they unblocked any,
    and the tick that called them nudges the passes.
    """

    def __init__(self, *, parts: RuntimeParts) -> None:
        self._parts = parts
        self._lock = asyncio.Lock()
        """NB: one pass over the pending actions at a time: a block's own pass and a tick's
        pass must not both post before either has written its receipt."""
        self._unblock_requested = False
        self.questions = Questions(parts=parts)
        """Waiting slots: their questions and answers."""

    def request_unblock(self) -> None:
        """A refresh was asked for: the next tick unblocks every blocked slot first."""
        self._unblock_requested = True

    async def honour_refresh(self) -> bool:
        """At the start of a tick's dispatch work: unblock every slot if a refresh asked.

        Returns whether some slot was unblocked (it is retried now: the caller nudges).
        """
        if not self._unblock_requested:
            return False
        self._unblock_requested = False
        unblocked = await self._parts.orchestrator.unblock()
        for blocked in unblocked:
            self._unblocked(blocked, why="refresh")
        return bool(unblocked)

    def after_eligibility(self, report: EligibilityReport) -> bool:
        """Report what an eligibility pass unblocked or released; ``True``: some were unblocked
        (they are retried now: the caller nudges)."""
        for blocked in report.unblocked:
            self._unblocked(blocked, why="the issue changed in the tracker")
        for blocked in report.released_blocked:
            self._parts.reporting.event(
                EventType.SLOT_UNBLOCKED,
                issue_id=blocked.issue_id,
                identifier=blocked.identifier,
                slot=blocked.slot_index,
                message="blocked slot released: the issue is no longer a candidate",
                reason="released",
            )
        return bool(report.unblocked)

    def on_blocked(self, blocked: BlockedEntry) -> None:
        """A run's end blocked its slot: say so, and start its terminal action (a waiting slot:
        post its question)."""
        if blocked.waiting:
            self.questions.on_waiting(blocked)
            if not self._parts.status.stopped:
                # NB: the pass that posts its question (and reports a wait that ended).
                self._parts.background.spawn(self.apply_pending(), name="lorenz-questions")
            return
        self._parts.reporting.event(
            EventType.SLOT_BLOCKED,
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot=blocked.slot_index,
            message=(
                f"blocked after {blocked.failures} consecutive failure(s) "
                f"({blocked.reason.value}); terminal action {blocked.action.value}"
            ),
            reason=blocked.reason.value,
            attempt=blocked.attempt,
            error=blocked.error,
        )
        if blocked.action_done or self._parts.status.stopped:
            return
        self._parts.background.spawn(self.apply_pending(), name="lorenz-terminal-actions")

    async def apply_pending(self) -> None:
        """Apply every terminal action that has no receipt yet; failures are kept and shown.
        Waiting slots go first: their questions are posted, answers read, and those past
        ``input.timeout_ms`` become blocked slots whose terminal action is applied here."""
        for expired in await self.questions.sync():
            self.on_blocked(expired)
        async with self._lock:
            for blocked in self._parts.orchestrator.pending_terminal_actions():
                error: str | None = None
                code: str = ErrorCode.TERMINAL_ACTION_FAILED
                try:
                    await self._apply(blocked)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any failure is shown and retried
                    error = self._parts.reporting.scrub(describe_error(exc))
                    code = getattr(exc, "code", type(exc).__name__)
                recorded = await self._parts.orchestrator.record_terminal_action(
                    blocked.key, action_key=blocked.action_key, error=error
                )
                if recorded is None:
                    continue
                if error is None:
                    self._parts.reporting.event(
                        EventType.TERMINAL_ACTION,
                        issue_id=blocked.issue_id,
                        identifier=blocked.identifier,
                        slot=blocked.slot_index,
                        message=f"{blocked.action.value} applied",
                        reason=blocked.action.value,
                        outcome=ActionOutcome.APPLIED,
                    )
                else:
                    self._parts.reporting.event(
                        EventType.TERMINAL_ACTION,
                        issue_id=blocked.issue_id,
                        identifier=blocked.identifier,
                        slot=blocked.slot_index,
                        message=f"{blocked.action.value} failed: {error}; tried again next poll",
                        reason=blocked.action.value,
                        outcome=ActionOutcome.FAILED,
                        code=code,
                        error=error,
                    )
            self._parts.reporting.emit_snapshot()

    async def _apply(self, blocked: BlockedEntry) -> None:
        tracker = self._parts.tracker.current
        if not isinstance(tracker, IssueWriter):
            raise TerminalActionUnsupported(
                f"tracker.kind {self._parts.settings.tracker.kind} cannot "
                f"{blocked.action.value}; use retry.terminal_action: block",
                key_path="retry.terminal_action",
            )
        issue = self._parts.candidates.get(blocked.issue_id)
        if issue is None:
            found = await self._parts.tracker.current.fetch_issues_by_ids([blocked.issue_id])
            if not found:
                return  # gone from the tracker: nothing to tell; the next poll releases it
            issue = found[0]
        retry = self._parts.settings.retry
        if blocked.action is TerminalAction.ESCALATE:
            escalation = retry.escalate
            body = escalation_body(
                identifier=blocked.identifier,
                reason=blocked.reason,
                failures=blocked.failures,
                detail=blocked.error,
            )
            await tracker.escalate_issue(
                issue,
                key=blocked.action_key,
                comment=body if escalation.comment else None,
                label=escalation.label,
            )
        elif blocked.action is TerminalAction.CANCEL:
            if retry.cancel_state is None:
                raise TerminalActionUnsupported(
                    "retry.cancel_state is no longer set; set it, or refresh to unblock",
                    key_path="retry.cancel_state",
                )
            await tracker.move_issue_to_state(issue, state=retry.cancel_state)

    def _unblocked(self, blocked: BlockedEntry, *, why: str) -> None:
        self._parts.reporting.event(
            EventType.SLOT_UNBLOCKED,
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot=blocked.slot_index,
            message=f"unblocked: {why}; retrying now",
        )

