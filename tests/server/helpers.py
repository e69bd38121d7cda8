"""Shared pieces of the server tests: issues, agents, a served runtime, waiting, SSE reading."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from lorenz.model import Issue
from lorenz.server import LorenzServer
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow

LIVE_SERVERS: list[LorenzServer] = []
"""Servers started by :func:`serve`; the folder's conftest stops them after each test."""

SENTINEL_SECRET = "lorenz-sentinel-api-key-4f1c9e"

WAITING_AGENT = """
name = env["LORENZ_ISSUE_IDENTIFIER"].replace("/", "_")
release = pathlib.Path(env["LORENZ_WORKFLOW"]).parent / ("release-" + name)
print("started work on", env["LORENZ_ISSUE_IDENTIFIER"], flush=True)
while not release.exists():
    time.sleep(0.02)
print("finishing", env["LORENZ_ISSUE_IDENTIFIER"], flush=True)
if release.read_text().strip() == "fail":
    sys.exit(3)
"""
"""Runs until ``release-<identifier>`` appears beside the workflow; fails if it says ``fail``."""


def issue(n: int, *, state: str = "Todo", **fields: Any) -> Issue:
    return Issue(
        id=f"id-{n}",
        identifier=fields.pop("identifier", f"T-{n}"),
        title=fields.pop("title", f"Issue {n}"),
        state=state,
        priority=2,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        + datetime.timedelta(minutes=n),
        **fields,
    )


def release(rig: RuntimeRig, identifier: str, *, fail: bool = False) -> None:
    path = rig.workflow.path.parent / f"release-{identifier.replace('/', '_')}"
    path.write_text("fail" if fail else "ok", encoding="utf-8")


@dataclasses.dataclass
class Served:
    rig: RuntimeRig
    server: LorenzServer

    @property
    def url(self) -> str:
        assert self.server.url is not None
        return self.server.url

    @property
    def auth(self) -> dict[str, str]:
        """The header state-changing requests over TCP need (the server's bearer token)."""
        assert self.server.guard is not None
        return {"Authorization": f"Bearer {self.server.guard.token}"}


def make_rig(
    tmp_path: Path,
    *,
    issues: list[Issue],
    agent_body: str = WAITING_AGENT,
    front_matter: dict[str, Any] | None = None,
    agent_settings: dict[str, Any] | None = None,
    **rig_options: Any,
) -> RuntimeRig:
    """A rig whose agent runs ``agent_body``; ``agent_settings`` go into ``agents.test``."""
    agent = write_agent(tmp_path, "agent", agent_body)
    front_matter = dict(front_matter or {})
    if agent_settings:
        front_matter["agents"] = {"test": {
            "protocol": "command",
            "command": f"{sys.executable} {agent}",
            "stall_timeout_ms": 60000,
            "turn_timeout_ms": 60000,
            **agent_settings,
        }}
    workflow = write_workflow(tmp_path, agent_script=agent, front_matter=front_matter)
    return build_rig(workflow, issues=issues, **rig_options)


async def serve(rig: RuntimeRig, **server_options: Any) -> Served:
    server_options.setdefault("port", 0)
    server_options.setdefault("static_routes", ())
    server = LorenzServer(**server_options)
    await server.start(rig.runtime)
    LIVE_SERVERS.append(server)
    return Served(rig=rig, server=server)


async def get_json(
    http: aiohttp.ClientSession, url: str, *, status: int = 200
) -> dict[str, Any]:
    async with http.get(url) as response:
        body = await response.text()
        assert response.status == status, body
        assert response.content_type == "application/json"
        document: dict[str, Any] = json.loads(body)
        return document


class SseReader:
    """Reads SSE frames from a live response: events (name, data) and comment lines."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.comments: list[str] = []
        self.fields: list[dict[str, str]] = []

    async def next_frame(self, *, timeout: float = 10.0) -> dict[str, str]:
        """The next frame; comment-only frames are recorded in ``comments`` and returned too."""
        frame: dict[str, str] = {}
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.response.content.readline()
                if not raw:
                    raise EOFError("the stream ended")
                line = raw.decode().rstrip("\n")
                if not line:
                    if frame:
                        self.fields.append(frame)
                        return frame
                    continue
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                    frame.setdefault(":comment", line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                frame[name] = value[1:] if value.startswith(" ") else value

    async def next_snapshot(self, *, timeout: float = 10.0) -> dict[str, Any]:
        while True:
            frame = await self.next_frame(timeout=timeout)
            if frame.get("event") == "snapshot":
                snapshot: dict[str, Any] = json.loads(frame["data"])
                return snapshot

    async def snapshot_where(
        self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 15.0
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                snapshot = await self.next_snapshot(timeout=timeout)
                if predicate(snapshot):
                    return snapshot


@dataclasses.dataclass
class PoolHost:
    host: str | None


class GatedPool:
    """The runtime's WorkerPool protocol over named hosts, handing them out when the gate opens."""

    def __init__(self, hosts: list[str]) -> None:
        self.free = list(hosts)
        self.gate = asyncio.Event()

    async def acquire(self, *, key: Any, timeout_ms: int) -> PoolHost | None:
        await self.gate.wait()
        return PoolHost(self.free.pop(0)) if self.free else None

    async def release(self, slot: PoolHost, *, poison: bool) -> None:
        if slot.host is not None:
            self.free.append(slot.host)

    async def drain(self, *, deadline_ms: int) -> None:
        return None


class PoolGoverns:
    """Capacity probe saying the pool governs dispatch (slots are reserved first)."""

    def governs(self) -> bool:
        return True

    def has_capacity(self) -> bool:
        return True
