"""Blocked slots at run time: their events, their terminal actions and their unblocking.

The orchestrator decides that a slot stops retrying (``policies.retries``) and keeps it in its
``blocked`` lane; this part of the runtime does what that decision asks of the outside world.
An ``escalate`` or ``cancel`` is applied right after the block, and again on every poll while
it has no receipt (the tracker was down, the process died in between): the action's
idempotency key makes a replay post nothing twice. A refresh (API, ``lorenz refresh``)
unblocks every blocked slot before the tick that follows it reads the board.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lorenz.config import TerminalAction
from lorenz.model import EventType, LorenzError
from lorenz.orchestrator import EligibilityReport
from lorenz.orchestrator.state import BlockedEntry
from lorenz.policies.retries import escalation_body
from lorenz.runtime.reporting import describe_error
from lorenz.trackers.writes import IssueWriter

if TYPE_CHECKING:
    from lorenz.runtime.runtime import LorenzRuntime


class TerminalActionUnsupported(LorenzError):
    """The configured tracker cannot apply ``escalate`` or ``cancel``."""

    code = "terminal_action_unsupported"


class Blocking:
    """Applies terminal actions and reports blocked and unblocked slots."""

    def __init__(self, *, runtime: LorenzRuntime) -> None:
        self._runtime = runtime
        self._lock = asyncio.Lock()
        """NB: one pass over the pending actions at a time: a block's own pass and a tick's
        pass must not both post before either has written its receipt."""
        self._unblock_requested = False

    def request_unblock(self) -> None:
        """A refresh was asked for: the next tick unblocks every blocked slot first."""
        self._unblock_requested = True

    async def before_dispatch(self) -> None:
        """At the start of a tick's dispatch work: honour a refresh, retry pending actions."""
        if self._unblock_requested:
            self._unblock_requested = False
            for blocked in await self._runtime._orchestrator.unblock():
                self._unblocked(blocked, why="refresh")
        await self.apply_pending()

    def after_eligibility(self, report: EligibilityReport) -> None:
        for blocked in report.unblocked:
            self._unblocked(blocked, why="the issue changed in the tracker")
        for blocked in report.released_blocked:
            self._runtime._reporting.event(
                EventType.SLOT_UNBLOCKED,
                issue_id=blocked.issue_id,
                identifier=blocked.identifier,
                slot=blocked.slot_index,
                message="blocked slot released: the issue is no longer a candidate",
                reason="released",
            )

    def on_blocked(self, blocked: BlockedEntry) -> None:
        """A run's end blocked its slot: say so, and start its terminal action."""
        self._runtime._reporting.event(
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
        if blocked.action_done or self._runtime._stopped:
            return
        self._runtime._background.spawn(self.apply_pending(), name="lorenz-terminal-actions")

    async def apply_pending(self) -> None:
        """Apply every terminal action that has no receipt yet; failures are kept and shown."""
        async with self._lock:
            for blocked in self._runtime._orchestrator.pending_terminal_actions():
                error: str | None = None
                code = "terminal_action_failed"
                try:
                    await self._apply(blocked)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any failure is shown and retried
                    error = self._runtime._reporting.scrub(describe_error(exc))
                    code = getattr(exc, "code", type(exc).__name__)
                recorded = await self._runtime._orchestrator.record_terminal_action(
                    blocked.key, action_key=blocked.action_key, error=error
                )
                if recorded is None:
                    continue
                if error is None:
                    self._runtime._reporting.event(
                        EventType.TERMINAL_ACTION,
                        issue_id=blocked.issue_id,
                        identifier=blocked.identifier,
                        slot=blocked.slot_index,
                        message=f"{blocked.action.value} applied",
                        reason=blocked.action.value,
                        outcome="applied",
                    )
                else:
                    self._runtime._reporting.event(
                        EventType.TERMINAL_ACTION,
                        issue_id=blocked.issue_id,
                        identifier=blocked.identifier,
                        slot=blocked.slot_index,
                        message=f"{blocked.action.value} failed: {error}; tried again next poll",
                        reason=blocked.action.value,
                        outcome="failed",
                        code=code,
                        error=error,
                    )
            self._runtime._reporting.emit_snapshot()

    async def _apply(self, blocked: BlockedEntry) -> None:
        tracker = self._runtime._tracker
        if not isinstance(tracker, IssueWriter):
            raise TerminalActionUnsupported(
                f"tracker.kind {self._runtime.settings.tracker.kind} cannot "
                f"{blocked.action.value}; use retry.terminal_action: block",
                key_path="retry.terminal_action",
            )
        issue = self._runtime._candidate_cache.get(blocked.issue_id)
        if issue is None:
            found = await self._runtime._tracker.fetch_issues_by_ids([blocked.issue_id])
            if not found:
                return  # gone from the tracker: nothing to tell; the next poll releases it
            issue = found[0]
        retry = self._runtime.settings.retry
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
        self._runtime._reporting.event(
            EventType.SLOT_UNBLOCKED,
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot=blocked.slot_index,
            message=f"unblocked: {why}; retrying now",
        )
        self._runtime._dispatching.nudge()

