"""The worker control protocol: newline-delimited JSON objects over a unix stream socket.

One message per line, each an object with an ``op``. The socket is the only way in: it lives in
the run's 0700 state directory with mode 0600, and the worker also refuses peers of another
uid (``SO_PEERCRED``). Lines are bounded (:data:`LINE_LIMIT_BYTES`), so a confused peer cannot
make either side buffer without limit.

Client → worker:

``attach {after_seq}``       replay every record with a larger seq, then ``live``, then records
                             as they are written. The newest attached client is the controller:
                             calls go to it.
``cancel {reason}``          end the run: the agent is stopped, ``after_run`` runs, the final
                             record says ``canceled`` with the reason.
``ping {id}``                heartbeat; answered with ``pong {id, last_seq, phase}``.
``reply {id, result}``       the answer to a ``call``.
``ack {seq}``                the final record was collected; the worker may exit at once.

Worker → client:

``hello {handle, pid, last_seq, generation, version}``   first line on every connection
``record {record}`` / ``live {seq}``                     the journal, replayed then live
``pong {id, last_seq, phase}``
``call {id, method, params}``  ``method`` is ``tool`` (``{name, arguments}``, answered with the
                               tool result) or ``issue_active`` (answered with a boolean)
``error {code, message}``      the peer sent something that is not a message
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Final

PROTOCOL_VERSION: Final = 1

LINE_LIMIT_BYTES: Final = 8 * 1024 * 1024
"""The longest message either side accepts (a large tool result fits; a runaway peer not)."""

SOCKET_NAME: Final = "control.sock"

SOCKET_PATH_LIMIT: Final = 107
"""``sun_path`` holds 108 bytes including the terminating NUL."""


class ProtocolError(Exception):
    """The peer sent something that is not a protocol message."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("a message is a JSON object with an `op` string")
    return message


class LineBuffer:
    """Bytes in as they arrive, whole lines out: :func:`read_message`'s rule without a stream.

    The worker reads its control socket in the loop's reader callbacks
    (:mod:`lorenz.workers.control_socket`), not through a ``StreamReader``; a line longer than
    ``limit`` (without its newline) is a :class:`ProtocolError` as soon as it is seen to be one.
    """

    def __init__(self, *, limit: int = LINE_LIMIT_BYTES) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0
        """How much of the buffer is known to hold no newline."""

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_line(self) -> bytes | None:
        """The next whole line with its newline, or ``None`` until more bytes are fed."""
        end = self._buffer.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                raise ProtocolError(f"a message is longer than {self._limit} bytes")
            return None
        if end > self._limit:
            raise ProtocolError(f"a message is longer than {self._limit} bytes")
        line = bytes(self._buffer[: end + 1])
        # NB: deleting a bytearray's head only moves its start: no copy of what follows.
        del self._buffer[: end + 1]
        self._scanned = 0
        return line

    def end(self) -> None:
        """The peer sent its last byte: raises :class:`ProtocolError` if it was mid-message."""
        if self._buffer.strip():
            raise ProtocolError("the stream ended inside a message")


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or ``None`` at end of stream.

    Raises :class:`ProtocolError` for an over-long or malformed line.
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise ProtocolError("the stream ended inside a message") from None
        return None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"a message is longer than {LINE_LIMIT_BYTES} bytes") from None
    return decode(line)


READ_CHUNK_BYTES: Final = 256 * 1024


async def read_messages(reader: asyncio.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """Every message until end of stream, read in large chunks (the busy direction: records).

    Raises :class:`ProtocolError` like :func:`read_message`.
    """
    pending = b""
    while True:
        chunk = await reader.read(READ_CHUNK_BYTES)
        if not chunk:
            if pending.strip():
                raise ProtocolError("the stream ended inside a message")
            return
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        if len(pending) > LINE_LIMIT_BYTES:
            raise ProtocolError(f"a message is longer than {LINE_LIMIT_BYTES} bytes")
        for line in lines:
            yield decode(line)
