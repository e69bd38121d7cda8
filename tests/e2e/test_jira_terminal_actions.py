"""The retry budget's terminal actions end to end on a Jira project.

The ``command`` agent exits 1 on every run of ENG-1 on the fake Jira site. When the budget is
used up, ``retry.terminal_action: escalate`` posts one ADF comment carrying the escalation marker
and adds one label; ``cancel`` runs the workflow transition to ``retry.cancel_state``. Both are
checked in the fake's own state, through the real runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
from tests.e2e.rig import (
    HostRun,
    agent_environ,
    install_scenarios,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    write_workflow,
)
from tests.fakes.jira_server import FakeJiraServer

E2E = Path(__file__).resolve().parent


def jira_tracker(jira: FakeJiraServer) -> dict[str, Any]:
    return {
        "kind": "jira",
        "endpoint": jira.url,
        "project_slug": jira.project,
        "active_states": ["To Do", "In Progress"],
        "terminal_states": ["Done", "Cancelled"],
    }


async def run_until_terminal_action(
    workflow: Path, tmp_path: Path, jira: FakeJiraServer
) -> HostRun:
    def stop_at_the_action(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] == "terminal_action":
            runtime.stop()

    return await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, JIRA_API_TOKEN=jira.token, JIRA_EMAIL=jira.email),
        once=False,
        on_event=stop_at_the_action,
        timeout_s=90.0,
    )


def _workflow(tmp_path: Path, jira: FakeJiraServer, retry: dict[str, Any]) -> Path:
    install_scenarios(tmp_path, {"ENG-1": {"exit": 1, "stderr": "cannot do it"}})
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    return write_workflow(
        tmp_path,
        tracker=jira_tracker(jira),
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
        extra={"retry": retry},
    )


async def test_a_jira_issue_that_fails_its_budget_is_escalated_once(
    tmp_path: Path, jira_server: FakeJiraServer
) -> None:
    jira = jira_server
    issue = jira.add_issue("Always fails", status="To Do", labels=["backend"])
    workflow = _workflow(
        tmp_path,
        jira,
        {
            "max_attempts": 2,
            "backoff": {"initial_ms": 50},
            "terminal_action": "escalate",
            "escalate": {"comment": True, "label": "needs-human"},
        },
    )

    run = await run_until_terminal_action(workflow, tmp_path, jira)

    assert len(read_jsonl(tmp_path / "workspaces" / "ENG-1" / "runs.jsonl")) == 2
    [action] = run.of_type("terminal_action")
    assert (action["reason"], action["outcome"]) == ("escalate", "applied")
    [comment] = jira.comment_texts(issue.id)
    assert "ENG-1" in comment
    assert "<!-- lorenz-escalation: lz-" in comment
    assert jira.issue(issue.id).labels == ["backend", "needs-human"]
    assert len(jira.requests_to("/comment", method="POST")) == 1
    assert len(jira.requests_to(f"/issue/{issue.id}", method="PUT")) == 1
    [row] = run.snapshot["blocked"]
    assert (row["identifier"], row["terminal_action"], row["action_done"]) == (
        "ENG-1", "escalate", True,
    )


async def test_a_jira_issue_that_fails_its_budget_with_cancel_is_transitioned_once(
    tmp_path: Path, jira_server: FakeJiraServer
) -> None:
    jira = jira_server
    issue = jira.add_issue("Always fails", status="In Progress")
    workflow = _workflow(
        tmp_path, jira, {"max_attempts": 1, "terminal_action": "cancel",
                         "cancel_state": "Cancelled"}
    )

    run = await run_until_terminal_action(workflow, tmp_path, jira)

    [action] = run.of_type("terminal_action")
    assert (action["reason"], action["outcome"]) == ("cancel", "applied")
    assert jira.issue(issue.id).status == "Cancelled"
    assert len(jira.requests_to("/transitions", method="POST")) == 1
    assert jira.comment_texts(issue.id) == []
