"""A hostile WORKFLOW.md edit under a running host: refused with a code, polls go on, /healthz
answers.

The whole single-host composition runs in-process (files tracker, memory claims, the HTTP
server on an ephemeral port); the test waits on the runtime's own events.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from lorenz.daemon import host
from lorenz.daemon.host import HostOptions, run_host
from lorenz.runtime import LorenzRuntime
from lorenz.server import app as server_app
from tests.waiting import wait_until_async
from tests.workflow.test_bounds import alias_bomb

EVENT_BOUND_S = 60.0
"""Hang protection while waiting for an event (generous: the machine may be loaded)."""


def workflow_text(tmp_path: Path, *, anchors: str = "", provider: str = "{}") -> str:
    return (
        "---\n"
        f"{anchors}\n"
        "tracker:\n"
        "  kind: files\n"
        f"  path: {tmp_path / 'issues'}\n"
        f"  provider: {provider}\n"
        "polling:\n"
        "  interval_ms: 100\n"
        "workspace:\n"
        f"  root: {tmp_path / 'workspaces'}\n"
        "agent:\n"
        "  kind: demo\n"
        "agents:\n"
        "  demo:\n"
        "    protocol: command\n"
        "    command: 'true'\n"
        "---\n"
        "Work on {{ issue.identifier }}.\n"
    )


BOMB_ANCHORS = alias_bomb().split("tracker:", 1)[0]
"""The bomb's anchor levels (top-level keys: ignored with a warning, but decoded)."""


@pytest.mark.parametrize(
    "hostile",
    [(BOMB_ANCHORS, "{x: *h}"), ("", "[" * 1000 + "]" * 1000)],
    ids=["alias-bomb", "depth-1000"],
)
async def test_a_hostile_reload_is_refused_and_the_host_keeps_polling_and_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: tuple[str, str]
) -> None:
    (tmp_path / "issues").mkdir()
    path = tmp_path / "WORKFLOW.md"
    path.write_text(workflow_text(tmp_path), encoding="utf-8")
    servers: list[server_app.LorenzServer] = []

    def serve(loaded: Any, options: Any) -> server_app.LorenzServer | None:
        server = server_app.attachment_factory(loaded, options)
        if server is not None:
            servers.append(server)
        return server

    monkeypatch.setattr(host, "ATTACHMENTS", [serve])
    runtimes: list[LorenzRuntime] = []
    events: list[dict[str, Any]] = []

    def ready(runtime: LorenzRuntime) -> None:
        runtime.add_event_listener(lambda event: events.append(event.to_dict()))
        runtimes.append(runtime)

    options = HostOptions(workflow_path=str(path), port=0, tui=False, environ={})
    task = asyncio.create_task(run_host(options, ready=ready))
    try:
        await wait_until_async(
            lambda: bool(runtimes) and runtimes[0].poll_count >= 1,
            timeout=EVENT_BOUND_S,
            what="the first poll",
        )
        runtime = runtimes[0]
        url = servers[0].url

        # NB: the hostile value sits in a pass-through section, where no schema refuses it.
        anchors, provider = hostile
        path.write_text(
            workflow_text(tmp_path, anchors=anchors, provider=provider), encoding="utf-8"
        )

        def refused() -> bool:
            return any(e["type"] == "workflow_reload_failed" for e in events)

        await wait_until_async(refused, timeout=EVENT_BOUND_S, what="the reload to be refused")
        failure = next(e for e in events if e["type"] == "workflow_reload_failed")
        assert failure["code"] == "workflow_too_complex", failure
        assert "limit" in failure["message"]
        assert not any(e["type"] == "workflow_reloaded" for e in events)

        polls = runtime.poll_count
        await wait_until_async(
            lambda: runtime.poll_count >= polls + 2,
            timeout=EVENT_BOUND_S,
            what="two more polls",
        )
        async with httpx.AsyncClient(timeout=EVENT_BOUND_S) as client:
            response = await client.get(f"{url}/healthz")
        assert response.status_code == 200
    finally:
        for runtime in runtimes:
            runtime.stop()
        await asyncio.wait_for(task, timeout=EVENT_BOUND_S)
