"""Child processes with pipes on the running event loop, without asyncio's subprocess layers.

Every live run is a worker forked from a preloaded launcher, and what a run costs in memory is
the pages its Python touches after the fork (issue #35). ``asyncio.create_subprocess_exec``
runs a stack of Python layers for each child — base_subprocess, unix_events' pipe transports
and child watcher, asyncio.subprocess, streams' ``StreamReader`` — some seventy distinct
functions a run, each dirtying its code object's pages in the fork. The agents' and hooks'
children need far less: a ``subprocess.Popen`` on pipes made here, non-blocking reads and
writes driven by ``loop.add_reader``/``add_writer``, and the exit seen on a pidfd. The loop's
C Tasks and Futures stay; only the Python layers go (``bench/fork_bench.py``: a worker run's
private pages 5.5 → 5.2 MiB).

The traps, solved once here:

* the child is reaped **only** by ``popen.poll()``: a ``waitpid`` behind Popen's back makes it
  report a wrong status, and a Popen dropped while its child lives is put on
  ``subprocess._active`` for a later Popen to reap — so :class:`ChildProcess` keeps its Popen;
* the exit is seen without waiting for the pipes: a grandchild holding stdout open must not
  make a finished child look alive (a pidfd is readable at exit; without pidfds — old kernels —
  ``popen.poll()`` is called with a short backoff);
* a reader or writer registered on the loop while nobody waits would spin (level-triggered
  epoll) or leak: each is registered only while a read waits or a write is pending, and removed
  on completion, on cancellation and on close — also on a loop that is already closed, where
  removing is a no-op and the descriptors are still closed;
* writing to a pipe whose reader is gone raises :class:`BrokenPipeError`, as asyncio does
  (Python ignores ``SIGPIPE``, so the write fails instead of killing the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

PIPE = subprocess.PIPE
"""A pipe between the child and this process (read or written through this module)."""

DEVNULL = subprocess.DEVNULL
"""The child's stream goes to (or comes from) ``/dev/null``."""

STDOUT = subprocess.STDOUT
"""The child's stderr goes wherever its stdout goes."""

_FIRST_EXIT_POLL_S = 0.005
_LAST_EXIT_POLL_S = 0.1


