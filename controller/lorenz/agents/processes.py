"""One agent child process: launched in its own process group, read line by line, killed whole.

Every wire protocol Lorenz speaks (Codex app-server, ACP, Claude stream-json, plain commands)
runs a shell command in the workspace and exchanges newline-delimited messages over stdio. The
traps are the same for all of them, so they are solved once, here:

* agents send single lines of many megabytes (whole diffs, file contents): ``asyncio``'s line
  reader gives up at 64 KiB, so lines are framed by hand up to :data:`MAX_LINE_BYTES`, and a
  longer line is reported and skipped without desynchronising the stream;
* an agent that floods stderr while nobody reads it blocks on a full pipe and looks hung:
  stderr is drained continuously into a small ring buffer (its tail explains failures);
* agents spawn helpers (shells, language servers, test runners): killing only the direct child
  leaves them running, so every agent gets its own session and process group, and termination
  signals the whole group, then sweeps any descendant that escaped it. The descendants are
  found by following the agent's own tree (``/proc/<pid>/task/<tid>/children``, a few small
  reads), not by walking every process of the host (psutil's ``children(recursive=True)``
  reads all of ``/proc``, so its cost grew with the host's process count); the walk is left
  only for kernels without those files (``CONFIG_PROC_CHILDREN``);
* the agent must see exactly the environment it was given (tracker secrets already removed),
  never whatever the controller happens to have;
* a request written to stdin waits in the pipe while ``bash -lc`` (a login shell: profiles,
  version managers) starts the agent, which can take seconds on a loaded machine: the time the
  agent takes to *read* its input (:meth:`AgentProcess.wait_input_read`, the pipe's unread
  bytes) is start-up, and only what follows is the agent's time to answer.

The child and its pipes are :mod:`lorenz.child_processes`' (a Popen, ``add_reader`` and a
pidfd), not asyncio's subprocess transports, whose Python layers each run's worker paid for in
memory (issue #35).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import signal
import struct
import termios
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import psutil

from lorenz.agents.base import AgentRunError
from lorenz.child_processes import DEVNULL, PIPE, ChildProcess, start_child
from lorenz.codes import ErrorCode

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest stdout line accepted (agents send huge diffs on one line)."""

STDERR_RING_BYTES = 64 * 1024
"""How much of the most recent stderr output is kept for error messages."""

_READ_CHUNK_BYTES = 256 * 1024
_GROUP_POLL_S = 0.02
_INPUT_POLL_S = 0.01


class LineTooLong(AgentRunError):
    """A stdout line passed :data:`MAX_LINE_BYTES`; the rest of that line is discarded."""

    code = ErrorCode.AGENT_LINE_TOO_LONG


class AgentStdinClosed(AgentRunError):
    """Writing to the agent failed because it closed its stdin (usually: it exited)."""

    code = ErrorCode.AGENT_EXITED


