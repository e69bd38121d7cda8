"""The single-host composition root: choose backends, open them, run, close them in order.

Everything that is a *choice* — which claim store, tracker, runner, whether to take the
leadership lease, serve HTTP, show a terminal view — is made here and nowhere below. The order
of shutdown is owned here too: stop the runtime, unmount the terminal view, drain the worker
pool, stop the server, close the tracker, close the claim store, release the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from lorenz.assembly import (
    assemble_runtime,
    local_worker_transport,
    runs_in_workers,
    tracker_factory,
)
from lorenz.claims import open_claim_store, sql_store_of, workflow_digest
from lorenz.claims.owners import default_owner_id
from lorenz.config import ClaimStoreBackend
from lorenz.daemon import shutdown
from lorenz.daemon.daemons import Daemon, wants_daemon, with_control_transport
from lorenz.daemon.exclusion import refuse_beside_daemon, warn_about_siblings
from lorenz.daemon.orphans import dead_owners_of, kill_orphans, marked_environment
from lorenz.daemon.recovery import RecoveryPasses
from lorenz.model import ClaimStore, SpawnIntents, SystemClock
from lorenz.orchestrator import Orchestrator
from lorenz.runtime import LorenzRuntime
from lorenz.tasks import install_child_watcher, start_up_objects_frozen
from lorenz.trackers import TrackerClient
from lorenz.workers.runner import Departure
from lorenz.workers.states import state_root_of
from lorenz.workflow import LoadedWorkflow, load_workflow, validate_dispatch

if TYPE_CHECKING:
    from lorenz.workers.handles import LocalTransport

logger = logging.getLogger("lorenz.daemon")

@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HostOptions:
    """What the command line chose for one single-host run."""

    workflow_path: str | None
    cli_flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cli_features: Sequence[str] = ()
    once: bool = False
    dry_run: bool = False
    port: int | None = None
    """``--port``: overrides ``server.port``."""
    tui: bool = True
    """Show the terminal view (only when stdout is a TTY)."""
    environ: Mapping[str, str] | None = None
    grace_seconds: float = shutdown.DEFAULT_GRACE_S
    """``--grace-seconds``: how long runs in flight may go on after a graceful stop."""
    force_kill: bool = False
    """``--force-kill``: at the end of the grace window cancel detached workers instead of
    leaving them to the next controller."""
    force: bool = False
    """``--force``: a daemon takes over a lease whose holder cannot be verified dead (another
    host), generation-fenced, instead of refusing with ``daemon_lock_stale``."""


class Attachment(Protocol):
    """Something the host starts after the runtime exists and stops during shutdown."""

    async def start(self, runtime: LorenzRuntime) -> None: ...

    async def stop(self) -> None: ...


AttachmentFactory = Callable[[LoadedWorkflow, HostOptions], Attachment | None]

ATTACHMENTS: list[AttachmentFactory] = []
"""Extra surfaces (server, terminal view) in shutdown order: the first is stopped first.

