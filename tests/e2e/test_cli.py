"""``lorenz WORKFLOW.md --once`` as a user runs it: the console script, in a process of its own.

The fake Linear server is served by the test's event loop while the CLI runs as a subprocess,
so everything crosses real process and socket boundaries. A subprocess has no snapshot to read:
the outcomes come from the event log file (``logging.log_file``) and from the agents' records.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from lorenz.workflow import continuation_prompt
from tests.e2e.rig import (
    FAKES,
    agent_environ,
    expected_prompt,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    seed_linear_board,
    write_workflow,
)
from tests.fakes.linear_server import FakeLinearServer

LORENZ = Path(sys.executable).with_name("lorenz")


async def test_the_console_script_runs_one_tick_against_linear_with_the_codex_agent(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    board = seed_linear_board(linear)
    install_scenarios(
        tmp_path, {"ENG-1": "e2e_codex_success.json", "ENG-2": "e2e_codex_failure.json"}
    )
    fake = python_command(FAKES / "codex_agent.py")
    dump = "import json, os; open('agent_env.json', 'w').write(json.dumps(dict(os.environ)))"
    command = (
        f"{python_command('-c', dump)} && "
        f'FAKE_CODEX_RECORD="$PWD/codex_record.jsonl" exec {fake} '
        f"{per_issue_scenario_arg(tmp_path)}"
    )
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
        max_turns=2,
    )

    process = await asyncio.create_subprocess_exec(
        str(LORENZ),
        str(workflow),
        "--once",
        "--no-tui",
        cwd=tmp_path,
        env=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    output = out.decode() + err.decode()

    assert process.returncode == 0, output
    assert linear.api_key not in output

    # What the tracker saw: one candidate query, the check before ENG-1's second turn, and the
    # read that decided ENG-1's clean exit (still active: a continuation).
    assert not linear.rejected
    assert {r.authorization for r in linear.requests} == {linear.api_key}
    assert [r.operation_name for r in linear.requests] == [
        "LorenzIssuesByStates",
        "LorenzIssuesByIds",
        "LorenzIssuesByIds",
    ]
    assert linear.requests[0].variables["stateNames"] == ["Todo", "In Progress"]
    assert linear.requests[0].variables["projectSlug"] == linear.project_slug
    assert linear.requests[1].variables["ids"] == [board.todo.id]
    assert linear.requests[2].variables["ids"] == [board.todo.id]

    # What the agents saw.
    workspaces = tmp_path / "workspaces"
    record = read_jsonl(workspaces / "ENG-1" / "codex_record.jsonl")
    assert [e["text"] for e in record if "turn" in e] == [
        expected_prompt(
            identifier="ENG-1",
            title=board.todo.title,
            state="Todo",
            priority=2,
            labels=["backend", "good first issue"],
            description=board.todo.description,
        ),
        continuation_prompt(2, 2),
    ]
    assert not (workspaces / "ENG-3").exists()
    assert not (workspaces / "ENG-4").exists()
    for identifier in ("ENG-1", "ENG-2"):
        env = read_jsonl(workspaces / identifier / "agent_env.json")[0]
        assert "LINEAR_API_KEY" not in env
        assert linear.api_key not in env.values()

    # What the runtime reported, from its event log.
    events = read_jsonl(tmp_path / "events.jsonl")
    outcomes = {e["identifier"]: e["outcome"] for e in events if "outcome" in e}
    assert outcomes == {"ENG-1": "success", "ENG-2": "failed"}
    retries = {
        e["identifier"]: (e["retry_kind"], e["attempt"])
        for e in events
        if e["type"] == "retry_scheduled"
    }
    assert retries == {"ENG-1": ("continuation", 1), "ENG-2": ("failure", 1)}
    assert [e["type"] for e in events].count("poll_completed") == 1
