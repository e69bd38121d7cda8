"""A launcher that forks local workers from one warm interpreter instead of starting Python per run.

Starting a worker with ``lorenz worker --spec - --detach`` costs a fresh interpreter and every
import a worker needs — about 0.25 to 0.3 CPU-s per run on a 2-core machine, most of the CPU a
run of a small agent costs, and the wall time before its agent starts (issue #11: with 10
slots the launches alone kept both cores busy, a drain of 100 issues took twice as long as with
in-process agents, and the controller polled and reconciled through all of it). The single host
therefore keeps one *launcher* (``lorenz worker --launcher``): it imports the worker's code
once, reads launch requests (one JSON line each) on its stdin, and for each forks a child that
does what the launch command does — create the state directory, probe it, write the spec —
and then *becomes* the worker (a session of its own) instead of forking it: its readiness line,
once it serves, is the launch command's JSON line, which the launcher tags with the request's
id and writes on its stdout. One fork a run, not two: a launch child that only forked, waited
and answered cost a run ~6 ms of CPU, most of it the kernel's fork and copy-on-write faults
(issue #35).

What the launch command's exec gave for free, the launcher keeps:

* the worker is detached as before (a session of its own, not the controller's child);
* NB: a forked process keeps the environment block of the interpreter it was forked from, so
  the run's handle cannot be *in* ``/proc/<pid>/environ`` of the worker
  (``lorenz.workers.leftovers`` finds the launch command and a just-forked worker by it). The
  chain dies with its parent instead (``PR_SET_PDEATHSIG``): the launcher with the controller,
  a worker with the launcher until its socket is bound and its status written — from then on
  a successor's probe finds it and adopts it. So a controller killed mid-launch leaves no
  unmarked worker behind that a retry could run beside. The agent and hooks a worker starts
  are exec'd and carry the handle as before;
* the worker is the launcher's child, not the controller's: the launcher reaps the workers that
  end while it runs; once it is gone they are the init process's (or the nearest subreaper's);
* the launcher's own environment carries ``LORENZ_WORKER_HANDLE=launcher`` (never a handle),
  so the orphan sweep of in-process agents passes it and its workers by, as it passes workers.

Only on Linux (the parent-death signal); elsewhere, and for any custom worker command, the
launch command is run per launch as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import itertools
import json
import logging
import os
import re
import select
import selectors
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from lorenz.codes import ErrorCode
from lorenz.workers import image_limits, profiling
from lorenz.workers.launch import LaunchResult, WorkerLaunchError, configure_worker_logging
from lorenz.workers.spec import RunSpec, encode_spec, is_handle
from lorenz.workers.states import HANDLE_ENV, LOG_NAME

logger = logging.getLogger(__name__)

LAUNCHER_MARK: Final = "launcher"
"""``LORENZ_WORKER_HANDLE`` of the launcher (and so of every worker it forks): not a handle."""

_PR_SET_PDEATHSIG: Final = 1
_GONE: Final[Mapping[str, Any]] = {
    "ok": False,
    "code": ErrorCode.WORKER_LAUNCH_FAILED,
    "message": "the worker launcher exited during the launch; the run is retried",
}
"""The answer of a launcher that is gone (identity-compared: one retry with a new launcher)."""
_READ_CHUNK: Final = 1 << 16


def parent_death_signal_supported() -> bool:
    return sys.platform.startswith("linux")


def set_parent_death_signal(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent thread ends (0: never).

    ``False`` when it cannot be set (not Linux, no libc).
    """
    if not parent_death_signal_supported():
        return False
    try:
        return int(_libc().prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    # NB: loaded once (in the launcher, before its forks): a CDLL is a dlopen and ~60 attribute
    # lookups, and a launch child and its worker each set the signal twice.
    return ctypes.CDLL(None, use_errno=True)


# -- the launcher process (``lorenz worker --launcher``) ---------------------------------------


class _Child:
    __slots__ = ("fd", "handle", "ident", "output", "pid")

    def __init__(self, *, ident: object, pid: int, fd: int, handle: str | None) -> None:
        self.ident = ident
        self.pid = pid
        self.fd = fd
        self.handle = handle
        """The run's handle: its state directory has the worker's log, where a worker that
        died before it was ready says why."""
        self.output = b""


def serve_launches(
    *, state_root: Path, parent: int, preload: Sequence[str] | None = None
) -> int:
    """Fork a worker per request line on stdin until stdin ends; answers on stdout.

    A request is ``{"id": ID, "handle": HANDLE, "spec": {...}}`` (start a worker; ``handle``
    optional) or ``{"kill": ID}`` (give up on one: its fork is killed unless it answered — it
    serves then, and a successor adopts it). An answer is ``{"id": ID, "answer": {...}}`` with
    the launch command's answer. ``preload``: the agent protocols whose runners are imported
    before the first fork (``None``: all).

    NB: a start request as the controller writes it (:data:`_START_REQUEST`) is not parsed
    here: its fork parses the spec. Every page this process writes after a fork is copied, and
    the original left to the fork just made; decoding a spec here (a dict of strings over many
    allocator pools) was ~30 of the ~165 pages a launch cost in the bench, ~70 for a 3 KiB spec
    (issue #35).
    """
    if not set_parent_death_signal(signal.SIGKILL) or os.getppid() != parent:
        return 1  # NB: the controller is gone already (or cannot take us along): no launches
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    profiling.begin("launcher")
    # NB: its stderr goes nowhere; each fork's goes to its worker's log (launch.py).
    configure_worker_logging()
    _preload(protocols=preload)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, None)
    # NB: the workers are this process's children: each is reaped as it ends (SIGCHLD wakes the
    # select), not at the next request — until then it is a zombie that still "exists" to
    # whoever waits for its pid to go (the controller collecting a finished run).
    wake = os.pipe()
    for fd in wake:
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, _on_child_exit)
    signal.set_wakeup_fd(wake[1], warn_on_full_buffer=False)
    selector.register(wake[0], selectors.EVENT_READ, _CHILD_EXITED)
    children: dict[int, _Child] = {}
    pending = b""
    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.data is _CHILD_EXITED:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake[0], _READ_CHUNK)
                    continue
                if key.data is None:
                    chunk = os.read(0, _READ_CHUNK)
                    if not chunk:
                        return 0  # the controller closed its end (or died): nothing to answer
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip():
                            _request(line, state_root=state_root, children=children,
                                     selector=selector, wake=wake)
                    continue
                child: _Child = key.data
                data = os.read(child.fd, _READ_CHUNK)
                if data:
                    child.output += data
                    continue
                selector.unregister(child.fd)
                os.close(child.fd)
                del children[child.fd]
                _answer(child.ident, _child_answer(child, state_root=state_root))
            _reap()
    finally:
        for child in children.values():
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
        profiling.end("launcher")


