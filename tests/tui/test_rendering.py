"""The terminal view's drawing, read back as text from a recording console."""

from __future__ import annotations

import dataclasses
import datetime
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from lorenz.model import (
    AppStatus,
    BlockedRow,
    ConfigError,
    EventType,
    Issue,
    OrchestratorSnapshot,
    PollStatus,
    ReservingRow,
    RetryRow,
    RunningRow,
    RunOutcome,
    RunRecord,
    RuntimeEvent,
    RuntimeSnapshot,
    TokenUsage,
    UsageTotals,
)
from lorenz.model.spending import BudgetHoldRow, BudgetSnapshot, RunSpendRow, SpendFigures
from lorenz.tui import render_snapshot
from lorenz.tui.rendering import describe_rate_limits, format_countdown, format_duration
from tests.runtime.harness import build_rig, write_agent, write_workflow

NOW = datetime.datetime(2026, 3, 4, 12, 0, 0, tzinfo=datetime.UTC)


def _at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def _running(n: int, **fields: Any) -> RunningRow:
    row = RunningRow(
        slot_key=f"id-{n}#0", issue_id=f"id-{n}", identifier=f"LOR-{n}",
        title=f"Issue number {n}", slot_index=0, state="Todo", url=None, host=None,
        workspace_path=None, session_id=f"sess-{n}", agent_pid=None, attempt=None,
        retry_kind=None, turn_count=1, last_agent_event="notification",
        last_agent_message="running the tests", last_agent_at=_at(-2), started_at=_at(-65),
        runtime_seconds=65.0, usage=TokenUsage(1234, 56, 1290), cost_usd=0.0,
    )
    return dataclasses.replace(row, **fields)


def _retry(**fields: Any) -> RetryRow:
    row = RetryRow(
        slot_key="id-9#0", issue_id="id-9", identifier="LOR-9", slot_index=0, attempt=2,
        kind="failure", due_at=_at(30), due_in_ms=30000,
        error="agent_exited: agent exited with status 1", host=None, workspace_path=None,
    )
    return dataclasses.replace(row, **fields)


def _poll(**fields: Any) -> PollStatus:
    poll = PollStatus(
        status="idle", interval_ms=30000, candidates=7, eligible=3, last_poll_at=_at(-3),
        next_poll_at=_at(11.2), last_error=None, count=42,
    )
    return dataclasses.replace(poll, **fields)


def _snapshot(
    *,
    app_status: AppStatus = AppStatus.RUNNING,
    poll: PollStatus | None = None,
    running: tuple[RunningRow, ...] | None = None,
    reserving: tuple[ReservingRow, ...] = (),
    retrying: tuple[RetryRow, ...] | None = None,
    blocked: tuple[BlockedRow, ...] = (),
    rate_limits: dict[str, Any] | None = None,
    recent_events: tuple[RuntimeEvent, ...] | None = None,
    run_history: tuple[RunRecord, ...] | None = None,
    config_error: ConfigError | None = None,
) -> RuntimeSnapshot:
    if recent_events is None:
        recent_events = (
            RuntimeEvent(type=EventType.RUN_FAILED, at=_at(-5), identifier="LOR-9",
                         message="boom"),
            RuntimeEvent(type=EventType.RUN_STARTED, at=_at(-65), identifier="LOR-1",
                         message="run started"),
        )
    if run_history is None:
        run_history = (
            RunRecord(
                issue_id="id-9", identifier="LOR-9", slot=0, attempt=1,
                outcome=RunOutcome.FAILED, error="agent_exited: agent exited with status 1",
                started_at=_at(-66), finished_at=_at(-5), duration_ms=61000, host=None,
                session_id=None, turn_count=1, usage=TokenUsage(),
            ),
        )
    return RuntimeSnapshot(
        app_status=app_status,
        workflow_path="/srv/repo/WORKFLOW.md",
        poll=poll or _poll(),
        lanes=OrchestratorSnapshot(
            generated_at=NOW,
            running=(_running(1),) if running is None else running,
            reserving=reserving,
            retrying=(_retry(),) if retrying is None else retrying,
            blocked=blocked,
            usage_totals=UsageTotals(98765, 4321, 103086, 3725.0, 1.5),
            rate_limits=rate_limits,
        ),
        recent_events=recent_events,
        run_history=run_history,
        log_file=None,
        config_error=config_error,
    )


