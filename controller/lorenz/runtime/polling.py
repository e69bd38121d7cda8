"""The poll: one tick's fixed order, the recurring loop, and the polls asked for meanwhile.

A tick never overlaps another. A poll requested while one runs (an API refresh, a second
``poll_once``) is queued and merged into a single follow-up tick, whose waiters all resolve when
it ends; this module keeps that merge logic apart from what a tick does with what it reads. One
tick, in order: prove leadership, heartbeat the claims, reload the workflow if its source
changed, the start-up workspace sweep (once), stalled runs, tracked issues (with the pending
clean exits), blocked slots, the candidate read, eligibility, retry timers, dispatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable

from lorenz.model import AppStatus, DispatchPause, EventType, PollStatus, RefreshReceipt
from lorenz.runtime.blocking import Blocking
from lorenz.runtime.dispatching import Dispatching
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.reloading import Reloading
from lorenz.runtime.reporting import describe_error
from lorenz.workflow import validate_dispatch


class Polling:
    """Runs ticks one at a time, in a loop or on request, and merges the polls asked meanwhile.

    It owns the poll state (in progress, the merged follow-up, its waiters, the loop's wake-up,
    the counters and times the snapshot's poll block shows) and the tick lock: a tick's body
    holds ``tick_lock``, and so does every dispatch pass (:class:`~.dispatching.Dispatching`
    is handed the same lock), so the two never interleave.
    """

    def __init__(
        self,
        *,
        parts: RuntimeParts,
        reloading: Reloading,
        reconciling: Reconciling,
        blocking: Blocking,
        dispatching: Dispatching,
        tick_lock: asyncio.Lock,
        prove_leadership: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self._parts = parts
        self._reloading = reloading
        self._reconciling = reconciling
        self._blocking = blocking
        self._dispatching = dispatching
        self._tick_lock = tick_lock
        """Held by a tick's body and by a dispatch pass: they never interleave."""
        self._prove_leadership = prove_leadership
        """Awaited first in every tick (the operator's lease check); ``None``: nothing to prove."""
        self._in_progress = False
        self._pending_poll: tuple[bool, bool] | None = None
        """The merged follow-up poll: (dry_run, wait_for_runs)."""
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        """Set to cut the recurring loop's wait short (a refresh, a stop)."""
        self.count = 0
        """Ticks begun so far."""
        self.next_poll_at: datetime.datetime | None = None
        self._last_poll_at: datetime.datetime | None = None
        self._last_poll_error: str | None = None
        self._last_candidates = 0
        self._last_eligible = 0

    @property
    def in_progress(self) -> bool:
        """Whether a tick (or its merged follow-up) is running now."""
        return self._in_progress

    def poll_status(self) -> PollStatus:
        """The poll block of the snapshot."""
        return PollStatus(
            status="polling" if self._in_progress else "idle",
            interval_ms=self._parts.settings.polling.interval_ms,
            candidates=self._last_candidates,
            eligible=self._last_eligible,
            last_poll_at=self._last_poll_at,
            next_poll_at=self.next_poll_at,
            last_error=self._last_poll_error,
            count=self.count,
            dispatch_paused=self.dispatch_pause(),
        )

    def dispatch_pause(self) -> DispatchPause | None:
        """Why dispatch is paused now, if it is: the claim store refuses writes, or this host
        cannot start workers (see :attr:`.dispatching.Dispatching.host_fault`)."""
        return self._reconciling.write_pause or self._dispatching.host_fault

    async def run(self, *, dry_run: bool) -> None:
        """The recurring loop: a tick, then wait the interval (or a wake-up), until stopped."""
        status = self._parts.status
        while not status.stopped:
            with contextlib.suppress(Exception):
                # NB: a failed tick is already recorded as poll_error; the loop lives on.
                await self.poll_once(dry_run=dry_run)
            if status.stopped:
                break
            interval_s = self._parts.settings.polling.interval_ms / 1000.0
            self.next_poll_at = self._parts.clock.now() + datetime.timedelta(seconds=interval_s)
            self._parts.reporting.emit_snapshot()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval_s)

    def stop(self) -> None:
        """The runtime stops: drop the merged follow-up, cut the loop's wait short."""
        self._pending_poll = None
        self._wake.set()

    async def poll_once(self, *, dry_run: bool = False, wait_for_runs: bool = False) -> None:
        """One tick; a concurrent request queues behind the running one and merges with it."""
        if self._in_progress:
            waiter = self.queue_poll(dry_run=dry_run, wait_for_runs=wait_for_runs)
            await waiter
            return
        self._in_progress = True
        options = (dry_run, wait_for_runs)
        try:
            while True:
                waiters, self._pending_waiters = self._pending_waiters, []
                try:
                    await self.tick(dry_run=options[0], wait_for_runs=options[1])
                finally:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                if self._pending_poll is None or self._parts.status.stopped:
                    break
                options, self._pending_poll = self._pending_poll, None
        finally:
            self._in_progress = False
            for waiter in self._pending_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._pending_waiters = []
            # NB: the tick's own snapshots all say "polling"; tell subscribers it is over.
            self._parts.reporting.emit_snapshot()

    def queue_poll(self, *, dry_run: bool, wait_for_runs: bool) -> asyncio.Future[None]:
        if self._pending_poll is None:
            self._pending_poll = (dry_run, wait_for_runs)
        else:
            queued_dry, queued_wait = self._pending_poll
            self._pending_poll = (queued_dry and dry_run, queued_wait or wait_for_runs)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending_waiters.append(waiter)
        return waiter

    def is_loop_waiting(self) -> bool:
        """Whether the recurring loop sits in its interval wait (a wake-up polls at once)."""
        return self._parts.status.app is AppStatus.RUNNING and not self._in_progress

    def spawn_poll(self) -> None:
        if self._parts.status.stopped:
            return
        self._parts.background.spawn(self.poll_quietly(), name="lorenz-poll")

    async def poll_quietly(self) -> None:
        # NB: a failed background tick is already recorded as poll_error.
        with contextlib.suppress(Exception):
            await self.poll_once()

    def request_refresh(self) -> RefreshReceipt:
        """Queue an immediate poll and reconcile pass (coalesced with one already under way)."""
        requested_at = self._parts.clock.now()
        coalesced = self._in_progress
        if self._parts.status.stopped:
            return RefreshReceipt(
                queued=False, coalesced=False, requested_at=requested_at, operations=()
            )
        self._blocking.request_unblock()
        if self._in_progress:
            self.queue_poll(dry_run=False, wait_for_runs=False)
        else:
            self._wake.set()
            if not self.is_loop_waiting():
                self.spawn_poll()
        self._parts.reporting.event(EventType.REFRESH_REQUESTED, message="refresh requested")
        return RefreshReceipt(
            queued=True,
            coalesced=coalesced,
            requested_at=requested_at,
            operations=("poll", "reconcile"),
        )

    async def tick(self, *, dry_run: bool, wait_for_runs: bool) -> None:
        """One tick's body under the tick lock; then, if asked, wait for the runs it started."""
        # NB: the lock covers the tick's body only: runs waiting in wait_for_runs() may need a
        # dispatch pass (their exit decision), which takes the same lock.
        async with self._tick_lock:
            await self.tick_body(dry_run=dry_run)
        if wait_for_runs:
            await self._dispatching.wait_for_runs()

    async def tick_body(self, *, dry_run: bool) -> None:
        started_ms = self._parts.clock.monotonic_ms()
        self.count += 1
        self._parts.reporting.emit_snapshot()
        dispatched: list[asyncio.Task[None]] = []
        try:
            if self._prove_leadership is not None:
                await self._prove_leadership()
            await self._reconciling.heartbeat_claims()
            paused = self._reconciling.write_failure
            await self._reloading.reload_if_changed()
            settings = self._parts.settings
            validate_dispatch(settings)
            await self._reconciling.cleanup_terminal_workspaces_once()
            await self._reconciling.reconcile_stalled_runs()
            await self._reconciling.reconcile_tracked_issues(exits=self._dispatching.exits)
            if not dry_run:
                if await self._blocking.honour_refresh():
                    self._dispatching.nudge()
                await self._blocking.apply_pending()
            candidates = await self._parts.tracker.current.fetch_candidate_issues()
            # NB: refilled in place: the parts share this one dict.
            self._parts.candidates.clear()
            self._parts.candidates.update((issue.id, issue) for issue in candidates)
            eligible = await self._parts.orchestrator.eligible_issues(candidates)
            report = self._parts.orchestrator.last_eligibility
            self._parts.reporting.eligibility(report)
            if report.pruned:
                await self._reconciling.cancel_dropped_adoptions(
                    report.pruned, issues=self._parts.candidates, reason="not_a_candidate"
                )
            if self._blocking.after_eligibility(report):
                self._dispatching.nudge()
            self._last_candidates = len(candidates)
            self._last_eligible = len(eligible)
            if not dry_run:
                self._parts.timers.sync(self._parts.orchestrator.retry_deadlines())
            for candidate in eligible if paused is None else ():
                if self._parts.status.stopped or self._parts.status.draining:
                    break
                if dry_run:
                    self._parts.reporting.event(
                        EventType.DRY_RUN,
                        issue=candidate.issue,
                        slot=candidate.slot_index,
                        attempt=candidate.attempt,
                        message="would dispatch",
                    )
                    continue
                task = await self._dispatching.maybe_dispatch(candidate)
                if task is not None:
                    dispatched.append(task)
                elif self._parts.orchestrator.available_slots() <= 0:
                    # NB: the global cap is full; every later candidate would be skipped too.
                    break
            # NB: a paused dispatch is the poll's error until it resumes (``lorenz status``);
            # the dispatch_paused event logged it once.
            pause = self.dispatch_pause()
            self._last_poll_error = None if pause is None else pause.message
            self._last_poll_at = self._parts.clock.now()
            self._parts.reporting.event(
                EventType.POLL_COMPLETED,
                message=f"{self._last_candidates} candidates, "
                f"{self._last_eligible} eligible",
                duration_ms=round(self._parts.clock.monotonic_ms() - started_ms, 3),
                candidates=self._last_candidates,
                eligible=self._last_eligible,
            )
        except Exception as exc:
            self._last_poll_at = self._parts.clock.now()
            self._last_poll_error = self._parts.reporting.scrub(describe_error(exc))
            self._parts.reporting.event(
                EventType.POLL_ERROR,
                message=self._last_poll_error,
                code=getattr(exc, "code", type(exc).__name__),
                duration_ms=round(self._parts.clock.monotonic_ms() - started_ms, 3),
            )
            raise
        finally:
            self._parts.reporting.emit_snapshot()
