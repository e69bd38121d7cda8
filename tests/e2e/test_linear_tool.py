"""The ``linear_graphql`` tool end to end: agent → Lorenz (host side) → Linear → agent.

The scripted Codex agent asks for the tool three times: a query, a mutation, and a document
with two operations. Lorenz runs each one itself, with the tracker's key (the agent never has
it), and the answers travel back over the app-server protocol into the agent's record file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.rig import (
    FAKES,
    agent_environ,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    write_workflow,
)
from tests.fakes.linear_server import FakeLinearServer


async def test_the_agent_queries_and_writes_linear_through_the_host_side_tool(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    linear.add_issue("ENG-1", title="Add a greeting", state="Todo", priority=2)
    install_scenarios(tmp_path, {"ENG-1": "e2e_codex_linear_tool.json"})
    command = (
        f'FAKE_CODEX_RECORD="$PWD/codex_record.jsonl" exec '
        f"{python_command(FAKES / 'codex_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    )
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
    )

    run = await run_host_once(
        workflow, environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key)
    )

    [history] = run.history("ENG-1")
    assert history["outcome"] == "success", history
    record = read_jsonl(tmp_path / "workspaces" / "ENG-1" / "codex_record.jsonl")
    assert not [e for e in record if "violation" in e]
    answers = {a["params"]["callId"]: a["result"] for a in _tool_answers(record)}
    assert set(answers) == {"call-read", "call-comment", "call-batch"}

    # The query reached Linear with the tracker's credentials, and its data reached the agent.
    [read] = linear.requests_for("E2EIssue")
    assert read.authorization == linear.api_key
    assert read.variables == {"id": "ENG-1"}
    assert answers["call-read"]["success"] is True
    assert _body(answers["call-read"]) == {
        "data": {
            "issue": {"identifier": "ENG-1", "title": "Add a greeting", "state": {"name": "Todo"}}
        }
    }

    # The mutation changed the board.
    [write] = linear.requests_for("E2EComment")
    assert write.authorization == linear.api_key
    assert linear.comments_on("ENG-1") == ["Started work (written by the agent)."]
    assert answers["call-comment"]["success"] is True
    assert _body(answers["call-comment"])["data"]["commentCreate"]["success"] is True

    # Two operations in one document are refused before anything is sent.
    assert answers["call-batch"]["success"] is False
    assert "exactly one" in answers["call-batch"]["contentItems"][0]["text"]
    assert not linear.requests_for("E2EOne")
    assert not linear.requests_for("E2ETwo")
    assert not linear.rejected

    assert run.snapshot["usage_totals"]["total_tokens"] == 40


def _tool_answers(record: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool-call requests the agent sent, each joined with the answer it got."""
    sent = {
        e["sent"]["id"]: e["sent"]
        for e in record
        if "sent" in e and e["sent"].get("method") == "item/tool/call"
    }
    answers = []
    for entry in record:
        if entry.get("server_request") == "item/tool/call":
            answer = entry["answer"]
            answers.append({**answer, "params": sent[answer["id"]]["params"]})
    return answers


def _body(result: dict[str, Any]) -> Any:
    [item] = result["contentItems"]
    assert item["type"] == "inputText"
    return json.loads(item["text"])
