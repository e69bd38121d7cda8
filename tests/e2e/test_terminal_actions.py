"""The retry budget end to end: an agent that always fails is blocked, and its action lands once.

The ``command`` agent exits 1 on every run of ENG-1 on the fake Linear board. With
``retry.max_attempts: 2`` the second failure writes no retry: the slot goes to the blocked lane
and ``retry.terminal_action: escalate`` posts one marked comment and adds one label; with
``cancel`` the issue moves to ``retry.cancel_state``. Both are checked in the fake's own state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
from tests.e2e.rig import (
    HostRun,
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

E2E = Path(__file__).resolve().parent


async def run_until_terminal_action(
    workflow: Path, tmp_path: Path, linear: FakeLinearServer, outcome: str | None = None
) -> HostRun:
    """Run the host on the Linear fake until a terminal action (with ``outcome``, if given)."""

    def stop_at_the_action(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] == "terminal_action" and outcome in (None, event.get("outcome")):
            runtime.stop()

    return await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
        once=False,
        on_event=stop_at_the_action,
        timeout_s=90.0,
    )


async def test_a_slot_that_fails_its_budget_is_blocked_and_escalated_once(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    issue = linear.add_issue("ENG-1", title="Always fails", state="Todo", labels=["Backend"])
    install_scenarios(tmp_path, {"ENG-1": {"exit": 1, "stderr": "cannot do it"}})
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
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

    run = await run_until_terminal_action(workflow, tmp_path, linear)

    runs = read_jsonl(tmp_path / "workspaces" / "ENG-1" / "runs.jsonl")
    assert len(runs) == 2  # the budget: two runs, no third
    assert [e["identifier"] for e in run.of_type("run_started")] == ["ENG-1", "ENG-1"]
    [blocked_event] = run.of_type("slot_blocked")
    assert blocked_event["identifier"] == "ENG-1"
    [action] = run.of_type("terminal_action")
    assert (action["reason"], action["outcome"]) == ("escalate", "applied")

    # The escalation as Linear holds it: one marked comment, one added label.
    [comment] = linear.comments_on(issue.id)
    assert comment.startswith("<!-- lorenz-escalation: lz-")
    assert "ENG-1" in comment
    assert sorted(linear.labels_on(issue.id)) == ["Backend", "needs-human"]
    assert len(linear.requests_for("LorenzEscalationComment")) == 1
    assert len(linear.requests_for("LorenzAddLabel")) == 1

    # The slot sits in the blocked lane, with no retry pending and nothing running.
    [row] = run.snapshot["blocked"]
    assert (row["identifier"], row["reason"], row["failures"]) == (
        "ENG-1",
        "retry_budget_exhausted",
        2,
    )
    assert (row["terminal_action"], row["action_done"], row["action_error"]) == (
        "escalate",
        True,
        None,
    )
    assert [r for r in run.snapshot["retrying"] if r["identifier"] == "ENG-1"] == []
    assert run.snapshot["running"] == []


async def test_a_slot_that_fails_its_budget_with_cancel_moves_the_issue_once(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    issue = linear.add_issue("ENG-1", title="Always fails", state="In Progress")
    install_scenarios(tmp_path, {"ENG-1": {"exit": 1}})
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
        extra={
            "retry": {
                "max_attempts": 1,
                "terminal_action": "cancel",
                "cancel_state": "Canceled",
            }
        },
    )

    run = await run_until_terminal_action(workflow, tmp_path, linear)

    assert len(read_jsonl(tmp_path / "workspaces" / "ENG-1" / "runs.jsonl")) == 1
    [action] = run.of_type("terminal_action")
    assert (action["reason"], action["outcome"]) == ("cancel", "applied")
    assert linear.state_of(issue.id) == "Canceled"
    assert len(linear.requests_for("LorenzMoveIssue")) == 1
    assert linear.comments_on(issue.id) == []
    [row] = run.snapshot["blocked"]
    assert (row["identifier"], row["terminal_action"], row["action_done"]) == (
        "ENG-1",
        "cancel",
        True,
    )


async def test_an_escalation_that_failed_halfway_is_finished_by_the_next_poll_without_repeats(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    issue = linear.add_issue("ENG-1", title="Always fails", state="Todo")
    install_scenarios(tmp_path, {"ENG-1": {"exit": 1}})
    # The label lands, then Linear refuses the comment: the action has no receipt, and the
    # next poll replays it with the same key.
    linear.fail_next("graphql_errors", operations=["LorenzEscalationComment"])
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
        extra={
            "polling": {"interval_ms": 200},
            "retry": {
                "max_attempts": 1,
                "terminal_action": "escalate",
                "escalate": {"comment": True, "label": "needs-human"},
            },
        },
    )

    run = await run_until_terminal_action(workflow, tmp_path, linear, outcome="applied")

    assert [e["outcome"] for e in run.of_type("terminal_action")] == ["failed", "applied"]
    assert len(read_jsonl(tmp_path / "workspaces" / "ENG-1" / "runs.jsonl")) == 1
    [comment] = linear.comments_on(issue.id)
    assert comment.startswith("<!-- lorenz-escalation: lz-")
    assert linear.labels_on(issue.id) == ["needs-human"]
    assert len(linear.requests_for("LorenzAddLabel")) == 1
    # Both tries carried the same idempotency key.
    keys = {
        r.variables["body"].split(" -->", 1)[0]
        for r in linear.requests_for("LorenzEscalationComment")
    }
    assert len(linear.requests_for("LorenzEscalationComment")) == 2
    assert len(keys) == 1
    [row] = run.snapshot["blocked"]
    assert (row["action_done"], row["action_error"]) == (True, None)
