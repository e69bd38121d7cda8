"""The daemon's side of leadership: take the lease first, keep proving it, give it back last.

A long-lived daemon (feature ``daemon``) is the one process allowed to run a workflow's
scheduler on this host. :class:`Daemon` wraps a
:class:`~lorenz.leadership.LeadershipProvider` with what the composition root needs around it:

* :meth:`Daemon.acquire` runs before anything else opens (tracker, claim store, server,
  runtime), and remembers which predecessor it replaced — a holder the lease proved dead;
* :meth:`Daemon.recover` kills that predecessor's orphaned agents and tells a durable claim
  store it is dead (the store proves a dead owner on this host by itself too, by pid and start
  time; this covers an owner whose pid the store may not inspect);
* :meth:`Daemon.prove` is the runtime's ``prove_leadership``: every tick starts with it, and
  a lost lease stops the runtime before the tick mutates anything;
* a heartbeat task renews the lease (and the claim store's owner row) every
  ``daemon.heartbeat_ms``, and stops the runtime the moment either is lost;
* :meth:`Daemon.info` is ``GET /api/v1/daemon``; :meth:`Daemon.request_stop` is
  ``POST /api/v1/stop``;
* :meth:`Daemon.release` runs last of all in the shutdown order.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorenz.claims import ClaimGenerationStale, ClaimOwnerLost, sql_store_of
from lorenz.daemon.orphans import kill_orphans
from lorenz.leadership import (
    FileLeaseProvider,
    LeadershipLost,
    LeadershipProvider,
    LeaseRecord,
    Liveness,
    local_liveness,
)
from lorenz.model import ClaimStore, GenerationFence, LorenzError
from lorenz.model.snapshots import WaitingRow
from lorenz.workers.runner import Departure

if TYPE_CHECKING:
    from lorenz.config.settings import DaemonSettings, WorkflowSettings
    from lorenz.daemon.control import DaemonControl
    from lorenz.runtime import LorenzRuntime
    from lorenz.workflow import LoadedWorkflow

logger = logging.getLogger("lorenz.daemon")


class Daemon:
    """One workflow's leadership, held by this process for as long as it runs it."""

    def __init__(
        self,
        *,
        workflow_path: Path,
        settings: DaemonSettings,
        claim_owner: str,
        provider: LeadershipProvider | None = None,
        force: bool = False,
        departure: Departure | None = None,
    ) -> None:
        self._workflow_path = workflow_path
        self._settings = settings
        self._claim_owner = claim_owner
        self._provider: LeadershipProvider = provider or FileLeaseProvider(
            workflow_path=workflow_path, stale_ms=settings.stale_ms, force=force
        )
        self._record: LeaseRecord | None = None
        self._endpoint: str | None = None
        self._dead_predecessors: set[str] = set()
        self._runtime: LorenzRuntime | None = None
        self._stop: Callable[[], None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_heartbeat_error: str | None = None
        self._stop_requested: str | None = None
        self._request_stop: Callable[..., None] | None = None
        self.lost: LorenzError | None = None
        """Why this process stopped leading (``leadership_lost``, ``claim_owner_lost``)."""
        self.departure = departure if departure is not None else Departure()
        """The runtime's switch that leaves its workers running once leadership is lost (the
        host passes the same one to the runtime it assembles)."""

    # -- lifecycle, in the order the composition root calls it -----------------------------------

    @property
    def provider(self) -> LeadershipProvider:
        return self._provider

    @property
    def record(self) -> LeaseRecord | None:
        """The lease as we hold it (``None`` before :meth:`acquire` and after release)."""
        return self._record

    @property
    def generation(self) -> int | None:
        """The controller generation of our holding (``None`` before :meth:`acquire`)."""
        return self._provider.generation

    @property
    def workflow_path(self) -> Path:
        """The canonical WORKFLOW.md path this daemon leads."""
        return self._workflow_path

    @property
    def claim_owner(self) -> str:
        return self._claim_owner

    @property
    def endpoint(self) -> str | None:
        return self._endpoint

    @property
    def runtime(self) -> LorenzRuntime | None:
        """The runtime once :meth:`bind` attached it."""
        return self._runtime

    async def acquire(self) -> LeaseRecord:
        """Take the lease; raises ``daemon_already_running`` / ``daemon_lock_stale`` as coded.

        The previous record is read first: if the lease then changes hands from it to us, its
        holder was verifiably dead (the provider replaces nothing else), and its claims and
        orphaned agents are ours to clean up.
        """
        previous = await self._read_quietly()
        record = await self._provider.acquire()
        self._record = record
        if previous is not None and previous.holder != record.holder:
            if record.transitions == previous.transitions + 1:
                self._dead_predecessors.add(previous.holder)
            else:
                # NB: another daemon took the lease and died between our read and our acquire.
                # The holder we saw is dead as well; the one we replaced is unknown to us, but
                # the store proves it dead by its pid and start time all the same.
                if _is_dead_record(previous):
                    self._dead_predecessors.add(previous.holder)
        forced = getattr(self._provider, "forced_from", None)
        if isinstance(forced, LeaseRecord):
            # NB: not a dead predecessor: nothing proves it dead, so none of its agents are
            # killed and its claims come back only once its owner row goes stale; what the
            # takeover buys is the fence — the generation below outranks it in the store.
            logger.warning(
                "leadership taken over by force lease=%s from holder=%s host=%s "
                "generation=%s (was %s)",
                getattr(self._provider, "path", "?"),
                forced.holder,
                forced.host,
                self._provider.generation,
                forced.generation,
            )
        logger.info(
            "leadership acquired lease=%s holder=%s transitions=%s generation=%s replaced=%s",
            getattr(self._provider, "path", "?"),
            record.holder,
            record.transitions,
            self._provider.generation,
            sorted(self._dead_predecessors) or "-",
        )
        return record

    async def fence(self, store: ClaimStore) -> None:
        """Fence ``store`` with our generation before anything writes it.

        From then on every claim write is conditioned on the store's fence; the first one
        refused (a newer leader fenced the store) stops this process like a lost lease —
        without cancelling its workers, which the new leader adopts.
        """
        generation = self._provider.generation
        if generation is None or not isinstance(store, GenerationFence):
            return
        await store.fence(generation, on_fenced=self._lose)
        logger.info("claim store fenced generation=%s", generation)

    async def recover(self, store: ClaimStore) -> list[int]:
        """Kill the dead predecessors' agents, then declare them dead to a durable store.

        Runs before hydration and before anything is dispatched. The order matters: first no
        process of theirs may still work on an issue, then their claims may come back as
        failure retries. Returns the pids killed.
        """
        if not self._dead_predecessors:
            return []
        owners = set(self._dead_predecessors)
        killed = await asyncio.to_thread(kill_orphans, owners)
        sql_store = sql_store_of(store)
        if sql_store is not None:
            marked = await sql_store.mark_owners_dead(owners)
            if marked:
                logger.info("claim owners declared dead owners=%s", marked)
        return killed

    def bind(
        self,
        runtime: LorenzRuntime,
        *,
        stop: Callable[[], None] | None = None,
        request_stop: Callable[..., None] | None = None,
    ) -> None:
        """Attach the runtime whose lanes :meth:`info` reports and which a lost lease stops.

        ``stop`` is what a lost lease calls (at once: no drain, nothing written);
        ``request_stop(now=…)`` is what ``POST /api/v1/stop`` calls (the host's drain).
        """
        self._runtime = runtime
        self._stop = stop or runtime.stop
        self._request_stop = request_stop

    async def set_endpoint(self, endpoint: str | None) -> None:
        """Publish where the control routes answer (``http://…`` or ``unix:///…``)."""
        self._endpoint = endpoint
        await self._provider.set_endpoint(endpoint)
        self._record = await self._read_quietly() or self._record
        logger.info("control endpoint published endpoint=%s", endpoint)

    def start_heartbeat(self, *, claim_heartbeat: Callable[[], Awaitable[None]] | None) -> None:
        """Renew the lease (and the claim owner row) every ``daemon.heartbeat_ms``."""
        if self._heartbeat_task is None:
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(claim_heartbeat), name="lorenz-daemon-heartbeat"
            )

    async def prove(self) -> None:
        """The runtime's ``prove_leadership``: raise (and stop it) unless we still hold the lease.

        A read, not a write: ticks can come much faster than heartbeats, and an fsync per tick
        would buy nothing — the lease only changes hands under its guard.
        """
        if self.lost is not None:
            raise self.lost
        current = await self._provider.read()
        mine = self._record.holder if self._record is not None else None
        if current is None or current.holder != mine:
            self._lose(
                LeadershipLost(
                    path=getattr(self._provider, "path", None),
                    holder=current.holder if current is not None else None,
                )
            )
            assert self.lost is not None
            raise self.lost

    def request_stop(self, *, reason: str, now: bool = False) -> None:
        """A graceful shutdown (``POST /api/v1/stop``); asking twice is one shutdown.

        It drains first (see :class:`lorenz.daemon.shutdown.GracefulStop`); ``now`` (``lorenz
        stop --now``) stops at once, also in the middle of a drain.
        """
        if self._stop_requested is None:
            self._stop_requested = reason
            logger.info("stop requested reason=%s now=%s", reason, now)
        if self._request_stop is not None:
            self._request_stop(now=now)
        elif self._stop is not None:
            self._stop()

    def raise_if_lost(self) -> None:
        """After the runtime returned: fail the process (exit 1) if leadership was lost."""
        if self.lost is not None:
            raise self.lost

    async def release(self) -> None:
        """Stop heartbeating and give the lease back (last step of the shutdown order)."""
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:
            await self._provider.release()
        finally:
            self._record = None
        logger.info("leadership released workflow=%s", self._workflow_path)

    # -- what GET /api/v1/daemon answers ------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """JSON-safe: owner, endpoint, heartbeat, workflow, leadership store, lanes."""
        record = self._record
        now = datetime.datetime.now(datetime.UTC)
        heartbeat_at = record.heartbeat_at if record is not None else None
        info: dict[str, Any] = {
            "holder": record.holder if record is not None else None,
            "pid": record.pid if record is not None else None,
            "process_started_at": _iso_epoch(record.process_started_at if record else None),
            "host": record.host if record is not None else None,
            "claim_owner": self._claim_owner,
            "endpoint": self._endpoint,
            "heartbeat_at": heartbeat_at.isoformat() if heartbeat_at is not None else None,
            "heartbeat_age_ms": (
                round((now - heartbeat_at).total_seconds() * 1000.0, 1)
                if heartbeat_at is not None
                else None
            ),
            "heartbeat_ms": self._settings.heartbeat_ms,
            "stale_ms": self._settings.stale_ms,
            "acquired_at": record.acquired_at.isoformat() if record is not None else None,
            "transitions": record.transitions if record is not None else None,
            "workflow_path": str(self._workflow_path),
            "lease_path": str(getattr(self._provider, "path", "")) or None,
            "leadership_store": self._provider.kind.value,
            "last_heartbeat_error": self._last_heartbeat_error,
            "stop_requested": self._stop_requested,
        }
        runtime = self._runtime
        if runtime is not None:
            snapshot = runtime.snapshot()
            lanes = snapshot.lanes
            info["app_status"] = snapshot.app_status.value
            info["lanes"] = {
                "running": len(lanes.running),
                "reserving": len(lanes.reserving),
                "retrying": len(lanes.retrying),
                "blocked": len(lanes.blocked),
            }
            info["waiting"] = waiting_summary(lanes.waiting)
            info["poll"] = snapshot.poll.to_dict()
            info["config_error"] = (
                snapshot.config_error.to_dict() if snapshot.config_error is not None else None
            )
            if snapshot.budget is not None:
                info["budget"] = snapshot.budget.to_dict()
        return info

    # -- internals ----------------------------------------------------------------------------

    async def _read_quietly(self) -> LeaseRecord | None:
        try:
            return await self._provider.read()
        except LorenzError:
            return None  # unreadable: acquire() decides what it means

    def _lose(self, error: LorenzError) -> None:
        if self.lost is None:
            self.lost = error
            logger.error("stopping: %s", error)
            # NB: before the runtime stops: its runs' workers belong to whoever leads now, and a
            # live worker is never killed because this process may no longer write.
            self.departure.leave(reason=error.code)
        if self._stop is not None:
            self._stop()

    async def _heartbeat_loop(self, claim_heartbeat: Callable[[], Awaitable[None]] | None) -> None:
        interval_s = self._settings.heartbeat_ms / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._provider.heartbeat()
                if claim_heartbeat is not None:
                    await claim_heartbeat()
            except (LeadershipLost, ClaimOwnerLost, ClaimGenerationStale) as exc:
                self._lose(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a full disk, a busy guard: next beat retries
                self._last_heartbeat_error = str(exc)
                logger.warning("heartbeat failed (retrying): %s", exc)
            else:
                self._last_heartbeat_error = None
                if self._record is not None:
                    self._record = await self._read_quietly() or self._record


def _is_dead_record(record: LeaseRecord) -> bool:
    return local_liveness(record.pid, record.process_started_at) is Liveness.DEAD


def _iso_epoch(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat()


def wants_daemon(settings: WorkflowSettings, *, once: bool) -> bool:
    """Daemon mode: feature ``daemon`` (``daemon.enabled``), and never for ``--once``."""
    return settings.daemon.enabled and not once


def control_transport(
    daemon: Daemon,
    *,
    settings: WorkflowSettings,
    port: int | None,
    environ: Mapping[str, str] | None,
) -> DaemonControl:
    """The attachment serving the control routes: HTTP when a port is set, else a unix socket.

    ``port`` is ``--port``; it wins over ``server.port``.
    """
    from lorenz.daemon.control import DaemonControl
    from lorenz.daemon.sockets import socket_path_for

    chosen = port if port is not None else settings.server.port
    if chosen is not None:
        return DaemonControl(daemon=daemon, host=settings.server.host, port=chosen)
    return DaemonControl(
        daemon=daemon, socket_path=socket_path_for(daemon.workflow_path, environ=environ)
    )


def with_control_transport(
    factories: Sequence[Callable[[LoadedWorkflow, Any], Any]], *, daemon: Daemon
) -> list[Callable[[LoadedWorkflow, Any], Any]]:
    """The host's attachment factories for daemon mode: the plain HTTP server's factory is
    replaced by the daemon's transport, which serves the same app plus the control routes."""
    from lorenz.server import attachment_factory as plain_server

    kept = [factory for factory in factories if factory is not plain_server]
    return [
        *kept,
        lambda loaded, options: control_transport(
            daemon, settings=loaded.settings, port=options.port, environ=options.environ
        ),
    ]


def waiting_summary(rows: Sequence[WaitingRow]) -> list[dict[str, Any]]:
    """The waiting lane as ``lorenz status`` shows it: who waits, since when, for what."""
    return [
        {
            "identifier": row.identifier,
            "question": row.question,
            "asked_at": row.asked_at.isoformat(),
        }
        for row in rows
    ]