class PipeReader:
    """The parent's end of a child's output pipe, read without blocking the loop."""

    def __init__(self, fd: int, *, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def fileno(self) -> int:
        """The pipe's descriptor; ``-1`` once closed."""
        return self._fd

    def is_closing(self) -> bool:
        return self._fd < 0

    async def read(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` as soon as some are there; ``b""`` at end of file or once closed.

        One read at a time: a second concurrent one raises :class:`RuntimeError`.
        """
        while self._fd >= 0:
            try:
                return os.read(self._fd, max_bytes)
            except BlockingIOError:
                await self._readable()
        return b""

    async def _readable(self) -> None:
        if self._waiter is not None:
            raise RuntimeError(f"pipe {self._fd} is already being read")
        self._waiter = self._loop.create_future()
        self._loop.add_reader(self._fd, self._wake)
        try:
            await self._waiter
        finally:
            self._waiter = None
            # NB: also on cancellation: a reader left registered while nobody reads would be
            # called again and again (epoll is level-triggered). A close() meanwhile has
            # removed it already, and its number may be another file's by now.
            if self._fd >= 0:
                self._loop.remove_reader(self._fd)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        """Close the pipe; a read waiting now returns ``b""``."""
        if self._fd < 0:
            return
        self._wake()
        # NB: on a closed loop remove_reader is a no-op; the descriptor is closed all the same.
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1

    def __del__(self) -> None:
        if self._fd >= 0:
            warnings.warn(f"unclosed pipe reader {self._fd}", ResourceWarning, stacklevel=1)
            os.close(self._fd)


class PipeWriter:
    """The parent's end of a child's stdin: writes at once what the pipe takes, buffers the rest.

    :meth:`write` never blocks; :meth:`drain` waits until the buffer is in the pipe. Once the
    child closed its end every write and drain raises :class:`BrokenPipeError`.
    """

    def __init__(self, fd: int, *, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._loop = loop
        self._buffer = bytearray()
        self._drainers: list[asyncio.Future[None]] = []
        self._closing = False
        self._broken: OSError | None = None

    def fileno(self) -> int:
        """The pipe's descriptor; ``-1`` once closed."""
        return self._fd

    @property
    def buffered_bytes(self) -> int:
        """Bytes written but not yet in the pipe."""
        return len(self._buffer)

    def is_closing(self) -> bool:
        """``True`` once closed, closing (flushing its buffer) or broken."""
        return self._closing or self._fd < 0

    def write(self, data: bytes) -> None:
        """Send ``data``: whatever the pipe takes now, the rest once it has room."""
        if self._broken is not None:
            raise BrokenPipeError(errno.EPIPE, f"cannot write to the pipe: {self._broken}")
        if self._closing or self._fd < 0:
            raise BrokenPipeError(errno.EPIPE, "the pipe writer is closed")
        if not data:
            return
        if self._buffer:
            self._buffer += data
            return
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self._break(exc)
            raise
        if written < len(data):
            self._buffer += memoryview(data)[written:]
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            self._break(exc)
            return
        del self._buffer[:written]
        if not self._buffer:
            self._loop.remove_writer(self._fd)
            self._settle_drainers()
            if self._closing:
                self._close_fd()

    async def drain(self) -> None:
        """Wait until everything written is in the pipe; :class:`BrokenPipeError` if it cannot
        be. A cancelled drain leaves the rest to be written all the same."""
        if self._broken is None and not self._buffer:
            return
        if self._broken is None:
            drained = self._loop.create_future()
            self._drainers.append(drained)
            try:
                await drained
            finally:
                with contextlib.suppress(ValueError):
                    self._drainers.remove(drained)
        if self._broken is not None:
            raise BrokenPipeError(errno.EPIPE, f"cannot write to the pipe: {self._broken}")

    def close(self) -> None:
        """No more writes: the pipe closes once the buffer is in it (the child then reads EOF)."""
        self._closing = True
        if not self._buffer:
            self._close_fd()

    def abort(self) -> None:
        """Close at once, dropping whatever is still buffered (a drain waiting for it raises)."""
        self._closing = True
        if self._buffer and self._broken is None:
            self._broken = BrokenPipeError(
                errno.EPIPE, f"closed with {len(self._buffer)} bytes not yet written"
            )
        self._buffer.clear()
        self._close_fd()

    def _break(self, exc: OSError) -> None:
        self._broken = exc
        self._buffer.clear()
        self._close_fd()

    def _settle_drainers(self) -> None:
        for drained in self._drainers:
            if not drained.done():
                drained.set_result(None)

    def _close_fd(self) -> None:
        self._settle_drainers()
        if self._fd < 0:
            return
        # NB: on a closed loop remove_writer is a no-op; the descriptor is closed all the same.
        self._loop.remove_writer(self._fd)
        os.close(self._fd)
        self._fd = -1

    def __del__(self) -> None:
        if self._fd >= 0:
            warnings.warn(f"unclosed pipe writer {self._fd}", ResourceWarning, stacklevel=1)
            os.close(self._fd)


class ChildProcess:
    """A started child: its pipes (``None`` where not :data:`PIPE`), its exit, its signals."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        stdin: PipeWriter | None,
        stdout: PipeReader | None,
        stderr: PipeReader | None,
        loop: asyncio.AbstractEventLoop,
        watch_exit_with_pidfd: bool,
    ) -> None:
        self._popen = popen
        self.pid: int = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = -1
        self._exit_poll: asyncio.TimerHandle | None = None
        self._exit_poll_s = _FIRST_EXIT_POLL_S
        if watch_exit_with_pidfd:
            with contextlib.suppress(AttributeError, OSError):
                # NB: the child cannot have been reaped yet (only poll() reaps it), so the pid
                # is still this child's even if it already exited.
                self._pidfd = os.pidfd_open(self.pid)
        if self._pidfd >= 0:
            loop.add_reader(self._pidfd, self._on_exit_seen)
        else:
            self._poll_exit()

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: killed by that signal)."""
        return self._popen.returncode

    def exited(self) -> bool:
        """Whether the exit has been seen (:meth:`wait` then returns at once)."""
        return self._exited.done()

    async def wait(self) -> int:
        """The exit status, as soon as the child itself exited (its pipes may still be open).

        :class:`ChildProcessError` when :meth:`close` stopped watching a child still running.
        """
        # NB: shielded: a cancelled waiter must not cancel the one exit future all share.
        return await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        """Signal the child itself; nothing once it has been reaped (its pid may be reused)."""
        self._popen.send_signal(signum)

    def kill(self) -> None:
        self._popen.kill()

    def _on_exit_seen(self) -> None:
        self._stop_pidfd()
        if self._popen.poll() is None:
            # NB: the pidfd says it exited, yet poll() did not reap it (another thread held
            # Popen's wait lock): ask again shortly.
            self._poll_exit()
            return
        self._settle_exit()

    def _poll_exit(self) -> None:
        self._exit_poll = None
        if self._popen.poll() is not None:
            self._settle_exit()
            return
        self._exit_poll = self._loop.call_later(self._exit_poll_s, self._poll_exit)
        self._exit_poll_s = min(self._exit_poll_s * 2, _LAST_EXIT_POLL_S)

    def _settle_exit(self) -> None:
        returncode = self._popen.returncode
        if returncode is not None and not self._exited.done():
            self._exited.set_result(returncode)

    def _stop_pidfd(self) -> None:
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def close(self) -> None:
        """Close the pipes (stdin without flushing) and stop watching the exit.

        The child itself is neither signalled nor waited for (kill it and :meth:`wait` first),
        only reaped if it has exited; a :meth:`wait` for one still running then raises
        :class:`ChildProcessError`. Idempotent; safe on a loop that is closed.
        """
        for pipe in (self.stdin, self.stdout, self.stderr):
            if isinstance(pipe, PipeWriter):
                pipe.abort()
            elif pipe is not None:
                pipe.close()
        self._stop_pidfd()
        if self._exit_poll is not None:
            self._exit_poll.cancel()
            self._exit_poll = None
        # NB: reaps a child that exited meanwhile, also on a later call (none is watching).
        if self._popen.poll() is not None:
            self._settle_exit()
        elif not self._exited.done():
            self._exited.set_exception(
                ChildProcessError(f"child {self.pid} was no longer watched before it exited")
            )
            # NB: marks the error as seen: nobody may be waiting for it.
            self._exited.exception()


def start_child(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    stdin: int = PIPE,
    stdout: int = PIPE,
    stderr: int = PIPE,
    watch_exit_with_pidfd: bool = True,
) -> ChildProcess:
    """Start ``argv`` in a session (and process group) of its own on the running loop.

    Each stream is :data:`PIPE`, :data:`DEVNULL`, a file descriptor, or (stderr only)
    :data:`STDOUT`. ``watch_exit_with_pidfd=False`` polls for the exit as on kernels without
    pidfds. Raises what :class:`subprocess.Popen` raises: :class:`OSError` when the program or
    ``cwd`` is missing, :class:`ValueError` for a NUL byte in ``argv`` or ``env``.
    """
    loop = asyncio.get_running_loop()
    parent_ends: list[int] = []
    child_ends: list[int] = []

    def pipe(*, child_reads: bool) -> int:
        read_end, write_end = os.pipe()
        parent_ends.append(write_end if child_reads else read_end)
        child_ends.append(read_end if child_reads else write_end)
        return child_ends[-1]

    try:
        popen = subprocess.Popen(
            argv,
            stdin=pipe(child_reads=True) if stdin == PIPE else stdin,
            stdout=pipe(child_reads=False) if stdout == PIPE else stdout,
            stderr=pipe(child_reads=False) if stderr == PIPE else stderr,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        for fd in parent_ends:
            os.close(fd)
        raise
    finally:
        # NB: the child has its copies; the parent's would keep the pipes open (no EOF).
        for fd in child_ends:
            os.close(fd)
    ends = iter(parent_ends)
    return ChildProcess(
        popen,
        stdin=PipeWriter(next(ends), loop=loop) if stdin == PIPE else None,
        stdout=PipeReader(next(ends), loop=loop) if stdout == PIPE else None,
        stderr=PipeReader(next(ends), loop=loop) if stderr == PIPE else None,
        loop=loop,
        watch_exit_with_pidfd=watch_exit_with_pidfd,
    )