def _preload(*, protocols: Sequence[str] | None = None) -> None:
    """Import what a launch child and its worker run, once, before any fork.

    NB: only the runners of ``protocols`` when named: the ACP SDK's schema alone is ~0.5 CPU-s
    of imports and tens of MiB that every worker would share for nothing when no agent speaks
    ACP. A run whose protocol was not preloaded (a reloaded workflow added one) imports its
    runner in its worker, after the fork: slower to start, never wrong.
    """
    import lorenz.workers.worker  # noqa: F401
    from lorenz.agents import preload_runners

    preload_runners(protocols)
    _libc()
    _rehearse()
    # NB: the launcher's entry (``lorenz worker --launcher``) kept TLS out of the modules just
    # loaded; what a worker imports after its fork may have it again.
    image_limits.let_in()
    # NB: the imported modules are never freed: keep the collector (in every forked child too)
    # from walking them, and from touching their pages (copy-on-write stays shared).
    gc.freeze()
    _return_free_heap()


def _return_free_heap() -> None:
    """Give the C heap's free pages back to the system before the first fork.

    NB: the imports and the rehearsal leave freed memory in malloc's heap; its pages stay
    resident in the image every worker shares until the allocator returns them (measured: 0.55
    MiB of the launcher's ~23 MiB, issue #35). A page handed out again later is a fresh one
    in whichever process touches it — as a copied page would be. Best effort: only glibc has
    ``malloc_trim``.
    """
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _rehearse() -> None:
    """Run, once and before any fork, what every worker runs: :data:`REHEARSED_RUNS` whole
    runs of a :class:`~lorenz.workers.worker.Worker` — its socket served, a ``command`` agent
    running ``true``, its journal written — with a client that attaches, reads to the final
    record and acks as the controller does.

    NB: Python 3.11 writes into a code object the first times it runs (its warm-up counter on
    every call until the 8th, then the specialising interpreter's inline caches), and asyncio
    makes some of its objects at first use. A worker doing all of that first after its fork
    copies every page it writes: rehearsed here, those writes land once in the launcher's
    pages instead of in each worker's (issue #35). NB: hooks are not rehearsed: they run in
    a login shell (``sh -lc``), and a profile that takes a second would hold the first
    dispatch back by as many seconds as rehearsed runs. Best effort: the rehearsal leaves no
    file, socket, thread or child behind, and one that fails changes nothing else.
    """
    from lorenz.tasks import install_child_watcher, run_on_fresh_loop

    install_child_watcher()  # NB: the watcher the worker uses (launch.py), no waiter thread
    try:
        # NB: each whole run on a loop of its own, made and closed by the workers' own runner
        # (launch._become_worker): what a worker calls once a run is rehearsed as many times.
        # A short name: the worker's socket path must fit a unix socket's 107 bytes.
        with tempfile.TemporaryDirectory(prefix="lzr-") as scratch:
            for run in range(REHEARSED_RUNS):
                run_on_fresh_loop(_rehearse_run(Path(scratch) / str(run), run=run))
    except Exception as exc:  # noqa: BLE001 - a warm-up; a worker does all of it anyway
        logger.debug("the launcher's rehearsal failed: %s", exc)


