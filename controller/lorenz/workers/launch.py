"""Starting a worker so that nothing the controller does to itself can take the run along.

Both placements start a worker the same way: the controller runs ``lorenz worker --spec -
--state-root ROOT --detach`` (locally, or on the far side of ``ssh``) with the spec on stdin.
That command creates the run's state directory (0700) and ``spec.json`` (0600), forks the
worker, and the worker calls ``setsid()``: a new POSIX session and process group, no
controlling terminal, stdio on ``worker.log``. The command itself exits as soon as the worker's
socket is bound and prints one JSON line saying so. Hence the worker

* is not in the controller's process group (``kill -9 -<pgid>`` of the controller misses it),
* is not the controller's child (no zombie to reap, nothing dies with the parent), and
* does not hold the ssh session's stdio (ssh returns; the session ending does not hang it up).

Launching is idempotent per handle: a handle whose worker is alive, finished or unknown is not
started again (the answer says which), and a handle whose worker died is refused — a new
attempt has a new handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from lorenz.agents import TRACKER_SECRET_ENV, agent_environment
from lorenz.codes import ErrorCode
from lorenz.model import LorenzError
from lorenz.tasks import install_child_watcher, run_on_fresh_loop
from lorenz.workers import profiling
from lorenz.workers.journal import JOURNAL_NAME, read_journal
from lorenz.workers.protocol import SOCKET_NAME
from lorenz.workers.spec import RunSpec, SpecInvalid, decode_spec, encode_spec
from lorenz.workers.states import (
    LOG_NAME,
    ProbeState,
    WorkerStateError,
    create_state_dir,
    probe_local,
    write_spec,
)

logger = logging.getLogger(__name__)

LOCAL_WORKER_COMMAND: Final = (sys.executable, "-m", "lorenz.cli.worker")
"""How a local worker is started: this interpreter, so the worker runs the same installation."""

SPEC_LIMIT_BYTES: Final = 4 * 1024 * 1024


class WorkerLaunchError(LorenzError):
    """A worker could not be started; ``code`` says why."""

    code = ErrorCode.WORKER_LAUNCH_FAILED


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    handle: str
    state_dir: str
    """On the host the worker runs on."""
    socket: str
    pid: int | None
    existing: str | None = None
    """``None`` for a fresh start; else the probe state of the worker already there."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LaunchResult:
        pid = raw.get("pid")
        existing = raw.get("existing")
        return cls(
            handle=str(raw["handle"]),
            state_dir=str(raw["state_dir"]),
            socket=str(raw["socket"]),
            pid=pid if isinstance(pid, int) else None,
            existing=existing if isinstance(existing, str) else None,
        )


def worker_process_env(
    *, base: Mapping[str, str] | None = None, secret_values: Sequence[str] = ()
) -> dict[str, str]:
    """The worker process's own environment: the controller's without tracker secrets."""
    return agent_environment(
        base=os.environ if base is None else base,
        secret_names=TRACKER_SECRET_ENV,
        secret_values=secret_values,
    )


def launch_arguments(state_root: str) -> list[str]:
    """The arguments after ``lorenz worker`` that start a worker from a spec on stdin."""
    return ["--spec", "-", "--state-root", state_root, "--detach"]


async def run_launch_command(
    argv: Sequence[str],
    *,
    spec: RunSpec,
    env: Mapping[str, str],
    timeout_s: float,
    unreachable_status: int | None = None,
) -> LaunchResult:
    """Run ``argv`` (``… worker --spec - --state-root ROOT --detach``); parse its answer.

    ``unreachable_status`` is the exit status meaning "the host could not be reached" (ssh:
    255), reported as ``worker_host_unreachable``.
    """
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        raise WorkerLaunchError(
            f"could not run {argv[0]}: {exc.strerror or exc}; check the worker command",
            code=ErrorCode.WORKER_LAUNCH_FAILED,
        ) from exc
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await process.communicate(encode_spec(spec))
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise WorkerLaunchError(
            f"starting the worker {spec.handle} took longer than {timeout_s:.0f} s",
            code=ErrorCode.WORKER_LAUNCH_TIMEOUT,
        ) from None
    answer = _last_json_line(out)
    if answer is not None and answer.get("ok") is True:
        return LaunchResult.from_json(answer)
    if answer is not None and isinstance(answer.get("code"), str):
        raise WorkerLaunchError(str(answer.get("message")), code=str(answer["code"]))
    tail = err.decode(errors="replace").strip()[-500:]
    if unreachable_status is not None and process.returncode == unreachable_status:
        raise WorkerLaunchError(
            f"the worker host could not be reached: {tail or 'no output'}; check that it is up "
            "and that ssh to it works without a prompt",
            code=ErrorCode.WORKER_HOST_UNREACHABLE,
        )
    raise WorkerLaunchError(
        f"the worker command exited with status {process.returncode}: "
        f"{tail or 'no output'}",
        code=ErrorCode.WORKER_LAUNCH_FAILED,
    )


