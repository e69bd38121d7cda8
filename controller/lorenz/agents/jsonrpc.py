"""JSON-RPC over an agent's stdio: one message per line, traffic in both directions.

Agent protocols (Codex app-server, ACP) are JSON-RPC peers, not plain servers: while we wait for
the answer to our request, the agent sends notifications and asks *us* things (approvals, tool
calls). A single reader task therefore routes every inbound line to one of three places —
the pending request with that id, the notification callback, or the server-request handler (run
in its own task, so a slow tool never blocks the stream) — and the rest of the runner only ever
awaits futures.

The reader never dies on bad input: lines that are not JSON objects are counted, reported to a
callback and skipped; so are lines over the process line limit. The end of stdout resolves
:attr:`JsonRpcConnection.closed`, and every pending request fails with
:class:`ConnectionClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lorenz.agents.processes import AgentProcess, AgentStdinClosed, LineTooLong
from lorenz.tasks import BackgroundTasks

logger = logging.getLogger(__name__)

RequestId = int | str

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_OVERLOADED = -32001
"""Codex app-server: ingress queue full, "retry later"."""


class JsonRpcError(Exception):
    """An error object, received in a response or raised by a handler to be sent as one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class ConnectionClosed(Exception):
    """The agent's stdout ended (the process exited or closed it)."""


NotificationHandler = Callable[[str, Mapping[str, Any], int], None]
"""``(method, params, line size in bytes)``; synchronous, called in arrival order."""

RequestHandler = Callable[[RequestId, str, Mapping[str, Any]], Awaitable[Any]]
"""Returns the ``result`` for a server request, or raises :class:`JsonRpcError`."""

GarbageHandler = Callable[[bytes | None, str], None]
"""``(line or None if it was too long to keep, reason)`` for every skipped line."""


class JsonRpcConnection:
    """The JSON-RPC peer over one :class:`AgentProcess`."""

    def __init__(
        self,
        process: AgentProcess,
        *,
        on_notification: NotificationHandler,
        on_request: RequestHandler,
        on_garbage: GarbageHandler | None = None,
        jsonrpc_member: bool = False,
    ) -> None:
        self.process = process
        self._on_notification = on_notification
        self._on_request = on_request
        self._on_garbage = on_garbage
        self._jsonrpc_member = jsonrpc_member
        self._next_id = 1
        self._pending: dict[RequestId, asyncio.Future[Any]] = {}
        self._handlers = BackgroundTasks(name="jsonrpc-handlers", log=logger)
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        """Resolves when stdout ends; its exception is set if the reader itself failed."""
        self.last_activity: float = self._loop.time()
        """Loop time of the latest line read or message written (silence timers use it)."""
        self.garbage_lines = 0
        """How many inbound lines were skipped (not JSON, not an object, or too long)."""
        self.messages_received = 0
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(
                self._read_loop(), name=f"jsonrpc-reader-{self.process.pid}"
            )

    async def aclose(self) -> None:
        """Stop reading and cancel in-flight handlers (the process is closed by its owner)."""
        tasks = [t for t in (self._reader, *self._handlers) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_pending(ConnectionClosed("connection closed by the client"))

    # -- outbound -------------------------------------------------------------------------

    def new_request_id(self) -> int:
        request_id = self._next_id
        self._next_id += 1
        return request_id

    async def request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        timeout_s: float | None,
        request_id: RequestId | None = None,
    ) -> Any:
        """Send a request and return its ``result``.

        Raises :class:`JsonRpcError` for an error response, :class:`TimeoutError` when no
        response arrives in time, :class:`ConnectionClosed` if the agent goes away first.
        """
        if self.closed.done():
            raise ConnectionClosed("the agent's output already ended")
        rid = self.new_request_id() if request_id is None else request_id
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[rid] = future
        message: dict[str, Any] = {"id": rid, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pending.pop(rid, None)

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def respond(self, request_id: RequestId, result: Any) -> None:
        await self._send({"id": request_id, "result": result})

    async def respond_error(
        self, request_id: RequestId, code: int, message: str, data: Any = None
    ) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        await self._send({"id": request_id, "error": error})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._jsonrpc_member:
            message = {"jsonrpc": "2.0", **message}
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        await self.process.write_line(data)
        self.last_activity = self._loop.time()

    # -- inbound --------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    line = await self.process.read_line()
                except LineTooLong as exc:
                    self.last_activity = self._loop.time()
                    self._garbage(None, exc.message)
                    continue
                if line is None:
                    break
                self.last_activity = self._loop.time()
                self._route(line)
        except Exception as exc:  # NB: never let a reader bug hang the run; surface it.
            logger.exception("agent reader failed", extra={"pid": self.process.pid})
            self._fail_pending(ConnectionClosed(f"reader failed: {exc}"))
            if not self.closed.done():
                self.closed.set_exception(exc)
            return
        self._fail_pending(ConnectionClosed("the agent's output ended"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _route(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError:
            self._garbage(line, "not JSON")
            return
        if not isinstance(message, dict):
            self._garbage(line, "not a JSON object")
            return
        self.messages_received += 1
        method = message.get("method")
        has_id = "id" in message and message["id"] is not None
        if isinstance(method, str):
            params = message.get("params")
            if not isinstance(params, Mapping):
                params = {}
            if has_id:
                self._start_handler(message["id"], method, params)
            else:
                try:
                    self._on_notification(method, params, len(line))
                except Exception:
                    logger.exception("notification handler failed", extra={"method": method})
            return
        if has_id and ("result" in message or "error" in message):
            self._resolve(message)
            return
        self._garbage(line, "neither a request, a response nor a notification")

    def _resolve(self, message: Mapping[str, Any]) -> None:
        rid = message["id"]
        future = self._pending.get(rid)
        if future is None and isinstance(rid, str) and rid.isdigit():
            future = self._pending.get(int(rid))
        if future is None or future.done():
            logger.debug("response to an unknown request ignored", extra={"id": rid})
            return
        error = message.get("error")
        if error is not None:
            if isinstance(error, Mapping):
                code = error.get("code")
                future.set_exception(
                    JsonRpcError(
                        code if isinstance(code, int) else INTERNAL_ERROR,
                        str(error.get("message") or "error without a message"),
                        error.get("data"),
                    )
                )
            else:
                future.set_exception(JsonRpcError(INTERNAL_ERROR, str(error)))
        else:
            future.set_result(message.get("result"))

    def _start_handler(self, request_id: RequestId, method: str, params: Mapping[str, Any]) -> None:
        self._handlers.spawn(
            self._handle(request_id, method, params), name=f"jsonrpc-handle-{method}"
        )

    async def _handle(self, request_id: RequestId, method: str, params: Mapping[str, Any]) -> None:
        try:
            try:
                result = await self._on_request(request_id, method, params)
            except JsonRpcError as exc:
                await self.respond_error(request_id, exc.code, exc.message, exc.data)
                return
            except Exception as exc:
                logger.exception("server request handler failed", extra={"method": method})
                await self.respond_error(request_id, INTERNAL_ERROR, f"client error: {exc}")
                return
            await self.respond(request_id, result)
        except AgentStdinClosed:
            logger.debug("could not answer a server request: agent gone", extra={"method": method})

    def _garbage(self, line: bytes | None, reason: str) -> None:
        self.garbage_lines += 1
        logger.warning(
            "agent sent an unusable line; skipped",
            extra={"pid": self.process.pid, "reason": reason, "count": self.garbage_lines},
        )
        if self._on_garbage is not None:
            try:
                self._on_garbage(line, reason)
            except Exception:
                logger.exception("garbage handler failed")

    def _fail_pending(self, exc: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