class AgentProcess:
    """A running agent: line-framed stdout, drained stderr, group-wide termination.

    Not safe for concurrent readers: one task reads lines, any task may write.
    """

    def __init__(self, child: ChildProcess, *, command: str) -> None:
        self._child = child
        self.command = command
        self.pid: int = child.pid
        # NB: with start_new_session=True the child is a session and group leader, so its
        # process-group id is its pid; it stays valid while any group member is alive.
        self._pgid: int = child.pid
        self._buffer = bytearray()
        self._scan_from = 0
        self._discarding = False
        self._eof = False
        self._stderr_ring: collections.deque[bytes] = collections.deque()
        self._stderr_size = 0
        self._stderr_total = 0
        self._write_lock = asyncio.Lock()
        self._terminated: asyncio.Future[int | None] | None = None
        self._stderr_task = asyncio.create_task(
            self._drain_stderr(), name=f"agent-stderr-{self.pid}"
        )
        self._descendants: dict[int, psutil.Process] = {}

    # -- status ---------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has been reaped (negative: killed by a signal)."""
        return self._child.returncode

    @property
    def stderr_bytes_total(self) -> int:
        """How many bytes of stderr the agent has written so far (kept or not)."""
        return self._stderr_total

    # -- stdout ---------------------------------------------------------------------------

    async def read_line(self, *, timeout_s: float | None = None) -> bytes | None:
        """One stdout line without its ``\\n``; ``None`` at end of output.

        Raises :class:`TimeoutError` when no complete line arrives within ``timeout_s`` (the
        partial line is kept for the next call) and :class:`LineTooLong` when a line passes
        :data:`MAX_LINE_BYTES` (the rest of it is skipped; the next call reads the next line).
        """
        async with asyncio.timeout(timeout_s):
            return await self._next_line()

    async def _next_line(self) -> bytes | None:
        stdout = self._child.stdout
        assert stdout is not None
        while True:
            newline = self._buffer.find(b"\n", self._scan_from)
            if newline >= 0:
                if self._discarding:
                    del self._buffer[: newline + 1]
                    self._scan_from = 0
                    self._discarding = False
                    continue
                del_upto = newline + 1
                if newline > MAX_LINE_BYTES:
                    del self._buffer[:del_upto]
                    self._scan_from = 0
                    raise self._too_long(newline)
                line = bytes(self._buffer[:newline])
                del self._buffer[:del_upto]
                self._scan_from = 0
                return line
            if self._discarding:
                self._buffer.clear()
                self._scan_from = 0
            elif len(self._buffer) > MAX_LINE_BYTES:
                size = len(self._buffer)
                self._buffer.clear()
                self._scan_from = 0
                self._discarding = True
                raise self._too_long(size)
            else:
                self._scan_from = len(self._buffer)
            if self._eof:
                if self._buffer and not self._discarding:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    self._scan_from = 0
                    return line
                return None
            chunk = await stdout.read(_READ_CHUNK_BYTES)
            if not chunk:
                self._eof = True
            else:
                self._buffer += chunk

    def _too_long(self, size: int) -> LineTooLong:
        return LineTooLong(
            f"agent {self.pid} sent a stdout line over {MAX_LINE_BYTES} bytes ({size} bytes "
            "seen); it was skipped — make the agent send smaller messages"
        )

    # -- stdin ----------------------------------------------------------------------------

    async def write_line(self, data: bytes) -> None:
        """Send ``data`` plus ``\\n`` and wait until the pipe accepted it."""
        stdin = self._child.stdin
        if stdin is None:
            raise AgentStdinClosed(f"agent {self.pid} was started without stdin")
        async with self._write_lock:
            try:
                stdin.write(data)
                stdin.write(b"\n")
                await stdin.drain()
            except BrokenPipeError as exc:
                # NB: also what a write after close_stdin() raises.
                raise AgentStdinClosed(
                    f"agent {self.pid} stopped reading its stdin ({exc.__class__.__name__}); "
                    f"it has probably exited: {self.stderr_tail(max_bytes=500)}"
                ) from exc

    def stdin_unread_bytes(self) -> int | None:
        """Bytes written to the agent's stdin that it has not read yet: the writer's buffer
        plus the pipe's contents (``FIONREAD``). ``None`` when stdin is closed or not a pipe."""
        stdin = self._child.stdin
        if stdin is None or stdin.is_closing():
            return None
        try:
            raw = fcntl.ioctl(stdin.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return None
        (in_pipe,) = struct.unpack("i", raw)
        return stdin.buffered_bytes + int(in_pipe)

    async def wait_input_read(
        self, *, timeout_s: float, until: asyncio.Future[object] | None = None
    ) -> bool:
        """Wait until the agent has read everything written to its stdin: it is up and reading.

        ``False`` when ``timeout_s`` passed first. ``True`` also when waiting can tell nothing
        more: the process exited, stdin closed, or ``until`` (the request waiting for its
        answer) finished — the caller then sees what happened from its own future.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            unread = self.stdin_unread_bytes()
            if not unread or self.returncode is not None or (until is not None and until.done()):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_INPUT_POLL_S)

    async def close_stdin(self) -> None:
        """Signal end of input once what was written is in the pipe; harmless if the agent
        already closed its end. A cancelled wait leaves the rest to be written and closed."""
        stdin = self._child.stdin
        if stdin is None or stdin.is_closing():
            return
        stdin.close()
        with contextlib.suppress(BrokenPipeError):
            await stdin.drain()

    # -- stderr ---------------------------------------------------------------------------

    async def _drain_stderr(self) -> None:
        stderr = self._child.stderr
        if stderr is None:
            return
        while True:
            chunk = await stderr.read(64 * 1024)
            if not chunk:
                return
            self._stderr_total += len(chunk)
            if logger.isEnabledFor(logging.DEBUG):
                for line in chunk.decode("utf-8", errors="replace").splitlines():
                    logger.debug("agent stderr: %s", line[:1000], extra={"pid": self.pid})
            self._stderr_ring.append(chunk)
            self._stderr_size += len(chunk)
            while self._stderr_size - len(self._stderr_ring[0]) >= STDERR_RING_BYTES:
                self._stderr_size -= len(self._stderr_ring.popleft())

    def stderr_tail(self, *, max_bytes: int = 4096) -> str:
        """The last ``max_bytes`` of stderr, decoded leniently and stripped."""
        data = b"".join(self._stderr_ring)[-max_bytes:]
        return data.decode("utf-8", errors="replace").strip()

    async def stderr_drained(self, *, timeout_s: float | None = None) -> None:
        """Wait until stderr reached end of file (after exit), so the tail is complete."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._stderr_task)

    # -- lifetime -------------------------------------------------------------------------

    async def wait(self, *, timeout_s: float | None = None) -> int:
        """Wait for the process to exit; :class:`TimeoutError` if it does not in time.

        Returns as soon as the process itself has exited, even while a background child it
        left behind still holds its stdout or stderr open.
        """
        async with asyncio.timeout(timeout_s):
            return await self._exit_status()

    async def _exit_status(self) -> int:
        # NB: the child's exit is watched on the process itself (a pidfd), not on its pipes:
        # a leftover grandchild holding stdout open does not delay it.
        return await self._child.wait()

    async def terminate(self, *, grace_s: float = 2.0) -> int | None:
        """Stop the agent and everything it started; returns its exit status.

        SIGTERM goes to the whole process group; whatever is still alive after ``grace_s``
        (group members, and descendants that left the group) gets SIGKILL. Idempotent and safe
        to call concurrently: later calls wait for the first one.
        """
        if self._terminated is None:
            self._terminated = asyncio.get_running_loop().create_future()
            try:
                result = await asyncio.shield(self._terminate(grace_s=grace_s))
            except BaseException:
                # NB: a cancelled caller must not leave the child alive; finish the kill
                # synchronously (SIGKILL cannot be refused) before propagating.
                self._kill_everything()
                self._terminated.set_result(self.returncode)
                raise
            self._terminated.set_result(result)
            return result
        return await asyncio.shield(self._terminated)

    async def _terminate(self, *, grace_s: float) -> int | None:
        self._remember_descendants()
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self._child.exited() and not self._group_alive():
                break
            await asyncio.sleep(_GROUP_POLL_S)
        self._kill_everything()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(grace_s, 1.0) + 5.0):
                await self._exit_status()
        await self.stderr_drained(timeout_s=1.0)
        await self._descendants_died(timeout_s=2.0)
        self._child.close()
        return self._child.returncode

    async def _descendants_died(self, *, timeout_s: float) -> None:
        # NB: stderr at end of file says every holder closed it, not that it is dead yet: a
        # killed process closes its files before it becomes a zombie, and on a loaded machine
        # it can be caught in between. Returning only once they are zombies (or gone) keeps
        # terminate()'s promise to whoever cleans up after it (the workspace, the slot).
        deadline = time.monotonic() + timeout_s
        while any(map(_still_running, self._descendants.values())):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(_GROUP_POLL_S)

    def _remember_descendants(self) -> None:
        if self._child.returncode is not None:
            # NB: a reaped agent has no descendants left to find (its children were reparented
            # when it exited), and its pid may already be someone else's: scanning the process
            # table for "its" children would cost a /proc walk and could name strangers.
            return
        for pid in descendant_pids(self.pid):
            if pid not in self._descendants:
                # NB: psutil.Process records the start time: a pid reused later is never
                # signalled by _kill_everything.
                with contextlib.suppress(psutil.Error):
                    self._descendants[pid] = psutil.Process(pid)

    def _kill_everything(self) -> None:
        self._remember_descendants()
        self._signal_group(signal.SIGKILL)
        for child in self._descendants.values():
            # NB: psutil checks the process start time, so a reused pid is never signalled.
            with contextlib.suppress(psutil.Error):
                if child.is_running():
                    child.kill()
        # NB: Popen signals only a child it has not reaped, so never a reused pid.
        self._child.kill()

    def _signal_group(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, signum)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self._pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # NB: zombies still count as group members until their parent reaps them; treat a
        # group made only of zombies as gone. The members remembered are asked first; only
        # when none of them lives is the process table searched (a rare case: the agent was
        # reaped, and what is left of its group is zombies or members started late).
        for member in self._descendants.values():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if (
                    member.is_running()
                    and os.getpgid(member.pid) == self._pgid
                    and member.status() != psutil.STATUS_ZOMBIE
                ):
                    return True
        with contextlib.suppress(psutil.Error):
            for proc in psutil.process_iter(["pid"]):
                # NB: any process of the machine may exit between the listing and getpgid.
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    if os.getpgid(proc.pid) == self._pgid and proc.status() != psutil.STATUS_ZOMBIE:
                        return True
            return False
        return True

    async def __aenter__(self) -> AgentProcess:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.terminate()