async def _rehearse_run(root: Path, *, run: int) -> None:
    """One whole run of a worker in ``root``, attached to and acked like the controller
    (within :data:`REHEARSAL_TIMEOUT_S`)."""
    async with asyncio.timeout(REHEARSAL_TIMEOUT_S):
        await _rehearse_whole_run(root, run=run)


async def _rehearse_whole_run(root: Path, *, run: int) -> None:
    from lorenz.config.kinds import AgentLaunch, AgentProtocol
    from lorenz.workers.journal import FINAL
    from lorenz.workers.launch import read_spec
    from lorenz.workers.spec import IssueSpec, encode_spec
    from lorenz.workers.states import write_spec
    from lorenz.workers.worker import Worker

    state_dir = root / "s"
    workspace = root / "w"
    state_dir.mkdir(parents=True)
    workspace.mkdir()
    # NB: the spec goes through JSON and is written as a launch child does (_launch_one): its
    # readers and checks are what every worker runs first.
    encoded = encode_spec(RunSpec(
        workflow=str(root / "WORKFLOW.md"),
        issue=IssueSpec(id="rehearsal", identifier="REHEARSAL-1", title="", state="Todo"),
        run=run,
        prompt="",
        agent=AgentLaunch(protocol=AgentProtocol.COMMAND, command="true", login_shell=False),
        workspace=str(workspace),
        max_turns=1,
        linger_ms=int(REHEARSAL_TIMEOUT_S * 1000),
    ))
    spec = read_spec(_Bytes(encoded))
    write_spec(state_dir, spec, encoded=encoded)
    worker = Worker(spec=spec, state_dir=state_dir)
    running: asyncio.Task[Any] | None = None
    writer: asyncio.StreamWriter | None = None
    try:
        await worker.bind()
        running = asyncio.create_task(worker.run())
        reader, writer = await asyncio.open_unix_connection(str(worker.socket_path))
        writer.write(b'{"op":"attach","after_seq":0}\n')
        while line := await reader.readline():
            message = json.loads(line)
            record = message.get("record") if message.get("op") == "record" else None
            if isinstance(record, dict) and record.get("kind") == FINAL:
                writer.write(json.dumps({"op": "ack", "seq": record["seq"]}).encode() + b"\n")
                await writer.drain()
                break
        await running
    finally:
        # NB: however it ended (a socket path too long, the bound hit), nothing stays open: the
        # forks would inherit it.
        if running is not None and not running.done():
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await worker.close()