Layer-8 modules register factories here so that this root stays the one place that wires a
run together, without importing layer-7 modules that a minimal install may not need.
"""


async def _inherit_workers(store: ClaimStore, *, workflow: str, root: Path) -> None:
    """Give a fresh memory store the claims its predecessor's workers stand for.

    NB: the memory store forgot the lost controller's runs; their workers did not. Written
    before hydration, these claims make it adopt, settle or cancel them exactly as a durable
    store's would (see :mod:`lorenz.workers.inheritance`).
    """
    from lorenz.workers.inheritance import inherited_claims
    from lorenz.workers.runner import live_controller_of

    for record in await inherited_claims(root=root, workflow=workflow, owner=store.owner):
        assert record.intent is not None
        controller = live_controller_of(root / record.intent.handle, me=store.owner)
        if controller is not None:
            # NB: not a lost controller's: the one that follows it lives (another lorenz of
            # this workflow); inheriting it would mean following — and cancelling — its run.
            logger.warning(
                "worker of a live controller left alone handle=%s issue=%s controller=%s",
                record.intent.handle,
                record.identifier,
                controller,
            )
            continue
        if await store.acquire(record) and isinstance(store, SpawnIntents):
            await store.record_intent(record.slot_key, record.intent)
            logger.info(
                "worker of a lost controller found handle=%s issue=%s",
                record.intent.handle,
                record.identifier,
            )


def load(options: HostOptions) -> LoadedWorkflow:
    """Load and validate the workflow; coded errors propagate (exit 2)."""
    loaded = load_workflow(
        options.workflow_path,
        cli_flags=options.cli_flags,
        cli_features=options.cli_features,
        environ=options.environ,
    )
    validate_dispatch(loaded.settings)
    for warning in loaded.warnings:
        logger.warning("%s", warning)
    warn_about_siblings(loaded, environ=options.environ)
    return loaded


async def run_host(
    options: HostOptions, *, ready: Callable[[LorenzRuntime], None] | None = None
) -> int:
    """Run one workflow on this host until it stops; returns the process exit code."""
    install_child_watcher()
    loaded = load(options)
    settings = loaded.settings
    owner = default_owner_id()
    # NB: one for the runtime's runners, the daemon (leadership lost) and the drain (grace
    # elapsed): any of them may leave this runtime's workers running for the next controller.
    departure = Departure()
    daemon: Daemon | None = None
    if wants_daemon(settings, once=options.once):
        # NB: the lease comes before everything else: a second daemon must not poll the
        # tracker, hydrate claims or bind a port before it learns that it is the second.
        daemon = Daemon(
            workflow_path=loaded.canonical_path,
            settings=settings.daemon,
            claim_owner=owner,
            force=options.force,
            departure=departure,
        )
        await daemon.acquire()
    elif options.force:
        logger.warning("--force has no effect without the daemon feature (no lease to take)")
    if daemon is None and not options.dry_run:
        # NB: the same place: a run beside a live daemon would run its issues a second time
        # (and take its workers for a lost controller's); see lorenz.daemon.exclusion.
        refuse_beside_daemon(
            loaded.canonical_path,
            shown_as=options.workflow_path,
            stale_ms=settings.daemon.stale_ms,
        )
    workspace_root = Path(settings.workspace.root or ".")
    store: ClaimStore | None = None
    attachments: list[Attachment] = []
    runtime: LorenzRuntime | None = None
    graceful: shutdown.GracefulStop | None = None
    recovery: RecoveryPasses | None = None
    tracker: TrackerClient | None = None
    transport: LocalTransport | None = None
    try:
        trackers = tracker_factory(base_dir=loaded.base_dir)
        tracker = trackers(settings)
        store = await open_claim_store(
            settings.claim_store,
            workspace_root=workspace_root,
            workflow_path=loaded.canonical_path,
            owner=owner,
        )
        if daemon is not None:
            # NB: the fence comes before the first write of this process (recover declares
            # owners dead): from here on, a newer leader's fence refuses every write of ours.
            await daemon.fence(store)
            await daemon.recover(store)
        # Agents of any dead owner of this workflow, found by their marks: one whose claims
        # a process took over and then died before sweeping is no longer named by the store.
        workflow_key = workflow_digest(loaded.canonical_path)
        await asyncio.to_thread(lambda: kill_orphans(dead_owners_of(workflow_key)))
        environ = options.environ if options.environ is not None else os.environ
        workers = runs_in_workers(environ)
        if workers and not store.durable and not options.dry_run:
            await _inherit_workers(
                store, workflow=str(loaded.path), root=state_root_of(environ)
            )
        orchestrator = Orchestrator(settings=settings, store=store, clock=SystemClock())
        report = await orchestrator.hydrate()
        logger.info(
            "claims hydrated backend=%s interrupted=%d adopting=%d restored_retries=%d "
            "taken_over=%d problems=%d",
            settings.claim_store.backend.value, len(report.interrupted), len(report.adopting),
            len(report.restored_retries), len(report.taken_over_from),
            len(report.problems),
        )
        for problem in report.problems:
            logger.warning("stored claim skipped code=%s: %s", problem.code, problem.message)
        # Processes of the owners just taken over may outlive them: none may still work on
        # an issue when it is dispatched again (see lorenz.daemon.orphans).
        await asyncio.to_thread(kill_orphans, report.taken_over_from - {owner})
        base_env = marked_environment(environ, owner=owner, workflow_key=workflow_key)
        if workers:
            transport = local_worker_transport(loaded, base_env=base_env)
        runtime = assemble_runtime(
            workflow=loaded,
            orchestrator=orchestrator,
            base_env=base_env,
            trackers=trackers,
            tracker=tracker,
            reload_workflow=lambda: load_workflow(
                loaded.path,
                cli_flags=options.cli_flags,
                cli_features=options.cli_features,
                environ=options.environ,
            ),
            prove_leadership=daemon.prove if daemon is not None else None,
            claim_store=store,
            generation=(lambda: daemon.generation) if daemon is not None else None,
            leave_workers=departure,
            transport=transport,
            workers=workers,
        )
        graceful = shutdown.GracefulStop(
            runtime=runtime,
            grace_s=options.grace_seconds,
            force_kill=options.force_kill,
            # NB: only with a durable claim store: a successor could adopt from the state root
            # too, but a plain ``lorenz`` stopped by its user (Ctrl-C, the demo) may have none,
            # and must leave nothing running.
            hand_over=workers and settings.claim_store.backend is not ClaimStoreBackend.MEMORY,
            departure=departure,
        )
        # NB: before any attachment starts: once the daemon's endpoint is published, SIGTERM
        # must already mean a graceful stop.
        _install_signal_handlers(graceful)
        factories = list(ATTACHMENTS)
        if daemon is not None:
            daemon.bind(runtime, request_stop=graceful.request)
            factories = with_control_transport(factories, daemon=daemon)
        for factory in factories:
            attachment = factory(loaded, options)
            if attachment is not None:
                await attachment.start(runtime)
                attachments.append(attachment)
        if daemon is not None:
            daemon.start_heartbeat(claim_heartbeat=orchestrator.heartbeat)
        sql_store = sql_store_of(store)
        if sql_store is not None and not (options.once or options.dry_run):
            # Owners that die after hydration: see lorenz.daemon.recovery.
            recovery = RecoveryPasses(
                store=sql_store,
                orchestrator=orchestrator,
                interval_ms=settings.claim_store.recovery_interval_ms,
                prove_leadership=daemon.prove if daemon is not None else None,
                on_recovered=runtime.request_refresh,
            )
            recovery.start()
        if ready is not None:
            ready(runtime)
        with start_up_objects_frozen():
            await runtime.start(once=options.once, dry_run=options.dry_run)
        if daemon is not None:
            daemon.raise_if_lost()
        return 0
    finally:
        if recovery is not None:
            await recovery.stop()
        if runtime is not None:
            shutdown.shutdown_step(shutdown.STOP_RUNTIME)
            if graceful is not None:
                await graceful.finish()
            runtime.stop()
            await wait_for_runs_or_leave(runtime, departure=departure)
            shutdown.shutdown_step(shutdown.UNMOUNT_TUI)
            for attachment in attachments:
                if not shutdown.stops_with_server(attachment):
                    # NB: shutdown goes on past an attachment that fails to stop.
                    with contextlib.suppress(Exception):
                        await attachment.stop()
            shutdown.shutdown_step(shutdown.DRAIN_WORKER_POOL)
            await runtime.drain_worker_pool()
        if transport is not None:
            # NB: no run is in flight any more (or none started); the workers go on without
            # their launcher.
            with contextlib.suppress(Exception):
                await transport.close()
        if runtime is not None:
            shutdown.shutdown_step(shutdown.STOP_SERVER)
            for attachment in attachments:
                if shutdown.stops_with_server(attachment):
                    # NB: shutdown goes on past an attachment that fails to stop.
                    with contextlib.suppress(Exception):
                        await attachment.stop()
        shutdown.shutdown_step(shutdown.CLOSE_TRACKER)
        open_tracker = runtime.tracker if runtime is not None else tracker
        if open_tracker is not None:
            # NB: closing the tracker's connections is best effort.
            with contextlib.suppress(Exception):
                await open_tracker.close()
        shutdown.shutdown_step(shutdown.CLOSE_CLAIM_STORE)
        try:
            if store is not None:
                await store.close()
        finally:
            if daemon is not None:
                shutdown.shutdown_step(shutdown.RELEASE_LEASE)
                await daemon.release()


async def wait_for_runs_or_leave(runtime: LorenzRuntime, *, departure: Departure) -> None:
    """Wait for the stopped runtime's runs; past the bound
    (:data:`~lorenz.daemon.shutdown.KILL_CONFIRM_BOUND_S`) leave those still waiting for a kill
    to be confirmed to the next controller.

    NB: a cancelled run whose worker cannot be reached (an SSH host down, an API server that
    does not answer) holds its slot until the kill is confirmed, which may be never while this
    controller runs: a stop must still end. Left, such a run ends unsettled — its claim keeps
    the worker's intent — and the next controller probes and kills it before it retries.
    """
    waiting = asyncio.ensure_future(runtime.wait_for_runs())
    try:
        await asyncio.wait_for(asyncio.shield(waiting), timeout=shutdown.KILL_CONFIRM_BOUND_S)
    except TimeoutError:
        left = runtime.leave_runs_in_flight()
        logger.warning(
            "runs whose kill is not confirmed after %g s left to the next controller runs=%d",
            shutdown.KILL_CONFIRM_BOUND_S,
            left,
        )
        departure.leave(reason=shutdown.KILL_UNCONFIRMED)
        await waiting
    finally:
        if not waiting.done():
            waiting.cancel()


def _install_signal_handlers(graceful: shutdown.GracefulStop) -> None:
    """SIGINT and SIGTERM begin the drain; a second signal is logged and ignored.

    NB: a second Ctrl-C is the reflex of an impatient user, and a supervisor's repeated
    SIGTERM is routine; neither may turn a drain that keeps runs alive into one that cancels
    them. Killing is asked for by name: ``lorenz stop --force`` (or ``--force-kill`` at start).
    """
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if graceful.requested:
            logger.warning(
                "received signal=%s again; ignored: the graceful stop goes on "
                "(`lorenz stop --force` cancels every run now)",
                name,
            )
            return
        logger.info("received signal=%s; stopping gracefully", name)
        graceful.request()

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, signum)
