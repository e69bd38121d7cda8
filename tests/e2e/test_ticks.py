"""Ticks as the tracker sees them: ``--once`` is one tick; later ticks reconcile what is tracked.

Both tests use the ``command`` agent (the fastest real subprocess) on the fake Linear board, so
what is measured is the runtime's cadence, read back from the requests the fake received.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
from tests.e2e.rig import (
    agent_environ,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    seed_linear_board,
    write_workflow,
)
from tests.fakes.linear_server import FakeLinearServer

E2E = Path(__file__).resolve().parent


def _command_workflow(tmp_path: Path, linear: FakeLinearServer) -> Path:
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    return write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
    )


async def test_once_is_one_tick_even_when_a_continuation_falls_due_meanwhile(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    seed_linear_board(linear)
    # ENG-1 finishes at once, so its 1 s continuation falls due while ENG-2 still works.
    install_scenarios(tmp_path, {"ENG-1": {"exit": 0}, "ENG-2": {"sleep": 1.5, "exit": 0}})

    run = await run_host_once(
        _command_workflow(tmp_path, linear),
        environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
    )

    assert len(run.of_type("poll_completed")) == 1
    assert sorted(e["identifier"] for e in run.of_type("run_started")) == ["ENG-1", "ENG-2"]
    for identifier in ("ENG-1", "ENG-2"):
        runs = read_jsonl(tmp_path / "workspaces" / identifier / "runs.jsonl")
        assert [r["attempt"] for r in runs] == [""]  # one start, a first run
        assert (run.retry(identifier)["kind"], run.retry(identifier)["attempt"]) == (
            "continuation",
            1,
        )
    # One candidate scan; then each clean exit reads its own issue once (still active: the
    # continuation stays) — and no second tick.
    names = [r.operation_name for r in linear.requests]
    assert names == ["LorenzIssuesByStates", "LorenzIssuesByIds", "LorenzIssuesByIds"]
    assert sorted(r.variables["ids"][0] for r in linear.requests[1:]) == sorted(
        linear.issue(identifier).id for identifier in ("ENG-1", "ENG-2")
    )
    assert not run.snapshot["running"]
    assert run.snapshot["app_status"] == "stopped"


async def test_the_next_tick_reconciles_exactly_the_tracked_issues_by_id(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    board = seed_linear_board(linear)
    install_scenarios(tmp_path, {"ENG-1": {"exit": 0}, "ENG-2": {"exit": 0}})
    polls: list[dict[str, Any]] = []
    finished: list[dict[str, Any]] = []

    def refresh_once_both_ran_then_stop(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        if event["type"] == "run_finished":
            finished.append(event)
            if len(finished) == 2:
                runtime.request_refresh()
        if event["type"] in ("poll_completed", "poll_error"):
            polls.append(event)
            if len(polls) == 2:
                runtime.stop()

    # Recurring mode with a long interval: the second tick is the refresh asked for once both
    # runs ended (settling runs do not start ticks; they start by-id dispatch passes).
    run = await run_host_once(
        _command_workflow(tmp_path, linear),
        environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
        once=False,
        on_event=refresh_once_both_ran_then_stop,
    )

    assert [p["type"] for p in polls] == ["poll_completed", "poll_completed"]
    names = [r.operation_name for r in linear.requests]
    # Tick 1 tracks nothing yet (no by-id read); the exits are decided by by-id reads; tick 2
    # refreshes what it tracks, then scans.
    assert names[0] == "LorenzIssuesByStates"
    assert set(names[1:-2]) == {"LorenzIssuesByIds"}
    assert names[-2:] == ["LorenzIssuesByIds", "LorenzIssuesByStates"]
    reconcile = linear.requests[-2]
    assert sorted(reconcile.variables["ids"]) == sorted([board.todo.id, board.in_progress.id])
    assert reconcile.variables["projectSlug"] == linear.project_slug
    assert {r.authorization for r in linear.requests} == {linear.api_key}
    # Both issues are still active: the exits and the reconciliation kept their continuations.
    assert {r["identifier"] for r in run.snapshot["retrying"]} == {"ENG-1", "ENG-2"}
    assert not run.of_type("run_canceled")


async def test_a_stop_right_after_the_dispatching_tick_leaves_no_phantom_run(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    seed_linear_board(linear)
    install_scenarios(tmp_path, {"ENG-1": {"exit": 0}, "ENG-2": {"exit": 0}})

    def stop_as_the_tick_ends(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
        # NB: synchronously, in the loop iteration that created the run tasks: they are
        # cancelled before their first step (a listener that stops on an event does this).
        if event["type"] == "poll_completed":
            runtime.stop()

    run = await run_host_once(
        _command_workflow(tmp_path, linear),
        environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
        once=False,
        on_event=stop_as_the_tick_ends,
    )

    assert sorted(e["identifier"] for e in run.of_type("run_started")) == ["ENG-1", "ENG-2"]
    # Nothing is left "running" without a process, and no claim is held by nobody.
    assert run.snapshot["running"] == []
    assert not run.runtime.orchestrator.state.claimed
    # A shutdown keeps each slot's place, as for runs that were under way.
    assert sorted((r["identifier"], r["kind"]) for r in run.snapshot["retrying"]) == [
        ("ENG-1", "continuation"),
        ("ENG-2", "continuation"),
    ]
    assert not run.of_type("run_failed")
