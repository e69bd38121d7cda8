"""The control routes on the server's application: shapes, the shared refresh, stop, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from lorenz.config.settings import DaemonSettings
from lorenz.daemon.control import DAEMON_SCHEMA, STOP_SCHEMA, DaemonControl
from lorenz.daemon.daemons import Daemon
from lorenz.daemon.discovery import lease_file_for, read_lease
from lorenz.daemon.sockets import socket_path_for
from lorenz.runtime import LorenzRuntime
from tests.daemon.harness import call
from tests.runtime.harness import LIVE_RUNTIMES, build_rig, write_agent, write_workflow


@pytest.fixture
async def served(
    tmp_path: Path, runtime_dir: Path
) -> AsyncIterator[tuple[Daemon, DaemonControl, LorenzRuntime, list[str]]]:
    agent = write_agent(tmp_path, "noop", "print('ok')\n")
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(workflow)
    stops: list[str] = []
    daemon = Daemon(
        workflow_path=workflow.resolve(), settings=DaemonSettings(), claim_owner="test-owner"
    )
    await daemon.acquire()
    daemon.bind(rig.runtime, stop=lambda: stops.append("stop"))
    control = DaemonControl(
        daemon=daemon,
        socket_path=socket_path_for(
            workflow.resolve(), environ={"XDG_RUNTIME_DIR": str(runtime_dir)}
        ),
    )
    await control.start(rig.runtime)
    try:
        yield daemon, control, rig.runtime, stops
    finally:
        await control.stop()
        await daemon.release()
        while LIVE_RUNTIMES:
            LIVE_RUNTIMES.pop().stop()


async def get(endpoint: str, method: str, path: str) -> Any:
    return await asyncio.to_thread(call, endpoint, method, path)


async def test_daemon_block_is_published_and_matches_its_schema(served: Any) -> None:
    daemon, control, _runtime, _ = served
    assert control.endpoint.startswith("unix://")
    lease = read_lease(lease_file_for(daemon.workflow_path))
    assert lease is not None
    assert lease["endpoint"] == control.endpoint  # published into the lease
    reply = await get(control.endpoint, "GET", "/api/v1/daemon")
    assert reply.status == 200
    jsonschema.validate(reply.body, DAEMON_SCHEMA)
    assert reply.body["holder"] == lease["holder"]
    assert reply.body["claim_owner"] == "test-owner"
    assert reply.body["lanes"] == {"running": 0, "reserving": 0, "retrying": 0, "blocked": 0}
    state = await get(control.endpoint, "GET", "/api/v1/state")
    assert state.status == 200
    assert state.body["daemon"]["holder"] == lease["holder"]
    document = await get(control.endpoint, "GET", "/api/v1/openapi.json")
    assert {"/api/v1/daemon", "/api/v1/stop", "/api/v1/refresh"} <= set(document.body["paths"])


async def test_refresh_is_the_servers_and_stop_answers_before_stopping(served: Any) -> None:
    _, control, _runtime, stops = served
    refresh = await get(control.endpoint, "POST", "/api/v1/refresh")
    assert refresh.status == 202
    assert refresh.body["queued"] is True
    assert refresh.body["operations"] == ["poll", "reconcile"]
    stop = await get(control.endpoint, "POST", "/api/v1/stop")
    assert stop.status == 202
    jsonschema.validate(stop.body, STOP_SCHEMA)
    await asyncio.sleep(0)  # the stop is scheduled after the response
    await asyncio.sleep(0)
    assert stops == ["stop"]
    again = await get(control.endpoint, "POST", "/api/v1/stop")
    assert again.status == 202  # asking twice is harmless: one shutdown
    wrong = await get(control.endpoint, "GET", "/api/v1/stop")
    assert wrong.status == 405
    assert wrong.body["error"]["code"] == "method_not_allowed"
    missing = await get(control.endpoint, "GET", "/api/v1/nothing")
    assert missing.status == 404
    assert missing.body["error"]["code"] == "route_not_found"
