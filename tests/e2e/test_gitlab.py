"""GitLab end to end: the ``gitlab_api`` tool (agent → Lorenz, host side → GitLab → agent), and an
agent that closes its own issue through it, after which reconciliation cleans up.

The scripted Codex agent picks up a GitLab issue (read from the fake GitLab REST API through
the real tracker) and asks for the tool: a read of its issue, a note on it, a read of another
project (refused before anything is sent), or, in the second test, the edit that closes it.
Lorenz makes the calls itself with the tracker's token; the agent never has it. The third test
spends a failing slot's retry budget and checks the escalation (one marked note, one label) in
the fake's own state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
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

E2E = Path(__file__).resolve().parent


def _scenario(tmp_path: Path, identifier: str, scenario: dict[str, Any]) -> None:
    """The agent's scenario for ``identifier`` (which holds a slash: a nested file)."""
    path = tmp_path / "scenarios" / f"{identifier}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(scenario), encoding="utf-8")


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


async def test_the_agent_closes_its_issue_with_the_tool_and_its_exit_cleans_up(
    tmp_path: Path, gitlab_server: FakeGitLabServer
) -> None:
    gitlab = gitlab_server
    issue = gitlab.add_issue("Fix the typo", labels=["bug", "status::todo"])
    old = gitlab.add_issue("Shipped long ago", labels=["status::done"], state="closed")
    own = f"/projects/{gitlab.project_id}/issues/{issue.iid}"  # by numeric id this time
    identifier = f"{gitlab.project}#{issue.iid}"
    scenario = {
        "expect": {"tools": ["gitlab_api"]},
        "turns": [{"steps": [
            {"request": "item/tool/call", "params": {
                "callId": "call-done", "tool": "gitlab_api",
                "arguments": {"method": "PUT", "path": own, "body": {
                    "remove_labels": "status::todo", "add_labels": "status::done",
                    "state_event": "close"}}}},
            {"agent_message": "Closed it."},
        ]}],
    }
    scenario_file = tmp_path / "scenarios" / f"{identifier}.json"
    scenario_file.parent.mkdir(parents=True)
    scenario_file.write_text(json.dumps(scenario), encoding="utf-8")
    command = f"exec {python_command(FAKES / 'codex_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker={
            "kind": "gitlab",
            "endpoint": gitlab.url,
            "project_slug": gitlab.project,  # api_key omitted: GITLAB_TOKEN is read
            "active_states": ["todo"],
            "terminal_states": ["done"],
            "provider": {"state_label_scope": "status"},
        },
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
    )

    def stop_once_cleaned_up(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] in ("workspace_cleanup", "poll_error"):
            runtime.stop()

    run = await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, GITLAB_TOKEN=gitlab.token),
        once=False,
        on_event=stop_once_cleaned_up,
    )

    assert run.of_type("poll_error") == []
    assert [e["identifier"] for e in run.of_type("run_started")] == [identifier]
    assert [h["outcome"] for h in run.history(identifier)] == ["success"]
    assert (gitlab.issue(issue.iid).state, gitlab.issue(issue.iid).labels) == (
        "closed", ["bug", "status::done"]
    )
    [write] = [r for r in gitlab.requests if r.method != "GET"]
    assert (write.method, write.path) == ("PUT", f"/api/v4{own}")
    # After the exit, Lorenz read the issue by iid, found it terminal and cleaned up.
    after = gitlab.requests[gitlab.requests.index(write) + 1 :]
    assert any(("iids[]", str(issue.iid)) in r.query_items for r in after)
    cleanups = run.of_type("workspace_cleanup")
    assert [(c["identifier"], c["reason"]) for c in cleanups] == [(identifier, "terminal")]
    assert run.snapshot["running"] == []
    assert run.snapshot["retrying"] == []
    assert f"{gitlab.project}#{old.iid}" not in {e.get("identifier") for e in run.events}


async def test_a_slot_that_fails_its_budget_is_escalated_once_on_gitlab(
    tmp_path: Path, gitlab_server: FakeGitLabServer
) -> None:
    gitlab = gitlab_server
    failing = gitlab.add_issue("Always fails", labels=["status::todo"])
    identifier = f"{gitlab.project}#{failing.iid}"
    _scenario(tmp_path, identifier, {"exit": 1, "stderr": "cannot do it"})
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker={
            "kind": "gitlab",
            "endpoint": gitlab.url,
            "project_slug": str(gitlab.project_id),
            "active_states": ["todo"],
            "terminal_states": ["done", "cancelled"],
            "provider": {"state_label_scope": "status"},
        },
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
        extra={
            "retry": {
                "max_attempts": 2,
                "backoff": {"initial_ms": 50},
                "terminal_action": "escalate",
                "escalate": {"comment": True, "label": "needs-human"},
            }
        },
    )

    def stop_at_the_action(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] in ("terminal_action", "poll_error"):
            runtime.stop()

    run = await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, GITLAB_TOKEN=gitlab.token),
        once=False,
        on_event=stop_at_the_action,
        timeout_s=90.0,
    )

    assert run.of_type("poll_error") == []
    assert [e["identifier"] for e in run.of_type("run_started")] == [identifier, identifier]
    [action] = run.of_type("terminal_action")
    assert (action["reason"], action["outcome"]) == ("escalate", "applied")
    # As GitLab holds it: one marked note, one added label, the issue still open.
    [note] = gitlab.issue(failing.iid).notes
    assert note.startswith("<!-- lorenz-escalation: lz-")
    assert identifier in note
    assert gitlab.issue(failing.iid).labels == ["status::todo", "needs-human"]
    assert gitlab.issue(failing.iid).state == "opened"
    assert len([r for r in gitlab.requests if r.method == "POST"]) == 1
    [row] = run.snapshot["blocked"]
    assert (row["identifier"], row["terminal_action"], row["action_done"]) == (
        identifier, "escalate", True
    )


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
