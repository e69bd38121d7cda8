"""The worker: one process that executes exactly one run and outlives the controller.

A controller that stops, crashes, is upgraded or loses leadership must not take the agents
with it (containerd's per-container shim is the model: it keeps a container's stdio and exit
status while containerd itself restarts). So a run is this process, in a POSIX session of its
own, holding the agent session (through :mod:`lorenz.agents`, the same code the controller
used to run in-process), the ``before_run``/``after_run`` hooks, and the journal. Controllers
come and go as clients of its control socket.

What the worker does not have is credentials: host-side tools (``linear_graphql``) and the
between-turn "is the issue still active?" question are *calls* to whichever controller is
attached. With none attached, a call waits up to ``controller_wait_ms`` for one, then is
answered without it (a failed tool call; "not active", which ends the run between turns).

The end of a run is its final record (outcome, usage, exit status). The worker then lingers
``linger_ms`` for a controller to collect it (``ack``) and exits; the record stays in the
journal for a controller that comes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import json
import logging
import os
import shutil
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from lorenz.agents import (
    TRACKER_SECRET_ENV,
    AgentRunRequest,
    AgentRunResult,
    agent_environment,
    build_runner,
    make_session_stores,
)
from lorenz.codes import ErrorCode
from lorenz.model import AgentUpdate, LorenzError, WorkerPhase
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.tasks import run_to_completion
from lorenz.workers.control_socket import ControlConnection, ControlListener, socket_answers
from lorenz.workers.journal import FINAL, JournalWriter, Record, read_journal
from lorenz.workers.protocol import (
    PROTOCOL_VERSION,
    SOCKET_NAME,
    SOCKET_PATH_LIMIT,
    ProtocolError,
    decode,
    encode,
)
from lorenz.workers.spec import RunSpec, SpecInvalid, decode_spec
from lorenz.workers.states import HANDLE_ENV, SPEC_NAME, STATUS_NAME, WorkerStateError
from lorenz.workspaces import HookName, run_hook

logger = logging.getLogger(__name__)


class ExitStatus(enum.IntEnum):
    """The worker's exit status, also written into the final record."""

    SUCCESS = 0
    FAILED = 1
    SPEC_INVALID = 2
    CANCELED = 3


class _ConnectionClosed(Exception):
    """A client's socket closed while the worker was writing to it."""


