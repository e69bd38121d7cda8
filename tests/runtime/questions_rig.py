"""A runtime whose agents are the scripted Codex app-server, one scenario per issue, for the
ask/answer/resume tests (runtime and server)."""

from __future__ import annotations

import asyncio
import datetime
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lorenz.model import Issue
from tests.runtime.harness import RuntimeRig, build_rig

FAKE_CODEX = Path(__file__).resolve().parent.parent / "fakes" / "codex_agent.py"

WAIT_S = 60.0
"""Generous: agent processes start slowly on a loaded machine."""

ASKING_TURN: dict[str, Any] = {
    "steps": [
        {
            "request": "item/tool/requestUserInput",
            "params": {
                "questions": [
                    {
                        "id": "q1",
                        "header": "Database",
                        "question": "Which database should the cache use?",
                        "options": [
                            {"label": "Redis", "description": "in memory"},
                            {"label": "Postgres", "description": "durable"},
                        ],
                    }
                ]
            },
        },
        {"hang": True},
    ]
}


def issue(n: int, *, priority: int = 2) -> Issue:
    return Issue(
        id=f"id-{n}",
        identifier=f"T-{n}",
        title=f"Issue {n}",
        state="Todo",
        priority=priority,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        + datetime.timedelta(minutes=n),
    )


def asking_scenario(tmp_path: Path, identifier: str) -> dict[str, Any]:
    """Asks in its first thread; answers the resumed thread with one message."""
    return {
        "thread_id": f"thr-{identifier}",
        "record": str(tmp_path / "records" / f"{identifier}.jsonl"),
        "turns": [ASKING_TURN],
        "resumed_turns": [{"steps": [{"agent_message": "resumed and done"}]}],
    }


def plain_scenario(tmp_path: Path, identifier: str) -> dict[str, Any]:
    return {
        "thread_id": f"thr-{identifier}",
        "record": str(tmp_path / "records" / f"{identifier}.jsonl"),
        "turns": [{"steps": [{"agent_message": "done"}]}],
    }


def codex_workflow(
    tmp_path: Path,
    *,
    scenarios: dict[str, dict[str, Any]],
    front_matter: dict[str, Any] | None = None,
) -> Path:
    """A WORKFLOW.md whose agent is the fake Codex with ``scenarios/<identifier>.json``."""
    folder = tmp_path / "scenarios"
    folder.mkdir(exist_ok=True)
    (tmp_path / "records").mkdir(exist_ok=True)
    for identifier, scenario in scenarios.items():
        (folder / f"{identifier}.json").write_text(json.dumps(scenario), encoding="utf-8")
    command = (
        " ".join(shlex.quote(str(p)) for p in (sys.executable, FAKE_CODEX))
        + f' {shlex.quote(str(folder))}/"$LORENZ_ISSUE_IDENTIFIER".json'
    )
    config: dict[str, Any] = {
        "tracker": {"kind": "memory"},
        "polling": {"interval_ms": 100},
        "workspace": {"root": str(tmp_path / "workspaces")},
        "agent": {"kind": "codex", "max_concurrent_agents": 1, "max_turns": 1},
        "agents": {
            "codex": {
                "protocol": "codex-app-server",
                "command": command,
                "stall_timeout_ms": 60000,
                "turn_timeout_ms": 60000,
            }
        },
    }
    for section, values in (front_matter or {}).items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    path = tmp_path / "WORKFLOW.md"
    path.write_text(
        f"---\n{yaml.safe_dump(config)}---\nWork on {{{{ issue.identifier }}}}\n",
        encoding="utf-8",
    )
    return path


def records(tmp_path: Path, identifier: str) -> list[dict[str, Any]]:
    path = tmp_path / "records" / f"{identifier}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def turn_texts(tmp_path: Path, identifier: str) -> list[str]:
    return [r["text"] for r in records(tmp_path, identifier) if "turn" in r and "text" in r]


async def until(check: Callable[[], bool], *, what: str, timeout_s: float = WAIT_S) -> None:
    """Wait (bounded) until ``check()`` holds."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def waiting_rows(rig: RuntimeRig) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = rig.runtime.snapshot().to_dict()["waiting"]
    return rows


def build(tmp_path: Path, workflow: Path, issues: list[Issue], **options: Any) -> RuntimeRig:
    return build_rig(workflow, issues=issues, **options)
