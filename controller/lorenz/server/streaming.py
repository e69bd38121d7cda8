"""Server-sent events: the live snapshot stream behind the dashboard.

The runtime pushes a fresh snapshot on every change — a burst of agent updates can be hundreds
a second. Browsers neither need nor can render that, and encoding the full state once per
client per change would make fan-out cost grow with clients times changes. So:

* one :class:`SnapshotHub` per app holds a single runtime subscription (taken when the first
  client connects, dropped when the last one leaves) that only says "changed": the snapshot is
  built when a frame is sent, not per change (a full snapshot costs ~25 ms at 1,000 entries,
  and a burst of agent updates is hundreds of changes a second);
* one broadcaster sends at most one ``snapshot`` frame per ``min_interval`` (~100 ms): changes
  that arrive in between are coalesced into the next frame, which is encoded once and the same
  bytes handed to every client — so encoding costs at most ten per second however many
  clients and changes there are;
* a slow client simply skips to the newest frame when it catches up;
* a comment line every ``heartbeat`` seconds keeps idle proxies and load balancers from cutting
  the stream, and makes a vanished client show up as a failed write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from lorenz.model import RuntimeSnapshot
from lorenz.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.server")

SSE_CONTENT_TYPE = "text/event-stream"
DEFAULT_MIN_INTERVAL_S = 0.1
DEFAULT_HEARTBEAT_S = 15.0
RECONNECT_MS = 2000
"""Sent as the stream's ``retry:`` field: how long a browser waits before reconnecting."""

HEARTBEAT_FRAME = b": heartbeat\n\n"

Render = Callable[[RuntimeSnapshot], Mapping[str, Any]]
"""Turns a snapshot into the document a frame carries (by default ``RuntimeSnapshot.to_dict``)."""


def encode_event(*, event: str, data: Mapping[str, Any], event_id: int | None = None) -> bytes:
    """One SSE frame. JSON has no raw newlines, so the payload is always a single data line."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    payload = json.dumps(data, separators=(",", ":"), default=str)
    return f"{head}event: {event}\ndata: {payload}\n\n".encode()


class _Client:
    __slots__ = ("frame", "wake")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.frame: bytes | None = None
        """The newest frame not yet written (a slow client skips the ones it missed)."""


class SnapshotHub:
    """Fans one runtime's snapshots out to any number of SSE clients."""

    def __init__(
        self,
        *,
        runtime: LorenzRuntime,
        render: Render = RuntimeSnapshot.to_dict,
        min_interval: float = DEFAULT_MIN_INTERVAL_S,
        heartbeat: float = DEFAULT_HEARTBEAT_S,
    ) -> None:
        self._runtime = runtime
        self._render = render
        self.min_interval = min_interval
        self.heartbeat = heartbeat
        self._clients: set[_Client] = set()
        self._unsubscribe: Callable[[], None] | None = None
        self._version = 0
        self._dirty = asyncio.Event()
        self._broadcaster: asyncio.Task[None] | None = None
        self._closed = False
        self.broadcasts = 0
        """Changes the runtime reported (for benchmarks and tests)."""
        self.frames_encoded = 0
        """Snapshot frames encoded for the stream (at most one per ``min_interval``)."""

    @property
    def client_count(self) -> int:
        return len(self._clients)

    @property
    def subscribed(self) -> bool:
        """Whether the hub currently holds a runtime subscription."""
        return self._unsubscribe is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every stream (server shutdown) and drop the runtime subscription."""
        self._closed = True
        for client in self._clients:
            client.wake.set()
        self._drop_subscription()

    def _on_change(self) -> None:
        # NB: called synchronously from inside the runtime on every change: keep it O(1);
        # the snapshot and its encoding wait for the broadcaster's next beat.
        self._version += 1
        self.broadcasts += 1
        self._dirty.set()

    async def _broadcast(self) -> None:
        """At most one frame per ``min_interval``, encoded once, handed to every client."""
        loop = asyncio.get_running_loop()
        last = -self.min_interval
        while not self._closed:
            await self._dirty.wait()
            pause = last + self.min_interval - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)  # changes meanwhile are coalesced into this frame
            self._dirty.clear()
            if not self._clients:
                continue
            try:
                frame = self._encode(self._runtime.snapshot(), version=self._version)
            except Exception:
                logger.exception("cannot encode a snapshot for the event stream")
                continue
            self.frames_encoded += 1
            last = loop.time()
            for client in self._clients:
                client.frame = frame
                client.wake.set()

    def _encode(self, snapshot: RuntimeSnapshot, *, version: int) -> bytes:
        # NB: the snapshot becomes JSON here, once per frame, not once per change.
        return encode_event(event="snapshot", data=self._render(snapshot), event_id=version)

    def _join(self) -> _Client:
        client = _Client()
        self._clients.add(client)
        if self._unsubscribe is None:
            self._unsubscribe = self._runtime.on_change(self._on_change)
        if self._broadcaster is None:
            self._broadcaster = asyncio.get_running_loop().create_task(
                self._broadcast(), name="lorenz-sse-broadcast"
            )
        return client

    def _leave(self, client: _Client) -> None:
        self._clients.discard(client)
        if not self._clients:
            self._drop_subscription()

    def _drop_subscription(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        broadcaster, self._broadcaster = self._broadcaster, None
        if broadcaster is not None:
            broadcaster.cancel()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """The ``GET /api/v1/events`` handler body: runs until the client or the server leaves."""
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": SSE_CONTENT_TYPE,
                "Cache-Control": "no-cache, no-transform",
                "X-Accel-Buffering": "no",
            },
        )
        if self._closed:
            response.set_status(503)
        await response.prepare(request)
        if self._closed:
            return response
        client = self._join()
        loop = asyncio.get_running_loop()
        try:
            # The first event is always the current state, built for this client now (the
            # hub's latest may be older than this connection, and clocks move on).
            first = self._encode(self._runtime.snapshot(), version=self._version)
            await response.write(f"retry: {RECONNECT_MS}\n".encode() + first)
            last_write = loop.time()
            while not self._closed:
                idle_left = self.heartbeat - (loop.time() - last_write)
                if idle_left <= 0 or not await _wait(client.wake, within=idle_left):
                    await response.write(HEARTBEAT_FRAME)
                    last_write = loop.time()
                    continue
                client.wake.clear()
                frame, client.frame = client.frame, None
                if frame is not None and not self._closed:
                    await response.write(frame)
                    last_write = loop.time()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away; nothing to tell it
        finally:
            self._leave(client)
        return response


async def _wait(event: asyncio.Event, *, within: float) -> bool:
    """Whether ``event`` was set within ``within`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await event.wait()
        return True
    return False
