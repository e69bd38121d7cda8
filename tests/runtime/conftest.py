"""Stop every runtime a test built before its event loop closes.

NB: a test that fails while a run is still spawning would otherwise leave asyncio's
loop-shutdown cancellation to cancel the subprocess transport's own pipe-connecting task, and
CPython then waits forever for pipes that will never connect. Stopping the runtime first lets
each run settle normally.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.runtime.harness import LIVE_RUNTIMES


@pytest.fixture(autouse=True)
async def _stop_runtimes() -> AsyncIterator[None]:
    yield
    while LIVE_RUNTIMES:
        runtime = LIVE_RUNTIMES.pop()
        runtime.stop()
        await asyncio.wait_for(runtime.wait_for_runs(), timeout=60)
