"""The serving lifecycle every fake remote service shares: an aiohttp app on 127.0.0.1.

A fake declares its routes; this base starts them on an ephemeral loopback port, stops them,
and offers the same server to synchronous callers from a background thread.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Self

from aiohttp import web


class LoopbackFake(abc.ABC):
    """Base of the fake servers: ``async with Fake() as fake`` or ``fake.running_in_thread()``."""

    thread_name = "fake-server"
    _runner: web.AppRunner | None = None
    _port: int | None = None

    @abc.abstractmethod
    def _add_routes(self, app: web.Application) -> None:
        """Register this fake's handlers on ``app``."""

    async def start(self) -> Self:
        app = web.Application()
        self._add_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[Self]:
        """Serve from a background thread with its own event loop (for synchronous callers)."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        thread.start()
        started.wait(timeout=30)
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
