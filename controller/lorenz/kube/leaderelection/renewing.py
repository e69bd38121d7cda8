"""Lease renewals on a thread and event loop of their own, so a busy main loop cannot lose them.

The operator's main event loop runs kopf's watches, every Workflow's controller and every
runtime. When the renewals of the replica's shard Leases and its membership ran there too, a
loop held up for longer than the renew deadline — a burst of runtime builds, a handler that
blocks, a long pause on a loaded host — made the replica give up its own shards although the API
server answered in time: every Workflow of those shards stopped, and another replica started
them. Here the renewals run on a daemon thread with its own loop (and, through the dedicated
Lease client, their own connections and worker threads), every retry period, whatever the main
loop is doing. What the main loop asks of a renewed Lease (``holds_lease()``: a flag and a
monotonic timestamp) it reads as plain attributes, with no call across the threads.

Ownership: while a Lease provider is registered here, whatever changes it (a renewal, a release)
runs on the renewer's loop under that provider's lock; the main loop takes it back with
:meth:`LeaseRenewer.remove`, which waits for a renewal in flight to end. A renewal that reports
the Lease lost unregisters it and tells the main loop (``on_lost``, run there with
``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger("lorenz.kube.renewing")

T = TypeVar("T")


@dataclasses.dataclass(eq=False, slots=True)
class _Entry:
    key: str
    renew: Callable[[], Awaitable[bool]]
    """One renewal attempt; ``False`` means lost (or, without ``on_lost``, just failed)."""
    on_lost: Callable[[], None] | None
    loop: asyncio.AbstractEventLoop | None
    """Where ``on_lost`` runs (the loop that registered the entry)."""
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    removed: bool = False


class LeaseRenewer:
    """Calls each registered renewal once per ``period_s`` on its own thread and loop."""

    def __init__(self, *, period_s: float, name: str) -> None:
        self._period_s = period_s
        self._name = name
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()
        """Guards ``_entries`` (changed from the main thread, read from the renewer's)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._passed = threading.Event()
        """Set after the first pass."""
        self.passes = 0
        """Completed passes over the registered renewals."""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread and its loop (returns once the loop runs)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        self._started.wait()

    async def first_pass(self, *, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the first pass has ended; true if it has."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._passed.wait, timeout_s
        )

    async def close(self) -> None:
        """Stop renewing (a renewal in flight ends first) and end the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        stop = self._stop
        if stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        await asyncio.get_running_loop().run_in_executor(None, thread.join)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._stop = asyncio.Event()
        self._started.set()
        try:
            loop.run_until_complete(self._run(self._stop))
        finally:
            # NB: the thread is ending: an async generator that fails to close holds nothing
            # the loop's close below does not release.
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            with self._guard:
                entries = list(self._entries.values())
            await asyncio.gather(*(self._renew(entry) for entry in entries))
            self.passes += 1
            self._passed.set()
            wait = self._period_s - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.0))

    async def _renew(self, entry: _Entry) -> None:
        async with entry.lock:
            if entry.removed:
                return
            try:
                ok = await entry.renew()
            except Exception:
                logger.exception("Lease renewal failed key=%s", entry.key)
                ok = False
            if ok or entry.on_lost is None:
                return
            entry.removed = True
            with self._guard:
                if self._entries.get(entry.key) is entry:
                    del self._entries[entry.key]
            if entry.loop is not None and not entry.loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    entry.loop.call_soon_threadsafe(entry.on_lost)

    # -- registrations (from the main loop) ------------------------------------------------

    def add(
        self,
        key: str,
        renew: Callable[[], Awaitable[bool]],
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        """Renew ``renew`` every period from now on (its first renewal comes at the next pass).

        ``on_lost`` (run on the calling loop) is told once when a renewal returns ``False``;
        without it a failed renewal is simply tried again at the next pass.
        """
        entry = _Entry(
            key=key, renew=renew, on_lost=on_lost, loop=asyncio.get_running_loop()
        )
        with self._guard:
            self._entries[key] = entry

    def holds(self, key: str) -> bool:
        with self._guard:
            return key in self._entries

    async def remove(self, key: str) -> None:
        """Stop renewing ``key``; returns once a renewal of it in flight has ended, so the
        caller owns the provider again (it may release it)."""
        with self._guard:
            entry = self._entries.pop(key, None)
        if entry is None:
            return
        entry.removed = True
        with contextlib.suppress(RuntimeError, concurrent.futures.CancelledError):
            await self._on_loop(self._settle(entry))

    async def _settle(self, entry: _Entry) -> None:
        async with entry.lock:
            pass

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            coro.close()
            raise RuntimeError("the renewer is not running")
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