def _text(snapshot: RuntimeSnapshot, *, width: int = 160, **options: Any) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(render_snapshot(snapshot, now=NOW, **options))
    return console.export_text()


def test_header_names_workflow_status_and_poll_countdown() -> None:
    text = _text(_snapshot())
    first, second = text.splitlines()[:2]
    assert "Lorenz" in first
    assert "● running" in first
    assert "/srv/repo/WORKFLOW.md" in first
    assert "next poll in 12s" in second
    assert "last poll 3s ago" in second
    assert "candidates 7" in second
    assert "eligible 3" in second


def test_countdown_says_polling_while_a_poll_runs_and_nothing_once_stopped() -> None:
    polling = _snapshot(poll=_poll(status="polling"))
    assert "next poll polling…" in _text(polling)
    assert "next poll —" in _text(_snapshot(app_status=AppStatus.STOPPED))


def test_running_lane_rows_carry_the_run() -> None:
    text = _text(_snapshot())
    row = next(line for line in text.splitlines() if "LOR-1" in line and "Issue number 1" in line)
    for expected in ("local", "1m 05s", "notification running the tests", "1,234/56"):
        assert expected in row, (expected, row)


def test_retry_lane_shows_kind_attempt_due_and_error() -> None:
    text = _text(_snapshot())
    row = next(line for line in text.splitlines() if "LOR-9" in line and "failure" in line)
    assert "in 30s" in row
    assert "agent exited with status 1" in row
    overdue = _snapshot(retrying=(_retry(due_at=_at(-1)),))
    assert "due now" in _text(overdue)


def test_totals_line() -> None:
    text = _text(_snapshot())
    totals = text.splitlines()[2]
    for expected in (
        "running 1",
        "retrying 1",
        "tokens in 98,765",
        "out 4,321",
        "total 103,086",
        "agent time 1h 02m",
        "cost $1.50",
    ):
        assert expected in totals, (expected, totals)


def test_markup_in_tracker_text_is_printed_as_written() -> None:
    hostile = "[bold red]pwned[/bold red] [link=http://x]y[/link]"
    snapshot = _snapshot(running=(_running(1, title=hostile, last_agent_message="[blink]hi"),))
    text = _text(snapshot, width=220)
    assert hostile in text
    assert "[blink]hi" in text


def test_empty_and_optional_lanes() -> None:
    text = _text(_snapshot(running=(), retrying=(), run_history=(), recent_events=()))
    assert "no runs in flight" in text
    assert "nothing yet" in text
    assert "Reserving" not in text  # shown only when a worker pool reserves
    assert "Blocked" not in text
    reserving = ReservingRow(
        slot_key="id-5#1", issue_id="id-5", identifier="LOR-5", title="Needs a worker",
        slot_index=1, state="Todo", attempt=None, reserved_at=_at(-4), expires_at=_at(56),
        expires_in_ms=56000,
    )
    blocked = BlockedRow(
        slot_key="id-6#0", issue_id="id-6", identifier="LOR-6", error="needs input",
        blocked_at=_at(-120),
    )
    text = _text(_snapshot(reserving=(reserving,), blocked=(blocked,)))
    assert "Reserving 1" in text
    row = next(line for line in text.splitlines() if "LOR-5" in line)
    assert "4s" in row
    assert "in 56s" in row
    assert "Blocked 1" in text
    assert "2m 00s" in next(line for line in text.splitlines() if "LOR-6" in line)


def test_long_lanes_are_cut_with_a_count() -> None:
    snapshot = _snapshot(running=tuple(_running(n) for n in range(1, 13)))
    text = _text(snapshot, max_rows_per_lane=3)
    assert "Running 12" in text
    assert "… and 9 more" in text
    assert "LOR-3 " in text
    assert "LOR-4 " not in text


