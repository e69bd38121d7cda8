"""One issue, seen from every angle the runtime has: the issue detail document.

An issue is spread over the lanes (one row per slot, in running, reserving, retrying or
blocked), the run history, the recent events, and the server's own per-issue journal. The
detail route gathers them into one document, so a person (or script) looking at ``ABC-123``
sees its slots, where its workspace is, how many attempts it took, what its agent said last and
what its runs cost, without filtering the whole state themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lorenz.model import (
    BlockedRow,
    Issue,
    ReservingRow,
    RetryRow,
    RunningRow,
    RunRecord,
    RuntimeEvent,
    RuntimeSnapshot,
    TokenUsage,
)
from lorenz.server.journal import IssueJournal, IssueTrail
from lorenz.workspaces import WorkspaceError, WorkspaceManager

LANES = ("running", "reserving", "retrying", "blocked")
"""Lane names in status priority: an issue with a running slot is ``running``, and so on."""

IDLE = "idle"
"""Status of an issue the runtime remembers (history, events) but holds no slot of."""

Row = RunningRow | ReservingRow | RetryRow | BlockedRow | RunRecord | RuntimeEvent


def issue_detail(
    snapshot: RuntimeSnapshot,
    *,
    identifier: str,
    journal: IssueJournal | None,
    workspaces: WorkspaceManager | None,
) -> dict[str, Any] | None:
    """The detail document for ``identifier`` (or an issue id), or ``None`` if nothing knows it."""
    trail = journal.find(identifier) if journal is not None else None
    issue_id, known_identifier = _resolve(snapshot, identifier, trail)
    if issue_id is None or known_identifier is None:
        return None
    lanes = snapshot.lanes
    running = [row for row in lanes.running if row.issue_id == issue_id]
    reserving = [row for row in lanes.reserving if row.issue_id == issue_id]
    retrying = [row for row in lanes.retrying if row.issue_id == issue_id]
    blocked = [row for row in lanes.blocked if row.issue_id == issue_id]
    history = [record for record in snapshot.run_history if record.issue_id == issue_id]
    if trail is not None:
        events = list(reversed(trail.events))
        agent_updates = list(reversed(trail.agent_updates))
    else:
        events = [event for event in snapshot.recent_events if event.issue_id == issue_id]
        agent_updates = []
    counts: dict[str, Sequence[object]] = {
        "running": running, "reserving": reserving, "retrying": retrying, "blocked": blocked
    }
    status = next((lane for lane in LANES if counts[lane]), IDLE)
    placed: list[RunningRow | ReservingRow] = [*running, *reserving]
    return {
        "issue_id": issue_id,
        "identifier": known_identifier,
        "status": status,
        "title": next((row.title for row in placed if row.title), None),
        "state": next((row.state for row in placed), None),
        "url": next((row.url for row in running if row.url), None),
        "workspace": _workspace(
            running, retrying, identifier=known_identifier, issue_id=issue_id,
            workspaces=workspaces,
        ),
        "attempts": _attempts([*running, *reserving, *retrying], trail=trail),
        "running": [row.to_dict() for row in running],
        "reserving": [row.to_dict() for row in reserving],
        "retrying": [row.to_dict() for row in retrying],
        "blocked": [row.to_dict() for row in blocked],
        "last_agent": _last_agent(running, agent_updates),
        "agent_updates": agent_updates,
        "tokens": _tokens(running, history=history, trail=trail).to_dict(),
        "recent_events": [event.to_dict() for event in events],
        "run_history": [record.to_dict() for record in history],
        "last_error": _last_error(retrying, blocked, history=history, trail=trail),
    }


def _resolve(
    snapshot: RuntimeSnapshot, wanted: str, trail: IssueTrail | None
) -> tuple[str | None, str | None]:
    """``(issue_id, identifier)`` for an identifier or id, looking everywhere the state holds."""
    if trail is not None:
        return trail.issue_id, trail.identifier
    folded = wanted.casefold()
    lanes = snapshot.lanes
    rows: list[Row] = [*lanes.running, *lanes.reserving, *lanes.retrying, *lanes.blocked]
    rows += snapshot.run_history
    rows += snapshot.recent_events
    matchers: tuple[Callable[[Row], bool], ...] = (
        lambda row: row.identifier == wanted,
        lambda row: row.issue_id == wanted,
        lambda row: (row.identifier or "").casefold() == folded,
    )
    for matches in matchers:
        for row in rows:
            if matches(row) and row.issue_id and row.identifier:
                return row.issue_id, row.identifier
    return None, None


def _workspace(
    running: Sequence[RunningRow],
    retrying: Sequence[RetryRow],
    *,
    identifier: str,
    issue_id: str,
    workspaces: WorkspaceManager | None,
) -> dict[str, Any]:
    recorded: list[RunningRow | RetryRow] = [*running, *retrying]
    for row in recorded:
        if row.workspace_path:
            return {"path": row.workspace_path, "recorded": True}
    if workspaces is None:
        return {"path": None, "recorded": False}
    try:
        # NB: where the workspace *would* be: only the identifier matters for the path.
        stub = Issue(id=issue_id, identifier=identifier, title=identifier, state="")
        path = workspaces.path_for(stub, slot_index=0)
    except WorkspaceError:
        return {"path": None, "recorded": False}
    return {"path": str(path), "recorded": False}


def _attempts(
    rows: Sequence[RunningRow | ReservingRow | RetryRow], *, trail: IssueTrail | None
) -> dict[str, Any]:
    attempts = [row.attempt for row in rows if row.attempt is not None]
    current = max(attempts) if attempts else None
    return {
        "current_retry_attempt": current,
        "restart_count": max((current or 0) - 1, 0),
        "runs_started": trail.runs_started if trail is not None else None,
    }


def _last_agent(
    running: Sequence[RunningRow], agent_updates: list[dict[str, Any]]
) -> dict[str, Any] | None:
    latest = max(
        (row for row in running if row.last_agent_at is not None),
        key=lambda row: row.last_agent_at.isoformat() if row.last_agent_at else "",
        default=None,
    )
    if latest is not None and latest.last_agent_at is not None:
        return {
            "slot_key": latest.slot_key,
            "event": latest.last_agent_event,
            "message": latest.last_agent_message,
            "at": latest.last_agent_at.isoformat(),
        }
    if agent_updates:
        update = agent_updates[0]
        return {key: update.get(key) for key in ("slot_key", "event", "message", "at")}
    return None


def _usage_of(usages: Iterable[TokenUsage]) -> TokenUsage:
    total = TokenUsage()
    for usage in usages:
        total = total + usage
    return total


def _tokens(
    running: Sequence[RunningRow],
    *,
    history: Sequence[RunRecord],
    trail: IssueTrail | None,
) -> TokenUsage:
    """Live runs from the lanes, ended runs from the journal (or the bounded history)."""
    finished = (
        trail.finished_usage
        if trail is not None
        else _usage_of(record.usage for record in history)
    )
    return _usage_of(row.usage for row in running) + finished


def _last_error(
    retrying: Sequence[RetryRow],
    blocked: Sequence[BlockedRow],
    *,
    history: Sequence[RunRecord],
    trail: IssueTrail | None,
) -> str | None:
    waiting: list[RetryRow | BlockedRow] = [*retrying, *blocked]
    for row in waiting:
        if row.error:
            return row.error
    if trail is not None and trail.last_error:
        return trail.last_error
    return next((record.error for record in history if record.error), None)
