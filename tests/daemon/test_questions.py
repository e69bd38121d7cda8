"""A waiting question survives ``kill -9`` of the daemon (SQLite claim store), and
``lorenz answer`` resumes the same Codex thread through the next daemon.

The runs execute in workers (the default), so the question crosses the worker boundary in the
final record and the answer goes back in the next run's spec."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.daemon.harness import CLI, DaemonProcess, get_state, write_daemon_workflow
from tests.runtime.questions_rig import ASKING_TURN
from tests.waiting import wait_until

FAKE_CODEX = Path(__file__).resolve().parent.parent / "fakes" / "codex_agent.py"

WAIT_S = 120.0
"""Generous: two daemon starts and three worker runs on a loaded machine."""


def codex_workflow(root: Path) -> Path:
    scenario = root / "codex-A-1.json"
    record = root / "codex-A-1.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    scenario.write_text(
        json.dumps(
            {
                "thread_id": "thr-A-1",
                "record": str(record),
                "turns": [ASKING_TURN],
                "resumed_turns": [{"steps": [{"agent_message": "resumed"}]}],
            }
        ),
        encoding="utf-8",
    )
    command = " ".join(shlex.quote(str(p)) for p in (sys.executable, FAKE_CODEX, scenario))
    return write_daemon_workflow(
        root,
        issues=("A-1",),
        front_matter={
            "agent": {"kind": "codex", "max_turns": 1},
            "agents": {
                "codex": {
                    "protocol": "codex-app-server",
                    "command": command,
                    "stall_timeout_ms": 60000,
                    "turn_timeout_ms": 60000,
                }
            },
        },
    )


def records(root: Path) -> list[dict[str, Any]]:
    path = root / "codex-A-1.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def turn_texts(root: Path) -> list[str]:
    return [r["text"] for r in records(root) if "turn" in r and "text" in r]


def waiting(endpoint: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = get_state(endpoint)["waiting"]
    return rows


def test_a_waiting_question_survives_kill_9_and_lorenz_answer_resumes_the_thread(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    workflow = codex_workflow(root)
    first = DaemonProcess(workflow, env=daemon_env, output=tmp_path / "first.log").start()
    daemons.append(first)
    endpoint = first.wait_ready()["endpoint"]
    wait_until(lambda: waiting(endpoint), timeout=WAIT_S, what="A-1 waiting for an answer")
    (before,) = waiting(endpoint)
    assert before["session_id"] == "thr-A-1"
    first.kill9()

    second = DaemonProcess(workflow, env=daemon_env, output=tmp_path / "second.log").start()
    daemons.append(second)
    endpoint = second.wait_ready()["endpoint"]
    (after,) = waiting(endpoint)
    assert {k: after[k] for k in ("identifier", "question", "options", "session_id", "turn")} == {
        k: before[k] for k in ("identifier", "question", "options", "session_id", "turn")
    }
    assert get_state(endpoint)["running"] == []
    assert turn_texts(root) == ["Work on A-1"]

    answered = subprocess.run(
        [*CLI, "answer", str(workflow), "A-1", "--text", "Postgres"],
        env=daemon_env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert answered.returncode == 0, answered.stderr
    assert "thr-A-1" in answered.stdout
    wait_until(lambda: len(turn_texts(root)) == 2, timeout=WAIT_S, what="the resumed turn")
    assert {"resume": "thr-A-1"} in records(root)
    assert turn_texts(root)[1] == "The answer to your question: Postgres"

    again = subprocess.run(
        [*CLI, "answer", str(workflow), "A-1", "--text", "Redis", "--json"],
        env=daemon_env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1
    assert json.loads(again.stdout)["error"]["code"] == "daemon_request_failed"
    assert "issue_not_waiting" in again.stderr
