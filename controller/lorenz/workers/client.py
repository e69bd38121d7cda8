"""The controller's side of one connection to a worker's control socket.

A connection reads everything the worker sends in one task and routes it: journal records to
the consumer (in order), ``pong`` to the pinger, and ``call`` to the controller's handlers —
host-side tools run here, with the controller's credentials, and only their results travel to
the worker. Connections are cheap and disposable: losing one loses nothing, because the journal
is replayed from the last seq the controller collected (see :mod:`lorenz.workers.handles`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from lorenz.agents import ToolHandler
from lorenz.tasks import BackgroundTasks
from lorenz.workers.journal import Record
from lorenz.workers.protocol import ProtocolError, encode, read_message, read_messages

logger = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


class ConnectionLost(Exception):
    """The connection to the worker ended (the worker may or may not still run)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CallHandlers:
    """What the controller answers worker calls with."""

    tools: ToolHandler | None = None
    """Executes ``tool`` calls; without it every tool call fails."""
    issue_active: Callable[[], Awaitable[bool]] | None = None
    """Answers ``issue_active``; without it the answer is "yes"."""


_EOF = object()

RecordSink = Callable[[Record | None], None]
"""Takes each record as it is read; ``None`` when the connection ended."""


class WorkerConnection:
    """One open control connection. Use :meth:`open`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        hello: dict[str, Any],
        handlers: CallHandlers,
        on_record: RecordSink | None = None,
    ) -> None:
        self.hello = hello
        self._sink = on_record
        self._reader = reader
        self._writer = writer
        self._handlers = handlers
        self._records: asyncio.Queue[Any] = asyncio.Queue()
        self._pongs: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ping_ids = itertools.count(1)
        self._calls = BackgroundTasks(name="worker-calls", log=logger)
        self.live = asyncio.Event()
        """Set once the replay after ``attach`` is complete."""
        self.closed = asyncio.Event()
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        handlers: CallHandlers | None = None,
        timeout_s: float = HELLO_TIMEOUT_S,
        on_record: RecordSink | None = None,
    ) -> WorkerConnection:
        """The connection, once the worker said hello.

        ``on_record``: every record is handed to it in the reading task, in order, and
        ``None`` once the connection ended (:meth:`records` then yields nothing). NB: this
        saves a queue and a second task's wake-up per record — the busiest path of a
        controller with many runs.
        """
        try:
            async with asyncio.timeout(timeout_s):
                hello = await read_message(reader)
        except (TimeoutError, ProtocolError, OSError) as exc:
            writer.close()
            raise ConnectionLost(f"no hello from the worker ({exc})") from None
        if hello is None or hello.get("op") != "hello":
            writer.close()
            raise ConnectionLost("the worker did not say hello")
        return cls(
            reader, writer, hello=hello, handlers=handlers or CallHandlers(), on_record=on_record
        )

    @property
    def pid(self) -> int | None:
        pid = self.hello.get("pid")
        return pid if isinstance(pid, int) else None

    def _send(self, message: dict[str, Any]) -> None:
        if self.closed.is_set():
            raise ConnectionLost("the connection is closed")
        self._writer.write(encode(message))

    async def attach(self, *, after_seq: int, role: str = "controller") -> None:
        self._send({"op": "attach", "after_seq": after_seq, "role": role})
        await self._drain()

    async def cancel(self, reason: str) -> None:
        self._send({"op": "cancel", "reason": reason})
        await self._drain()

    async def ack(self, seq: int) -> None:
        with contextlib.suppress(ConnectionLost):
            self._send({"op": "ack", "seq": seq})
            await self._drain()

    async def ping(self, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """A heartbeat: the worker's ``pong`` (``last_seq``, ``phase``)."""
        ping_id = next(self._ping_ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pongs[ping_id] = future
        try:
            self._send({"op": "ping", "id": ping_id})
            await self._drain()
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pongs.pop(ping_id, None)

    async def records(self) -> AsyncIterator[Record]:
        """Records in the order the worker wrote them; ends with :class:`ConnectionLost`."""
        while True:
            item = await self._records.get()
            if item is _EOF:
                raise ConnectionLost("the worker closed the connection")
            yield item

    async def close(self) -> None:
        if self._task is not asyncio.current_task():
            self._task.cancel()
            # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
            with contextlib.suppress(BaseException):
                await self._task
        # NB: cancelled, not awaited: their replies have nowhere to go once the writer closes,
        # and closing must not wait on a tool call that is slow to notice.
        for task in self._calls:
            task.cancel()
        self._writer.close()
        # NB: the peer may be gone already: closing is best effort.
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self.closed.set()

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ConnectionLost(str(exc)) from None

    async def _read_loop(self) -> None:
        try:
            try:
                async for message in read_messages(self._reader):
                    self._route(message)
            except ProtocolError as exc:
                logger.warning("worker sent garbage, connection dropped: %s", exc)
            except (ConnectionError, OSError):
                return
        finally:
            self.closed.set()
            if self._sink is not None:
                self._sink(None)
            self._records.put_nowait(_EOF)
            for future in self._pongs.values():
                if not future.done():
                    future.set_exception(ConnectionLost("the connection closed"))

    def _route(self, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "record":
            try:
                record = Record.from_json(message.get("record"))
            except ValueError as exc:
                logger.warning("worker sent a malformed record: %s", exc)
                return
            if self._sink is not None:
                self._sink(record)
            else:
                self._records.put_nowait(record)
        elif op == "live":
            self.live.set()
        elif op == "pong":
            future = self._pongs.get(message.get("id"))  # type: ignore[arg-type]
            if future is not None and not future.done():
                future.set_result(message)
        elif op == "call":
            self._calls.spawn(self._answer(message), name="lorenz-worker-call")
        elif op == "error":
            logger.warning("worker refused a message: %s", message.get("message"))

    async def _answer(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params")
        params = params if isinstance(params, dict) else {}
        result: Any
        if method == "tool":
            result = await self._run_tool(params)
        elif method == "issue_active":
            check = self._handlers.issue_active
            try:
                result = True if check is None else bool(await check())
            except Exception:
                logger.exception("the issue-activity check raised")
                result = False
        else:
            result = None
        with contextlib.suppress(ConnectionLost):
            self._send({"op": "reply", "id": message.get("id"), "result": result})
            await self._drain()

    async def _run_tool(self, params: dict[str, Any]) -> dict[str, Any]:
        tools = self._handlers.tools
        name = params.get("name")
        arguments = params.get("arguments")
        if tools is None or not isinstance(name, str):
            return {"success": False, "output": "this controller offers no host-side tools"}
        try:
            return await tools.call_tool(name, arguments if isinstance(arguments, dict) else {})
        except Exception as exc:  # NB: the contract says never raise; a bug must not stall.
            logger.exception("tool handler raised", extra={"tool": name})
            return {"success": False, "output": str(exc)}
