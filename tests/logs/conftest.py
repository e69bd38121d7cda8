"""Stop the runtimes a test built before its loop closes; leave the root logger as found.

NB: as in tests/runtime — a test that fails while a run is spawning would otherwise hang at
loop teardown. ``configure_logging`` changes the process-wide root logger, so every test gets
it back as it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.runtime.harness import LIVE_RUNTIMES


@pytest.fixture(autouse=True)
async def _stop_runtimes() -> AsyncIterator[None]:
    yield
    while LIVE_RUNTIMES:
        runtime = LIVE_RUNTIMES.pop()
        runtime.stop()
        await asyncio.wait_for(runtime.wait_for_runs(), timeout=60)


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    from lorenz.daemon import logs

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access_level = logging.getLogger("aiohttp.access").level
    yield
    active = logs.active_logging()
    if active is not None:
        active.close()
    logs._ACTIVE = None
    logs.RUN_CONTEXT.clear()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(access_level)
