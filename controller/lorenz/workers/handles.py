"""Handles: the controller's grip on one worker, wherever it runs, across reconnects.

A handle remembers the last sequence number it collected. Following a run is then a loop:
attach after that seq, take records in order, and on a lost connection ask the transport what
became of the worker — alive: attach again after the same seq; final: read the rest from the
journal; gone: the run died (:class:`WorkerGone`); unknown: keep asking for a while, then
:class:`WorkerUnknown`. Every record is delivered exactly once and in order, across any number
of reconnects and controller restarts (a new controller builds a new handle with the last seq
it had persisted).

Transports hide where the worker is: :class:`LocalTransport` (this host's state directory) and
:class:`~lorenz.workers.ssh.SshTransport` (a remote host, reached through ssh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError
from lorenz.workers.client import CallHandlers, ConnectionLost, RecordSink, WorkerConnection
from lorenz.workers.forkserver import Launcher, parent_death_signal_supported
from lorenz.workers.journal import JOURNAL_NAME, Record, accepts_after, read_journal
from lorenz.workers.launch import (
    LOCAL_WORKER_COMMAND,
    LaunchResult,
    launch_arguments,
    run_launch_command,
    worker_process_env,
)
from lorenz.workers.leftovers import end_run
from lorenz.workers.protocol import LINE_LIMIT_BYTES, SOCKET_NAME
from lorenz.workers.spec import RunSpec
from lorenz.workers.states import (
    HANDLE_ENV,
    Probe,
    ProbeState,
    default_state_root,
    probe_local,
)

logger = logging.getLogger(__name__)


class WorkerGone(LorenzError):
    """The worker ended without a final record (killed, crashed, its host rebooted)."""

    code = ErrorCode.WORKER_GONE


class WorkerUnknown(LorenzError):
    """The worker's fate cannot be proven (its host or socket does not answer)."""

    code = ErrorCode.WORKER_UNKNOWN


class WorkerKillUnconfirmed(LorenzError):
    """A run's processes could not be proven killed (their host or API server does not
    answer, a Pod's deletion is held): the slot stays held and the kill is tried again."""

    code = ErrorCode.WORKER_KILL_UNCONFIRMED


class SequenceGap(LorenzError):
    """Records did not continue the collected sequence: a bug or a foreign journal."""

    code = ErrorCode.WORKER_SEQUENCE_GAP


class Transport(Protocol):
    """Where workers run, and how to reach them."""

    name: str

    async def launch(self, spec: RunSpec) -> LaunchResult: ...

    async def probe(self, handle: str) -> Probe: ...

    async def read_journal(self, handle: str, *, after_seq: int) -> list[Record]: ...

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...

    async def kill(self, handle: str) -> None:
        """Kill every process of the run ``handle`` (worker, agent, hooks) and return once
        they are proven gone; :class:`WorkerKillUnconfirmed` when that cannot be shown (the
        caller keeps the slot held and tries again)."""
        ...

    async def close(self) -> None: ...


