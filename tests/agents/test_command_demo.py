"""The bundled demo agent (examples/demo/agent.py), driven by the real command runner."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from lorenz.agents.base import AgentRunError
from lorenz.agents.command import CommandRunner
from lorenz.config import AgentProtocol
from tests.agents.conftest import RunKit, base_env

DEMO_AGENT = Path(__file__).resolve().parents[2] / "examples" / "demo" / "agent.py"
COMMAND = f"{shlex.quote(sys.executable)} {shlex.quote(str(DEMO_AGENT))}"

ISSUE = """---
id: demo-1
identifier: DEMO-1
title: Write a greeting
state: Todo   # moved by the agent
priority: 1
labels: [demo]
---
Add a friendly greeting to NOTES.md.
state: this line is description, not front matter
"""


def write_board(folder: Path) -> Path:
    folder.mkdir()
    (folder / "DEMO-0.md").write_text(ISSUE.replace("DEMO-1", "DEMO-0").replace("demo-1", "d0"))
    issue = folder / "greeting.md"
    issue.write_text(ISSUE)
    return issue


def demo_env(workspace: Path, **extra: str) -> dict[str, str]:
    return {
        **base_env(),
        "LORENZ_ISSUE_ID": "demo-1",
        "LORENZ_ISSUE_IDENTIFIER": "DEMO-1",
        "LORENZ_WORKSPACE": str(workspace),
        "LORENZ_DEMO_STEP_DELAY": "0",
        **extra,
    }


def read(path: Path) -> str:
    return path.read_text()


async def test_the_demo_agent_edits_the_workspace_and_finishes_its_issue(
    kit: RunKit, tmp_path: Path, workspace: Path
) -> None:
    issue = write_board(tmp_path / "issues")
    env = demo_env(workspace, LORENZ_TRACKER_PATH=str(tmp_path / "issues"))
    result = await CommandRunner().run(
        kit.request(command=COMMAND, protocol=AgentProtocol.COMMAND, env=env)
    )
    assert result.turns == 1

    notes = read(workspace / "NOTES.md")
    assert "DEMO-1: handled by the Lorenz demo agent" in notes
    text = read(issue)
    assert "state: Done\n" in text
    assert "state: Todo" not in text
    # Everything else is untouched, including a body line that looks like front matter.
    assert text == ISSUE.replace("state: Todo   # moved by the agent", "state: Done")
    assert "state: Todo" in read(tmp_path / "issues" / "DEMO-0.md")

    lines = [u.message or "" for u in kit.recorder.of("output")]
    assert lines[0].startswith("[demo-agent] working on DEMO-1: Fix the bug described in ABC-1.")
    assert any("moved DEMO-1 to Done" in line for line in lines)


async def test_an_explicit_issue_file_and_done_state_are_honoured(
    kit: RunKit, tmp_path: Path, workspace: Path
) -> None:
    issue = write_board(tmp_path / "issues")
    env = demo_env(workspace, LORENZ_ISSUE_FILE=str(issue), LORENZ_DEMO_DONE_STATE="In Review")
    await CommandRunner().run(kit.request(command=COMMAND, protocol=AgentProtocol.COMMAND, env=env))
    assert "state: In Review\n" in read(issue)


async def test_running_twice_appends_two_notes(
    kit: RunKit, tmp_path: Path, workspace: Path
) -> None:
    issue = write_board(tmp_path / "issues")
    env = demo_env(workspace, LORENZ_ISSUE_FILE=str(issue))
    for _ in range(2):
        await CommandRunner().run(
            kit.request(command=COMMAND, protocol=AgentProtocol.COMMAND, env=env)
        )
    assert read(workspace / "NOTES.md").count("DEMO-1") == 2


async def test_a_missing_issue_file_fails_the_run_with_a_hint(
    kit: RunKit, tmp_path: Path, workspace: Path
) -> None:
    write_board(tmp_path / "issues")
    env = demo_env(
        workspace,
        LORENZ_ISSUE_IDENTIFIER="NOPE-9",
        LORENZ_ISSUE_ID="nope-9",
        LORENZ_TRACKER_PATH=str(tmp_path / "issues"),
    )
    with pytest.raises(AgentRunError) as caught:
        await CommandRunner().run(
            kit.request(command=COMMAND, protocol=AgentProtocol.COMMAND, env=env)
        )
    assert caught.value.code == "agent_exited"
    assert "status 2" in caught.value.message
    assert "LORENZ_ISSUE_FILE" in caught.value.message