REHEARSED_RUNS: Final = 12
"""Whole worker runs the launcher rehearses before its first fork: more than the 8 calls after
which Python 3.11 stops counting a function's calls in its code object, so that what a worker
calls once a run is no longer written (copied) in every worker. Measured (issue #35, 200 runs,
10 slots): a worker's own pages 5.9 → 5.5 to 5.6 MiB with 12 runs, 5.6 to 5.7 with 3."""
REHEARSAL_TIMEOUT_S: Final = 10.0
"""Each whole run's bound (a hung rehearsal must not keep the launcher from serving)."""

_CHILD_EXITED: Final = object()
"""The selector's mark of the SIGCHLD wake-up pipe."""


def _on_child_exit(signum: int, frame: object) -> None:
    """Nothing: the signal's byte on the wake-up pipe is what wakes the launcher's select."""


_START_REQUEST: Final = re.compile(
    rb'\{"id": (?P<id>[0-9]{1,18}), "handle": "(?P<handle>[A-Za-z0-9._-]{1,200})", "spec": '
)
"""The head of a start request as :class:`Launcher` writes it; the spec follows, then ``}``."""


def _request(
    line: bytes,
    *,
    state_root: Path,
    children: dict[int, _Child],
    selector: selectors.BaseSelector,
    wake: tuple[int, int],
) -> None:
    head = _START_REQUEST.match(line)
    spec: bytes | object
    if head is not None and line.endswith(b"}"):
        ident: object = int(head["id"])
        handle: object = head["handle"].decode()
        spec = line[head.end():-1]  # NB: parsed (and validated) by the fork
    else:
        try:
            request = json.loads(line)
        except ValueError:
            return
        if not isinstance(request, dict):
            return
        if "kill" in request:
            for child in children.values():
                if child.ident == request["kill"] and not _answered(child):
                    with contextlib.suppress(OSError):
                        os.kill(child.pid, signal.SIGKILL)
            return
        ident = request.get("id")
        spec = request.get("spec")
        handle = spec.get("handle") if isinstance(spec, dict) else None
    read_fd, write_fd = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:  # the launch child, the worker itself once the spec is written
        status = 1
        try:
            profiling.begin("launch")
            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != launcher:
                os._exit(1)
            os.close(read_fd)
            for fd in children:
                os.close(fd)
            selector.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in wake:
                os.close(fd)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(write_fd, 1)
            os.close(null)
            os.close(write_fd)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            status = _launch_one(spec, state_root=state_root)
        except BaseException as exc:  # noqa: BLE001 - reported as the answer, then _exit
            _write_line(1, {"ok": False, "code": ErrorCode.WORKER_LAUNCH_FAILED,
                            "message": f"the launcher failed: {type(exc).__name__}: {exc}"})
        finally:
            profiling.end("launch")
            os._exit(status)
    os.close(write_fd)
    children[read_fd] = _Child(
        ident=ident, pid=pid, fd=read_fd,
        handle=handle if isinstance(handle, str) and is_handle(handle) else None,
    )
    selector.register(read_fd, selectors.EVENT_READ, children[read_fd])


def _launch_one(raw: bytes | object, *, state_root: Path) -> int:
    """In the launch child: what ``lorenz worker --spec - --detach`` does (same answers).
    ``raw``: the spec's JSON as the request carried it, or the spec decoded already."""
    from lorenz.model import LorenzError
    from lorenz.workers.launch import answer, read_spec, start_from_spec

    try:
        data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
        spec = read_spec(_Bytes(data))
        os.environ[HANDLE_ENV] = spec.handle
        return start_from_spec(
            spec, state_root=state_root, detach=True, die_with_parent=True, in_place=True,
            encoded=data,
        )
    except LorenzError as exc:
        answer({"ok": False, "code": exc.code, "message": exc.message})
        return 2


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, limit: int) -> bytes:
        return self._data[:limit]


def _answered(child: _Child) -> bool:
    """Whether the fork wrote its answer (read here now if it waits in the pipe).

    NB: a worker answers only once it serves with its status written, and starts its agent only
    after that: a fork that answered is never killed (its run goes on, and the controller's
    successor adopts it); one that did not has no agent yet, and dies with nothing to adopt.
    """
    if child.output:
        return True
    ready, _, _ = select.select([child.fd], [], [], 0)
    if ready:
        with contextlib.suppress(OSError):
            child.output += os.read(child.fd, _READ_CHUNK)
    return bool(child.output)