def _last_json_line(out: bytes) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None


# -- the worker side of the launch (what ``lorenz worker`` runs) --------------------------


def answer(payload: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(dict(payload)) + "\n")
    sys.stdout.flush()


def read_spec(stream: Any) -> RunSpec:
    raw = stream.read(SPEC_LIMIT_BYTES + 1)
    if len(raw) > SPEC_LIMIT_BYTES:
        raise WorkerStateError(
            f"the run spec is larger than {SPEC_LIMIT_BYTES} bytes",
            code=ErrorCode.WORKER_SPEC_INVALID,
        )
    try:
        return decode_spec(raw)
    except SpecInvalid as exc:
        raise WorkerStateError(
            f"the run spec is invalid at {exc.where}: {exc.message}; controller and "
            "worker must run compatible lorenz versions",
            code=ErrorCode.WORKER_SPEC_INVALID,
        ) from None


def start_from_spec(
    spec: RunSpec,
    *,
    state_root: Path,
    detach: bool,
    die_with_parent: bool = False,
    in_place: bool = False,
    encoded: bytes | None = None,
) -> int:
    """Create the state directory for ``spec`` and start (or find) its worker.

    ``die_with_parent``: the worker dies with this process until it serves (see
    :mod:`lorenz.workers.forkserver`, whose forks call this). ``in_place`` (with
    ``detach``): this process, a launcher's fork, becomes the worker itself instead of forking
    it (see :func:`serve`); it never returns then. ``encoded``: the JSON document ``spec`` was
    read from, written as ``spec.json`` as it is (see :func:`~lorenz.workers.states.write_spec`).
    """
    state_dir = create_state_dir(state_root, spec.handle)
    if _is_empty_dir(state_dir):
        # NB: a new run's directory (the usual launch): no journal, no status, no socket, so
        # the probe could only say "gone, never ran"; skip its event loop and connect attempt.
        write_spec(state_dir, spec, encoded=encoded)
        return serve(
            state_dir, detach=detach, die_with_parent=die_with_parent, spec=spec,
            in_place=in_place,
        )
    probe = asyncio.run(probe_local(state_dir, timeout_s=2.0))
    journal = read_journal(state_dir / JOURNAL_NAME) if probe.state is ProbeState.GONE else []
    if probe.state is not ProbeState.GONE:
        answer(
            {
                "ok": True,
                "handle": spec.handle,
                "state_dir": str(state_dir),
                "socket": str(state_dir / SOCKET_NAME),
                "pid": probe.pid,
                "existing": probe.state.value,
            }
        )
        return 0
    if journal:
        raise WorkerStateError(
            f"the worker of {spec.handle} already ran and died without a final record; a new "
            "attempt gets a new handle",
            code=ErrorCode.WORKER_HANDLE_USED,
        )
    write_spec(state_dir, spec, encoded=encoded)
    return serve(
        state_dir, detach=detach, die_with_parent=die_with_parent, spec=spec, in_place=in_place
    )


def _is_empty_dir(path: Path) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is None


