"""Continuation turns end to end: more turns on one thread while the issue stays active.

``agent.max_turns: 3`` with the scripted Codex agent. Between turns the runner asks Lorenz
whether the issue is still active, and Lorenz asks Linear (a by-id read). While the answer is
yes, the next turn goes to the same thread with the continuation prompt; once the issue has
moved to Done (here: on the fake board, while turn 2 runs) no further turn starts.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
from lorenz.workflow import continuation_prompt
from tests.e2e.rig import (
    FAKES,
    HostRun,
    agent_environ,
    expected_prompt,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    write_workflow,
)
from tests.fakes.linear_server import FakeIssue, FakeLinearServer

MAX_TURNS = 3


async def _run(
    tmp_path: Path,
    linear: FakeLinearServer,
    *,
    scenario: str,
    on_event: Any = None,
) -> tuple[FakeIssue, HostRun, list[dict[str, Any]]]:
    issue = linear.add_issue("ENG-1", title="Add a greeting", state="Todo", priority=2)
    install_scenarios(tmp_path, {"ENG-1": scenario})
    # NB: the record is kept outside the workspace, which is removed once the issue is Done.
    record_file = tmp_path / "codex_record.jsonl"
    command = (
        f"FAKE_CODEX_RECORD={shlex.quote(str(record_file))} exec "
        f"{python_command(FAKES / 'codex_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    )
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="codex",
        agent={"protocol": "codex-app-server", "command": command},
        max_turns=MAX_TURNS,
    )
    run = await run_host_once(
        workflow,
        environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
        on_event=on_event,
    )
    record = read_jsonl(record_file)
    assert not [e for e in record if "violation" in e]
    return issue, run, record


def _received(record: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    return [
        e["received"] for e in record if "received" in e and e["received"].get("method") == method
    ]


def _first_prompt(issue: FakeIssue) -> str:
    return expected_prompt(
        identifier="ENG-1",
        title=issue.title,
        state="Todo",
        priority=2,
        labels=[],
        description=None,
    )


async def test_an_active_issue_gets_every_turn_on_the_same_thread(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    issue, run, record = await _run(tmp_path, linear, scenario="codex_multi_turn.json")

    assert len(_received(record, "thread/start")) == 1
    turn_starts = _received(record, "turn/start")
    assert [t["params"]["threadId"] for t in turn_starts] == ["thr-multi"] * MAX_TURNS
    assert [e["text"] for e in record if "turn" in e] == [
        _first_prompt(issue),
        continuation_prompt(2, MAX_TURNS),
        continuation_prompt(3, MAX_TURNS),
    ]
    # One "still active?" read before each continuation turn, and one after the run ended
    # (still active: the slot keeps its continuation).
    checks = linear.requests_for("LorenzIssuesByIds")
    assert [c.variables["ids"] for c in checks] == [[issue.id]] * MAX_TURNS

    [history] = run.history("ENG-1")
    assert (history["outcome"], history["turn_count"]) == ("success", MAX_TURNS)
    assert history["session_id"] == "thr-multi-turn-3"
    # Codex reports thread totals: the last report is the run's usage (110 + 280 + 450 is not).
    assert history["usage"] == {"input_tokens": 400, "output_tokens": 50, "total_tokens": 450}
    assert run.snapshot["usage_totals"]["total_tokens"] == 450
    retry = run.retry("ENG-1")
    assert (retry["kind"], retry["attempt"]) == ("continuation", 1)


async def test_no_further_turn_once_the_issue_moved_to_done_mid_run(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    sessions: list[dict[str, Any]] = []

    def move_to_done_during_turn_2(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] == "run_update" and event["event"] == "session_started":
            sessions.append(event)
            if len(sessions) == 2:
                # Turn 2 is under way (the agent dawdles in it): someone closes the issue.
                linear.set_state("ENG-1", "Done")

    issue, run, record = await _run(
        tmp_path,
        linear,
        scenario="e2e_codex_moved_mid_run.json",
        on_event=move_to_done_during_turn_2,
    )

    assert len(sessions) == 2
    assert [e["text"] for e in record if "turn" in e] == [
        _first_prompt(issue),
        continuation_prompt(2, MAX_TURNS),
    ]
    assert len(_received(record, "turn/start")) == 2
    # Before turn 2 (active), before turn 3 (Done: stop), and the exit's read (Done: release).
    checks = linear.requests_for("LorenzIssuesByIds")
    assert [c.variables["ids"] for c in checks] == [[issue.id]] * 3
    [history] = run.history("ENG-1")
    # Stopping because the issue is no longer active is a clean end, not a failure.
    assert (history["outcome"], history["turn_count"]) == ("success", 2)
    assert history["usage"]["total_tokens"] == 280
    # Done is done: no continuation retry, the claim released, the workspace removed.
    assert run.snapshot["retrying"] == []
    assert run.of_type("retry_scheduled") == []
    assert not (tmp_path / "workspaces" / "ENG-1").exists()
