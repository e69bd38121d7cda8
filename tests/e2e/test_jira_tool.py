"""The ``jira_rest`` tool end to end: agent → Lorenz (host side) → Jira → agent.

The scripted Codex agent, working on a Jira issue, asks for the tool three times: a read, a
comment in Atlassian Document Format, and a call aimed at another host. Lorenz makes each call
itself with the tracker's email and token (the agent never has them), refuses the third before
anything is sent, and the answers travel back over the app-server protocol into the agent's
record file.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tests.e2e.rig import (
    FAKES,
    agent_environ,
    install_scenarios,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    write_workflow,
)
from tests.fakes.jira_server import FakeJiraServer


async def test_the_agent_reads_and_comments_on_jira_through_the_host_side_tool(
    tmp_path: Path, jira_server: FakeJiraServer
) -> None:
    jira = jira_server
    jira.add_issue("Add a greeting", status="To Do", description="Say hello.")
    install_scenarios(tmp_path, {"ENG-1": "e2e_codex_jira_tool.json"})
    command = (
        f'FAKE_CODEX_RECORD="$PWD/codex_record.jsonl" exec '
        f"{python_command(FAKES / 'codex_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    )
    workflow = write_workflow(
        tmp_path,
        tracker={
            "kind": "jira",
            "endpoint": jira.url,
            "project_slug": jira.project,
            "active_states": ["To Do", "In Progress"],
            "terminal_states": ["Done", "Cancelled"],
        },
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
    )

    run = await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, JIRA_API_TOKEN=jira.token, JIRA_EMAIL=jira.email),
    )

    [history] = run.history("ENG-1")
    assert history["outcome"] == "success", history
    record = read_jsonl(tmp_path / "workspaces" / "ENG-1" / "codex_record.jsonl")
    assert not [e for e in record if "violation" in e]
    answers = {a["params"]["callId"]: a["result"] for a in _tool_answers(record)}
    assert set(answers) == {"call-read", "call-comment", "call-escape"}

    # The read reached Jira with the tracker's credentials, and its answer reached the agent.
    [read] = [r for r in jira.requests_to("/issue/ENG-1") if r.method == "GET"]
    credential = (read.authorization or "").removeprefix("Basic ")
    assert base64.b64decode(credential).decode() == f"{jira.email}:{jira.token}"
    assert read.query == {"fields": "summary,status"}
    assert answers["call-read"]["success"] is True
    body = _body(answers["call-read"])
    assert body["status"] == 200
    assert body["body"]["key"] == "ENG-1"
    assert body["body"]["fields"]["summary"] == "Add a greeting"

    # The comment changed the issue.
    assert answers["call-comment"]["success"] is True
    assert _body(answers["call-comment"])["status"] == 201
    assert jira.comment_texts("ENG-1") == ["Started work (written by the agent)."]

    # A call aimed at another host is refused before anything is sent.
    assert answers["call-escape"]["success"] is False
    assert "path" in answers["call-escape"]["contentItems"][0]["text"]
    assert not [r for r in jira.requests if "elsewhere" in r.path or r.path.endswith("/myself")]

    # Nothing the agent saw carries the token.
    assert jira.token not in json.dumps(record)


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