def serve(
    state_dir: Path,
    *,
    detach: bool,
    die_with_parent: bool = False,
    spec: RunSpec | None = None,
    in_place: bool = False,
) -> int:
    """Run the worker of ``state_dir``; with ``detach``, in a new session, answering once
    its socket is bound (the answer is one JSON line on stdout).

    ``die_with_parent`` (with ``detach``): the forked worker is killed if this process ends
    before the worker's socket is bound and its status written. ``spec``: the spec just
    written there (``None``: read from ``state_dir``). ``in_place`` (with ``detach``): this
    process is already a child of its own (a launcher's fork, its parent-death signal set, its
    stdout the launcher's answer pipe), so it becomes the worker without a second fork — one
    fork a run instead of two, and no launch child's copy-on-write faults — and answers on
    that pipe once it serves; it never returns.
    """
    if spec is None:
        from lorenz.workers.worker import load_spec

        spec = load_spec(state_dir)
    if not detach:
        return asyncio.run(_serve(spec, state_dir, ready_fd=None))
    if in_place:
        sys.stdout.flush()
        # NB: its own descriptor for the answer: stdout goes to the worker's log below, and
        # the launcher reads the answer until this last end of its pipe closes.
        _become_worker(
            spec, state_dir, ready_fd=os.dup(1), die_with_parent=die_with_parent, parent=None
        )
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid > 0:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as ready:
            reply = ready.read()
        result = _last_json_line(reply)
        if result is None:
            result = {
                "ok": False,
                "code": ErrorCode.WORKER_START_FAILED,
                "message": f"the worker exited before it was ready; see {state_dir / LOG_NAME}",
            }
        answer(result)
        return 0 if result.get("ok") else 1
    os.close(read_fd)
    _become_worker(
        spec, state_dir, ready_fd=write_fd, die_with_parent=die_with_parent, parent=parent
    )


def _become_worker(
    spec: RunSpec, state_dir: Path, *, ready_fd: int, die_with_parent: bool, parent: int | None
) -> NoReturn:
    """The worker: a session of its own, stdio on the log, then the run; ends the process.

    ``parent``: the process that forked this one just now, to die with until the worker
    serves (``None``: the parent-death signal is set already, by a launcher's fork).
    """
    # NB: the worker's module is imported here, not with this one: a controller imports launch
    # for the launch command's side and never runs a worker itself (the launcher preloads it).
    from lorenz.workers.worker import ExitStatus

    status = int(ExitStatus.FAILED)
    try:
        profiling.begin("worker")
        if die_with_parent and parent is not None:
            from lorenz.workers.forkserver import set_parent_death_signal

            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(status)  # NB: the launch died before we could follow it
        os.setsid()
        _redirect_stdio(state_dir / LOG_NAME)
        if not logging.root.handlers:
            # NB: a launcher's fork inherits the handler the launcher made (stderr, now this
            # worker's log): see configure_worker_logging.
            configure_worker_logging()
        # NB: not asyncio.run: a detached worker handles its own signals, and what asyncio.run
        # adds for a program's main costs each forked worker pages of its own (lorenz.tasks).
        status = run_on_fresh_loop(
            _serve(spec, state_dir, ready_fd=ready_fd, die_with_parent=die_with_parent)
        )
    except BaseException:
        logger.exception("the worker failed")
    finally:
        logging.shutdown()
        profiling.end("worker")
        os._exit(status)


def configure_worker_logging() -> None:
    """Log INFO and above to stderr, which is the worker's log once it is detached.

    The launcher calls this once before its preload, so its forks inherit the handler instead
    of each making one and tearing it down: that was ~25 of the ~380 Python functions a worker
    runs, each a page of its own to copy (issue #35). A fork's stderr is its own worker's log
    (:func:`_redirect_stdio` replaces file descriptor 2), so the inherited handler writes there.
    """
    logging.basicConfig(level=logging.INFO, format=WORKER_LOG_FORMAT)


WORKER_LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


def _redirect_stdio(log_path: Path) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


async def _serve(
    spec: RunSpec, state_dir: Path, *, ready_fd: int | None, die_with_parent: bool = False
) -> int:
    from lorenz.workers.worker import ExitStatus, Worker

    install_child_watcher()
    worker = Worker(spec=spec, state_dir=state_dir)
    try:
        await worker.bind()
    except LorenzError as exc:
        _ready(ready_fd, {"ok": False, "code": exc.code, "message": exc.message})
        if ready_fd is None:
            print(f"lorenz worker: {exc}", file=sys.stderr)
        return int(ExitStatus.SPEC_INVALID)
    if die_with_parent:
        from lorenz.workers.forkserver import set_parent_death_signal

        # NB: serving, with its status written: a successor's probe finds it from now on.
        set_parent_death_signal(0)
    _ready(
        ready_fd,
        {
            "ok": True,
            "handle": spec.handle,
            "state_dir": str(state_dir),
            "socket": str(worker.socket_path),
            "pid": os.getpid(),
            "existing": None,
        },
    )
    return int(await worker.run())


def _ready(fd: int | None, payload: Mapping[str, Any]) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, (json.dumps(dict(payload)) + "\n").encode())
    with contextlib.suppress(OSError):
        os.close(fd)
