"""The I/O shell around the orchestrator: the runtime's facade, its state, its loop, reloads.

The orchestrator decides; the runtime acts. Every fetch, spawn, timer and broadcast lives in
this package, and no scheduling decision does: the runtime asks the orchestrator what is
eligible, whether a slot may be claimed, whether a tracked run should stop, which runs are
stalled, and tells it what happened. One tick runs in a fixed order (see
:meth:`.polling.Polling.tick_body`), ticks never overlap, and each dispatched run is a detached task
behind an :class:`~.runs.ActiveRun` handle.

:class:`LorenzRuntime` holds the state and the public surface (start, stop, poll_once, the
snapshot, listeners, reload); the work is done by one collaborator per concern, each given the
runtime by keyword: :mod:`.polling` (ticks and poll coalescing), :mod:`.dispatching` (claim,
run, settle, dispatch passes), :mod:`.reconciling` (claims, stalls, tracker state, terminal
grace) and :mod:`.reporting` (events, history, listeners, redaction). The JSONL log file is
not the runtime's: the single-host daemon writes it as an event listener
(:class:`lorenz.daemon.logs.LogFileSink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lorenz.agents import AgentRunner
from lorenz.config import AgentProtocol, WorkflowSettings
from lorenz.model import (
    AppStatus,
    Clock,
    ConfigError,
    EventType,
    Issue,
    LorenzError,
    PollStatus,
    RefreshReceipt,
    RunIdentity,
    RuntimeSnapshot,
    SlotKey,
    SystemClock,
)
from lorenz.orchestrator import Orchestrator
from lorenz.runtime.blocking import Blocking
from lorenz.runtime.dispatching import Dispatching, WorkerPool, WorkerSlot
from lorenz.runtime.polling import Polling
from lorenz.runtime.projection import Projection
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.reporting import EventListener, Reporting, SnapshotListener, describe_error
from lorenz.runtime.retry_timers import RetryTimers
from lorenz.runtime.runs import AbortReason, ActiveRuns, PendingExit, TerminalGrace
from lorenz.secrets import Redactor, tracker_secrets
from lorenz.tasks import BackgroundTasks
from lorenz.trackers import TrackerClient
from lorenz.workflow import (
    LoadedWorkflow,
    WorkflowStamp,
    load_off_loop,
    validate_dispatch,
    workflow_stamp,
)
from lorenz.workspaces import WorkspaceManager

logger = logging.getLogger("lorenz.runtime")


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
        self._polling = Polling(runtime=self)
        self._dispatching = Dispatching(runtime=self)
        self._reconciling = Reconciling(runtime=self)
        self._reporting = Reporting(runtime=self)
        self._blocking = Blocking(runtime=self)
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
        self._timers = RetryTimers(clock=self._clock, on_fire=self._dispatching.on_retry_due)
        self._snapshot_listeners: list[SnapshotListener] = []
        self._progress_blind_listeners: list[SnapshotListener] = []
        """Listeners (also in ``_snapshot_listeners``) not called for agent progress alone."""
        self._change_listeners: list[Callable[[], None]] = []
        """Told that the state changed, without a snapshot (they build one when they need it)."""
        self._progress_blind_change_listeners: list[Callable[[], None]] = []
        """Change listeners (also in ``_change_listeners``) not told of agent progress alone."""
        self._event_listeners: list[EventListener] = []

        self._stopped = False
        self._draining = False
        self._once = False
        self._app_status = AppStatus.STARTING
        self._poll_in_progress = False
        self._pending_poll: tuple[bool, bool] | None = None
        self._pending_waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._startup_cleanup_done = False
        self._background = BackgroundTasks(name="runtime", log=logger)
        """Work nobody awaits (a poll, an agent update, a terminal action, a grace's stop)."""
        self._loop_task: asyncio.Task[None] | None = None

        self._last_poll_at: datetime.datetime | None = None
        self._next_poll_at: datetime.datetime | None = None
        self._last_poll_error: str | None = None
        self._config_error: ConfigError | None = None
        """The reload failing now; ``None`` once one succeeds."""
        self._last_candidates = 0
        self._last_eligible = 0
        self.poll_count = 0

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
    def draining(self) -> bool:
        """Whether :meth:`drain` began: no new run starts, the ones in flight go on."""
        return self._draining

    @property
    def next_poll_at(self) -> datetime.datetime | None:
        return self._next_poll_at

    async def poll_once(self, *, dry_run: bool = False, wait_for_runs: bool = False) -> None:
        """One tick; a concurrent request queues behind the running one and merges with it."""
        await self._polling.poll_once(dry_run=dry_run, wait_for_runs=wait_for_runs)

    def request_refresh(self) -> RefreshReceipt:
        """Queue an immediate poll and reconcile pass (coalesced with one already under way)."""
        return self._polling.request_refresh()

    def subscribe(
        self, listener: SnapshotListener, *, agent_progress: bool = True
    ) -> Callable[[], None]:
        """Call ``listener`` with every new snapshot, starting with the current one.

        ``agent_progress=False``: skip the snapshots after an agent update that only moved its
        run's progress (last event, message, tokens), the bulk of a chatty agent's traffic.
        """
        return self._reporting.subscribe(listener, agent_progress=agent_progress)

    def on_change(
        self, listener: Callable[[], None], *, agent_progress: bool = True
    ) -> Callable[[], None]:
        """Call ``listener`` whenever the state changes, without building a snapshot.

        For listeners that coalesce changes and read :meth:`snapshot` at their own pace (the
        dashboard's event stream): the snapshot is built per frame, not per change; and for
        those that read less than a snapshot (:meth:`run_identities`). ``agent_progress=False``
        as for :meth:`subscribe`.
        """
        return self._reporting.on_change(listener, agent_progress=agent_progress)

    def run_identities(self) -> tuple[RunIdentity, ...]:
        """Each slot running, reserved or waiting for a retry, with its issue and session:
        the part of :meth:`snapshot` the log's run context reads, without building one."""
        return self._orchestrator.run_identities()

    def add_event_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` with every runtime event (metrics, Kubernetes Events, logs)."""
        return self._reporting.add_event_listener(listener)

    async def abandon_runs(self, *, reason: str) -> None:
        """Abort every local run whose claim we no longer own; record nothing for them."""
        await self._reconciling.abandon_runs(reason=reason)

    async def cancel_slot(self, key: SlotKey, *, reason: str = "claim_deleted") -> bool:
        """Stop one slot's run from outside (a deleted ``Claim``); the issue may run again."""
        return await self._reconciling.cancel_slot(key, reason=reason)

    def _emit_snapshot(self) -> None:
        self._reporting.emit_snapshot()

    async def start(self, *, once: bool = False, dry_run: bool = False) -> None:
        """Run until stopped (recurring mode) or for one tick plus its runs (``once``)."""
        self._app_status = AppStatus.RUNNING
        self._dry_run = dry_run
        self._reporting.emit_snapshot()
        if once:
            # NB: one tick means one. Without this, the nudges of settling runs (and the retry
            # timers they arm) merge a follow-up tick into this one, which may dispatch a
            # continuation that nobody waits for and that the shutdown kills moments later.
            self._once = True
            await self.poll_once(dry_run=dry_run, wait_for_runs=True)
            self._app_status = AppStatus.STOPPED
            self._reporting.emit_snapshot()
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
                self._reporting.emit_snapshot()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=interval_s)
        finally:
            await self._dispatching.settle_runs()
            self._app_status = AppStatus.STOPPED
            self._reporting.emit_snapshot()

    def stop(self, *, hand_over: bool = False) -> None:
        """Stop at once: no new polls, every active run aborted as a clean shutdown.

        ``hand_over``: a run whose agent is under way is left to its detached worker for the
        next controller to adopt (see :attr:`AbortReason.HANDED_OVER`); the caller has made the
        runner leave workers running. Runs that have not started yet stop as a clean shutdown.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._app_status is not AppStatus.STOPPED:  # a finished --once run stays stopped
            self._app_status = AppStatus.STOPPING
        self._pending_poll = None
        for grace in self._graces.values():
            if grace.timer is not None:
                grace.timer.cancel()
        self._graces.clear()
        for run in self._runs.all():
            handed = hand_over and run.started and not run.exited
            run.finish_externally(AbortReason.HANDED_OVER if handed else AbortReason.SHUTDOWN)
        self._timers.cancel_all()
        self._wake.set()
        self._pass_wake.set()
        self._reporting.event(EventType.STOPPING, message="runtime stopping")

    async def drain(self, *, grace_s: float, cut_short: asyncio.Event | None = None) -> bool:
        """Stop starting runs and let the ones in flight go on for up to ``grace_s`` seconds.

        Ticks go on (heartbeats, reconciliation, reload: a run whose issue turned terminal is
        still stopped), and so do the exit decisions of runs that end; nothing is claimed or
        dispatched any more. Returns ``True`` once no run is in flight, ``False`` when the
        window ended (or ``cut_short`` was set) first. Does not stop the runtime: the caller
        decides what happens to the runs left, then calls :meth:`stop`.
        """
        if not self._draining and not self._stopped:
            self._draining = True
            if self._app_status is not AppStatus.STOPPED:
                self._app_status = AppStatus.STOPPING
            self._reporting.event(
                EventType.STOPPING,
                message=f"draining: no new runs; {len(self._runs.tasks())} in flight may "
                f"finish within {grace_s:g} s",
            )
        deadline = self._clock.monotonic_ms() + grace_s * 1000.0
        cut = asyncio.ensure_future(cut_short.wait()) if cut_short is not None else None
        try:
            while tasks := self._runs.tasks():
                remaining_s = (deadline - self._clock.monotonic_ms()) / 1000.0
                if remaining_s <= 0 or (cut is not None and cut.done()):
                    return False
                waiting: set[asyncio.Future[Any]] = set(tasks)
                if cut is not None:
                    waiting.add(cut)
                await asyncio.wait(
                    waiting, timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED
                )
            return True
        finally:
            if cut is not None:
                cut.cancel()

    async def wait_for_runs(self) -> None:
        """Wait until every run in flight has settled."""
        while True:
            tasks = self._runs.tasks()
            if not tasks:
                break
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._dispatching.settle_unstarted_runs()

    async def drain_worker_pool(self) -> None:
        """Bounded async teardown of a worker pool (separate from :meth:`stop`)."""
        if self._pool is None:
            return
        deadline = self.settings.worker.worker_pool.drain_deadline_ms
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pool.drain(deadline_ms=deadline), deadline / 1000.0)

    def poll_status(self) -> PollStatus:
        """The poll block of :meth:`snapshot` alone (cheap: no lanes, events or history)."""
        return PollStatus(
            status="polling" if self._poll_in_progress else "idle",
            interval_ms=self.settings.polling.interval_ms,
            candidates=self._last_candidates,
            eligible=self._last_eligible,
            last_poll_at=self._last_poll_at,
            next_poll_at=self._next_poll_at,
            last_error=self._last_poll_error,
            count=self.poll_count,
        )

    def snapshot(self) -> RuntimeSnapshot:
        """The full picture, in three layers: orchestrator, runtime live fields, projections."""
        return RuntimeSnapshot(
            app_status=self._app_status,
            workflow_path=str(self._workflow.path),
            poll=self.poll_status(),
            lanes=self._orchestrator.snapshot(),
            recent_events=self._projection.recent_events(),
            run_history=self._projection.run_history(),
            log_file=self.settings.logging.log_file,
            config_error=self._config_error,
        )

    async def _tick(self, *, dry_run: bool, wait_for_runs: bool) -> None:
        # NB: the lock covers the tick's body only: runs waiting in wait_for_runs() may need a
        # dispatch pass (their exit decision), which takes the same lock.
        async with self._dispatch_lock:
            await self._polling.tick_body(dry_run=dry_run)
        if wait_for_runs:
            await self.wait_for_runs()

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
            stamp = None
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
            self._config_error = ConfigError(
                code=code,
                message=self._reporting.scrub(_config_message(exc)),
                since=(
                    self._config_error.since
                    if self._config_error is not None
                    else self._clock.now()
                ),
            )
            self._reporting.event(
                EventType.WORKFLOW_RELOAD_FAILED,
                message=f"{describe_error(exc)}; keeping the last known good workflow",
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
            try:
                await old_tracker.close()
            except Exception:
                # NB: the swapped-out tracker's connections are closed best effort: the new
                # client is in force already, and the reload succeeded.
                logger.warning("closing the replaced tracker client failed", exc_info=True)
        self._reporting.event(EventType.WORKFLOW_RELOADED, message="workflow reloaded")


__all__ = ["EventListener", "LorenzRuntime", "SnapshotListener", "WorkerPool", "WorkerSlot"]


def _config_message(exc: BaseException) -> str:
    """A reload error without its code in front (the snapshot carries the code beside it)."""
    if isinstance(exc, LorenzError):
        return f"[{exc.key_path}] {exc.message}" if exc.key_path else exc.message
    return describe_error(exc)


def _tracker_changed(old: WorkflowSettings, new: WorkflowSettings) -> bool:
    return old.tracker != new.tracker
