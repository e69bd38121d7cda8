"""Fixtures for the agent-runner tests: run requests, update recorders, scripted fake agents."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.agents.base import AgentRunRequest, ToolHandler
from lorenz.config import AgentKindSettings, AgentProtocol
from lorenz.model import AgentUpdate, Issue

FAKES = Path(__file__).resolve().parent.parent / "fakes"
FAKE_CODEX = FAKES / "codex_agent.py"
SCENARIOS = FAKES / "scenarios"


def python_command(script: Path | str, *args: str) -> str:
    """A shell command running ``script`` with this interpreter (login shells reset PATH)."""
    return " ".join(shlex.quote(part) for part in (sys.executable, str(script), *args))


def base_env() -> dict[str, str]:
    """A small, explicit environment for agent processes."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
    }


@dataclasses.dataclass
class UpdateRecorder:
    updates: list[AgentUpdate] = dataclasses.field(default_factory=list)

    def __call__(self, update: AgentUpdate) -> None:
        self.updates.append(update)

    def events(self) -> list[str]:
        return [u.event for u in self.updates]

    def of(self, event: str) -> list[AgentUpdate]:
        return [u for u in self.updates if u.event == event]


@dataclasses.dataclass
class RunKit:
    """Builds :class:`AgentRunRequest`s for one test, recording what the runner reports."""

    workspace: Path
    recorder: UpdateRecorder
    active_answers: list[bool]
    active_calls: int = 0
    continuation_calls: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def request(
        self,
        *,
        command: str,
        protocol: AgentProtocol = AgentProtocol.CODEX_APP_SERVER,
        prompt: str = "Fix the bug described in ABC-1.",
        max_turns: int = 1,
        tools: ToolHandler | None = None,
        env: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> AgentRunRequest:
        return AgentRunRequest(
            issue=Issue(id="issue-1", identifier="ABC-1", title="Fix the bug", state="Todo"),
            attempt=None,
            slot_index=0,
            prompt=prompt,
            workspace=self.workspace,
            settings=AgentKindSettings(command=command, protocol=protocol, **settings).launch(),
            max_turns=max_turns,
            env=base_env() if env is None else env,
            on_update=self.recorder,
            issue_is_active=self._issue_is_active,
            continuation_prompt=self._continuation,
            tools=tools,
        )

    async def _issue_is_active(self) -> bool:
        self.active_calls += 1
        if self.active_answers:
            return self.active_answers.pop(0)
        return True

    def _continuation(self, turn: int, max_turns: int) -> str:
        self.continuation_calls.append((turn, max_turns))
        return f"Continue: turn {turn} of {max_turns}."


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def kit(workspace: Path) -> RunKit:
    return RunKit(workspace=workspace, recorder=UpdateRecorder(), active_answers=[])


@dataclasses.dataclass
class FakeCodexScript:
    """One scenario, materialized in a temp dir with its own record file."""

    scenario_path: Path
    record_path: Path

    @property
    def command(self) -> str:
        return python_command(FAKE_CODEX, str(self.scenario_path))

    def records(self) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines() if line]

    def received(self) -> list[dict[str, Any]]:
        return [r["received"] for r in self.records() if "received" in r]

    def answers(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.records():
            if "server_request" in r:
                out.setdefault(r["server_request"], []).append(r["answer"])
        return out

    def violations(self) -> list[str]:
        return [r["violation"] for r in self.records() if "violation" in r]


FakeCodexFactory = Callable[..., FakeCodexScript]


@pytest.fixture
def fake_codex(tmp_path: Path) -> FakeCodexFactory:
    counter = iter(range(1_000_000))

    def make(name: str | None = None, /, **overrides: Any) -> FakeCodexScript:
        scenario: dict[str, Any] = {}
        if name is not None:
            scenario = json.loads((SCENARIOS / f"codex_{name}.json").read_text())
        scenario.update(overrides)
        n = next(counter)
        record = tmp_path / f"codex-record-{n}.jsonl"
        scenario["record"] = str(record)
        path = tmp_path / f"codex-scenario-{n}.json"
        path.write_text(json.dumps(scenario))
        return FakeCodexScript(scenario_path=path, record_path=record)

    return make


class StaticTools:
    """A ToolHandler with one ``linear_graphql`` tool that answers from a table."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Mapping[str, Any]]] = []

    def tool_specs(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "linear_graphql",
                "description": "Run one GraphQL operation against Linear.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "variables": {"type": "object"}},
                    "required": ["query"],
                    "additionalProperties": False,
                },
            }
        ]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append((name, dict(arguments)))
        return {"success": True, "output": json.dumps({"data": {"viewer": {"id": "user-1"}}})}


@pytest.fixture
def tools() -> StaticTools:
    return StaticTools()


def assert_gone(pids: list[int]) -> None:
    """Every pid is dead (or a zombie about to be reaped by init)."""
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            status = proc.status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"process {pid} is still alive ({status})"


AwaitableFactory = Callable[[], Awaitable[Any]]