def test_events_are_newest_first_and_capped() -> None:
    events = tuple(
        RuntimeEvent(type=EventType.POLL_COMPLETED, at=_at(-n), message=f"event {n}")
        for n in range(20)
    )
    text = _text(_snapshot(recent_events=events), max_events=4)
    shown = [line for line in text.splitlines() if "event " in line and "poll_completed" in line]
    assert [line.split("event ")[-1].strip() for line in shown] == ["0", "1", "2", "3"]


def test_poll_error_and_rate_limits() -> None:
    snapshot = _snapshot(
        rate_limits={"primary": {"used_percent": 42}, "requests": 7},
        poll=_poll(last_error="linear_api_status: 502 from Linear"),
    )
    text = _text(snapshot)
    assert "last poll failed: linear_api_status: 502 from Linear" in text
    assert "rate limits primary 42% · requests 7" in text


def test_the_reload_error_in_force_is_shown_until_it_is_gone() -> None:
    snapshot = _snapshot(
        config_error=ConfigError(
            code="workflow_parse_error",
            message="front matter is not valid YAML [red]x[/red]",
            since=datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC),
        )
    )
    text = _text(snapshot)
    assert "WORKFLOW.md reload failed: workflow_parse_error front matter is not valid YAML" in text
    assert "[red]x[/red]" in text  # markup in the message is printed literally
    assert "since 2026-01-01T12:00:00+00:00" in text
    assert "reload failed" not in _text(dataclasses.replace(snapshot, config_error=None))


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (4.9, "4s"), (65, "1m 05s"), (3725, "1h 02m"), (-3, "0s"), (float("nan"), "—")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(11.2, "in 12s"), (0.2, "due now"), (-5, "due now"), (61, "in 1m 01s"), (60.5, "in 1m 01s")],
)
def test_format_countdown(seconds: float, text: str) -> None:
    assert format_countdown(seconds) == text


def test_rate_limit_edge_cases() -> None:
    assert describe_rate_limits(None) == ""
    assert describe_rate_limits({"x": None, "y": {"remaining": 3}, "z": {}}) == "y 3 · z …"


async def test_renders_a_live_runtime_snapshot(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "quick", "print('hello from the agent', flush=True)\n")
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(
        workflow, issues=[Issue(id="a", identifier="LIVE-1", title="Live one", state="Todo")]
    )
    await rig.runtime.poll_once(wait_for_runs=True)
    console = Console(record=True, width=160, file=io.StringIO(), color_system=None)
    console.print(render_snapshot(rig.runtime.snapshot()))
    text = console.export_text()
    assert str(workflow) in text
    assert "Retrying 1" in text
    assert "continuation" in next(line for line in text.splitlines() if "LIVE-1" in line)
    assert "success" in text
    assert "run_finished" in text


def test_budget_line_spend_column_and_budget_lane() -> None:
    """With a cap set, the view shows the day's spend against it, each run's spend, and the
    issues held back at a cap (the ``budget`` lane)."""
    base = _snapshot()
    running = base.lanes.running[0]
    budget = BudgetSnapshot(
        day="2026-12-07",
        day_spend=SpendFigures(tokens=12345, usd=0.42),
        max_usd_per_day=1.0,
        held=(
            BudgetHoldRow(issue_id="id-7", identifier="LOR-7", cap="usd_per_issue", limit=0.5,
                          spent=0.51, held_at=_at(-30)),
        ),
        runs=(
            RunSpendRow(slot_key=running.slot_key, issue_id=running.issue_id,
                        identifier=running.identifier, spend=SpendFigures(tokens=900, usd=0.25),
                        model="gpt-5"),
        ),
    )
    text = _text(dataclasses.replace(base, budget=budget), width=200)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("spend today")]
    assert "$0.42 of $1.00 (0.58 left)" in line
    assert "tokens 12,345" in line
    assert "held 1" in line
    (row,) = [ln for ln in text.splitlines() if running.identifier in ln and "$" in ln]
    assert row.rstrip().endswith("$0.25")
    (held,) = [ln for ln in text.splitlines() if "LOR-7" in ln]
    assert "usd_per_issue" in held
    assert "$0.51/$0.50" in held
    assert "30s" in held
    assert "Budget 1" in text
    assert "spend today" not in _text(base)
