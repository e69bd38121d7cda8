"""One timer per pending retry, so retries fire off the poll cadence.

A slot whose backoff ends between two polls should not wait for the next one. Each retry gets
an event-loop timer at its monotonic deadline plus :data:`SYNC_DELAY_MS`; the small delay is on
purpose, so that timer skew never fires a retry before the orchestrator considers it due.

NB: asyncio timer handles never keep a process alive by themselves: the loop exits when its
main coroutine does, whatever timers are pending. That is the "unref" behaviour we need.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from lorenz.model import Clock, SlotKey

SYNC_DELAY_MS = 5.0


class RetryTimers:
    """Keeps exactly one armed timer per slot key with a pending retry."""

    def __init__(self, *, clock: Clock, on_fire: Callable[[SlotKey], None] | None = None) -> None:
        self._clock = clock
        self._on_fire = on_fire
        self._timers: dict[SlotKey, tuple[float, asyncio.TimerHandle]] = {}
        self.fired: dict[SlotKey, float] = {}
        """Last firing lateness (ms past the deadline) per key, for benchmarks."""

    def sync(self, deadlines: Mapping[SlotKey, float]) -> None:
        """Arm timers for ``deadlines`` (monotonic ms), cancel timers of keys no longer present."""
        loop = asyncio.get_running_loop()
        for key in list(self._timers):
            if key not in deadlines:
                self.cancel(key)
        for key, due_ms in deadlines.items():
            armed = self._timers.get(key)
            if armed is not None and armed[0] == due_ms:
                continue
            if armed is not None:
                armed[1].cancel()
            delay_s = max(due_ms + SYNC_DELAY_MS - self._clock.monotonic_ms(), 0.0) / 1000.0
            handle = loop.call_later(delay_s, self._fire, key, due_ms)
            self._timers[key] = (due_ms, handle)

    def connect(self, on_fire: Callable[[SlotKey], None]) -> None:
        """Call ``on_fire`` with the key of each retry that falls due.

        NB: set after construction when the listener is made after the timers (the runtime's
        dispatch passes are: they are handed the timers among their parts).
        """
        self._on_fire = on_fire

    def cancel(self, key: SlotKey) -> None:
        armed = self._timers.pop(key, None)
        if armed is not None:
            armed[1].cancel()

    def cancel_all(self) -> None:
        for key in list(self._timers):
            self.cancel(key)

    def armed(self) -> dict[SlotKey, float]:
        return {key: due for key, (due, _) in self._timers.items()}

    def _fire(self, key: SlotKey, due_ms: float) -> None:
        armed = self._timers.get(key)
        if armed is None or armed[0] != due_ms:
            return
        del self._timers[key]
        self.fired[key] = self._clock.monotonic_ms() - due_ms
        if self._on_fire is not None:
            self._on_fire(key)
