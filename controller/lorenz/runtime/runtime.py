"""The I/O shell around the orchestrator: polls, dispatches, reconciles, reloads, reports.

The orchestrator decides; this module acts. Every fetch, spawn, timer and broadcast lives here,
and no scheduling decision does: the runtime asks the orchestrator what is eligible, whether a
slot may be claimed, whether a tracked run should stop, which runs are stalled, and tells it
what happened. One tick runs in a fixed order (see :meth:`LorenzRuntime._tick`), ticks never
overlap, and each dispatched run is a detached task behind an :class:`~.runs.ActiveRun` handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from lorenz.agents import AgentRunner, AgentRunRequest
from lorenz.agents.environment import agent_environment
from lorenz.config import AgentProtocol, TrackerKind, WorkflowSettings
from lorenz.model import (
    AgentUpdate,
    Clock,
    EventType,
    Issue,
    LorenzError,
    RetryEntry,
    RunFailure,
    RunningEntry,
    RunOutcome,
    SlotKey,
    SystemClock,
    parse_slot_key,
)
from lorenz.orchestrator import (
    DispatchCandidate,
    Orchestrator,
    Released,
    Reserved,
    Skipped,
    Started,
)
from lorenz.policies import StopReason, WorkerHealth, classify_worker_outcome
from lorenz.runtime.projection import Projection
from lorenz.runtime.retry_timers import RetryTimers
from lorenz.runtime.runs import AbortReason, ActiveRun, ActiveRuns, PendingExit, TerminalGrace
from lorenz.runtime.tools import tracker_tools
from lorenz.secrets import Redactor, tracker_secrets
from lorenz.tasks import run_to_completion
from lorenz.trackers import TrackerClient
from lorenz.workflow import (
    LoadedWorkflow,
    WorkflowStamp,
    continuation_prompt,
    load_off_loop,
    render_prompt,
    validate_dispatch,
    workflow_stamp,
)
from lorenz.workspaces import (
    PRESERVING_CODES,
    Workspace,
    WorkspaceCleanupError,
    WorkspaceManager,
)

logger = logging.getLogger("lorenz.runtime")

SnapshotListener = Callable[[dict[str, Any]], None]
EventListener = Callable[[dict[str, Any]], None]


class WorkerSlot(Protocol):
    """A host handed out by a worker pool for one run."""

    host: str | None


class WorkerPool(Protocol):
    """A pool that governs dispatch: reservations are bound once it hands out a host."""

    async def acquire(self, *, key: SlotKey, timeout_ms: int) -> WorkerSlot | None:
        """A slot, or ``None`` when the pool has no capacity."""
        ...

    async def release(self, slot: WorkerSlot, *, poison: bool) -> None: ...

    async def drain(self, *, deadline_ms: int) -> None: ...


class LorenzRuntime:
    """Drives one workflow: the poll loop, detached runs, retry timers and the snapshot."""

    def __init__(
        self,
        *,
        workflow: LoadedWorkflow,
        orchestrator: Orchestrator,
        tracker: TrackerClient,
        workspaces: WorkspaceManager,
        runner_factory: Callable[[AgentProtocol], AgentRunner],
        tracker_factory: Callable[[WorkflowSettings], TrackerClient] | None = None,
        reload_workflow: Callable[[], LoadedWorkflow] | None = None,
        source_stamp: Callable[[], WorkflowStamp] | None = None,
        prove_leadership: Callable[[], Awaitable[None]] | None = None,
        pool: WorkerPool | None = None,
        clock: Clock | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self._workflow = workflow
        self._orchestrator = orchestrator
        self._tracker = tracker
        self._workspaces = workspaces
        self._runner_factory = runner_factory
        self._tracker_factory = tracker_factory
        self._reload_workflow = reload_workflow
        self._source_stamp = source_stamp
        """What the workflow's source looks like now (a stamp unlike the loaded one means
        "reload"); default: the WORKFLOW.md file's stamp. The operator passes the stamp of the
        Workflow object's latest spec."""
        self._prove_leadership = prove_leadership
        self._pool = pool
        self._clock = clock or SystemClock()
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._redactor = Redactor()
        self._redactor_key: str | None = None
        self._redactor.update(tracker_secrets(api_key=None, environ=self._base_env))

        self._runs = ActiveRuns()
        self._graces: dict[str, TerminalGrace] = {}
        """Issues that turned terminal mid-turn, by id, while their runs finish the turn."""
        self._candidate_cache: dict[str, Issue] = {}
        """The last full candidate list (by id, in tracker order), kept fresh by every by-id
        read; dispatch between polls picks from it."""
        self._exits: dict[SlotKey, PendingExit] = {}
        self._refused: dict[str, tuple[object, ...]] = {}
        """Issues not started because of an unpassable field, with the version reported."""
        self._dispatch_lock = asyncio.Lock()
        """Held by a tick's body and by a dispatch pass: they never interleave."""
        self._pass_wanted = False
        self._pass_task: asyncio.Task[None] | None = None
        self._pass_wake = asyncio.Event()
        self._dry_run = False
        self._projection = Projection()
        self._timers = RetryTimers(clock=self._clock, on_fire=self._on_retry_due)
        self._snapshot_listeners: list[SnapshotListener] = []
        self._event_listeners: list[EventListener] = []

        self._stopped = False
        self._once = False
        self._app_status = "starting"
        self._poll_in_progress = False
        self._pending_poll: tuple[bool, bool] | None = None
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._startup_cleanup_done = False
        self._background: set[asyncio.Task[Any]] = set()
        self._loop_task: asyncio.Task[None] | None = None

        self._last_poll_at: datetime.datetime | None = None
        self._next_poll_at: datetime.datetime | None = None
        self._last_poll_error: str | None = None
        self._config_error: dict[str, str] | None = None
        """``{code, message, since}`` of the reload failing now; ``None`` once one succeeds."""
        self._last_candidates = 0
        self._last_eligible = 0
        self.poll_count = 0
        self.stats: dict[str, int] = {}

    # ------------------------------------------------------------------ public surface

    @property
    def workflow(self) -> LoadedWorkflow:
        return self._workflow

    @property
    def settings(self) -> WorkflowSettings:
        return self._workflow.settings

    @property
    def tracker(self) -> TrackerClient:
        """The tracker client in force (a reload may have replaced it)."""
        return self._tracker

    @property
    def orchestrator(self) -> Orchestrator:
        return self._orchestrator

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def next_poll_at(self) -> datetime.datetime | None:
        return self._next_poll_at

    async def start(self, *, once: bool = False, dry_run: bool = False) -> None:
        """Run until stopped (recurring mode) or for one tick plus its runs (``once``)."""
        self._app_status = "running"
        self._dry_run = dry_run
        self._emit_snapshot()
        if once:
            # NB: one tick means one. Without this, the nudges of settling runs (and the retry
            # timers they arm) merge a follow-up tick into this one, which may dispatch a
            # continuation that nobody waits for and that the shutdown kills moments later.
            self._once = True
            await self.poll_once(dry_run=dry_run, wait_for_runs=True)
            self._app_status = "stopped"
            self._emit_snapshot()
            return
        try:
            while not self._stopped:
                with contextlib.suppress(Exception):
                    # NB: a failed tick is already recorded as poll_error; the loop lives on.
                    await self.poll_once(dry_run=dry_run)
                if self._stopped:
                    break
                interval_s = self.settings.polling.interval_ms / 1000.0
                self._next_poll_at = self._clock.now() + datetime.timedelta(seconds=interval_s)
                self._emit_snapshot()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=interval_s)
        finally:
            await self._settle_runs()
            self._app_status = "stopped"
            self._emit_snapshot()

    def stop(self) -> None:
        """Stop at once: no new polls, every active run aborted as a clean shutdown."""
        if self._stopped:
            return
        self._stopped = True
        if self._app_status != "stopped":  # a finished --once run stays stopped
            self._app_status = "stopping"
        self._pending_poll = None
        for grace in self._graces.values():
            if grace.timer is not None:
                grace.timer.cancel()
        self._graces.clear()
        for run in self._runs.all():
            run.finish_externally(AbortReason.SHUTDOWN)
        self._timers.cancel_all()
        self._wake.set()
        self._pass_wake.set()
        self._event(EventType.STOPPING, message="runtime stopping")

    async def wait_for_runs(self) -> None:
        """Wait until every run in flight has settled."""
        while True:
            tasks = self._runs.tasks()
            if not tasks:
                break
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._settle_unstarted_runs()

    async def drain_worker_pool(self) -> None:
        """Bounded async teardown of a worker pool (separate from :meth:`stop`)."""
        if self._pool is None:
            return
        deadline = self.settings.worker.worker_pool.drain_deadline_ms
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pool.drain(deadline_ms=deadline), deadline / 1000.0)

    def request_refresh(self) -> dict[str, Any]:
        """Queue an immediate poll and reconcile pass (coalesced with one already under way)."""
        requested_at = self._clock.now().isoformat()
        coalesced = self._poll_in_progress
        if self._stopped:
            return {
                "queued": False,
                "coalesced": False,
                "requested_at": requested_at,
                "operations": [],
            }
        if self._poll_in_progress:
            self._queue_poll(dry_run=False, wait_for_runs=False)
        else:
            self._wake.set()
            if self._loop_task is None and not self._is_loop_waiting():
                self._spawn_poll()
        self._event(EventType.REFRESH_REQUESTED, message="refresh requested")
        return {
            "queued": True,
            "coalesced": coalesced,
            "requested_at": requested_at,
            "operations": ["poll", "reconcile"],
        }

    def subscribe(self, listener: SnapshotListener) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot, starting with the current one."""
        self._snapshot_listeners.append(listener)
        listener(self.snapshot())

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._snapshot_listeners.remove(listener)

        return unsubscribe

    def add_event_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` with every runtime event (metrics, Kubernetes Events, logs)."""
        self._event_listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._event_listeners.remove(listener)

        return remove

    def snapshot(self) -> dict[str, Any]:
        """The full picture, in three layers: orchestrator, runtime live fields, projections."""
        core = self._orchestrator.snapshot().to_dict()
        return {
            "generated_at": self._clock.now().isoformat(),
            "app_status": self._app_status,
            "workflow_path": str(self._workflow.path),
            "poll": {
                "status": "polling" if self._poll_in_progress else "idle",
                "interval_ms": self.settings.polling.interval_ms,
                "candidates": self._last_candidates,
                "eligible": self._last_eligible,
                "last_poll_at": self._last_poll_at.isoformat() if self._last_poll_at else None,
                "next_poll_at": self._next_poll_at.isoformat() if self._next_poll_at else None,
                "last_error": self._last_poll_error,
                "count": self.poll_count,
            },
            **core,
            "recent_events": self._projection.recent_events(),
            "run_history": self._projection.run_history(),
            "log_file": self.settings.logging.log_file,
            "config_error": dict(self._config_error) if self._config_error else None,
        }

    # ------------------------------------------------------------------ polling

    async def poll_once(self, *, dry_run: bool = False, wait_for_runs: bool = False) -> None:
        """One tick; a concurrent request queues behind the running one and merges with it."""
        if self._poll_in_progress:
            waiter = self._queue_poll(dry_run=dry_run, wait_for_runs=wait_for_runs)
            await waiter
            return
        self._poll_in_progress = True
        options = (dry_run, wait_for_runs)
        try:
            while True:
                waiters, self._pending_waiters = self._pending_waiters, []
                try:
                    await self._tick(dry_run=options[0], wait_for_runs=options[1])
                finally:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                if self._pending_poll is None or self._stopped:
                    break
                options, self._pending_poll = self._pending_poll, None
        finally:
            self._poll_in_progress = False
            for waiter in self._pending_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._pending_waiters = []
            # NB: the tick's own snapshots all say "polling"; tell subscribers it is over.
            self._emit_snapshot()

    def _queue_poll(self, *, dry_run: bool, wait_for_runs: bool) -> asyncio.Future[None]:
        if self._pending_poll is None:
            self._pending_poll = (dry_run, wait_for_runs)
        else:
            queued_dry, queued_wait = self._pending_poll
            self._pending_poll = (queued_dry and dry_run, queued_wait or wait_for_runs)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending_waiters.append(waiter)
        return waiter

    def _is_loop_waiting(self) -> bool:
        return self._app_status == "running" and not self._poll_in_progress

    def _spawn_poll(self) -> None:
        if self._stopped:
            return
        task = asyncio.get_running_loop().create_task(self._poll_quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _poll_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self.poll_once()

    def _nudge(self) -> None:
        """Freed capacity, a clean exit or a due retry: act now, not at the next interval.

        What runs is a dispatch pass, not a tick: it decides pending exits and fills free slots
        from the last candidate list, revalidating each chosen issue by id first (one batched
        read). Passes serialize with ticks and with each other; nudges during a pass merge into
        one follow-up pass. Never in ``--once``.
        """
        if self._stopped or self._once:
            return
        self._pass_wanted = True
        if self._pass_task is None:
            self._pass_task = asyncio.get_running_loop().create_task(
                self._run_passes(), name="lorenz-dispatch-pass"
            )

    async def _run_passes(self) -> None:
        try:
            while self._pass_wanted and not self._stopped:
                # NB: gather what comes close together (exits of runs started together, retries
                # due together) so one tracker read serves them all; stop() cuts the wait short.
                batch_s = self.settings.polling.dispatch_batch_ms / 1000.0
                if batch_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._pass_wake.wait(), timeout=batch_s)
                if self._stopped:
                    break
                self._pass_wanted = False
                async with self._dispatch_lock:
                    try:
                        await self._dispatch_pass()
                    except Exception:
                        logger.exception("dispatch pass failed")
        finally:
            self._pass_task = None

    def _on_retry_due(self, key: SlotKey) -> None:
        self._nudge()

    async def _tick(self, *, dry_run: bool, wait_for_runs: bool) -> None:
        # NB: the lock covers the tick's body only: runs waiting in wait_for_runs() may need a
        # dispatch pass (their exit decision), which takes the same lock.
        async with self._dispatch_lock:
            await self._tick_body(dry_run=dry_run)
        if wait_for_runs:
            await self.wait_for_runs()

    async def _tick_body(self, *, dry_run: bool) -> None:
        started_ms = self._clock.monotonic_ms()
        self.poll_count += 1
        self._emit_snapshot()
        dispatched: list[asyncio.Task[None]] = []
        try:
            if self._prove_leadership is not None:
                await self._prove_leadership()
            await self._heartbeat_claims()
            await self._reload_if_changed()
            settings = self.settings
            validate_dispatch(settings)
            await self._cleanup_terminal_workspaces_once()
            await self._reconcile_stalled_runs()
            await self._reconcile_tracked_issues()
            candidates = await self._tracker.fetch_candidate_issues()
            self._candidate_cache = {issue.id: issue for issue in candidates}
            eligible = await self._orchestrator.eligible_issues(candidates)
            self._last_candidates = len(candidates)
            self._last_eligible = len(eligible)
            if not dry_run:
                self._timers.sync(self._orchestrator.retry_deadlines())
            for candidate in eligible:
                if self._stopped:
                    break
                if dry_run:
                    self._event(
                        EventType.DRY_RUN,
                        issue=candidate.issue,
                        slot=candidate.slot_index,
                        attempt=candidate.attempt,
                        message="would dispatch",
                    )
                    continue
                task = await self._maybe_dispatch(candidate)
                if task is not None:
                    dispatched.append(task)
                elif self._orchestrator.available_slots() <= 0:
                    # NB: the global cap is full; every later candidate would be skipped too.
                    break
            self._last_poll_error = None
            self._last_poll_at = self._clock.now()
            self._event(
                EventType.POLL_COMPLETED,
                message=f"{self._last_candidates} candidates, {self._last_eligible} eligible",
                duration_ms=round(self._clock.monotonic_ms() - started_ms, 3),
                candidates=self._last_candidates,
                eligible=self._last_eligible,
            )
        except Exception as exc:
            self._last_poll_at = self._clock.now()
            self._last_poll_error = self._scrub(_describe(exc))
            self._event(
                EventType.POLL_ERROR,
                message=self._last_poll_error,
                code=getattr(exc, "code", type(exc).__name__),
                duration_ms=round(self._clock.monotonic_ms() - started_ms, 3),
            )
            raise
        finally:
            self._emit_snapshot()

    async def _heartbeat_claims(self) -> None:
        """Prove our claims are still ours before this tick mutates anything.

        A store that declared us stale and handed our claims to another owner says so once
        (``claim_owner_lost``): every local run of those slots now belongs to someone else, so
        it is aborted without recording a result, and the slots are forgotten locally.
        """
        try:
            await self._orchestrator.heartbeat()
        except LorenzError as exc:
            if exc.code != "claim_owner_lost":
                raise
            await self.abandon_runs(reason=str(exc))

    async def abandon_runs(self, *, reason: str) -> None:
        """Abort every local run whose claim we no longer own; record nothing for them."""
        issue_ids = self._orchestrator.claimed_issue_ids()
        for run in self._runs.all():
            run.finish_externally(AbortReason.LEADERSHIP_LOST)
        for issue_id in sorted(issue_ids):
            await self._orchestrator.cleanup_issue(issue_id)
        self._timers.cancel_all()
        self._event(EventType.LEADERSHIP_LOST, message=f"claims lost: {reason}",
                    aborted=len(issue_ids))

    # ------------------------------------------------------------------ reload

    async def _reload_if_changed(self) -> None:
        if self._reload_workflow is None:
            return
        try:
            stamp = (
                self._source_stamp()
                if self._source_stamp is not None
                else workflow_stamp(self._workflow.path)
            )
        except Exception:  # noqa: BLE001 - unreadable now: the reload below reports why
            stamp = None  # unreadable now: the reload below reports why
        if stamp is not None and stamp == self._workflow.stamp:
            self._config_error = None  # NB: back to the very workflow in force: nothing failing
            return
        try:
            # NB: every step that can throw runs before anything is swapped, so a failure
            # leaves the last-known-good workflow, settings and tracker client in place.
            loaded = await load_off_loop(self._reload_workflow)
            validate_dispatch(loaded.settings)
            tracker = (
                self._tracker_factory(loaded.settings)
                if self._tracker_factory is not None
                and _tracker_changed(self.settings, loaded.settings)
                else None
            )
        except Exception as exc:  # noqa: BLE001 - any reload failure keeps the last good workflow
            code = str(getattr(exc, "code", type(exc).__name__))
            self._config_error = {
                "code": code,
                "message": self._scrub(_config_message(exc)),
                "since": (self._config_error or {}).get("since")
                or self._clock.now().isoformat(),
            }
            self._event(
                EventType.WORKFLOW_RELOAD_FAILED,
                message=f"{_describe(exc)}; keeping the last known good workflow",
                code=code,
            )
            return
        self._config_error = None
        old_tracker = self._tracker if tracker is not None else None
        self._workflow = loaded
        self._orchestrator.update_settings(loaded.settings)
        self._workspaces.update_settings(loaded.settings)
        if tracker is not None:
            self._tracker = tracker
        if old_tracker is not None:
            with contextlib.suppress(Exception):
                await old_tracker.close()
        self._event(EventType.WORKFLOW_RELOADED, message="workflow reloaded")

    # ------------------------------------------------------------------ reconciliation

    async def _cleanup_terminal_workspaces_once(self) -> None:
        if self._startup_cleanup_done:
            return
        self._startup_cleanup_done = True
        try:
            on_disk = self._workspaces.list_workspaces()
            ids = sorted({w.issue_id for w in on_disk if w.issue_id})
            if not ids:
                return
            issues = await self._tracker.fetch_issues_by_ids(ids)
            terminal = {s.strip().lower() for s in self.settings.tracker.terminal_states}
            removed: list[str] = []
            for issue in issues:
                # NB: a preserved worktree is reported and the sweep goes on with the next one.
                if issue.state_key in terminal and await self._remove_workspaces(
                    issue.identifier, issue_id=issue.id
                ) is not None:
                    removed.append(issue.identifier)
            self._event(
                EventType.STARTUP_WORKSPACE_CLEANUP,
                message=f"removed {len(removed)} workspace(s) of terminal issues",
                removed=removed,
            )
        except Exception as exc:  # noqa: BLE001 - reported; the sweep must not stop the start
            self._event(EventType.STARTUP_WORKSPACE_CLEANUP_FAILED, message=_describe(exc))

    async def _remove_workspaces(self, identifier: str, *, issue_id: str) -> list[Path] | None:
        """Remove a done issue's workspaces; ``None`` when some were left in place.

        A worktree with uncommitted work, or one that is not ours, is kept on purpose: that is
        reported (``workspace_preserved``, a warning) and never fails the tick; the same goes
        for a removal that failed for another reason (its code is in the event).
        """
        try:
            return await self._workspaces.remove_issue(identifier)
        except WorkspaceCleanupError as exc:
            preserved = all(f.code in PRESERVING_CODES for f in exc.failures)
            self._event(
                EventType.WORKSPACE_PRESERVED if preserved else EventType.WORKSPACE_CLEANUP,
                issue_id=issue_id,
                identifier=identifier,
                message=self._scrub(exc.message),
                code=exc.code,
                kept=[str(f.path) for f in exc.failures if f.path is not None],
                removed=[str(p) for p in exc.removed],
            )
            return None

    async def _reconcile_stalled_runs(self) -> None:
        for stalled in await self._orchestrator.finish_stalled():
            entry = stalled.entry
            run = self._runs.get(entry.key)
            if run is not None:
                run.finish_externally(AbortReason.STALLED)
            self._record_run(entry, outcome=RunOutcome.STALLED, error=stalled.error)
            self._event(
                EventType.RUN_STALLED, issue=entry.issue, slot=entry.slot_index,
                message=stalled.error,
            )
            self._retry_event(stalled.retry)

    async def _reconcile_tracked_issues(self) -> None:
        exits = self._take_exits()
        tracked = self._orchestrator.tracked_issue_ids()
        if not tracked:
            return
        try:
            fresh = await self._tracker.fetch_issues_by_ids(sorted(tracked))
        except Exception as exc:  # noqa: BLE001 - reported; a live run outlives a tracker error
            # NB: never tear down a live run on a transient tracker error.
            self._event(
                EventType.RECONCILE_REFRESH_FAILED,
                message=_describe(exc),
                code=getattr(exc, "code", type(exc).__name__),
            )
            for pending in exits:
                await self._decide_exit(pending, None, known=False)
            return
        by_id = {issue.id: issue for issue in fresh}
        for pending in exits:
            await self._decide_exit(pending, by_id.get(pending.issue_id), known=True)
        waiting = {pending.issue_id for pending in self._exits.values()}
        for issue_id in sorted(tracked & self._orchestrator.tracked_issue_ids() - waiting):
            # NB: an issue with a run that exited after the read above is left to the pass
            # that decides that exit; stopping it here would cancel a run that ended cleanly.
            issue = by_id.get(issue_id)
            reason = self._orchestrator.reconciliation_decision(issue)
            if reason is None:
                assert issue is not None
                await self._orchestrator.refresh_running_issue(issue)
                continue
            if reason is StopReason.TERMINAL and self._finishing_turn(issue_id, issue):
                continue
            self._end_grace(issue_id)
            await self._stop_issue(issue_id, issue=issue, reason=str(reason))

    def _finishing_turn(self, issue_id: str, issue: Issue | None) -> bool:
        """Whether runs of this terminal issue are (now) finishing their turn in a grace."""
        if issue_id in self._graces:
            return True
        return issue is not None and self._begin_grace(issue)

    def _begin_grace(self, issue: Issue) -> bool:
        """Let the runs of a just-terminal issue finish their turn; ``False``: stop them now.

        Only bound runs are in a turn; a slot still reserving a worker is given back at once
        (its retry is then pruned, the issue being terminal).
        """
        grace_ms = self.settings.agent.terminal_grace_ms
        runs = [run for run in self._runs.of_issue(issue.id) if run.is_active and not run.exited]
        turning = [run for run in runs if run.started]
        if grace_ms <= 0 or not turning:
            return False
        for run in runs:
            if not run.started:
                run.finish_externally(AbortReason.CANCELED)
        grace = TerminalGrace(issue=issue, keys={run.key for run in turning})
        grace.timer = asyncio.get_running_loop().call_later(
            grace_ms / 1000.0, self._on_grace_over, issue.id
        )
        self._graces[issue.id] = grace
        for run in turning:
            self._event(
                EventType.RUN_FINISHING,
                issue=issue,
                slot=parse_slot_key(run.key)[1],
                message=f"issue terminal: the turn in progress may finish within {grace_ms} ms; "
                        "no new turn starts",
                reason=str(StopReason.TERMINAL),
                grace_ms=grace_ms,
            )
        return True

    def _end_grace(self, issue_id: str) -> TerminalGrace | None:
        grace = self._graces.pop(issue_id, None)
        if grace is not None and grace.timer is not None:
            grace.timer.cancel()
        return grace

    def _on_grace_over(self, issue_id: str) -> None:
        """The grace ran out: cancel what is still going, as any terminal stop does."""
        grace = self._end_grace(issue_id)
        if grace is None or self._stopped:
            return
        task = asyncio.get_running_loop().create_task(
            self._stop_issue(issue_id, issue=grace.issue, reason=str(StopReason.TERMINAL))
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_issue(self, issue_id: str, *, issue: Issue | None, reason: str) -> None:
        """Stop every slot of an issue, release its claims, clean up when it is terminal."""
        released = await self._orchestrator.cleanup_issue(issue_id)
        identifier = issue.identifier if issue is not None else released.identifier or issue_id
        for key in released.aborted:
            self._timers.cancel(key)
            run = self._runs.get(key)
            if run is not None:
                run.finish_externally(AbortReason.CANCELED)
        for key in list(self._timers.armed()):
            if key.rsplit("#", 1)[0] == issue_id:
                self._timers.cancel(key)
        for entry in released.runs:
            self._record_run(entry, outcome=RunOutcome.CANCELED, error=f"stopped: {reason}")
            self._event(
                EventType.RUN_CANCELED,
                issue=entry.issue,
                slot=entry.slot_index,
                message=f"run stopped: issue {reason}",
                reason=reason,
            )
        if reason == "terminal":
            removed = await self._remove_workspaces(identifier, issue_id=issue_id)
            if removed is not None:
                self._event(
                    EventType.WORKSPACE_CLEANUP,
                    issue_id=issue_id,
                    identifier=identifier,
                    message=f"removed {len(removed)} workspace(s)",
                    reason=reason,
                )
        else:
            self._event(
                EventType.RUN_RECONCILED,
                issue_id=issue_id,
                identifier=identifier,
                message=f"released: issue {reason}",
                reason=reason,
            )

    async def cancel_slot(self, key: SlotKey, *, reason: str = "claim_deleted") -> bool:
        """Stop one slot's run from outside (a deleted ``Claim``); the issue may run again."""
        run = self._runs.get(key)
        self._timers.cancel(key)
        released: Released = await self._orchestrator.release_slot(key)
        if not released.aborted and run is None:
            return False
        for entry in released.runs:
            self._record_run(entry, outcome=RunOutcome.CANCELED, error=f"stopped: {reason}")
            self._event(
                EventType.RUN_CANCELED,
                issue=entry.issue,
                slot=entry.slot_index,
                message=f"run stopped: {reason}",
                reason=reason,
            )
        if run is not None:
            run.finish_externally(AbortReason.CANCELED)
        self._nudge()
        return True

    # ------------------------------------------------------------------ dispatch

    async def _maybe_dispatch(self, candidate: DispatchCandidate) -> asyncio.Task[None] | None:
        issue = candidate.issue
        if self._refuse_unpassable(issue, slot=candidate.slot_index):
            return None
        result = await self._orchestrator.claim(candidate)
        if isinstance(result, Skipped):
            self.stats[f"skipped_{result.reason}"] = (
                self.stats.get(f"skipped_{result.reason}", 0) + 1
            )
            if result.reason in ("worker_host_capacity", "claimed_elsewhere"):
                self._event(
                    EventType.DISPATCH_SKIPPED,
                    issue=issue,
                    slot=candidate.slot_index,
                    message=f"skipped: {result.reason}",
                    reason=result.reason,
                )
            return None
        key = result.reservation.key if isinstance(result, Reserved) else result.entry.key
        run = ActiveRun(key=key, issue_id=issue.id, identifier=issue.identifier)
        self._runs.register(run)
        if isinstance(result, Started):
            self._event(
                EventType.RUN_STARTED,
                issue=issue,
                slot=candidate.slot_index,
                attempt=candidate.attempt,
                host=result.entry.host,
                message="run started",
            )
            run.started = True
            coro = self._run_slot(run, entry=result.entry)
        else:
            self._event(
                EventType.RUN_RESERVING,
                issue=issue,
                slot=candidate.slot_index,
                attempt=candidate.attempt,
                message="reserving a worker",
            )
            coro = self._run_reserved(run, reservation=result.reservation)
        task = asyncio.get_running_loop().create_task(coro, name=f"lorenz-run:{key}")
        run.task = task
        return task

    def _refuse_unpassable(self, issue: Issue, *, slot: int) -> bool:
        """Whether an issue holds a field no process can be given (a NUL byte); say so once.

        Hooks and agents get the identifier, title and state as environment variables (and the
        identifier names the workspace); a NUL byte cannot be passed to a process at all, so
        such an issue is not started — no run, no retry — and reported once per version of it
        (``issue_field_invalid``): it is looked at again when it changes.
        """
        fields = [name for name in _PASSED_FIELDS if "\x00" in (getattr(issue, name) or "")]
        if not fields:
            self._refused.pop(issue.id, None)
            return False
        version = (issue.identifier, issue.title, issue.state, issue.updated_at)
        if self._refused.get(issue.id) != version:
            self._refused[issue.id] = version
            self._event(
                EventType.DISPATCH_SKIPPED,
                issue=issue,
                slot=slot,
                message=f"skipped: the issue's {', '.join(fields)} hold(s) a NUL byte, which "
                        "cannot be passed to hooks or agents; edit the issue to remove it",
                reason="issue_field_invalid",
                code="issue_field_invalid",
                fields=fields,
            )
        return True

    async def _run_reserved(self, run: ActiveRun, *, reservation: Any) -> None:
        assert self._pool is not None
        timeout_ms = self.settings.worker.worker_pool.acquire_timeout_ms
        try:
            slot = await self._pool.acquire(key=run.key, timeout_ms=timeout_ms)
        except asyncio.CancelledError:
            await self._give_back(run, reservation, reason=None)
            return
        except Exception as exc:  # noqa: BLE001 - any pool failure gives the reservation back
            await self._give_back(run, reservation, reason="worker_pool_acquire_error",
                                  message=f"worker_pool_acquire_error {_describe(exc)}")
            return
        if slot is None:
            await self._give_back(run, reservation, reason="worker_host_capacity",
                                  message="skipped: worker_host_capacity")
            return
        entry = await self._orchestrator.bind_reservation(reservation, host=slot.host)
        if entry is None or not run.is_active:
            await self._pool.release(slot, poison=False)
            self._runs.discard(run)
            return
        self._event(
            EventType.RUN_STARTED,
            issue=entry.issue,
            slot=entry.slot_index,
            attempt=entry.attempt,
            host=entry.host,
            message="run started",
        )
        run.started = True
        await self._run_slot(run, entry=entry, worker_slot=slot)

    async def _give_back(self, run: ActiveRun, reservation: Any, *, reason: str | None,
                         message: str | None = None) -> None:
        """No host for a reservation: cancel it (no backoff, retry restored) and say why."""
        await self._orchestrator.cancel_reservation(reservation)
        self._runs.discard(run)
        if reason is not None:
            self._event(EventType.DISPATCH_SKIPPED, issue=reservation.issue,
                        slot=reservation.slot_index, message=message, reason=reason)

    async def _run_slot(
        self, run: ActiveRun, *, entry: RunningEntry, worker_slot: WorkerSlot | None = None
    ) -> None:
        key = entry.key
        settings = self.settings
        workflow = self._workflow
        issue = entry.issue
        workspace: Workspace | None = None
        error: RunFailure | None = None
        normal = False
        cancelled_from_outside = False
        try:
            workspace = await self._workspaces.prepare(
                issue, slot_index=entry.slot_index, attempt=entry.attempt
            )
            await self._orchestrator.set_workspace(key, str(workspace.path))
            await self._workspaces.before_run(workspace, attempt=entry.attempt)
            prompt = render_prompt(workflow, issue=issue, attempt=entry.attempt)
            kind = settings.agent_kind()
            runner = self._runner_factory(kind.protocol)
            request = AgentRunRequest(
                issue=issue,
                attempt=entry.attempt,
                slot_index=entry.slot_index,
                prompt=prompt,
                workspace=workspace.path,
                settings=kind,
                max_turns=settings.agent.max_turns,
                env=self._agent_env(
                    issue=issue,
                    attempt=entry.attempt,
                    slot_index=entry.slot_index,
                    workspace=workspace.path,
                ),
                on_update=lambda update: self._on_agent_update(key, update),
                issue_is_active=lambda: self._issue_still_active(issue.id),
                continuation_prompt=continuation_prompt,
                tools=tracker_tools(self._tracker),
            )
            await runner.run(request)
            normal = True
        except asyncio.CancelledError:
            if run.reason is None:
                # NB: cancelled by nobody we know of (the loop itself is going away): settle it
                # as a shutdown, then let the cancellation propagate.
                run.reason = AbortReason.SHUTDOWN
                cancelled_from_outside = True
            error = _aborted(run.reason)
        except LorenzError as exc:
            error = RunFailure.from_error(exc)
        except Exception as exc:  # noqa: BLE001 - an uncoded runner crash is a failed run
            error = RunFailure(code="agent_exited", text=f"agent exited: {_describe(exc)}")
        finally:
            if workspace is not None:
                # NB: shielded so that cancellation (stop, stall, reconciliation) still runs
                # after_run; the hook is bounded by hooks.timeout_ms inside the manager.
                with contextlib.suppress(BaseException):
                    await asyncio.shield(
                        self._workspaces.after_run(workspace, attempt=entry.attempt)
                    )
            if error is not None:
                error = RunFailure(code=error.code, text=self._scrub(error.text))
            await self._settle(run, key=key, normal=normal, error=error, worker_slot=worker_slot)
        if cancelled_from_outside:
            raise asyncio.CancelledError

    async def _settle(
        self,
        run: ActiveRun,
        *,
        key: SlotKey,
        normal: bool,
        error: RunFailure | None,
        worker_slot: WorkerSlot | None,
    ) -> None:
        text = error.text if error is not None else None
        try:
            if run.reason is AbortReason.SHUTDOWN:
                # A clean shutdown: keep the slot's place with a continuation retry, so a
                # durable store brings it back after a restart without counting a failure.
                await self._orchestrator.finish(key, normal=True, error=None)
            elif run.is_active and key in self._grace_keys(run.issue_id):
                await self._settle_in_grace(run, key=key, normal=normal, text=text)
            elif run.is_active and normal:
                run.exited = True
                await self._settle_clean_exit(run)
            elif run.is_active:
                finished = await self._orchestrator.finish(key, normal=normal, error=text)
                if finished is not None:
                    entry = finished.entry
                    outcome = RunOutcome.SUCCESS if normal else RunOutcome.FAILED
                    self._record_run(entry, outcome=outcome, error=text)
                    self._event(
                        EventType.RUN_FINISHED if normal else EventType.RUN_FAILED,
                        issue=entry.issue,
                        slot=entry.slot_index,
                        message="run finished" if normal else (text or "run failed"),
                        outcome=outcome.value,
                    )
                    self._retry_event(finished.retry)
                    if finished.retry is not None and not self._stopped:
                        self._timers.sync(self._orchestrator.retry_deadlines())
            if worker_slot is not None and self._pool is not None:
                health = classify_worker_outcome(error, stalled=run.reason is AbortReason.STALLED)
                poison = health is WorkerHealth.POISON
                with contextlib.suppress(Exception):
                    await self._pool.release(worker_slot, poison=poison)
        finally:
            self._runs.discard(run)
            self._emit_snapshot()
            self._nudge()

    async def _settle_clean_exit(self, run: ActiveRun) -> None:
        """Wait for the by-id read that decides a cleanly exited slot (see :class:`PendingExit`).

        In ``--once`` there are no dispatch passes, so the run reads its issue itself.
        """
        pending = PendingExit(run=run, decided=asyncio.get_running_loop().create_future())
        if self._once:
            try:
                found = await self._tracker.fetch_issues_by_ids([run.issue_id])
            except Exception:  # noqa: BLE001 - unknown state: the exit keeps its continuation
                await self._decide_exit(pending, None, known=False)
            else:
                by_id = {issue.id: issue for issue in found}
                await self._decide_exit(pending, by_id.get(run.issue_id), known=True)
            return
        self._exits[run.key] = pending
        self._nudge()
        try:
            await pending.decided
        except asyncio.CancelledError:
            self._exits.pop(run.key, None)
            if run.reason is AbortReason.SHUTDOWN:
                # Stopped while waiting: as any shutdown, keep the slot's place (if the pass
                # did not decide it already).
                await self._orchestrator.finish(run.key, normal=True, error=None)
                return
            if run.reason is None:
                run.reason = AbortReason.SHUTDOWN
                await self._orchestrator.finish(run.key, normal=True, error=None)
                raise

    def _take_exits(self) -> list[PendingExit]:
        exits = list(self._exits.values())
        self._exits.clear()
        return exits

    async def _decide_exit(self, pending: PendingExit, issue: Issue | None, *, known: bool) -> None:
        """Continuation retry while the issue stays active (or cannot be read); else release."""
        key, issue_id = pending.key, pending.issue_id
        try:
            if pending.decided.done() or not pending.run.is_active:
                return  # stopped or cancelled meanwhile: whoever did that settled the slot
            reason = self._orchestrator.reconciliation_decision(issue) if known else None
            if reason is None:
                finished = await self._orchestrator.finish(key, normal=True, error=None)
                if issue is not None:
                    self._candidate_cache[issue_id] = issue
                if finished is None:
                    return
                self._record_run(finished.entry, outcome=RunOutcome.SUCCESS, error=None)
                self._event(EventType.RUN_FINISHED, issue=finished.entry.issue,
                            slot=finished.entry.slot_index, message="run finished",
                            outcome=RunOutcome.SUCCESS.value)
                self._retry_event(finished.retry)
                if finished.retry is not None and not self._stopped:
                    self._timers.sync(self._orchestrator.retry_deadlines())
                return
            finished = await self._orchestrator.finish(key, normal=True, error=None, release=True)
            self._candidate_cache.pop(issue_id, None)
            if finished is not None:
                self._record_run(finished.entry, outcome=RunOutcome.SUCCESS, error=None)
                self._event(EventType.RUN_FINISHED, issue=finished.entry.issue,
                            slot=finished.entry.slot_index,
                            message=f"run finished; issue {reason}, released",
                            outcome=RunOutcome.SUCCESS.value, reason=str(reason))
            if reason is StopReason.TERMINAL and self._finishing_turn(issue_id, issue):
                return  # other slots are finishing their turn; the last one cleans up
            self._end_grace(issue_id)
            await self._stop_issue(issue_id, issue=issue, reason=str(reason))
        finally:
            if not pending.decided.done():
                pending.decided.set_result(None)

    async def _dispatch_pass(self) -> None:
        """Between polls: decide pending exits, then fill free slots from the last candidates.

        Every chosen candidate is read again by id before it is claimed (an issue closed since
        the last poll must not start); the read is one request for the exits and the chosen
        issues together. A failed read decides the exits as continuations (as a settle always
        did) and starts nothing.
        """
        exits = self._take_exits()
        chosen: list[DispatchCandidate] = []
        if not self._stopped and not self._dry_run and self._candidate_cache:
            room = self._orchestrator.available_slots() + len(exits)
            exiting = {pending.issue_id for pending in exits}
            if room > 0:
                cached = list(self._candidate_cache.values())
                for candidate in await self._orchestrator.eligible_issues(cached, complete=False):
                    if candidate.issue.id in exiting:
                        continue
                    chosen.append(candidate)
                    if len(chosen) >= room:
                        break
        ids = sorted({p.issue_id for p in exits} | {c.issue.id for c in chosen})
        if not ids:
            return
        try:
            found = await self._tracker.fetch_issues_by_ids(ids)
        except Exception as exc:  # noqa: BLE001 - reported; the pass retries at the next tick
            self._event(
                EventType.RECONCILE_REFRESH_FAILED,
                message=_describe(exc),
                code=getattr(exc, "code", type(exc).__name__),
            )
            for pending in exits:
                await self._decide_exit(pending, None, known=False)
            return
        by_id = {issue.id: issue for issue in found}
        for pending in exits:
            await self._decide_exit(pending, by_id.get(pending.issue_id), known=True)
        for candidate in chosen:
            if self._stopped:
                break
            fresh = by_id.get(candidate.issue.id)
            reason = self._orchestrator.reconciliation_decision(fresh)
            if reason is not None or fresh is None:
                self._candidate_cache.pop(candidate.issue.id, None)
                self._event(
                    EventType.DISPATCH_SKIPPED,
                    issue=candidate.issue,
                    slot=candidate.slot_index,
                    message=f"skipped: the issue is {reason} now (read again before dispatch)",
                    reason="issue_changed",
                )
                continue
            self._candidate_cache[fresh.id] = fresh
            task = await self._maybe_dispatch(candidate._replace(issue=fresh))
            if task is None and self._orchestrator.available_slots() <= 0:
                break

    def _grace_keys(self, issue_id: str) -> set[SlotKey]:
        grace = self._graces.get(issue_id)
        return grace.keys if grace is not None else set()

    async def _settle_in_grace(
        self, run: ActiveRun, *, key: SlotKey, normal: bool, text: str | None
    ) -> None:
        """A run of a terminal issue ended its last turn: no retry; the last one cleans up."""
        grace = self._graces[run.issue_id]
        grace.keys.discard(key)
        finished = await self._orchestrator.finish(key, normal=normal, error=text, release=True)
        if finished is not None:
            entry = finished.entry
            outcome = RunOutcome.SUCCESS if normal else RunOutcome.FAILED
            self._record_run(entry, outcome=outcome, error=text)
            self._event(
                EventType.RUN_FINISHED if normal else EventType.RUN_FAILED,
                issue=entry.issue,
                slot=entry.slot_index,
                message="run finished; issue terminal" if normal else (text or "run failed"),
                outcome=outcome.value,
            )
        if not grace.keys and self._end_grace(run.issue_id) is not None:
            await self._stop_issue(run.issue_id, issue=grace.issue, reason=str(StopReason.TERMINAL))

    async def _settle_runs(self) -> None:
        """On the way out: let every aborted run record its shutdown."""
        tasks = self._runs.tasks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._settle_unstarted_runs()

    async def _settle_unstarted_runs(self) -> None:
        """Settle the runs whose task ended without running a line of it.

        NB: a task cancelled before its first step (``stop()`` called in the very loop
        iteration that dispatched it) never enters its body, so nothing in it settles the slot:
        it would stay "running", claimed, with no process. Every handle still registered once
        its task is done is such a run (a run that started always discards its handle).
        """
        for run in self._runs.all():
            if run.task is not None and run.task.done():
                await self._settle(
                    run,
                    key=run.key,
                    normal=False,
                    error=_aborted(run.reason),
                    worker_slot=None,
                )

    def _agent_env(
        self, *, issue: Issue, attempt: int | None, slot_index: int, workspace: Path
    ) -> dict[str, str]:
        settings = self.settings
        kind = settings.agent_kind()
        extra = dict(kind.env)
        extra.update(
            {
                "LORENZ_ISSUE_ID": issue.id,
                "LORENZ_ISSUE_IDENTIFIER": issue.identifier,
                "LORENZ_ISSUE_TITLE": issue.title,
                "LORENZ_ISSUE_STATE": issue.state,
                "LORENZ_ATTEMPT": "" if attempt is None else str(attempt),
                "LORENZ_SLOT": str(slot_index),
                "LORENZ_WORKSPACE": str(workspace),
                "LORENZ_WORKFLOW": str(self._workflow.path),
            }
        )
        if settings.tracker.kind is TrackerKind.FILES and settings.tracker.path:
            extra["LORENZ_TRACKER_PATH"] = settings.tracker.path
        secrets = [settings.tracker.api_key] if settings.tracker.api_key else []
        return agent_environment(base=self._base_env, extra=extra, secret_values=secrets)

    async def _issue_still_active(self, issue_id: str) -> bool:
        if issue_id in self._graces:
            return False  # terminal already: the turn under way is the last one
        try:
            # NB: asked mid-run; a run cancelled meanwhile lets the request finish first.
            found = await run_to_completion(self._tracker.fetch_issues_by_ids([issue_id]))
        except Exception:  # noqa: BLE001 - unknown counts as inactive: no new turn
            return False
        issue = found[0] if found else None
        return self._orchestrator.reconciliation_decision(issue) is None

    def _on_agent_update(self, key: SlotKey, update: AgentUpdate) -> None:
        if update.message:
            update = dataclasses.replace(update, message=self._scrub(update.message))
        task = asyncio.get_running_loop().create_task(self._apply_update(key, update))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _apply_update(self, key: SlotKey, update: AgentUpdate) -> None:
        try:
            await self._orchestrator.apply_update(key, update)
        except Exception:
            logger.exception("applying an agent update failed slot=%s", key)
            return
        for listener in self._event_listeners:
            with contextlib.suppress(Exception):
                listener(
                    {
                        "type": EventType.RUN_UPDATE.value,
                        "slot_key": key,
                        "event": update.event,
                        "usage": update.usage.to_dict() if update.usage else None,
                    }
                )
        self._emit_snapshot()

    # ------------------------------------------------------------------ reporting

    def _retry_event(self, retry: RetryEntry | None) -> None:
        if retry is None:
            return
        self._event(
            EventType.RETRY_SCHEDULED,
            issue_id=retry.issue_id,
            identifier=retry.identifier,
            slot=retry.slot_index,
            attempt=retry.attempt,
            message=f"{retry.kind.value} retry #{retry.attempt} due {retry.due_at.isoformat()}",
            retry_kind=retry.kind.value,
            due_at=retry.due_at.isoformat(),
            delay_ms=round(retry.due_at_ms - self._clock.monotonic_ms()),
            error=retry.error,
        )

    def _record_run(self, entry: RunningEntry, *, outcome: RunOutcome, error: str | None) -> None:
        now = self._clock.now()
        self._projection.record_run(
            {
                "issue_id": entry.issue.id,
                "identifier": entry.issue.identifier,
                "slot": entry.slot_index,
                "attempt": entry.attempt,
                "outcome": outcome.value,
                "error": error,
                "started_at": entry.started_at.isoformat(),
                "finished_at": now.isoformat(),
                "duration_ms": round((now - entry.started_at).total_seconds() * 1000),
                "host": entry.host,
                "session_id": entry.session_id,
                "turn_count": entry.turn_count,
                "usage": entry.usage.to_dict(),
            }
        )

    def _event(
        self,
        kind: EventType,
        *,
        issue: Issue | None = None,
        slot: int | None = None,
        message: str | None = None,
        **fields: Any,
    ) -> None:
        event: dict[str, Any] = {"type": kind.value, "at": self._clock.now().isoformat()}
        if issue is not None:
            event["issue_id"] = issue.id
            event["identifier"] = issue.identifier
        if slot is not None:
            event["slot"] = slot
        if message is not None:
            event["message"] = message
        event.update({k: v for k, v in fields.items() if v is not None})
        event = self._current_redactor().redact_value(event)
        self._projection.record_event(event)
        self.stats[kind.value] = self.stats.get(kind.value, 0) + 1
        log_level = logging.WARNING if kind in _WARNING_EVENTS else logging.INFO
        logger.log(log_level, "%s %s", kind.value, message or "", extra={"lorenz": event})
        self._append_log_file(event)
        for listener in self._event_listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("event listener failed")

    def _append_log_file(self, event: Mapping[str, Any]) -> None:
        path = self.settings.logging.log_file
        if not path:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event, default=str) + "\n")
        except OSError:
            # NB: a broken log sink must never take the orchestrator down.
            logger.warning("cannot append to log_file path=%s", path)

    def _scrub(self, text: str) -> str:
        """``text`` with the tracker token (and the well-known token variables) as ``***``.

        NB: agents echo what they saw and trackers echo what they were sent, so a token can
        reach an error message; everything shown or written (events, the log file, snapshot
        errors, agent messages) passes through here first.
        """
        return self._current_redactor().redact(text)

    def _current_redactor(self) -> Redactor:
        """The redactor for the current settings (rebuilt only when a reload changed the key)."""
        api_key = self.settings.tracker.api_key
        if self._redactor_key != api_key:
            self._redactor.update(tracker_secrets(api_key=api_key, environ=self._base_env))
            self._redactor_key = api_key
        return self._redactor

    def _emit_snapshot(self) -> None:
        if not self._snapshot_listeners:
            return
        snapshot = self.snapshot()
        for listener in list(self._snapshot_listeners):
            try:
                listener(snapshot)
            except Exception:
                logger.exception("snapshot listener failed")


_PASSED_FIELDS = ("id", "identifier", "title", "state")
"""Issue fields handed to hooks and agents as environment variables (or a workspace name)."""

_WARNING_EVENTS = frozenset(
    {
        EventType.POLL_ERROR,
        EventType.RUN_FAILED,
        EventType.RUN_STALLED,
        EventType.RECONCILE_REFRESH_FAILED,
        EventType.WORKFLOW_RELOAD_FAILED,
        EventType.STARTUP_WORKSPACE_CLEANUP_FAILED,
        EventType.WORKSPACE_PRESERVED,
    }
)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, LorenzError):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _aborted(reason: AbortReason | None) -> RunFailure:
    return RunFailure(code="run_aborted", text=f"aborted: {reason}")


def _config_message(exc: BaseException) -> str:
    """A reload error without its code in front (the snapshot carries the code beside it)."""
    if isinstance(exc, LorenzError):
        return f"[{exc.key_path}] {exc.message}" if exc.key_path else exc.message
    return _describe(exc)


def _tracker_changed(old: WorkflowSettings, new: WorkflowSettings) -> bool:
    return old.tracker != new.tracker