class _Client(ControlConnection):
    """A connection to the control socket: a controller, or another attached reader."""

    def __init__(
        self, sock: socket.socket, *, worker: Worker, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(sock, loop=loop)
        self._worker = worker
        self.attached = False
        self.controller = False

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(encode(message))

    def line_received(self, line: bytes) -> None:
        try:
            message = decode(line)
        except ProtocolError as exc:
            self.lost(exc)
            return
        self._worker._handle(self, message)

    def lost(self, error: ProtocolError | None) -> None:
        if error is not None:
            self.send({"op": "error", "code": ErrorCode.PROTOCOL_ERROR, "message": str(error)})
        # NB: what is queued (this error above all) is written before the socket closes.
        self._worker._client_gone(self)


@dataclasses.dataclass(eq=False)
class _Call:
    id: int
    method: str
    params: dict[str, Any]
    idempotent: bool
    future: asyncio.Future[Any]
    sent_to: _Client | None = None


class ForwardedTools:
    """The :class:`~lorenz.agents.ToolHandler` of a worker: every call goes to the controller."""

    def __init__(self, worker: Worker, specs: list[dict[str, Any]]) -> None:
        self._worker = worker
        self._specs = specs

    def tool_specs(self) -> list[dict[str, Any]]:
        return [dict(spec) for spec in self._specs]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            result = await self._worker.call(
                "tool", {"name": name, "arguments": dict(arguments)}, idempotent=False
            )
        except _ConnectionClosed:
            result = {
                "success": False,
                "output": "the controller's connection closed during the call; it may or may "
                "not have run — check before repeating it",
            }
        except TimeoutError:
            result = {
                "success": False,
                "output": "no controller is attached to run host-side tools right now",
            }
        if not isinstance(result, dict):
            result = {"success": False, "output": "the controller answered with no result"}
        self._worker.journal(
            "tool_call", {"name": name, "success": bool(result.get("success"))}
        )
        return result


class Worker:
    """Runs one :class:`RunSpec` in ``state_dir`` and serves its control socket."""

    def __init__(self, *, spec: RunSpec, state_dir: Path) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.socket_path = state_dir / SOCKET_NAME
        self.phase = WorkerPhase.STARTING
        self._journal = JournalWriter(
            state_dir / "journal.jsonl", max_bytes=spec.journal_max_bytes
        )
        self._clients: set[_Client] = set()
        self._controller: _Client | None = None
        self._calls: dict[int, _Call] = {}
        self._call_ids = itertools.count(1)
        self._run_task: asyncio.Task[Record] | None = None
        self._cancel_reason: str | None = None
        self._acked = asyncio.Event()
        self._usage: dict[str, int] | None = None
        self._cost_usd: float | None = None
        self._listener: ControlListener | None = None
        self._agent_task: asyncio.Task[AgentRunResult] | None = None

    # -- the journal ---------------------------------------------------------------------

    def journal(self, kind: str, data: Mapping[str, Any]) -> Record:
        """Write a record, then send it to every attached client (in that order, always)."""
        record = self._journal.append(kind, data)
        # NB: the journal's own line spliced into the message, not the record encoded again:
        # the same JSON object (a client decodes it alike), one encoding per record.
        # A record whose payload the journal dropped still goes out whole to who is attached.
        journaled = self._journal.last_line
        if journaled is not None:
            line = b'{"op":"record","record":' + journaled[:-1] + b"}\n"
        else:
            line = encode({"op": "record", "record": record.to_json()})
        for client in list(self._clients):
            if client.attached:
                client.send_raw(line)
        return record

    # -- lifecycle -----------------------------------------------------------------------

    async def bind(self) -> None:
        """Open the control socket (0600). Raises :class:`WorkerStateError` when another worker
        for this run is alive, or when the path is too long for a unix socket."""
        path = str(self.socket_path)
        if len(os.fsencode(path)) > SOCKET_PATH_LIMIT:
            raise WorkerStateError(
                f"the control socket path {path} is longer than {SOCKET_PATH_LIMIT} bytes; "
                "use a shorter worker state directory",
                code=ErrorCode.WORKER_SOCKET_PATH_TOO_LONG,
            )
        if self.socket_path.exists():
            if socket_answers(path):
                raise WorkerStateError(
                    f"a worker for {self.spec.handle} is already serving {path}",
                    code=ErrorCode.WORKER_ALREADY_RUNNING,
                )
            self.socket_path.unlink()
        self._listener = ControlListener(
            path=path, accepted=self._accepted, loop=asyncio.get_running_loop()
        )
        _write_status(self.state_dir, pid=os.getpid(), handle=self.spec.handle)

    async def run(self) -> ExitStatus:
        """Execute the run to its final record, linger, close; the exit status."""
        if self._journal.final is not None:
            # A worker that finished before; a new one must not run the agent again.
            await self.close()
            return ExitStatus(int(self._journal.final.data.get("exit_status", 1)))
        loop = asyncio.get_running_loop()

        def on_signal(signum: int, _frame: object) -> None:
            loop.call_soon_threadsafe(self.cancel, f"signal {signal.Signals(signum).name}")

        # NB: plain handlers that hand over to the loop, not loop.add_signal_handler: on Python
        # 3.11 each add (and each remove at the loop's close) checks the signal against
        # signal.valid_signals(), ~64 enum members built per call — about a tenth of a short
        # run's worker CPU. SIGHUP gets a Python no-op (not SIG_IGN, which the agent and hooks
        # would inherit through exec): a closed terminal does not end the run.
        previous = {sig: signal.getsignal(sig) for sig in _RUN_SIGNALS}
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, _ignore_signal)
        try:
            self._run_task = asyncio.create_task(self._execute())
            try:
                final = await asyncio.shield(self._run_task)
            except asyncio.CancelledError:
                final = await self._run_task
            if self.spec.linger_ms > 0 and not self._acked.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.spec.linger_ms / 1000):
                        await self._acked.wait()
            await self.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        return ExitStatus(int(final.data["exit_status"]))

    async def close(self) -> None:
        """Stop serving: every client's queued lines written (within a bound), sockets closed,
        the socket path removed, the journal closed. Closing again does nothing more."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        clients = list(self._clients)
        self._clients.clear()
        self._controller = None
        for client in clients:
            client.close()
        # NB: let every client take what is queued for it (the final record above all):
        # exiting with lines unwritten would cut a client's last message in half.
        flushing = [client.finished for client in clients if not client.finished.done()]
        if flushing:
            await asyncio.wait(flushing, timeout=FLUSH_TIMEOUT_S)
        for client in clients:
            client.abort()
        self._journal.close()

    def cancel(self, reason: str) -> None:
        """Stop the run: the agent is stopped, ``after_run`` runs, the run ends ``canceled``."""
        if self._cancel_reason is not None or self._run_task is None or self._run_task.done():
            return
        self._cancel_reason = reason or "canceled"
        self.journal("cancel", {"reason": self._cancel_reason})
        self._agent_task_cancel()

    def _agent_task_cancel(self) -> None:
        task = self._agent_task
        if task is not None and not task.done():
            task.cancel()

    async def _execute(self) -> Record:
        spec = self.spec
        self.journal(
            "run_started",
            {
                "handle": spec.handle,
                "pid": os.getpid(),
                "generation": spec.generation,
                "issue_id": spec.issue.id,
                "identifier": spec.issue.identifier,
                "attempt": spec.attempt,
                "workspace": spec.workspace,
            },
        )
        workspace = Path(spec.workspace)
        outcome, error, code = "success", None, None
        question: AgentQuestion | None = None
        result: AgentRunResult | None = None
        work = asyncio.create_task(self._work(workspace))
        self._agent_task = work
        if self._cancel_reason is not None:
            work.cancel()  # NB: a cancel that arrived before the work began.
        try:
            result = await work
        except asyncio.CancelledError:
            if not work.cancelled():
                raise
            outcome, code = "canceled", "canceled"
            error = self._cancel_reason or "canceled"
        except LorenzError as exc:
            outcome, error, code = "failed", exc.message, exc.code
            asked = getattr(exc, "question", None)
            question = asked if isinstance(asked, AgentQuestion) else None
        except Exception as exc:
            logger.exception("the run crashed")
            outcome, error, code = "failed", f"{type(exc).__name__}: {exc}", "worker_crashed"
        finally:
            self._agent_task = None
        self.phase = WorkerPhase.CLEANUP
        if _is_dir(workspace):
            await self._after_run(workspace)
        self.phase = WorkerPhase.FINAL
        status = {
            "success": ExitStatus.SUCCESS,
            "failed": ExitStatus.FAILED,
            "canceled": ExitStatus.CANCELED,
        }[outcome]
        return self.journal(
            FINAL,
            {
                "outcome": outcome,
                "error": error,
                "error_code": code,
                "reason": self._cancel_reason,
                "usage": self._usage,
                "cost_usd": self._cost_usd,
                "turns": result.turns if result else None,
                "session_id": result.session_id if result else None,
                "stop_reason": result.stop_reason if result else None,
                "question": question.to_json() if question is not None else None,
                "exit_status": int(status),
            },
        )

    async def _work(self, workspace: Path) -> AgentRunResult:
        """Prepare the workspace, run ``before_run``, then the agent session."""
        spec = self.spec
        self.phase = WorkerPhase.PREPARING
        if spec.create_workspace and not _is_dir(workspace):
            _make_dir(workspace)
            try:
                await self._hook("after_create", workspace)
            except BaseException:
                # NB: as the workspace manager does locally: a workspace whose after_create
                # failed, timed out or was cancelled is removed, so the next attempt creates
                # it again and runs the hook again (a half-made clone is never reused).
                await run_to_completion(self._discard_new(workspace))
                raise
        if not _is_dir(workspace):
            raise WorkerStateError(
                f"workspace {workspace} does not exist on this host; the controller prepares "
                "it (local placement) or the spec asks the worker to create it (remote)",
                code=ErrorCode.WORKSPACE_MISSING,
            )
        await self._hook("before_run", workspace)
        self.phase = WorkerPhase.AGENT
        request = self._request(workspace)
        make_session_stores(request.env)
        return await build_runner(spec.agent.protocol).run(request)

    def _request(self, workspace: Path) -> AgentRunRequest:
        spec = self.spec
        return AgentRunRequest(
            issue=spec.issue.to_issue(),
            attempt=spec.attempt,
            slot_index=spec.slot_index,
            prompt=spec.prompt,
            workspace=workspace,
            settings=spec.agent,
            max_turns=spec.max_turns,
            env=self._environment(spec.env),
            on_update=self._on_update,
            issue_is_active=self._issue_is_active,
            continuation_prompt=spec.continuation_prompt,
            tools=ForwardedTools(self, spec.tools) if spec.tools else None,
            answer=SessionResume.from_json(spec.answer) if spec.answer is not None else None,
            scratch_dir=self.state_dir,
        )

    def _environment(self, given: Mapping[str, str]) -> dict[str, str]:
        """``given`` (over this process's environment with ``inherit_env``) plus the handle."""
        if not self.spec.inherit_env:
            return {**given, HANDLE_ENV: self.spec.handle}
        inherited = agent_environment(base=os.environ, secret_names=TRACKER_SECRET_ENV)
        return {**inherited, **given, HANDLE_ENV: self.spec.handle}

    def _on_update(self, update: AgentUpdate) -> None:
        if update.usage is not None:
            self._usage = update.usage.to_dict()
        if update.cost_usd is not None:
            self._cost_usd = update.cost_usd
        self.journal("agent_update", agent_update_data(update))

    async def _issue_is_active(self) -> bool:
        try:
            answer = await self.call("issue_active", {}, idempotent=True)
        except TimeoutError:
            self.journal("controller_absent", {"question": "issue_active"})
            return False
        return answer is True

    async def _discard_new(self, workspace: Path) -> None:
        logger.warning("removing new workspace after failed after_create workspace=%s",
                       workspace)
        await asyncio.to_thread(shutil.rmtree, workspace, True)
        self.journal("workspace_discarded", {"workspace": str(workspace)})

    async def _hook(self, name: HookName, workspace: Path) -> None:
        script: str | None = getattr(self.spec.hooks, name)
        if not script:
            return
        self.journal("hook_started", {"hook": name})
        try:
            result = await run_hook(
                name=name,
                script=script,
                cwd=workspace,
                # NB: LORENZ_HOOK names the hook, as for hooks the workspace manager runs.
                env=self._environment({**self.spec.hooks.env, "LORENZ_HOOK": name}),
                timeout_ms=self.spec.hooks.timeout_ms,
                log_context={"handle": self.spec.handle},
            )
        except LorenzError as exc:
            self.journal(
                "hook_finished", {"hook": name, "ok": False, "error": str(exc), "code": exc.code}
            )
            raise
        self.journal("hook_finished", {"hook": name, "ok": True, "output": result.output})

    async def _after_run(self, workspace: Path) -> None:
        # NB: shielded: a second cancel (or SIGTERM) during cleanup must not skip after_run.
        task = asyncio.ensure_future(self._hook("after_run", workspace))
        # NB: after_run's failure is logged by the hook runner; cleanup goes on.
        with contextlib.suppress(Exception):
            while not task.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(task)
            task.result()

    # -- calls to the controller ---------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any], *, idempotent: bool) -> Any:
        """Ask the attached controller; wait ``controller_wait_ms`` for one if none is.

        Raises :class:`TimeoutError` when no controller answered in time, and
        ``_ConnectionClosed`` when a non-idempotent call's controller went away mid-call.
        """
        loop = asyncio.get_running_loop()
        call = _Call(
            id=next(self._call_ids),
            method=method,
            params=params,
            idempotent=idempotent,
            future=loop.create_future(),
        )
        self._calls[call.id] = call
        try:
            if self._controller is not None:
                self._send_call(call, self._controller)
            # NB: a call nobody received yet is sent by _set_controller when one attaches.
            async with asyncio.timeout(self.spec.controller_wait_ms / 1000):
                return await call.future
        finally:
            self._calls.pop(call.id, None)

    def _send_call(self, call: _Call, client: _Client) -> None:
        call.sent_to = client
        client.send({"op": "call", "id": call.id, "method": call.method, "params": call.params})

    def _client_gone(self, client: _Client) -> None:
        client.close()
        self._clients.discard(client)
        if self._controller is client:
            self._controller = None
            for other in self._clients:
                if other.controller and other.attached:
                    self._set_controller(other)
        for call in list(self._calls.values()):
            if call.sent_to is client and not call.future.done():
                if call.idempotent:
                    call.sent_to = None
                    if self._controller is not None:
                        self._send_call(call, self._controller)
                else:
                    call.future.set_exception(_ConnectionClosed())

    def _set_controller(self, client: _Client) -> None:
        self._controller = client
        for call in self._calls.values():
            if call.sent_to is None and not call.future.done():
                self._send_call(call, client)

    # -- the control socket --------------------------------------------------------------

    def _accepted(self, sock: socket.socket) -> None:
        """A peer of this uid connected (:class:`ControlListener` refused the others)."""
        client = _Client(sock, worker=self, loop=asyncio.get_running_loop())
        self._clients.add(client)
        client.send(
            {
                "op": "hello",
                "version": PROTOCOL_VERSION,
                "handle": self.spec.handle,
                "pid": os.getpid(),
                "generation": self.spec.generation,
                "last_seq": self._journal.last_seq,
            }
        )
        client.start()

    def _handle(self, client: _Client, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "attach":
            after = message.get("after_seq", 0)
            if not isinstance(after, int) or isinstance(after, bool) or after < 0:
                client.send({"op": "error", "code": ErrorCode.BAD_REQUEST, "message": "after_seq"})
                return
            # NB: read and subscribe in one step (no await in between): every record is either
            # in this replay or sent live, never both, never neither.
            for record in read_journal(self._journal.path, after_seq=after):
                client.send({"op": "record", "record": record.to_json()})
            client.send({"op": "live", "seq": self._journal.last_seq})
            if client.closed:
                return  # NB: dropped or gone during the replay: its loss is on its way.
            client.attached = True
            if message.get("role", "controller") == "controller":
                client.controller = True
                self._set_controller(client)
        elif op == "ping":
            client.send(
                {
                    "op": "pong",
                    "id": message.get("id"),
                    "last_seq": self._journal.last_seq,
                    "phase": self.phase.value,
                }
            )
        elif op == "cancel":
            reason = message.get("reason")
            self.cancel(str(reason)[:500] if reason else "canceled")
        elif op == "reply":
            call_id = message.get("id")
            call = self._calls.get(call_id) if isinstance(call_id, int) else None
            if call is not None and call.sent_to is client and not call.future.done():
                call.future.set_result(message.get("result"))
        elif op == "ack":
            final = self._journal.final
            if final is not None and message.get("seq") == final.seq:
                self._acked.set()
        else:
            client.send(
                {"op": "error", "code": ErrorCode.UNKNOWN_OP, "message": f"unknown op {op!r}"},
            )


_RUN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

FLUSH_TIMEOUT_S: Final = 5.0
"""How long :meth:`Worker.close` waits for clients to take what is queued for them."""


def _ignore_signal(_signum: int, _frame: object) -> None:
    """SIGHUP does nothing to a worker (it outlives the terminal that started its controller).

    NB: a handler that does nothing, not ``signal.SIG_IGN``: an ignored signal stays ignored
    across ``exec``, so the agent and its hooks would inherit it; a handler resets to the
    default in them.
    """


def agent_update_data(update: AgentUpdate) -> dict[str, Any]:
    """The journal form of an :class:`AgentUpdate` (``timestamp_ms`` is the record's ``t``)."""
    data: dict[str, Any] = {"event": update.event}
    if update.message is not None:
        data["message"] = update.message
    if update.session_id is not None:
        data["session_id"] = update.session_id
    if update.usage is not None:
        data["usage"] = update.usage.to_dict()
    if update.cost_usd is not None:
        data["cost_usd"] = update.cost_usd
    if update.rate_limits is not None:
        data["rate_limits"] = dict(update.rate_limits)
    if update.pid is not None:
        data["pid"] = update.pid
    if update.payload is not None:
        data["payload"] = dict(update.payload)
    return data


def _is_dir(path: Path) -> bool:
    return path.is_dir()


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _start_time(pid: int) -> float:
    """What ``psutil.Process(pid).create_time()`` answers, read from ``/proc`` (else psutil).

    NB: psutil's own arithmetic (the start in clock ticks since boot, over the ticks a second,
    plus ``btime``), so :func:`~lorenz.workers.states.worker_pid` finds the same value with
    psutil; without psutil's ``Process``, whose setup is some sixteen Python functions a
    worker would run once after its fork (~0.1 MiB of its own pages; issue #35).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # NB: after the last ")": the command name before it may hold spaces and ")".
            ticks = stat.read().rsplit(b")", 1)[1].split()[19]
        with open("/proc/stat", "rb") as system:
            boot = next(float(line.split()[1]) for line in system if line.startswith(b"btime"))
    except (OSError, IndexError, ValueError, StopIteration):
        return float(psutil.Process(pid).create_time())
    return float(ticks) / _CLOCK_TICKS + boot


def _write_status(state_dir: Path, *, pid: int, handle: str) -> None:
    """``worker.json``: the pid and its start time (a reused pid is not this worker)."""
    status = {
        "pid": pid,
        "create_time": _start_time(pid),
        "handle": handle,
    }
    tmp = state_dir / f".{STATUS_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle_file:
        json.dump(status, handle_file)
    os.replace(tmp, state_dir / STATUS_NAME)


def load_spec(state_dir: Path) -> RunSpec:
    """The spec in ``state_dir``; raises :class:`WorkerStateError` ``worker_spec_invalid``."""
    path = state_dir / SPEC_NAME
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise WorkerStateError(
            f"cannot read the run spec {path}: {exc.strerror or exc}",
            code=ErrorCode.WORKER_SPEC_INVALID,
        ) from None
    try:
        return decode_spec(raw)
    except SpecInvalid as exc:
        raise WorkerStateError(
            f"the run spec {path} is invalid at {exc.where}: {exc.message}; it was "
            "written by an incompatible lorenz version",
            code=ErrorCode.WORKER_SPEC_INVALID,
        ) from None
