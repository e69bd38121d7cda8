"""``lorenz status [WORKFLOW.md] [--url URL] [--port N] [--json]``: what the daemon is doing.

Finds the daemon through its lease (see :mod:`lorenz.daemon.attach`) and prints who leads,
where it answers, how fresh its heartbeat is and how many slots sit in each lane. Over HTTP the
lanes come from ``GET /api/v1/state`` (which carries the daemon block too); over the unix
socket from ``GET /api/v1/daemon``. Exit codes: 0 running, 1 not running or unreachable,
2 usage.

NB: cold start matters here (target ≤ 300 ms, measured by ``bench/status_bench.py``): only
the standard library and :mod:`lorenz.daemon`'s stdlib-only modules are imported on success.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

LANES = ("running", "reserving", "retrying", "blocked")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lorenz.daemon.attach import add_attach_arguments

    add_attach_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from lorenz.daemon.attach import attached

    return attached(args, lambda target: _status(target, as_json=args.json))


def _status(target: Any, *, as_json: bool) -> int:
    from lorenz.daemon.attach import EXIT_OK, print_json

    status = collect(target)
    if as_json:
        print_json(status)
    else:
        print(render(status))
    return EXIT_OK


def collect(target: Any) -> dict[str, Any]:
    """The daemon block, lanes and poll of the daemon ``target`` names, as one JSON object."""
    from lorenz.daemon.attach import call, try_call

    state: dict[str, Any] | None = None
    info: dict[str, Any] | None = None
    if target.endpoint.is_unix:
        info = call(target, "GET", "/api/v1/daemon").body
    else:
        reply = try_call(target, "GET", "/api/v1/state")
        state = reply.body if reply is not None else None
        block = state.get("daemon") if state is not None else None
        info = block if isinstance(block, dict) else None
        if info is None:
            fallback = try_call(target, "GET", "/api/v1/daemon")
            info = fallback.body if fallback is not None else None
        if state is None and info is None:
            from lorenz.daemon.errors import DaemonRequestFailed

            raise DaemonRequestFailed(
                endpoint=target.endpoint.url,
                path="/api/v1/state",
                status=404,
                error={"message": "neither /api/v1/state nor /api/v1/daemon answers: not Lorenz?"},
            )
    source = state if state is not None else (info or {})
    if state is not None:
        lanes = {lane: len(state.get(lane) or ()) for lane in LANES}
    else:
        raw = source.get("lanes") or {}
        lanes = {lane: int(raw.get(lane) or 0) for lane in LANES}
    return {
        "endpoint": target.endpoint.url,
        "workflow_path": (info or {}).get("workflow_path") or source.get("workflow_path"),
        "app_status": source.get("app_status"),
        "daemon": info,
        "lease": target.lease,
        "lanes": lanes,
        "poll": source.get("poll"),
        # The reload error in force (the daemon runs the last good workflow meanwhile).
        "config_error": source.get("config_error"),
        # Issues whose agent asked a question (`lorenz answer` answers them).
        "waiting": [
            {key: row.get(key) for key in ("identifier", "question", "asked_at")}
            for row in (source.get("waiting") or ())
            if isinstance(row, dict)
        ],
        # Spend control, while a budget cap is set (docs/budgets.md).
        "budget": source.get("budget") if isinstance(source.get("budget"), dict) else None,
    }


def render(status: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect`'s result."""
    info = status.get("daemon") or {}
    lease = status.get("lease") or {}
    lines = [f"Lorenz daemon: {status.get('app_status') or 'unknown'}"]

    def row(label: str, value: object) -> None:
        lines.append(f"  {label:<10} {value}")

    row("workflow", status.get("workflow_path") or lease.get("workflow_path") or "?")
    pid = info.get("pid", lease.get("pid"))
    host = info.get("host", lease.get("host"))
    if pid is not None or host is not None:
        started = info.get("process_started_at")
        since = f" (started {started})" if started else ""
        row("owner", f"pid {pid} on {host}{since}")
    row("endpoint", status.get("endpoint"))
    heartbeat = _heartbeat_text(info, lease)
    if heartbeat:
        row("heartbeat", heartbeat)
    if info.get("leadership_store") or info.get("lease_path"):
        row("lease", f"{info.get('leadership_store')} {info.get('lease_path') or ''}".strip())
    lanes = status.get("lanes") or {}
    row("lanes", ", ".join(f"{lane} {lanes.get(lane, 0)}" for lane in LANES))
    for waiting in status.get("waiting") or ():
        question = " ".join(str(waiting.get("question") or "").split())
        question = question if len(question) <= 120 else question[:119] + "…"
        row("waiting", f"{waiting.get('identifier')} (since {waiting.get('asked_at')}): {question}")
    poll = status.get("poll") or {}
    if poll:
        parts = [str(poll.get("status") or "?")]
        if poll.get("last_poll_at"):
            parts.append(f"last {poll['last_poll_at']}")
        if poll.get("next_poll_at"):
            parts.append(f"next {poll['next_poll_at']}")
        parts.append(f"{poll.get('count', 0)} polls")
        if poll.get("last_error"):
            parts.append(f"last error: {poll['last_error']}")
        row("poll", "; ".join(parts))
        paused = poll.get("dispatch_paused")
        if isinstance(paused, dict):
            row("dispatch", f"PAUSED since {paused.get('since')} ({paused.get('code')})")
    budget = status.get("budget")
    if isinstance(budget, dict):
        row("spend", _budget_text(budget))
    config_error = status.get("config_error")
    if isinstance(config_error, dict):
        row(
            "config",
            f"reload refused: {config_error.get('code')}: {config_error.get('message')}"
            f" (since {config_error.get('since')}; running the last good workflow)",
        )
    if info.get("last_heartbeat_error"):
        row("warning", f"heartbeat failing: {info['last_heartbeat_error']}")
    return "\n".join(lines)


def _budget_text(budget: dict[str, Any]) -> str:
    """``today 0.4200 of 1.00 USD (0.5800 left), 12345 tokens; 1 held: T-1 (usd_per_issue)``."""
    spend = budget.get("day_spend") or {}
    usd = float(spend.get("usd") or 0.0)
    cap = float(budget.get("max_usd_per_day") or 0.0)
    text = f"{budget.get('day') or 'today'} {usd:.4f}"
    left = float(budget.get("remaining_usd") or 0.0)
    text += f" of {cap:g} USD ({left:.4f} left)" if cap else " USD"
    text += f", {int(spend.get('tokens') or 0)} tokens"
    held = budget.get("held") or []
    if held:
        names = ", ".join(
            f"{row.get('issue_identifier')} ({row.get('cap')})" for row in held[:5]
        )
        more = f" and {len(held) - 5} more" if len(held) > 5 else ""
        text += f"; {len(held)} held: {names}{more}"
    return text


def _heartbeat_text(info: dict[str, Any], lease: dict[str, Any]) -> str | None:
    age_ms = info.get("heartbeat_age_ms")
    if age_ms is None:
        at = info.get("heartbeat_at") or lease.get("heartbeat_at")
        if not at:
            return None
        try:
            then = datetime.datetime.fromisoformat(str(at))
        except ValueError:
            return str(at)
        if then.tzinfo is None:
            then = then.replace(tzinfo=datetime.UTC)
        age_ms = (datetime.datetime.now(datetime.UTC) - then).total_seconds() * 1000.0
    text = f"{float(age_ms) / 1000.0:.1f} s ago"
    every = info.get("heartbeat_ms")
    if every:
        text += f" (every {float(every) / 1000.0:.1f} s)"
    return text
