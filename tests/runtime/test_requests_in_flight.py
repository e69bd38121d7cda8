"""A run cancelled while its tool call is talking to the tracker does not cut the request off.

The tracker is a real Linear client; the server is a real HTTP server on 127.0.0.1 that checks
each body arrived whole (its length matches ``Content-Length`` and it parses) and whether the
client was still there to receive the answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from lorenz.config import WorkflowSettings
from lorenz.runtime.tools import GraphQLToolHandler
from lorenz.trackers.linear import LinearTracker


class CheckingServer:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.bodies_whole: list[bool] = []
        self.answered_to_a_live_client: list[bool] = []

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            json.loads(raw)
            whole = len(raw) == int(request.headers["Content-Length"])
        except ValueError:
            whole = False
        self.bodies_whole.append(whole)
        self.started.set()
        await self.release.wait()
        transport = request.transport
        self.answered_to_a_live_client.append(transport is not None and not transport.is_closing())
        return web.json_response({"data": {"viewer": {"id": "u1"}}})


@pytest.fixture
async def server() -> AsyncIterator[tuple[CheckingServer, str]]:
    checking = CheckingServer()
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/graphql", checking.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield checking, f"http://127.0.0.1:{port}/graphql"
    await runner.cleanup()


async def test_a_cancelled_tool_call_lets_its_tracker_request_finish(
    server: tuple[CheckingServer, str],
) -> None:
    checking, url = server
    settings = WorkflowSettings.model_validate(
        {"tracker": {"kind": "linear", "api_key": "k", "project_slug": "p", "endpoint": url}}
    )
    tracker = LinearTracker(settings=settings, api_key="k", endpoint=url)
    tools = GraphQLToolHandler(tracker=tracker)
    try:
        call = asyncio.create_task(tools.call_tool(
            "linear_graphql",
            {"query": "query Big($pad: String) { viewer { id } }",
             "variables": {"pad": "x" * (2 * 1024 * 1024)}},
        ))
        await asyncio.wait_for(checking.started.wait(), 30)
        call.cancel()  # the run is stopped while the request is in flight
        await asyncio.sleep(0.1)
        assert not call.done(), "the call must wait for its request"
        checking.release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 30)
    finally:
        await tracker.close()
    assert checking.bodies_whole == [True]
    assert checking.answered_to_a_live_client == [True]
