"""The clean exits of runs, waiting for the read that decides each one: continue or release.

A run whose agent ended its turn cleanly does not decide by itself whether the issue gets
another turn: it waits here until the next tracker read (a dispatch pass's batched by-id read,
or a tick's reconciliation) says whether the issue is still active, then either keeps the
slot's place with a continuation retry or releases it and stops the issue's other runs. In
``--once`` the run reads its issue itself. Apart from dispatching (which spawns and settles
runs) because this bookkeeping and its decision are what reconciliation shares with it (see
:class:`~.reconciling.PendingExits`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from lorenz.claims.errors import ClaimStoreWriteFailed
from lorenz.model import AbortReason, EventType, Issue, RunOutcome, SlotKey, StopReason
from lorenz.runtime.blocking import Blocking
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.runs import ActiveRun, PendingExit

logger = logging.getLogger("lorenz.runtime")


class CleanExits:
    """Keeps the clean exits waiting for their decision, and decides them.

    ``wake`` asks for a dispatch pass (the dispatcher's ``nudge``): a pass decides the exits
    waiting now with one tracker read. It is the one thing this holds of its owner.
    """

    def __init__(
        self,
        *,
        parts: RuntimeParts,
        reconciling: Reconciling,
        blocking: Blocking,
        wake: Callable[[], None],
    ) -> None:
        self._parts = parts
        self._reconciling = reconciling
        self._blocking = blocking
        self._wake = wake
        self._exits: dict[SlotKey, PendingExit] = {}

    def waiting_issue_ids(self) -> set[str]:
        """The issues with a clean exit still waiting for its decision."""
        return {pending.issue_id for pending in self._exits.values()}

    async def settle_clean_exit(self, run: ActiveRun) -> None:
        """Wait for the by-id read that decides a cleanly exited slot (see :class:`PendingExit`).

        In ``--once`` there are no dispatch passes, so the run reads its issue itself.
        """
        pending = PendingExit(run=run, decided=asyncio.get_running_loop().create_future())
        if self._parts.status.once:
            try:
                found = await self._parts.tracker.current.fetch_issues_by_ids([run.issue_id])
            except Exception:  # noqa: BLE001 - unknown state: the exit keeps its continuation
                await self.decide_exit(pending, None, known=False)
            else:
                by_id = {issue.id: issue for issue in found}
                await self.decide_exit(pending, by_id.get(run.issue_id), known=True)
            return
        self._exits[run.key] = pending
        self._wake()
        try:
            await pending.decided
        except asyncio.CancelledError:
            self._exits.pop(run.key, None)
            if run.reason is AbortReason.SHUTDOWN:
                # Stopped while waiting: as any shutdown, keep the slot's place (if the pass
                # did not decide it already).
                await self.finish_for_shutdown(run.key)
                return
            if run.reason is None:
                run.reason = AbortReason.SHUTDOWN
                await self.finish_for_shutdown(run.key)
                raise

    async def finish_for_shutdown(self, key: SlotKey) -> None:
        """End a run stopped by the shutdown: its continuation keeps the slot's place, and the
        stop does not count as one of the agent's continuations."""
        try:
            await self._parts.orchestrator.finish(
                key, normal=True, error=None, count_continuation=False
            )
        except ClaimStoreWriteFailed as exc:
            # NB: a full disk must not turn a clean stop into a traceback; the claim stays
            # running in the store, and the next controller recovers it as interrupted.
            logger.warning("slot not recorded at shutdown slot=%s: %s", key, exc)

    def take_exits(self) -> list[PendingExit]:
        exits = list(self._exits.values())
        self._exits.clear()
        return exits

    async def decide_exit(self, pending: PendingExit, issue: Issue | None, *, known: bool) -> None:
        """Continuation retry while the issue stays active (or cannot be read); else release."""
        key, issue_id = pending.key, pending.issue_id
        try:
            if pending.decided.done() or not pending.run.is_active:
                return  # stopped or cancelled meanwhile: whoever did that settled the slot
            reason = self._parts.orchestrator.reconciliation_decision(issue) if known else None
            if reason is None:
                finished = await self._parts.orchestrator.finish(key, normal=True, error=None)
                if issue is not None:
                    self._parts.candidates[issue_id] = issue
                if finished is None:
                    return
                self._parts.reporting.record_run(
                    finished.entry, outcome=RunOutcome.SUCCESS, error=None
                )
                self._parts.reporting.event(
                    EventType.RUN_FINISHED,
                    issue=finished.entry.issue,
                    slot=finished.entry.slot_index,
                    message="run finished",
                    outcome=RunOutcome.SUCCESS,
                )
                self._parts.reporting.retry_event(finished.retry)
                if finished.blocked is not None:
                    self._blocking.on_blocked(finished.blocked)
                if finished.retry is not None and not self._parts.status.stopped:
                    self._parts.timers.sync(self._parts.orchestrator.retry_deadlines())
                return
            finished = await self._parts.orchestrator.finish(
                key, normal=True, error=None, release=True
            )
            self._parts.candidates.pop(issue_id, None)
            if finished is not None:
                self._parts.reporting.record_run(
                    finished.entry, outcome=RunOutcome.SUCCESS, error=None
                )
                self._parts.reporting.event(
                    EventType.RUN_FINISHED,
                    issue=finished.entry.issue,
                    slot=finished.entry.slot_index,
                    message=f"run finished; issue {reason}, released",
                    outcome=RunOutcome.SUCCESS,
                    reason=str(reason),
                )
            if reason is StopReason.TERMINAL and self._reconciling.finishing_turn(
                issue_id, issue
            ):
                return  # other slots are finishing their turn; the last one cleans up
            self._reconciling.end_grace(issue_id)
            await self._reconciling.stop_issue(issue_id, issue=issue, reason=str(reason))
        finally:
            if not pending.decided.done():
                pending.decided.set_result(None)
