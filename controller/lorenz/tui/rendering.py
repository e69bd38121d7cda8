"""Turns one runtime snapshot into a rich renderable: the terminal view's only drawing code.

Kept apart from the live mount (:mod:`lorenz.tui.view`) so it is a pure function of the (typed)
snapshot and the current time — tests render snapshots into a recording console and read the
text back, with no terminal involved.

NB: titles, messages and errors are tracker- or agent-controlled text. They are always wrapped
in :class:`rich.text.Text` (never interpolated into markup), so ``[red]`` in an issue title is
printed as written instead of being interpreted by rich.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from lorenz.model import (
    BlockedRow,
    ReservingRow,
    RetryRow,
    RunningRow,
    RunRecord,
    RuntimeEvent,
    RuntimeSnapshot,
)
from lorenz.model.clocks import as_utc
from lorenz.model.snapshots import WaitingRow
from lorenz.model.spending import BudgetHoldRow, BudgetSnapshot

MAX_ROWS_PER_LANE = 8
"""Rows shown per lane before the rest are summed up as "… and N more"."""
MAX_EVENTS = 8
"""Recent events shown under the lanes."""

_STATUS_STYLES = {
    "running": "bold green",
    "starting": "bold yellow",
    "stopping": "bold yellow",
    "stopped": "bold red",
}
_OUTCOME_STYLES = {
    "success": "green",
    "failed": "red",
    "stalled": "yellow",
    "canceled": "bright_black",
}
_BAD_EVENTS = frozenset(
    {
        "poll_error",
        "run_failed",
        "run_stalled",
        "reconcile_refresh_failed",
        "workflow_reload_failed",
        "startup_workspace_cleanup_failed",
        "leadership_lost",
        "reservation_expired",
    }
)
_GOOD_EVENTS = frozenset({"run_finished", "workflow_reloaded"})
_QUIET_EVENTS = frozenset({"poll_completed", "dry_run", "refresh_requested"})


def render_snapshot(
    snapshot: RuntimeSnapshot,
    *,
    now: datetime.datetime | None = None,
    max_rows_per_lane: int = MAX_ROWS_PER_LANE,
    max_events: int = MAX_EVENTS,
) -> RenderableType:
    """The whole view: header, totals, the four lanes, recent runs and events.

    ``now`` (timezone-aware) drives the countdowns and elapsed times; it defaults to the
    wall clock, so a view re-rendered every second ticks between snapshots.
    """
    at = now or datetime.datetime.now(datetime.UTC)
    lanes = snapshot.lanes
    parts: list[RenderableType] = [_header(snapshot, now=at), _totals(snapshot)]
    config_error = snapshot.config_error
    if config_error is not None:
        parts.append(
            Text.assemble(
                ("WORKFLOW.md reload failed: ", "bold yellow"),
                (f"{config_error.code} ", "bold yellow"),
                (config_error.message, "yellow"),
                (
                    f" (since {config_error.since.isoformat()}; running the last good one)",
                    "dim",
                ),
            )
        )
    paused = snapshot.poll.dispatch_paused
    if paused is not None:
        parts.append(
            Text.assemble(
                ("dispatch paused: ", "bold red"),
                (f"{paused.code} ", "bold red"),
                (paused.message, "red"),
                (f" (since {paused.since.isoformat()})", "dim"),
            )
        )
    elif snapshot.poll.last_error:
        parts.append(
            Text.assemble(("last poll failed: ", "bold red"), (snapshot.poll.last_error, "red"))
        )
    budget = snapshot.budget
    if budget is not None:
        parts.append(_budget_line(budget))
    run_spend = (
        {row.slot_key: row.spend.usd for row in budget.runs} if budget is not None else None
    )
    parts.append(_running(lanes.running, now=at, limit=max_rows_per_lane, spend=run_spend))
    if budget is not None and budget.held:
        parts.append(_held(budget.held, now=at, limit=max_rows_per_lane))
    if lanes.reserving:
        parts.append(_reserving(lanes.reserving, now=at, limit=max_rows_per_lane))
    parts.append(_retrying(lanes.retrying, now=at, limit=max_rows_per_lane))
    if lanes.blocked:
        parts.append(_blocked(lanes.blocked, now=at, limit=max_rows_per_lane))
    if lanes.waiting:
        parts.append(_waiting(lanes.waiting, now=at, limit=max_rows_per_lane))
    if snapshot.run_history:
        parts.append(_history(snapshot.run_history, limit=min(max_rows_per_lane, 5)))
    parts.append(_events(snapshot.recent_events, limit=max_events))
    return Group(*parts)


# ---------------------------------------------------------------------------------- sections


def _header(snapshot: RuntimeSnapshot, *, now: datetime.datetime) -> Text:
    status = snapshot.app_status.value
    poll = snapshot.poll
    header = Text()
    header.append("Lorenz ", style="bold")
    header.append(f"● {status}", style=_STATUS_STYLES.get(status, "bold"))
    header.append("  ")
    header.append(snapshot.workflow_path, style="cyan")
    header.append("\n")
    header.append("next poll ", style="dim")
    if poll.status == "polling":
        header.append("polling…", style="bold")
    elif status == "running" and poll.next_poll_at is not None:
        header.append(format_countdown(_until(poll.next_poll_at, now=now)), style="bold")
    else:
        header.append("—")
    header.append("   last poll ", style="dim")
    last = poll.last_poll_at
    header.append(f"{format_duration(_since(last, now=now))} ago" if last else "never")
    header.append("   candidates ", style="dim")
    header.append(str(poll.candidates))
    header.append("   eligible ", style="dim")
    header.append(str(poll.eligible))
    header.append("   polls ", style="dim")
    header.append(str(poll.count))
    return header


def _totals(snapshot: RuntimeSnapshot) -> Text:
    lanes = snapshot.lanes
    usage = lanes.usage_totals
    totals = Text()
    pairs = (
        ("running", str(len(lanes.running))),
        ("retrying", str(len(lanes.retrying))),
        ("tokens in", format_int(usage.input_tokens)),
        ("out", format_int(usage.output_tokens)),
        ("total", format_int(usage.total_tokens)),
        ("agent time", format_duration(usage.seconds_running)),
        ("cost", f"${usage.cost_usd:.2f}"),
    )
    for index, (label, value) in enumerate(pairs):
        if index:
            totals.append("  ")
        totals.append(f"{label} ", style="dim")
        totals.append(value, style="bold")
    limits = describe_rate_limits(lanes.rate_limits)
    if limits:
        totals.append("  rate limits ", style="dim")
        totals.append(limits)
    return totals


def _lane(title: str, count: int, *, style: str) -> Table:
    table = Table(
        title=Text.assemble((title, f"bold {style}"), (f" {count}", "dim")),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        expand=True,
        pad_edge=False,
        show_edge=False,
    )
    return table


def _budget_line(budget: BudgetSnapshot) -> Text:
    """``spend today $0.42 of $1.00 (0.58 left)  12,345 tokens  held 1``."""
    line = Text()
    line.append("spend today ", style="dim")
    line.append(f"${budget.day_spend.usd:.2f}", style="bold")
    remaining = budget.remaining_usd
    if remaining is not None:
        line.append(f" of ${budget.max_usd_per_day:.2f}", style="bold")
        line.append(f" ({remaining:.2f} left)", style="red" if remaining <= 0 else "dim")
    line.append("  tokens ", style="dim")
    line.append(format_int(budget.day_spend.tokens), style="bold")
    if budget.held:
        line.append("  held ", style="dim")
        line.append(str(len(budget.held)), style="bold red")
    return line


def _held(rows: Sequence[BudgetHoldRow], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Budget", len(rows), style="red")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("cap", no_wrap=True)
    table.add_column("spent / limit", justify="right", no_wrap=True)
    table.add_column("held for", justify="right", no_wrap=True)
    for row in rows[:limit]:
        tokens = row.cap.startswith("tokens")
        figures = (
            f"{format_int(int(row.spent))}/{format_int(int(row.limit))}"
            if tokens
            else f"${row.spent:.2f}/${row.limit:.2f}"
        )
        table.add_row(
            Text(row.identifier),
            Text(row.cap, style="red"),
            figures,
            format_duration(_since(row.held_at, now=now)),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _running(
    rows: Sequence[RunningRow],
    *,
    now: datetime.datetime,
    limit: int,
    spend: Mapping[str, float] | None = None,
) -> Table:
    table = _lane("Running", len(rows), style="blue")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("title", ratio=3, no_wrap=True, overflow="ellipsis")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    table.add_column("host", no_wrap=True)
    table.add_column("elapsed", justify="right", no_wrap=True)
    table.add_column("last agent event", ratio=4, no_wrap=True, overflow="ellipsis")
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    if spend is not None:
        table.add_column("spend", justify="right", no_wrap=True)
    for row in rows[:limit]:
        event = Text(row.last_agent_event or "—", style="cyan")
        if row.last_agent_message:
            event.append(" ")
            event.append(_one_line(row.last_agent_message), style="default")
        cells: list[RenderableType] = [
            Text(row.identifier),
            Text(_one_line(row.title or "")),
            str(row.slot_index),
            _attempt(row.attempt),
            Text(row.agent_kind or "—"),
            Text(row.host or "local"),
            format_duration(_since(row.started_at, now=now)),
            event,
            f"{format_int(row.usage.input_tokens)}/{format_int(row.usage.output_tokens)}",
        ]
        if spend is not None:
            cells.append(f"${spend.get(row.slot_key, 0.0):.2f}")
        table.add_row(*cells)
    _more(table, rows, limit=limit, empty="no runs in flight")
    return table


def _reserving(rows: Sequence[ReservingRow], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Reserving", len(rows), style="magenta")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("title", ratio=3, no_wrap=True, overflow="ellipsis")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("expires", justify="right", no_wrap=True)
    for row in rows[:limit]:
        table.add_row(
            Text(row.identifier),
            Text(_one_line(row.title or "")),
            str(row.slot_index),
            _attempt(row.attempt),
            format_duration(_since(row.reserved_at, now=now)),
            format_countdown(_until(row.expires_at, now=now)),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _retrying(rows: Sequence[RetryRow], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Retrying", len(rows), style="yellow")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("due", justify="right", no_wrap=True)
    table.add_column("error", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        table.add_row(
            Text(row.identifier),
            str(row.slot_index),
            Text(row.kind, style="red" if row.kind == "failure" else "blue"),
            str(row.attempt),
            format_countdown(_until(row.due_at, now=now)),
            Text(_one_line(row.error or ""), style="red"),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _blocked(rows: Sequence[BlockedRow], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Blocked", len(rows), style="red")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("blocked for", justify="right", no_wrap=True)
    table.add_column("error", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        table.add_row(
            Text(row.identifier),
            format_duration(_since(row.blocked_at, now=now)),
            Text(_one_line(row.error or ""), style="red"),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _waiting(rows: Sequence[WaitingRow], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Waiting for an answer", len(rows), style="yellow")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("asked", justify="right", no_wrap=True)
    table.add_column("question", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        table.add_row(
            Text(row.identifier),
            format_duration(_since(row.asked_at, now=now)),
            Text(_one_line(row.question), style="yellow"),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _history(rows: Sequence[RunRecord], *, limit: int) -> Table:
    table = _lane("Recent runs", len(rows), style="white")
    table.add_column("finished", no_wrap=True, style="dim")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("detail", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        outcome = row.outcome.value
        table.add_row(
            format_clock(row.finished_at),
            Text(row.identifier),
            str(row.slot),
            Text(outcome, style=_OUTCOME_STYLES.get(outcome, "")),
            format_duration(row.duration_ms / 1000.0),
            Text(_one_line(row.error or ""), style="red"),
        )
    return table


def _events(events: Sequence[RuntimeEvent], *, limit: int) -> Table:
    table = _lane("Recent events", len(events), style="white")
    table.add_column("at", no_wrap=True, style="dim")
    table.add_column("event", no_wrap=True)
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("message", ratio=1, no_wrap=True, overflow="ellipsis")
    for event in events[:limit]:
        kind = event.type.value
        style = (
            "red"
            if kind in _BAD_EVENTS
            else "green"
            if kind in _GOOD_EVENTS
            else "bright_black"
            if kind in _QUIET_EVENTS
            else "cyan"
        )
        table.add_row(
            format_clock(event.at),
            Text(kind, style=style),
            Text(event.identifier or ""),
            Text(_one_line(event.message or "")),
        )
    if not events:
        table.add_row("", Text("nothing yet", style="dim italic"), "", "")
    return table


def _more(table: Table, rows: Sequence[Any], *, limit: int, empty: str) -> None:
    if not rows:
        table.add_row(Text(empty, style="dim italic"))
    elif len(rows) > limit:
        table.add_row(Text(f"… and {len(rows) - limit} more", style="dim"))


def _attempt(value: Any) -> str:
    return "—" if value is None else str(value)


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


# ---------------------------------------------------------------------------------- formatting


def _since(value: datetime.datetime | None, *, now: datetime.datetime) -> float:
    return (now - as_utc(value)).total_seconds() if value is not None else float("nan")


def _until(value: datetime.datetime | None, *, now: datetime.datetime) -> float:
    return (as_utc(value) - now).total_seconds() if value is not None else float("nan")


def format_duration(seconds: float) -> str:
    """``4s``, ``3m 05s``, ``2h 07m``; ``—`` when unknown."""
    if seconds != seconds:  # NaN
        return "—"
    total = max(int(seconds), 0)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_countdown(seconds: float) -> str:
    """``in 12s``, or ``due now`` once the moment has come."""
    if seconds != seconds:
        return "—"
    if seconds <= 0.5:
        return "due now"
    return f"in {format_duration(seconds + 0.999)}"


def format_clock(value: datetime.datetime | None) -> str:
    """Local ``HH:MM:SS`` of a snapshot timestamp."""
    return as_utc(value).astimezone().strftime("%H:%M:%S") if value is not None else "—"


def format_int(value: Any) -> str:
    try:
        return f"{int(value or 0):,}"
    except (TypeError, ValueError):
        return "0"


def describe_rate_limits(limits: Any) -> str:
    """A one-line summary of the latest rate-limit snapshot (empty when there is none)."""
    if not isinstance(limits, Mapping):
        return ""
    parts: list[str] = []
    for key, value in limits.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            if "used_percent" in value:
                parts.append(f"{key} {value['used_percent']}%")
            elif "remaining" in value:
                parts.append(f"{key} {value['remaining']}")
            else:
                parts.append(f"{key} …")
        else:
            parts.append(f"{key} {value}")
    return " · ".join(parts)