def _child_answer(child: _Child, *, state_root: Path) -> dict[str, Any]:
    for line in reversed(child.output.splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    log = state_root.absolute() / child.handle / LOG_NAME if child.handle is not None else None
    if log is not None and log.exists():
        return {"ok": False, "code": ErrorCode.WORKER_START_FAILED,
                "message": f"the worker exited before it was ready; see {log}"}
    return {"ok": False, "code": ErrorCode.WORKER_LAUNCH_FAILED,
            "message": "the launch child ended without an answer (killed?)"}


def _answer(ident: object, answer: Mapping[str, Any]) -> None:
    _write_line(1, {"id": ident, "answer": dict(answer)})


def _write_line(fd: int, payload: Mapping[str, Any]) -> None:
    data = (json.dumps(dict(payload)) + "\n").encode()
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# -- the controller's side ---------------------------------------------------------------------


class Launcher:
    """The controller's launcher process: one per event loop, started by :meth:`warm_up` (the
    single host calls it at start-up) or else at the first launch.

    NB: it dies with the thread that started it (the loop's); a launcher found dead is started
    again at the next launch, and the launches it had in flight fail (``worker_launch_failed``)
    like a launch command that died.
    """

    def __init__(
        self,
        *,
        command: Sequence[str],
        state_root: Path,
        env: Mapping[str, str],
        preload: Sequence[str] | None = None,
    ):
        self.command = tuple(command)
        self.preload = tuple(preload) if preload is not None else None
        """The agent protocols whose runners the launcher imports before it forks (``None``:
        every protocol's)."""
        self.state_root = state_root
        self.env = {**env, HANDLE_ENV: LAUNCHER_MARK}
        self._process: asyncio.subprocess.Process | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[asyncio.subprocess.Process] | None = None
        self._warming: asyncio.Task[asyncio.subprocess.Process] | None = None
        self._pending: dict[int, asyncio.Future[Mapping[str, Any]]] = {}
        self._ids = itertools.count(1)
        self.starts = 0
        """How many launcher processes this object started (for tests and diagnostics)."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def warm_up(self) -> bool:
        """Start the launcher now, in the background, on the running loop (``False``: no loop
        runs, or it is started already).

        NB: the launcher's own start (an interpreter, the worker's imports, the agents'
        runners: ~1 CPU-s, seconds of wall time on a loaded machine) would otherwise sit
        between the first dispatch and its agent; started with the controller, it runs while
        the first poll and claims do. A start that fails here is tried again by the first
        launch, which then reports the error.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        warming = self._warming
        if warming is not None and not warming.done() and warming.get_loop() is loop:
            return False
        if self._loop is loop and self._starting is not None:
            return False
        self._warming = loop.create_task(self._running(), name="lorenz-launcher-warm-up")
        self._warming.add_done_callback(_consume_start)
        return True

    async def launch(self, spec: RunSpec, *, timeout_s: float) -> LaunchResult:
        # NB: the spec's JSON spliced into the request as it is (not a dict dumped once more).
        spec_json = encode_spec(spec)
        result = await self._launch_once(spec, spec_json, timeout_s=timeout_s)
        if result is _GONE:
            # NB: a launcher that died before the loop saw its exit (a kill -9 a moment ago)
            # still looked alive: the request went nowhere. A new launcher gets it, once. Safe
            # even if the dead one had started the worker: the handle is the same, so that
            # worker is found by the new launch (and followed), never started twice.
            logger.info("the worker launcher was gone; starting a new one handle=%s",
                        spec.handle)
            await self.close()
            result = await self._launch_once(spec, spec_json, timeout_s=timeout_s)
        if result.get("ok") is True:
            return LaunchResult.from_json(result)
        raise WorkerLaunchError(
            str(result.get("message") or "the worker could not be started"),
            code=str(result.get("code") or ErrorCode.WORKER_LAUNCH_FAILED),
        )

    async def _launch_once(
        self, spec: RunSpec, spec_json: bytes, *, timeout_s: float
    ) -> Mapping[str, Any]:
        """The launcher's answer to one request; :data:`_GONE` when the launcher was gone."""
        process = await self._running()
        assert process.stdin is not None
        ident = next(self._ids)
        answer: asyncio.Future[Mapping[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = answer
        try:
            process.stdin.write(
                b'{"id": %d, "handle": "%s", "spec": %s}\n'
                % (ident, spec.handle.encode(), spec_json)
            )
            await process.stdin.drain()
            async with asyncio.timeout(timeout_s):
                return await answer
        except TimeoutError:
            self._send({"kill": ident})
            raise WorkerLaunchError(
                f"starting the worker {spec.handle} took longer than {timeout_s:.0f} s",
                code=ErrorCode.WORKER_LAUNCH_TIMEOUT,
            ) from None
        except (ConnectionError, BrokenPipeError):
            return _GONE
        finally:
            self._pending.pop(ident, None)

    def _send(self, payload: Mapping[str, Any]) -> None:
        process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                process.stdin.write(json.dumps(dict(payload)).encode() + b"\n")

    async def _running(self) -> asyncio.subprocess.Process:
        """The launcher of the running loop, started (once, for concurrent launches) if need be."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            await self.close()
            self._loop = loop
        start = self._starting
        if start is not None and start.done() and (
            start.cancelled() or start.exception() is not None or not self._alive()
        ):
            start = None
        if start is None:
            await self.close()
            self._loop = loop
            start = self._starting = loop.create_task(self._start())
        return await asyncio.shield(start)

    def _alive(self) -> bool:
        process, reader = self._process, self._reader
        return (
            process is not None
            and process.returncode is None
            and reader is not None
            and not reader.done()
        )

    async def _start(self) -> asyncio.subprocess.Process:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                "--launcher",
                "--state-root",
                str(self.state_root),
                "--parent",
                str(os.getpid()),
                *(["--preload", ",".join(self.preload)] if self.preload is not None else []),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=self.env,
                # NB: a session of its own, like the launch command it replaces: a terminal's
                # ^C to the controller's group does not reach launches in flight.
                start_new_session=True,
            )
        except OSError as exc:
            raise WorkerLaunchError(
                f"could not run {self.command[0]}: {exc.strerror or exc}; check the worker "
                "command",
                code=ErrorCode.WORKER_LAUNCH_FAILED,
            ) from exc
        self._process = process
        self.starts += 1
        self._reader = asyncio.get_running_loop().create_task(self._read_answers(process))
        return process

    async def _read_answers(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            while True:
                try:
                    line = await process.stdout.readline()
                except (ValueError, ConnectionError):
                    break  # NB: an over-long line: the launcher is not ours to trust
                if not line:
                    break
                with contextlib.suppress(ValueError):
                    message = json.loads(line)
                    ident = message.get("id") if isinstance(message, dict) else None
                    future = self._pending.get(ident) if isinstance(ident, int) else None
                    answer = message.get("answer") if future is not None else None
                    if future is not None and not future.done() and isinstance(answer, dict):
                        future.set_result(answer)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_result(_GONE)

    async def close(self) -> None:
        """End the launcher (its launches in flight are killed with it)."""
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            if starting.get_loop() is asyncio.get_running_loop():
                # NB: not cancelled: the launcher may be forked already, its process not yet
                # handed back, and a cancelled start would leave it running unowned. A start
                # is a fork and an exec; the launcher's imports come after it.
                await asyncio.wait([starting])
            else:
                starting.cancel()
        process, self._process = self._process, None
        reader, self._reader = self._reader, None
        warming, self._warming = self._warming, None
        if warming is not None and not warming.done() and warming is not asyncio.current_task():
            # NB: a warm-up that has not run yet would start a launcher after this close.
            warming.cancel()
        if process is None:
            return
        same_loop = self._loop is asyncio.get_running_loop()
        if not same_loop or process.stdin is None:
            # NB: its pipes belong to another (closed) loop: only the signal reaches it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            return
        process.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _consume_start(task: asyncio.Task[asyncio.subprocess.Process]) -> None:
    """A warm-up's failure is the first launch's to report (it starts the launcher again)."""
    if not task.cancelled():
        task.exception()
