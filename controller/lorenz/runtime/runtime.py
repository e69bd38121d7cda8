"""The I/O shell around the orchestrator: the runtime's facade, composing its collaborators.

The orchestrator decides; the runtime acts. Every fetch, spawn, timer and broadcast lives in
this package, and no scheduling decision does: the runtime asks the orchestrator what is
eligible, whether a slot may be claimed, whether a tracked run should stop, which runs are
stalled, and tells it what happened. One tick runs in a fixed order (see
:meth:`.polling.Polling.tick_body`), ticks never overlap, and each dispatched run is a detached task
behind an :class:`~.runs.ActiveRun` handle.

:class:`LorenzRuntime` composes and exposes: it builds the shared :class:`~.parts.RuntimeParts`
and one collaborator per concern, each handed its parts and its siblings by keyword and owning
its own state — :mod:`.polling` (the loop, ticks, poll coalescing), :mod:`.reloading` (the
transactional reload), :mod:`.dispatching` (claim, run, settle, dispatch passes),
:mod:`.reconciling` (claims, stalls, tracker state, terminal grace), :mod:`.blocking` (blocked
slots' terminal actions) and :mod:`.reporting` (events, history, listeners, redaction). None of
them holds a reference back to the facade; the import layers inside the package are enforced
(``pyproject.toml``, ``[tool.importlinter]``). The JSONL log file is not the runtime's: the
single-host daemon writes it as an event listener (:class:`lorenz.daemon.logs.LogFileSink`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from collections.abc import Awaitable, Callable, Mapping

from lorenz.agents import AgentRunner
from lorenz.claims.spend import SpendLedger
from lorenz.config import AgentProtocol, WorkflowSettings
from lorenz.model import (
    AbortReason,
    AppStatus,
    Clock,
    EventType,
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
from lorenz.runtime.parts import RuntimeParts, RuntimeStatus
from lorenz.runtime.polling import Polling
from lorenz.runtime.providers import InForce
from lorenz.runtime.questions import AnswerReceipt
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.reloading import Reloading
from lorenz.runtime.reporting import EventListener, Reporting, SnapshotListener
from lorenz.runtime.retry_timers import RetryTimers
from lorenz.runtime.runs import ActiveRuns
from lorenz.runtime.spending import Spending
from lorenz.tasks import BackgroundTasks
from lorenz.trackers import TrackerClient
from lorenz.workflow import LoadedWorkflow, WorkflowStamp
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
        clock = clock or SystemClock()
        in_force = InForce(workflow)
        environ = dict(os.environ if base_env is None else base_env)
        reporting = Reporting(clock=clock, workflow=in_force, base_env=environ)
        store = orchestrator.claim_store
        self._parts = RuntimeParts(
            orchestrator=orchestrator,
            workspaces=workspaces,
            runs=ActiveRuns(),
            timers=RetryTimers(clock=clock),
            reporting=reporting,
            clock=clock,
            background=BackgroundTasks(name="runtime", log=logger),
            workflow=in_force,
            tracker=InForce(tracker),
            runner_factory=runner_factory,
            status=RuntimeStatus(),
            candidates={},
            base_env=environ,
            spending=Spending(
                reporting=reporting,
                clock=clock,
                settings=lambda: in_force.current.settings,
                ledger=store if isinstance(store, SpendLedger) else None,
            ),
        )
        tick_lock = asyncio.Lock()
        self._reporting = self._parts.reporting
        self._reloading = Reloading(
            parts=self._parts,
            reload_workflow=reload_workflow,
            tracker_factory=tracker_factory,
            source_stamp=source_stamp,
        )
        self._blocking = Blocking(parts=self._parts)
        self._reconciling = Reconciling(parts=self._parts, blocking=self._blocking)
        self._dispatching = Dispatching(
            parts=self._parts,
            reconciling=self._reconciling,
            blocking=self._blocking,
            pool=pool,
            tick_lock=tick_lock,
        )
        self._polling = Polling(
            parts=self._parts,
            reloading=self._reloading,
            reconciling=self._reconciling,
            blocking=self._blocking,
            dispatching=self._dispatching,
            tick_lock=tick_lock,
            prove_leadership=prove_leadership,
        )
        self._parts.timers.connect(self._dispatching.on_retry_due)
        # NB: the one callable that reaches the facade, looked up at each call: whatever wraps
        # snapshot() (a test counting builds) sees every snapshot the listeners get.
        self._reporting.serve_snapshots(lambda: self.snapshot())

    @property
    def workflow(self) -> LoadedWorkflow:
        return self._parts.workflow.current

    @property
    def settings(self) -> WorkflowSettings:
        return self._parts.settings

    @property
    def tracker(self) -> TrackerClient:
        """The tracker client in force (a reload may have replaced it)."""
        return self._parts.tracker.current

    @property
    def orchestrator(self) -> Orchestrator:
        return self._parts.orchestrator

    @property
    def stopped(self) -> bool:
        return self._parts.status.stopped

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` began: no new run starts, the ones in flight go on."""
        return self._parts.status.draining

    @property
    def next_poll_at(self) -> datetime.datetime | None:
        return self._polling.next_poll_at

    @property
    def poll_count(self) -> int:
        """Ticks begun so far."""
        return self._polling.count

    async def poll_once(self, *, dry_run: bool = False, wait_for_runs: bool = False) -> None:
        """One tick; a concurrent request queues behind the running one and merges with it."""
        await self._polling.poll_once(dry_run=dry_run, wait_for_runs=wait_for_runs)

    def request_refresh(self) -> RefreshReceipt:
        """Queue an immediate poll and reconcile pass (coalesced with one already under way)."""
        return self._polling.request_refresh()

    async def answer(self, identifier: str, *, text: object, source: str) -> AnswerReceipt:
        """Answer the question a waiting issue's agent asked (``identifier``: the issue's
        identifier or id); its slots resume their sessions with it at once. Raises
        :class:`~.questions.AnswerRefused` (``issue_not_waiting``, ``answer_invalid``) or
        ``template_render_error``."""
        receipt = await self._blocking.questions.answer(identifier, text=text, source=source)
        self._dispatching.nudge()
        self._emit_snapshot()
        return receipt

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
        return self._parts.orchestrator.run_identities()

    def add_event_listener(self, listener: EventListener) -> Callable[[], None]:
        """Call ``listener`` with every runtime event (metrics, Kubernetes Events, logs)."""
        return self._reporting.add_event_listener(listener)

    async def abandon_runs(self, *, reason: str) -> None:
        """Abort every local run whose claim we no longer own; record nothing for them."""
        await self._reconciling.abandon_runs(reason=reason)

    async def cancel_slot(self, key: SlotKey, *, reason: str = "claim_deleted") -> bool:
        """Stop one slot's run from outside (a deleted ``Claim``); the issue may run again."""
        cancelled = await self._reconciling.cancel_slot(key, reason=reason)
        if cancelled:
            self._dispatching.nudge()  # NB: the slot is free: fill it now, not at the next poll
        return cancelled

    def _emit_snapshot(self) -> None:
        # NB: tests and benchmarks push a snapshot to the listeners through this.
        self._reporting.emit_snapshot()

    @property
    def _change_listeners(self) -> list[Callable[[], None]]:
        # NB: tests check that nothing leaks into the list (it is Reporting's own).
        return self._reporting.change_listeners

    @property
    def _timers(self) -> RetryTimers:
        # NB: benchmarks read the timers' firing lateness.
        return self._parts.timers

    async def start(self, *, once: bool = False, dry_run: bool = False) -> None:
        """Run until stopped (recurring mode) or for one tick plus its runs (``once``)."""
        status = self._parts.status
        status.app = AppStatus.RUNNING
        status.dry_run = dry_run
        self._reporting.emit_snapshot()
        if once:
            # NB: one tick means one. Without this, the nudges of settling runs (and the retry
            # timers they arm) merge a follow-up tick into this one, which may dispatch a
            # continuation that nobody waits for and that the shutdown kills moments later.
            status.once = True
            await self.poll_once(dry_run=dry_run, wait_for_runs=True)
            await self._parts.spending.flush()
            status.app = AppStatus.STOPPED
            self._reporting.emit_snapshot()
            return
        try:
            await self._polling.run(dry_run=dry_run)
        finally:
            await self._dispatching.settle_runs()
            await self._parts.spending.flush()
            status.app = AppStatus.STOPPED
            self._reporting.emit_snapshot()

    def stop(self, *, hand_over: bool = False) -> None:
        """Stop at once: no new polls, every active run aborted as a clean shutdown.

        ``hand_over``: a run whose agent is under way is left to its detached worker for the
        next controller to adopt (see :attr:`AbortReason.HANDED_OVER`); the caller has made the
        runner leave workers running. So is a run whose worker is being placed (a Pod created,
        not bound yet): its agent may already run, and the Claim's spawn intent names it (#37).
        Runs that have not started yet stop as a clean shutdown.
        """
        status = self._parts.status
        if status.stopped:
            return
        status.stopped = True
        if status.app is not AppStatus.STOPPED:  # a finished --once run stays stopped
            status.app = AppStatus.STOPPING
        self._reconciling.end_all_graces()
        for run in self._parts.runs.all():
            handed = hand_over and (run.started or run.placing) and not run.exited
            run.finish_externally(AbortReason.HANDED_OVER if handed else AbortReason.SHUTDOWN)
        self._parts.timers.cancel_all()
        self._polling.stop()
        self._dispatching.wake_passes()
        self._reporting.event(EventType.STOPPING, message="runtime stopping")

    def leave_runs_in_flight(self) -> int:
        """Leave every run still in flight to its worker and the next controller (as
        :meth:`stop` with ``hand_over`` does), even one stopped already; how many.

        NB: for a stopping controller whose cancelled runs cannot be proven killed (a frozen
        worker whose host is unreachable): settled as stopped, each would write a retry that
        the next controller starts beside a possibly live agent; left, its claim keeps the
        worker's intent, and the next controller probes and kills it first. The caller has made
        the runner leave workers running.
        """
        left = 0
        for run in self._parts.runs.all():
            if run.task is not None and not run.task.done() and not run.exited:
                run.reason = AbortReason.HANDED_OVER
                left += 1
        return left

    async def drain(self, *, grace_s: float, cut_short: asyncio.Event | None = None) -> bool:
        """Stop starting runs and let the ones in flight go on for up to ``grace_s`` seconds.

        Ticks go on (heartbeats, reconciliation, reload: a run whose issue turned terminal is
        still stopped), and so do the exit decisions of runs that end; nothing is claimed or
        dispatched any more. Returns ``True`` once no run is in flight, ``False`` when the
        window ended (or ``cut_short`` was set) first. Does not stop the runtime: the caller
        decides what happens to the runs left, then calls :meth:`stop`.
        """
        status = self._parts.status
        if not status.draining and not status.stopped:
            status.draining = True
            if status.app is not AppStatus.STOPPED:
                status.app = AppStatus.STOPPING
            self._reporting.event(
                EventType.STOPPING,
                message=f"draining: no new runs; {len(self._parts.runs.tasks())} in flight may "
                f"finish within {grace_s:g} s",
            )
        return await self._dispatching.wait_for_runs_within(grace_s=grace_s, cut_short=cut_short)

    async def wait_for_runs(self) -> None:
        """Wait until every run in flight has settled (and its spend is written)."""
        await self._dispatching.wait_for_runs()
        await self._parts.spending.flush()

    @property
    def spending(self) -> Spending:
        """Spend control: totals, meters and the ``budget`` lane (see :mod:`.spending`)."""
        return self._parts.spending

    async def drain_worker_pool(self) -> None:
        """Bounded async teardown of a worker pool (separate from :meth:`stop`)."""
        await self._dispatching.drain_pool()

    def poll_status(self) -> PollStatus:
        """The poll block of :meth:`snapshot` alone (cheap: no lanes, events or history)."""
        return self._polling.poll_status()

    def snapshot(self) -> RuntimeSnapshot:
        """The full picture, in three layers: orchestrator, runtime live fields, projections."""
        return _snapshot(parts=self._parts, polling=self._polling, reloading=self._reloading)

__all__ = ["EventListener", "LorenzRuntime", "SnapshotListener", "WorkerPool", "WorkerSlot"]


def _snapshot(*, parts: RuntimeParts, polling: Polling, reloading: Reloading) -> RuntimeSnapshot:
    return RuntimeSnapshot(
        app_status=parts.status.app,
        workflow_path=str(parts.workflow.current.path),
        poll=polling.poll_status(),
        lanes=parts.orchestrator.snapshot(),
        recent_events=parts.reporting.recent_events(),
        run_history=parts.reporting.run_history(),
        log_file=parts.settings.logging.log_file,
        config_error=reloading.config_error,
        budget=parts.spending.snapshot(candidates=parts.candidates.keys()),
    )
