"""The worker's end of its control socket: plain non-blocking sockets served by the running
loop's reader and writer callbacks, not asyncio's streams.

Why: every live run is a worker forked from the preloaded launcher, and what a run costs in
memory is the pages its Python writes after the fork (copy-on-write; issue #35). asyncio's
stream server — ``start_unix_server``, a ``StreamReader``/``StreamWriter``, a socket transport,
an ``asyncio.Queue`` and a sender task per client — ran some seventy Python functions a run
that the callbacks here do not (``bench/fork_bench.py``). The loop itself (its C tasks and
futures) stays: the agent side of the worker runs on it. The controller's side of the socket
(:mod:`lorenz.workers.client`) stays on streams: it is one process for every run.

What is here is bytes and lines: a listening socket that accepts peers of this uid only, and a
connection that splits its input into bounded lines and queues its output while the peer does
not read. What a line means is the worker's (:mod:`lorenz.workers.worker`).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import itertools
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Final

from lorenz.workers.protocol import LineBuffer, ProtocolError

logger = logging.getLogger(__name__)

QUEUE_LIMIT: Final = 100_000
"""Lines queued for one client before it is dropped (it re-attaches from its seq)."""

READ_CHUNK_BYTES: Final = 256 * 1024
"""The most one reader callback takes from a peer (the loop serves the others in between)."""

GATHER_LINES: Final = 64
"""Queued lines written by one ``sendmsg`` (well under any ``IOV_MAX``)."""

DISCARD_READS: Final = 64
"""The most reads :meth:`ControlConnection.close` discards before the socket closes."""

ACCEPTS_PER_WAKE: Final = 16
"""Connections accepted by one reader callback of the listening socket."""

BACKLOG: Final = 100
"""Pending connections the kernel holds (asyncio's default for a stream server)."""

ACCEPT_PAUSE_S: Final = 1.0
"""How long the listener stops accepting after ``accept`` failed (out of descriptors)."""


class ControlConnection(abc.ABC):
    """One accepted peer: its input as whole lines, its output sent at once or queued.

    A subclass says what a line means (:meth:`line_received`) and what the end of the peer
    means (:meth:`lost`, called once: end of stream, a read or write error, an over-long line,
    or the peer dropped for reading too slowly). Once the owner called :meth:`close`, no line
    is delivered and no loss is reported, but for a write that failed just before: that loss
    comes from the loop, later.
    """

    def __init__(self, sock: socket.socket, *, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self._input = LineBuffer()
        self._outgoing: collections.deque[bytes | memoryview] = collections.deque()
        self._reading = False
        self._writing = False
        self._input_ended = False
        self.closed = False
        """No more output is taken and no more input is delivered."""
        self.finished: asyncio.Future[None] = loop.create_future()
        """Done once the socket is closed (after what was queued was written, or not)."""

    @abc.abstractmethod
    def line_received(self, line: bytes) -> None:
        """One whole line from the peer (without its newline)."""

    @abc.abstractmethod
    def lost(self, error: ProtocolError | None) -> None:
        """The peer is gone: ``error`` says what it sent that ended it (a line over the limit,
        or one cut off by the end of the stream); ``None`` for an end of stream, a socket
        error, or a peer dropped for reading too slowly."""

    def start(self) -> None:
        """Begin reading (after the first lines are sent: a peer gone already is closed)."""
        if not self.closed:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    # -- output --------------------------------------------------------------------------

    def send_raw(self, line: bytes) -> None:
        """Send ``line`` now, or queue it behind what the peer has not taken yet."""
        if self.closed:
            return
        if self._outgoing:
            if len(self._outgoing) >= QUEUE_LIMIT:
                logger.warning("client too slow, dropped; it re-attaches from its last seq")
                self._fail()
                return
            self._outgoing.append(line)
            return
        try:
            sent = self.sock.send(line)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._fail()
            return
        if sent < len(line):
            # NB: a view, not a slice: a long line written in many pieces is never copied.
            self._outgoing.append(memoryview(line)[sent:])
            self._loop.add_writer(self._fd, self._on_writable)
            self._writing = True

    def _on_writable(self) -> None:
        while self._outgoing:
            try:
                sent = self.sock.sendmsg(list(itertools.islice(self._outgoing, GATHER_LINES)))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._fail()
                return
            while sent:
                head = self._outgoing[0]
                if len(head) > sent:
                    self._outgoing[0] = memoryview(head)[sent:]
                    return
                sent -= len(head)
                self._outgoing.popleft()
        self._loop.remove_writer(self._fd)
        self._writing = False
        if self.closed:
            self._finish()

    # -- input ---------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._stop_reading()
            if not self.closed:
                self.lost(None)
            return
        if not data:
            # NB: end of stream stays readable: a reader left registered would spin the loop.
            self._stop_reading()
            self._input_ended = True
            if not self.closed:
                try:
                    self._input.end()
                except ProtocolError as exc:
                    self.lost(exc)
                else:
                    self.lost(None)
            return
        if self.closed:
            return  # NB: read and dropped while flushing (see _discard_input).
        self._input.feed(data)
        while not self.closed:
            try:
                line = self._input.next_line()
            except ProtocolError as exc:
                self.lost(exc)  # NB: reading goes on, dropped, until the socket closes.
                return
            if line is None:
                return
            self.line_received(line)

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    # -- the end -------------------------------------------------------------------------

    def close(self) -> None:
        """Take nothing more; the socket closes once what is queued is written."""
        if self.closed:
            return
        self.closed = True
        if not self._outgoing:
            self._finish()

    def abort(self) -> None:
        """Close the socket now; what is still queued is lost."""
        self.closed = True
        self._outgoing.clear()
        self._finish()

    def _fail(self) -> None:
        """The peer is gone (or dropped): close now; the subclass hears of it once, later.

        NB: ``lost`` is called from the loop, not from here: a send fails inside the worker's
        own loops over its clients and calls, which ``lost`` changes.
        """
        was_closed = self.closed
        self.abort()
        if not was_closed:
            self._loop.call_soon(self.lost, None)

    def _finish(self) -> None:
        self._stop_reading()
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False
        if not self._input_ended:
            self._discard_input()
        self.sock.close()
        if not self.finished.done():
            self.finished.set_result(None)


    def _discard_input(self) -> None:
        """Read what the peer sent and nobody will handle, before the socket closes.

        NB: a unix socket closed with unread input makes the peer's next read fail with
        ``ECONNRESET`` after the lines it was sent, instead of ending cleanly (Linux): a
        client that had just sent a ping, or the rest of an over-long line, would see its
        connection reset rather than closed.
        """
        for _ in range(DISCARD_READS):
            try:
                if not self.sock.recv(READ_CHUNK_BYTES):
                    return
            except OSError:  # NB: nothing more now (BlockingIOError) or the peer is gone
                return


class ControlListener:
    """The listening socket: hands each accepted peer of this uid to ``accepted``."""

    def __init__(
        self,
        *,
        path: str,
        accepted: Callable[[socket.socket], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.path = path
        self._accepted = accepted
        self._loop = loop
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # NB: the umask makes the socket 0600 from its first instant (the chmod after is
            # for a filesystem that ignores it): no window in which another uid may connect.
            old_umask = os.umask(0o177)
            try:
                self._sock.bind(path)
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o600)
            self._sock.listen(BACKLOG)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        self._accepting = True

    def close(self) -> None:
        """Stop accepting, close the socket and remove its path (again: nothing)."""
        if self._sock.fileno() < 0:
            return
        if self._accepting:
            self._loop.remove_reader(self._sock.fileno())
            self._accepting = False
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _on_readable(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                # NB: out of descriptors (EMFILE, ENFILE) or memory: the pending peer stays
                # pending and the socket stays readable; stop asking for a while, as asyncio's
                # servers do, or the loop would spin on it.
                logger.warning("cannot accept a control connection: %s", exc)
                self._loop.remove_reader(self._sock.fileno())
                self._accepting = False
                self._loop.call_later(ACCEPT_PAUSE_S, self._resume)
                return
            if peer_uid(sock) != os.getuid():
                sock.close()
                continue
            self._accepted(sock)

    def _resume(self) -> None:
        if self._sock.fileno() >= 0 and not self._accepting:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)
            self._accepting = True


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def socket_answers(path: str) -> bool:
    """Whether something listens on the unix socket ``path``.

    NB: a non-blocking connect to a unix socket answers at once: done (someone listens),
    ``ECONNREFUSED`` or missing (nobody does), or ``EAGAIN`` — :class:`BlockingIOError` —
    (someone listens and its backlog is full: alive, not free to take over).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(path)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
    return True