class LocalTransport:
    """Workers on this host, under ``state_root``."""

    name = "local"

    def __init__(
        self,
        *,
        state_root: Path | None = None,
        command: Sequence[str] = LOCAL_WORKER_COMMAND,
        env: Mapping[str, str] | None = None,
        secret_values: Sequence[str] = (),
        launch_timeout_s: float = 60.0,
        forkserver: bool = False,
        preload: Sequence[str] | None = None,
    ) -> None:
        self.state_root = state_root or default_state_root()
        self.command = tuple(command)
        self.env = worker_process_env(base=env, secret_values=secret_values)
        """The worker processes' environment (tracker secrets stripped by name and value)."""
        self.launch_timeout_s = launch_timeout_s
        self.launcher: Launcher | None = (
            Launcher(
                command=self.command, state_root=self.state_root, env=self.env, preload=preload
            )
            if forkserver and parent_death_signal_supported()
            else None
        )
        """With ``forkserver`` (on Linux): workers are forked by one warm launcher process
        instead of a launch command per run (:mod:`lorenz.workers.forkserver`); ``preload``
        names the agent protocols whose runners it imports before forking (``None``: all)."""

    def warm_up(self) -> bool:
        """Start the warm launcher now, in the background (see :meth:`Launcher.warm_up`);
        ``False`` without one (no ``forkserver``, not Linux) or when it is started already."""
        return self.launcher.warm_up() if self.launcher is not None else False

    def state_dir(self, handle: str) -> Path:
        return self.state_root / handle

    async def launch(self, spec: RunSpec) -> LaunchResult:
        if self.launcher is not None:
            return await self.launcher.launch(spec, timeout_s=self.launch_timeout_s)
        return await run_launch_command(
            [*self.command, *launch_arguments(str(self.state_root))],
            spec=spec,
            # NB: the launch command carries the run's mark (and so does the worker it forks):
            # a successor that finds the handle gone kills a launch still in flight
            # (lorenz.workers.leftovers) instead of retrying beside it.
            env={**self.env, HANDLE_ENV: spec.handle},
            timeout_s=self.launch_timeout_s,
        )

    async def probe(self, handle: str) -> Probe:
        return await probe_local(self.state_dir(handle))

    async def read_journal(self, handle: str, *, after_seq: int) -> list[Record]:
        return read_journal(self.state_dir(handle) / JOURNAL_NAME, after_seq=after_seq)

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(
            str(self.state_dir(handle) / SOCKET_NAME), limit=LINE_LIMIT_BYTES
        )

    async def kill(self, handle: str) -> None:
        state_dir = self.state_dir(handle)
        alive = await asyncio.to_thread(end_run, state_dir)
        if alive:
            raise WorkerKillUnconfirmed(
                f"processes of the run {handle} survived SIGKILL (stuck in the kernel?) "
                f"pids={alive}; the slot stays held and the kill is tried again"
            )

    async def close(self) -> None:
        if self.launcher is not None:
            await self.launcher.close()


