"""The ``gitlab_api`` tool end to end: agent → Lorenz (host side) → GitLab → agent.

The scripted Codex agent picks up a GitLab issue (read from the fake GitLab REST API through
the real tracker) and asks for the tool three times: a read of its issue, a note on it, and a
read of another project. Lorenz makes the calls itself with the tracker's token (the agent never
has it); the third is refused before anything is sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.rig import (
    FAKES,
    agent_environ,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    write_workflow,
)
from tests.fakes.gitlab_server import FakeGitLabServer


async def test_the_agent_reads_and_writes_gitlab_through_the_host_side_tool(
    tmp_path: Path, gitlab_server: FakeGitLabServer
) -> None:
    gitlab = gitlab_server
    issue = gitlab.add_issue("Add a greeting", labels=["status::todo"])
    own = f"/projects/{gitlab.encoded_project}/issues/{issue.iid}"
    scenario = {
        "thread_id": "thr-e2e-gitlab",
        "record_sent": True,
        "expect": {"tools": ["gitlab_api"], "experimental_api": True},
        "turns": [{"steps": [
            {"request": "item/tool/call", "params": {
                "callId": "call-read", "tool": "gitlab_api",
                "arguments": {"method": "GET", "path": own}}},
            {"request": "item/tool/call", "params": {
                "callId": "call-note", "tool": "gitlab_api",
                "arguments": {"method": "POST", "path": f"{own}/notes",
                              "body": {"body": "Started work (written by the agent)."}}}},
            {"request": "item/tool/call", "params": {
                "callId": "call-other", "tool": "gitlab_api",
                "arguments": {"method": "GET", "path": "/projects/other%2Fapp/issues"}}},
            {"token_usage": {"input": 30, "output": 10, "total": 40}},
            {"agent_message": "Done with the tools."},
        ]}],
    }
    # NB: the scenario file is named by the issue's identifier, which holds a slash.
    scenario_file = tmp_path / "scenarios" / f"{gitlab.project}#{issue.iid}.json"
    scenario_file.parent.mkdir(parents=True)
    scenario_file.write_text(json.dumps(scenario), encoding="utf-8")
    record_file = tmp_path / "codex_record.jsonl"
    command = (
        f'FAKE_CODEX_RECORD="{record_file}" exec '
        f"{python_command(FAKES / 'codex_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    )
    workflow = write_workflow(
        tmp_path,
        tracker={
            "kind": "gitlab",
            "endpoint": gitlab.url,
            "api_key": "$GITLAB_TOKEN",
            "project_slug": gitlab.project,
            "active_states": ["todo"],
            "terminal_states": ["done"],
            "provider": {"state_label_scope": "status"},
        },
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
    )

    run = await run_host_once(
        workflow, environ=agent_environ(tmp_path, GITLAB_TOKEN=gitlab.token)
    )

    [history] = run.history(f"{gitlab.project}#{issue.iid}")
    assert history["outcome"] == "success", history
    record = read_jsonl(record_file)
    assert not [e for e in record if "violation" in e]
    answers = {a["params"]["callId"]: a["result"] for a in _tool_answers(record)}
    assert set(answers) == {"call-read", "call-note", "call-other"}

    # The read reached GitLab with the tracker's token, and the issue reached the agent.
    reads = [r for r in gitlab.requests if r.method == "GET" and r.path == f"/api/v4{own}"]
    assert len(reads) == 1
    assert reads[0].headers["PRIVATE-TOKEN"] == gitlab.token
    assert answers["call-read"]["success"] is True
    assert _body(answers["call-read"])["body"]["title"] == "Add a greeting"

    # The note was written.
    assert gitlab.issue(issue.iid).notes == ["Started work (written by the agent)."]
    assert answers["call-note"]["success"] is True
    assert _body_text(answers["call-note"]).count(gitlab.token) == 0

    # Another project is refused before anything is sent there.
    assert answers["call-other"]["success"] is False
    assert "another project" in _body_text(answers["call-other"])
    assert not [r for r in gitlab.requests if "other" in r.path]

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


def _body_text(result: dict[str, Any]) -> str:
    [item] = result["contentItems"]
    assert item["type"] == "inputText"
    return str(item["text"])


def _body(result: dict[str, Any]) -> Any:
    return json.loads(_body_text(result))
