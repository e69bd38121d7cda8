"""Turns one runtime snapshot into a rich renderable: the terminal view's only drawing code.

Kept apart from the live mount (:mod:`lorenz.tui.view`) so it is a pure function of the snapshot
and the current time — tests render recorded snapshots into a recording console and read the
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
_GOOD_EVENTS = frozenset({"run_finished", "workflow_reloaded", "leadership_acquired"})
_QUIET_EVENTS = frozenset({"poll_completed", "dry_run", "refresh_requested"})


def render_snapshot(
    snapshot: Mapping[str, Any],
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
    parts: list[RenderableType] = [_header(snapshot, now=at), _totals(snapshot)]
    config_error = snapshot.get("config_error")
    if isinstance(config_error, Mapping):
        parts.append(
            Text.assemble(
                ("WORKFLOW.md reload failed: ", "bold yellow"),
                (f"{config_error.get('code')} ", "bold yellow"),
                (str(config_error.get("message") or ""), "yellow"),
                (f" (since {config_error.get('since')}; running the last good one)", "dim"),
            )
        )
    poll = snapshot.get("poll") or {}
    if poll.get("last_error"):
        parts.append(
            Text.assemble(("last poll failed: ", "bold red"), (str(poll["last_error"]), "red"))
        )
    parts.append(_running(snapshot.get("running") or [], now=at, limit=max_rows_per_lane))
    reserving = snapshot.get("reserving") or []
    if reserving:
        parts.append(_reserving(reserving, now=at, limit=max_rows_per_lane))
    parts.append(_retrying(snapshot.get("retrying") or [], now=at, limit=max_rows_per_lane))
    blocked = snapshot.get("blocked") or []
    if blocked:
        parts.append(_blocked(blocked, now=at, limit=max_rows_per_lane))
    history = snapshot.get("run_history") or []
    if history:
        parts.append(_history(history, limit=min(max_rows_per_lane, 5)))
    parts.append(_events(snapshot.get("recent_events") or [], limit=max_events))
    return Group(*parts)


# ---------------------------------------------------------------------------------- sections


def _header(snapshot: Mapping[str, Any], *, now: datetime.datetime) -> Text:
    status = str(snapshot.get("app_status") or "unknown")
    poll = snapshot.get("poll") or {}
    header = Text()
    header.append("Lorenz ", style="bold")
    header.append(f"● {status}", style=_STATUS_STYLES.get(status, "bold"))
    header.append("  ")
    header.append(str(snapshot.get("workflow_path") or ""), style="cyan")
    header.append("\n")
    header.append("next poll ", style="dim")
    if poll.get("status") == "polling":
        header.append("polling…", style="bold")
    elif status == "running" and poll.get("next_poll_at"):
        header.append(format_countdown(_until(poll["next_poll_at"], now=now)), style="bold")
    else:
        header.append("—")
    header.append("   last poll ", style="dim")
    last = poll.get("last_poll_at")
    header.append(f"{format_duration(_since(last, now=now))} ago" if last else "never")
    header.append("   candidates ", style="dim")
    header.append(str(poll.get("candidates", 0)))
    header.append("   eligible ", style="dim")
    header.append(str(poll.get("eligible", 0)))
    header.append("   polls ", style="dim")
    header.append(str(poll.get("count", 0)))
    return header


def _totals(snapshot: Mapping[str, Any]) -> Text:
    usage = snapshot.get("usage_totals") or {}
    totals = Text()
    pairs = (
        ("running", str(len(snapshot.get("running") or []))),
        ("retrying", str(len(snapshot.get("retrying") or []))),
        ("tokens in", format_int(usage.get("input_tokens"))),
        ("out", format_int(usage.get("output_tokens"))),
        ("total", format_int(usage.get("total_tokens"))),
        ("agent time", format_duration(float(usage.get("seconds_running") or 0.0))),
        ("cost", f"${float(usage.get('cost_usd') or 0.0):.2f}"),
    )
    for index, (label, value) in enumerate(pairs):
        if index:
            totals.append("  ")
        totals.append(f"{label} ", style="dim")
        totals.append(value, style="bold")
    limits = describe_rate_limits(snapshot.get("rate_limits"))
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


def _running(rows: Sequence[Mapping[str, Any]], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Running", len(rows), style="blue")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("title", ratio=3, no_wrap=True, overflow="ellipsis")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("host", no_wrap=True)
    table.add_column("elapsed", justify="right", no_wrap=True)
    table.add_column("last agent event", ratio=4, no_wrap=True, overflow="ellipsis")
    table.add_column("tokens in/out", justify="right", no_wrap=True)
    for row in rows[:limit]:
        usage = row.get("usage") or {}
        event = Text(str(row.get("last_agent_event") or "—"), style="cyan")
        if row.get("last_agent_message"):
            event.append(" ")
            event.append(_one_line(row["last_agent_message"]), style="default")
        table.add_row(
            Text(str(row.get("identifier", ""))),
            Text(_one_line(row.get("title") or "")),
            str(row.get("slot_index", "")),
            _attempt(row.get("attempt")),
            Text(str(row.get("host") or "local")),
            format_duration(_since(row.get("started_at"), now=now)),
            event,
            f"{format_int(usage.get('input_tokens'))}/{format_int(usage.get('output_tokens'))}",
        )
    _more(table, rows, limit=limit, empty="no runs in flight")
    return table


def _reserving(rows: Sequence[Mapping[str, Any]], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Reserving", len(rows), style="magenta")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("title", ratio=3, no_wrap=True, overflow="ellipsis")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("expires", justify="right", no_wrap=True)
    for row in rows[:limit]:
        table.add_row(
            Text(str(row.get("identifier", ""))),
            Text(_one_line(row.get("title") or "")),
            str(row.get("slot_index", "")),
            _attempt(row.get("attempt")),
            format_duration(_since(row.get("reserved_at"), now=now)),
            format_countdown(_until(row.get("expires_at"), now=now)),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _retrying(rows: Sequence[Mapping[str, Any]], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Retrying", len(rows), style="yellow")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("due", justify="right", no_wrap=True)
    table.add_column("error", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        kind = str(row.get("kind", ""))
        table.add_row(
            Text(str(row.get("identifier", ""))),
            str(row.get("slot_index", "")),
            Text(kind, style="red" if kind == "failure" else "blue"),
            str(row.get("attempt", "")),
            format_countdown(_until(row.get("due_at"), now=now)),
            Text(_one_line(row.get("error") or ""), style="red"),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _blocked(rows: Sequence[Mapping[str, Any]], *, now: datetime.datetime, limit: int) -> Table:
    table = _lane("Blocked", len(rows), style="red")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("blocked for", justify="right", no_wrap=True)
    table.add_column("error", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        table.add_row(
            Text(str(row.get("identifier", ""))),
            format_duration(_since(row.get("blocked_at"), now=now)),
            Text(_one_line(row.get("error") or ""), style="red"),
        )
    _more(table, rows, limit=limit, empty="none")
    return table


def _history(rows: Sequence[Mapping[str, Any]], *, limit: int) -> Table:
    table = _lane("Recent runs", len(rows), style="white")
    table.add_column("finished", no_wrap=True, style="dim")
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("slot", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("detail", ratio=1, no_wrap=True, overflow="ellipsis")
    for row in rows[:limit]:
        outcome = str(row.get("outcome", ""))
        table.add_row(
            format_clock(row.get("finished_at")),
            Text(str(row.get("identifier", ""))),
            str(row.get("slot", "")),
            Text(outcome, style=_OUTCOME_STYLES.get(outcome, "")),
            format_duration(float(row.get("duration_ms") or 0) / 1000.0),
            Text(_one_line(row.get("error") or ""), style="red"),
        )
    return table


def _events(events: Sequence[Mapping[str, Any]], *, limit: int) -> Table:
    table = _lane("Recent events", len(events), style="white")
    table.add_column("at", no_wrap=True, style="dim")
    table.add_column("event", no_wrap=True)
    table.add_column("issue", no_wrap=True, style="bold")
    table.add_column("message", ratio=1, no_wrap=True, overflow="ellipsis")
    for event in events[:limit]:
        kind = str(event.get("type", ""))
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
            format_clock(event.get("at")),
            Text(kind, style=style),
            Text(str(event.get("identifier") or "")),
            Text(_one_line(event.get("message") or "")),
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


def parse_timestamp(value: Any) -> datetime.datetime | None:
    """An ISO-8601 timestamp from a snapshot (naive ones are taken as UTC), or ``None``."""
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def _since(value: Any, *, now: datetime.datetime) -> float:
    at = parse_timestamp(value)
    return (now - at).total_seconds() if at is not None else float("nan")


def _until(value: Any, *, now: datetime.datetime) -> float:
    at = parse_timestamp(value)
    return (at - now).total_seconds() if at is not None else float("nan")


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


def format_clock(value: Any) -> str:
    """Local ``HH:MM:SS`` of a snapshot timestamp."""
    at = parse_timestamp(value)
    return at.astimezone().strftime("%H:%M:%S") if at is not None else "—"


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