class WorkerHandle:
    """One run's worker as the controller sees it."""

    def __init__(
        self,
        *,
        transport: Transport,
        handle: str,
        last_seq: int = 0,
        handlers: CallHandlers | None = None,
        unknown_patience_s: float = 30.0,
        heartbeat_s: float = 15.0,
    ) -> None:
        self.transport = transport
        self.handle = handle
        self.last_seq = last_seq
        """The newest seq delivered to the consumer (persist it to re-attach without a gap)."""
        self.handlers = handlers or CallHandlers()
        self.unknown_patience_s = unknown_patience_s
        """How long :meth:`follow` keeps probing an ``unknown`` worker before giving up."""
        self.heartbeat_s = heartbeat_s
        """While following, a ping this often; a missed pong drops the connection (a frozen
        worker or a dead network path then goes through the probe table)."""
        self.final: Record | None = None
        self.connection: WorkerConnection | None = None
        self.attaches = 0
        """How many times :meth:`follow` attached (1 + reconnects)."""
        self.journal_reads = 0
        """How many times :meth:`follow` had to read records from the journal instead."""

    async def probe(self) -> Probe:
        return await self.transport.probe(self.handle)

    async def connect(self, *, on_record: RecordSink | None = None) -> WorkerConnection:
        reader, writer = await self.transport.connect(self.handle)
        return await WorkerConnection.open(
            reader, writer, handlers=self.handlers, on_record=on_record
        )

    async def follow(self, on_record: Callable[[Record], None]) -> Record:
        """Deliver every record after :attr:`last_seq` to ``on_record``; return the final one.

        Raises :class:`WorkerGone` or :class:`WorkerUnknown` when the run cannot be followed to
        its end.
        """
        unknown_since: float | None = None
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        while self.final is None:
            ended: asyncio.Future[None] = loop.create_future()

            def take(record: Record | None, ended: asyncio.Future[None] = ended) -> None:
                # NB: runs in the connection's reading task. A follow that is being cancelled
                # takes nothing more: the records stay in the journal for the next attach.
                if ended.done() or (me is not None and me.cancelling()):
                    return
                if record is None:
                    ended.set_exception(ConnectionLost("the worker closed the connection"))
                    return
                try:
                    self._deliver(record, on_record)
                except SequenceGap as exc:
                    ended.set_exception(exc)
                    return
                if record.is_final:
                    ended.set_result(None)

            try:
                connection = await self.connect(on_record=take)
            except (OSError, ConnectionLost) as exc:
                probe = await self.probe()
                if probe.state is ProbeState.FINAL:
                    await self._catch_up(on_record)
                    break
                if probe.state is ProbeState.GONE:
                    await self._catch_up(on_record)
                    if self.final is not None:
                        break
                    raise WorkerGone(
                        f"the worker of {self.handle} ended without a final record "
                        f"({probe.detail or exc}); the run is retried as a failure",
                    ) from None
                # Alive but not reachable, or unknown: wait, within bounds.
                now = loop.time()
                unknown_since = unknown_since if unknown_since is not None else now
                if now - unknown_since > self.unknown_patience_s:
                    raise WorkerUnknown(
                        f"the worker of {self.handle} cannot be reached "
                        f"({probe.state.value}: {probe.detail or exc})",
                    ) from None
                await asyncio.sleep(0.2 if probe.state is ProbeState.ALIVE else 1.0)
                continue
            unknown_since = None
            self.connection = connection
            self.attaches += 1
            heartbeat = asyncio.create_task(self._heartbeat(connection))
            try:
                await connection.attach(after_seq=self._resume_after)
                await ended
                assert self.final is not None
                await connection.ack(self.final.seq)
            except ConnectionLost:
                # The worker or the socket went away mid-stream: probe and re-attach from the
                # last delivered record on the next turn of the loop.
                logger.debug("worker connection lost; re-attaching handle=%s", self.handle)
            finally:
                heartbeat.cancel()
                self.connection = None
                await connection.close()
                if ended.done() and not ended.cancelled():
                    ended.exception()  # NB: marks it retrieved when attach failed first
        assert self.final is not None
        return self.final

    async def _heartbeat(self, connection: WorkerConnection) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await connection.ping(timeout_s=self.heartbeat_s)
            except (ConnectionLost, TimeoutError):
                logger.warning("worker %s missed a heartbeat; reconnecting", self.handle)
                await connection.close()
                return

    async def cancel(self, reason: str) -> bool:
        """Ask the worker to end the run; ``False`` when it cannot be reached."""
        connection = self.connection
        if connection is not None and not connection.closed.is_set():
            with contextlib.suppress(ConnectionLost):
                await connection.cancel(reason)
                return True
        try:
            connection = await self.connect()
        except (OSError, ConnectionLost):
            return False
        try:
            await connection.cancel(reason)
            return True
        except ConnectionLost:
            return False
        finally:
            await connection.close()

    async def _catch_up(self, on_record: Callable[[Record], None]) -> None:
        self.journal_reads += 1
        for record in await self.transport.read_journal(self.handle, after_seq=self._resume_after):
            self._deliver(record, on_record)

    @property
    def _resume_after(self) -> int:
        # NB: one record early: if the last one collected was the final record (a controller
        # killed between collecting it and acting on it), it comes back and ends the follow
        # — without being delivered a second time.
        return max(self.last_seq - 1, 0)

    def _deliver(self, record: Record, on_record: Callable[[Record], None]) -> None:
        if record.seq <= self.last_seq:
            if record.is_final:
                self.final = record
            return  # never deliver twice
        if not accepts_after(record, self.last_seq):
            # NB: a ``journal_dropped`` record (a capped journal) may jump: it stands for the
            # records it replaced.
            raise SequenceGap(
                f"worker {self.handle} sent seq {record.seq} after {self.last_seq}",
            )
        self.last_seq = record.seq
        if record.is_final:
            self.final = record
        try:
            on_record(record)
        except Exception:
            logger.exception("a record consumer raised; record %d of %s", record.seq, self.handle)


async def launch(
    spec: RunSpec, *, transport: Transport, handlers: CallHandlers | None = None
) -> tuple[WorkerHandle, LaunchResult]:
    """Start (or find) the worker of ``spec``; the handle to follow it."""
    result = await transport.launch(spec)
    return WorkerHandle(transport=transport, handle=result.handle, handlers=handlers), result
