"""Fixtures for the server tests: a real runtime (memory tracker, command agents) behind a real
server on 127.0.0.1, and an HTTP client session.

NB: runtimes are stopped after each test before the loop closes (see tests/runtime/conftest.py
for why a still-spawning run would otherwise hang teardown); servers are stopped before that so
no SSE stream outlives its runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.runtime.harness import LIVE_RUNTIMES
from tests.server.helpers import LIVE_SERVERS


@pytest.fixture(autouse=True)
async def _stop_servers_and_runtimes() -> AsyncIterator[None]:
    yield
    while LIVE_SERVERS:
        await LIVE_SERVERS.pop().stop()
    while LIVE_RUNTIMES:
        runtime = LIVE_RUNTIMES.pop()
        runtime.stop()
        await asyncio.wait_for(runtime.wait_for_runs(), timeout=60)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
