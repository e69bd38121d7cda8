"""The poll: one tick's fixed order, and the coalescing of polls asked for meanwhile.

A tick never overlaps another. A poll requested while one runs (an API refresh, a second
``poll_once``) is queued and merged into a single follow-up tick, whose waiters all resolve when
it ends; this module keeps that merge logic apart from what a tick does with what it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from lorenz.model import EventType, RefreshReceipt
from lorenz.runtime.reporting import describe_error
from lorenz.workflow import validate_dispatch

if TYPE_CHECKING:
    from lorenz.runtime.runtime import LorenzRuntime


class Polling:
    """Runs ticks one at a time and merges the polls requested meanwhile.

    It holds no state of its own: the :class:`LorenzRuntime` it serves keeps all of it.
    """

    def __init__(self, *, runtime: LorenzRuntime) -> None:
        self._runtime = runtime

    async def poll_once(self, *, dry_run: bool = False, wait_for_runs: bool = False) -> None:
        """One tick; a concurrent request queues behind the running one and merges with it."""
        if self._runtime._poll_in_progress:
            waiter = self.queue_poll(dry_run=dry_run, wait_for_runs=wait_for_runs)
            await waiter
            return
        self._runtime._poll_in_progress = True
        options = (dry_run, wait_for_runs)
        try:
            while True:
                waiters, self._runtime._pending_waiters = self._runtime._pending_waiters, []
                try:
                    await self._runtime._tick(dry_run=options[0], wait_for_runs=options[1])
                finally:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                if self._runtime._pending_poll is None or self._runtime._stopped:
                    break
                options, self._runtime._pending_poll = self._runtime._pending_poll, None
        finally:
            self._runtime._poll_in_progress = False
            for waiter in self._runtime._pending_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._runtime._pending_waiters = []
            # NB: the tick's own snapshots all say "polling"; tell subscribers it is over.
            self._runtime._reporting.emit_snapshot()

    def queue_poll(self, *, dry_run: bool, wait_for_runs: bool) -> asyncio.Future[None]:
        if self._runtime._pending_poll is None:
            self._runtime._pending_poll = (dry_run, wait_for_runs)
        else:
            queued_dry, queued_wait = self._runtime._pending_poll
            self._runtime._pending_poll = (queued_dry and dry_run, queued_wait or wait_for_runs)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._runtime._pending_waiters.append(waiter)
        return waiter

    def is_loop_waiting(self) -> bool:
        return self._runtime._app_status == "running" and not self._runtime._poll_in_progress

    def spawn_poll(self) -> None:
        if self._runtime._stopped:
            return
        self._runtime._background.spawn(self.poll_quietly(), name="lorenz-poll")

    async def poll_quietly(self) -> None:
        # NB: a failed background tick is already recorded as poll_error.
        with contextlib.suppress(Exception):
            await self.poll_once()

    def request_refresh(self) -> RefreshReceipt:
        """Queue an immediate poll and reconcile pass (coalesced with one already under way)."""
        requested_at = self._runtime._clock.now()
        coalesced = self._runtime._poll_in_progress
        if self._runtime._stopped:
            return RefreshReceipt(
                queued=False, coalesced=False, requested_at=requested_at, operations=()
            )
        self._runtime._blocking.request_unblock()
        if self._runtime._poll_in_progress:
            self.queue_poll(dry_run=False, wait_for_runs=False)
        else:
            self._runtime._wake.set()
            if self._runtime._loop_task is None and not self.is_loop_waiting():
                self.spawn_poll()
        self._runtime._reporting.event(EventType.REFRESH_REQUESTED, message="refresh requested")
        return RefreshReceipt(
            queued=True,
            coalesced=coalesced,
            requested_at=requested_at,
            operations=("poll", "reconcile"),
        )

    async def tick_body(self, *, dry_run: bool) -> None:
        started_ms = self._runtime._clock.monotonic_ms()
        self._runtime.poll_count += 1
        self._runtime._reporting.emit_snapshot()
        dispatched: list[asyncio.Task[None]] = []
        try:
            if self._runtime._prove_leadership is not None:
                await self._runtime._prove_leadership()
            await self._runtime._reconciling.heartbeat_claims()
            await self._runtime._reload_if_changed()
            settings = self._runtime.settings
            validate_dispatch(settings)
            await self._runtime._reconciling.cleanup_terminal_workspaces_once()
            await self._runtime._reconciling.reconcile_stalled_runs()
            await self._runtime._reconciling.reconcile_tracked_issues()
            if not dry_run:
                await self._runtime._blocking.before_dispatch()
            candidates = await self._runtime._tracker.fetch_candidate_issues()
            self._runtime._candidate_cache = {issue.id: issue for issue in candidates}
            eligible = await self._runtime._orchestrator.eligible_issues(candidates)
            report = self._runtime._orchestrator.last_eligibility
            self._runtime._reporting.eligibility(report)
            if report.pruned:
                await self._runtime._reconciling.cancel_dropped_adoptions(
                    report.pruned, issues=self._runtime._candidate_cache, reason="not_a_candidate"
                )
            self._runtime._blocking.after_eligibility(report)
            self._runtime._last_candidates = len(candidates)
            self._runtime._last_eligible = len(eligible)
            if not dry_run:
                self._runtime._timers.sync(self._runtime._orchestrator.retry_deadlines())
            for candidate in eligible:
                if self._runtime._stopped or self._runtime._draining:
                    break
                if dry_run:
                    self._runtime._reporting.event(
                        EventType.DRY_RUN,
                        issue=candidate.issue,
                        slot=candidate.slot_index,
                        attempt=candidate.attempt,
                        message="would dispatch",
                    )
                    continue
                task = await self._runtime._dispatching.maybe_dispatch(candidate)
                if task is not None:
                    dispatched.append(task)
                elif self._runtime._orchestrator.available_slots() <= 0:
                    # NB: the global cap is full; every later candidate would be skipped too.
                    break
            self._runtime._last_poll_error = None
            self._runtime._last_poll_at = self._runtime._clock.now()
            self._runtime._reporting.event(
                EventType.POLL_COMPLETED,
                message=f"{self._runtime._last_candidates} candidates, "
                f"{self._runtime._last_eligible} eligible",
                duration_ms=round(self._runtime._clock.monotonic_ms() - started_ms, 3),
                candidates=self._runtime._last_candidates,
                eligible=self._runtime._last_eligible,
            )
        except Exception as exc:
            self._runtime._last_poll_at = self._runtime._clock.now()
            self._runtime._last_poll_error = self._runtime._reporting.scrub(describe_error(exc))
            self._runtime._reporting.event(
                EventType.POLL_ERROR,
                message=self._runtime._last_poll_error,
                code=getattr(exc, "code", type(exc).__name__),
                duration_ms=round(self._runtime._clock.monotonic_ms() - started_ms, 3),
            )
            raise
        finally:
            self._runtime._reporting.emit_snapshot()