def _still_running(process: psutil.Process) -> bool:
    """Alive and not a zombie (psutil compares the start time: a reused pid is not it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendant_pids(pid: int) -> list[int]:
    """Every descendant of ``pid`` still alive, following its tree from ``pid`` down.

    NB: each thread lists the children it forked (``/proc/<pid>/task/<tid>/children``), so
    every thread of every process is read. A process that exits while it is read is skipped
    (its children were reparented away from the tree). Without those files (a kernel built
    without ``CONFIG_PROC_CHILDREN``) psutil walks the whole process table instead.
    """
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as listing:
                    children = [int(word) for word in listing.read().split()]
            except FileNotFoundError:
                if parent == pid and os.path.isdir(f"/proc/{parent}/task/{task}"):
                    return _walked_descendant_pids(pid)
                continue
            except (OSError, ValueError):
                continue
            found.extend(children)
            pending.extend(children)
    return found


def _walked_descendant_pids(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return []


async def spawn_agent(
    *,
    command: str,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bool = True,
    login_shell: bool = True,
) -> AgentProcess:
    """Start ``bash -lc <command>`` in ``cwd`` with exactly ``env``, in its own process group.

    ``login_shell=False`` (``agents.<kind>.login_shell: false``) starts ``bash -c <command>``
    instead: no profiles are read, so their cost is not paid on every run.

    Raises :class:`AgentRunError` (``agent_spawn_failed``) when the workspace or bash is missing.
    """
    # NB: the spawn is synchronous (a Popen: fork and exec, nothing awaited), so no
    # cancellation can land inside it and leave a started child unowned; with asyncio's
    # create_subprocess_exec one could, and the spawn had to be shielded and its child killed.
    try:
        child = start_child(
            ("bash", "-lc" if login_shell else "-c", command),
            stdin=PIPE if stdin else DEVNULL,
            cwd=cwd,
            env=env,
        )
    except OSError as exc:
        raise AgentRunError(
            f"could not start the agent command in {cwd}: {exc.strerror or exc}; "
            "check that the workspace exists and bash is installed",
            code=ErrorCode.AGENT_SPAWN_FAILED,
        ) from exc
    logger.debug("agent started", extra={"pid": child.pid, "cwd": str(cwd)})
    return AgentProcess(child, command=command)
