"""One way for tests to wait for a condition, instead of a polling loop per module.

Tests wait on events with generous bounds, never on wall-clock races: the bound only stops a
test from hanging forever, and it is not a speed check. When the bound is hit, the failure names
what was awaited and the last value the predicate returned, so a red test says why.

Helpers that wait for something specific (a daemon's readiness, a log line, a phase) stay
beside their harness, but poll through these two.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_INTERVAL_S = 0.02
"""How often the predicate is called: small, since it is a cheap in-process check."""

HANG_GUARD_FLOOR_S = 60.0
"""The least time any wait allows, whatever bound its caller names.

NB: a bound here only stops a hang; it never checks speed. Bounds of 5 to 15 s, written on an idle
machine for a process to start or a poll to come round, were missed at load 25 on 2 cores (the
suite's three groups beside other work); a passing wait ends as soon as its condition holds, so
the floor costs nothing but the time a failing test takes to say so."""

What = str | Callable[[], str]
"""What is awaited: a text, or a callable that describes the state at the moment of failure."""


class WaitTimedOut(AssertionError, TimeoutError):
    """The condition did not hold within the bound.

    NB: both an ``AssertionError`` (what most former local helpers raised, a plain test failure)
    and a ``TimeoutError`` (what those built on ``asyncio.timeout`` raised).
    """


def _failure(*, what: What, timeout: float, last: object) -> WaitTimedOut:
    said = what() if callable(what) else what
    return WaitTimedOut(f"timed out after {timeout:g} s waiting for {said}; last value: {last!r}")


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    what: What,
    interval: float = POLL_INTERVAL_S,
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that."""
    timeout = max(timeout, HANG_GUARD_FLOOR_S)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _failure(what=what, timeout=timeout, last=value)
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    what: What,
    interval: float = POLL_INTERVAL_S,
) -> T:
    """Like `wait_until`, but sleeps on the running event loop so its tasks make progress."""
    timeout = max(timeout, HANG_GUARD_FLOOR_S)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise _failure(what=what, timeout=timeout, last=value)
        await asyncio.sleep(interval)
