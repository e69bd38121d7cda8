"""Stop the runtimes a test built before its loop closes (see tests/runtime/conftest.py)."""

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
