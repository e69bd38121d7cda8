"""Fixtures for the worker tests: short state roots, run specs for the gated Codex agent, and a
teardown that kills every worker a test left behind (by pid, never by name)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.config import AgentLaunch, AgentProtocol
from lorenz.workers.journal import Record
from lorenz.workers.spec import HookSpec, IssueSpec, RunSpec
from lorenz.workers.states import worker_pid
from lorenz.workflow import continuation_prompt

GATED_CODEX = Path(__file__).resolve().parent / "gated_codex.py"

SECRET = "lin_api_SECRET-token-never-in-a-worker-0123456789"


def base_env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
    }


@pytest.fixture
def state_root() -> Iterator[Path]:
    """A short state root (socket paths must stay under 108 bytes); workers in it are killed
    at teardown (``LORENZ_TEST_KEEP_WORKER_STATE=1`` keeps the directories to inspect)."""
    root = Path(tempfile.mkdtemp(prefix="lzw", dir="/tmp"))
    try:
        yield root
    finally:
        kill_workers_under(root)
        if not os.environ.get("LORENZ_TEST_KEEP_WORKER_STATE"):
            shutil.rmtree(root, ignore_errors=True)


def kill_workers_under(root: Path) -> None:
    for status in root.glob("*/worker.json"):
        pid = worker_pid(status.parent)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


@dataclasses.dataclass
class Scenario:
    dir: Path
    name: str

    @property
    def marks(self) -> Path:
        return self.dir / f"{self.name}.marks"

    @property
    def record(self) -> Path:
        return self.dir / f"{self.name}.record"

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    def gate(self, label: str) -> Path:
        return self.dir / f"{self.name}.gate-{label}"

    def open_gate(self, label: str) -> None:
        self.gate(label).write_text("open")

    def answers(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def agent_pid(self) -> int:
        return int(self.pid_file.read_text())


SpecFactory = Callable[..., tuple[RunSpec, Scenario]]


@pytest.fixture
def make_spec(tmp_path: Path) -> SpecFactory:
    counter = itertools.count(1)

    def make(
        *,
        turns: list[dict[str, Any]] | None = None,
        max_turns: int = 1,
        identifier: str | None = None,
        hooks: HookSpec | None = None,
        workspace: Path | None = None,
        create_workspace: bool = False,
        tools: list[dict[str, Any]] | None = None,
        python: str = sys.executable,
        gate: str | None = None,
        after_gate: list[dict[str, Any]] | None = None,
        **overrides: Any,
    ) -> tuple[RunSpec, Scenario]:
        n = next(counter)
        scenario = Scenario(dir=tmp_path, name=f"agent{n}")
        if gate is not None:
            turns = [
                {"steps": [{"message": "waiting"}, {"gate": str(scenario.gate(gate))},
                           *(after_gate or [{"message": "through"}, {"usage": 42}])]}
            ]
        body = {
            "turns": turns or [{"steps": [{"message": "hello"}, {"usage": 42}]}],
            "record": str(scenario.record),
            "marks": str(scenario.marks),
            "pid_file": str(scenario.pid_file),
        }
        path = tmp_path / f"scenario{n}.json"
        path.write_text(json.dumps(body))
        if workspace is None:
            workspace = tmp_path / f"ws{n}"
            if not create_workspace:
                workspace.mkdir()
        command = " ".join(shlex.quote(p) for p in (python, str(GATED_CODEX), str(path)))
        spec = RunSpec(
            workflow=str(tmp_path / "WORKFLOW.md"),
            issue=IssueSpec(
                id=f"issue-{n}", identifier=identifier or f"ABC-{n}", title="Fix it", state="Todo"
            ),
            prompt="Fix the bug.",
            agent=AgentLaunch(
                command=command, protocol=AgentProtocol.CODEX_APP_SERVER, read_timeout_ms=30000
            ),
            max_turns=max_turns,
            continuation_prompts=[
                continuation_prompt(turn, max_turns) for turn in range(2, max_turns + 1)
            ],
            workspace=str(workspace),
            create_workspace=create_workspace,
            hooks=hooks or HookSpec(env=base_env()),
            env=base_env(),
            tools=tools or [],
            **overrides,
        )
        return spec, scenario

    return make


class Collected:
    """A record sink that checks order as it goes."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.changed = asyncio.Event()

    def __call__(self, record: Record) -> None:
        self.records.append(record)
        self.changed.set()

    def seqs(self) -> list[int]:
        return [r.seq for r in self.records]

    def kinds(self) -> list[str]:
        return [r.kind for r in self.records]

    def events(self) -> list[str]:
        return [str(r.data.get("event")) for r in self.records if r.kind == "agent_update"]

    async def wait_for(
        self, predicate: Callable[[list[Record]], bool], timeout_s: float = 60.0
    ) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate(self.records):
                self.changed.clear()
                await self.changed.wait()


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def environ_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()
