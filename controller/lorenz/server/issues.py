"""One issue, seen from every angle the runtime has: the issue detail document.

An issue is spread over the lanes (one row per slot, in running, reserving, retrying or
blocked), the run history, the recent events, and the server's own per-issue journal. The
detail route gathers them into one document, so a person (or script) looking at ``ABC-123``
sees its slots, where its workspace is, how many attempts it took, what its agent said last and
what its runs cost, without filtering the whole state themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lorenz.model import Issue, TokenUsage
from lorenz.server.journal import IssueJournal, IssueTrail
from lorenz.workspaces import WorkspaceError, WorkspaceManager

LANES = ("running", "reserving", "retrying", "blocked")
"""Lane names in status priority: an issue with a running slot is ``running``, and so on."""

IDLE = "idle"
"""Status of an issue the runtime remembers (history, events) but holds no slot of."""


def issue_detail(
    snapshot: Mapping[str, Any],
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

    def mine(row: Mapping[str, Any]) -> bool:
        return row.get("issue_id") == issue_id

    lanes = {lane: [row for row in snapshot.get(lane, ()) if mine(row)] for lane in LANES}
    history = [entry for entry in snapshot.get("run_history", ()) if mine(entry)]
    if trail is not None:
        events = list(reversed(trail.events))
        agent_updates = list(reversed(trail.agent_updates))
    else:
        events = [event for event in snapshot.get("recent_events", ()) if mine(event)]
        agent_updates = []
    status = next((lane for lane in LANES if lanes[lane]), IDLE)
    running = lanes["running"]
    return {
        "issue_id": issue_id,
        "identifier": known_identifier,
        "status": status,
        "title": next(
            (row["title"] for row in running + lanes["reserving"] if row.get("title")), None
        ),
        "state": next((row["state"] for row in running + lanes["reserving"]), None),
        "url": next((row["url"] for row in running if row.get("url")), None),
        "workspace": _workspace(
            lanes, identifier=known_identifier, issue_id=issue_id, workspaces=workspaces
        ),
        "attempts": _attempts(lanes, trail=trail),
        **lanes,
        "last_agent": _last_agent(running, agent_updates),
        "agent_updates": agent_updates,
        "tokens": _tokens(running, history=history, trail=trail).to_dict(),
        "recent_events": events,
        "run_history": history,
        "last_error": _last_error(lanes, history=history, trail=trail),
    }


def _resolve(
    snapshot: Mapping[str, Any], wanted: str, trail: IssueTrail | None
) -> tuple[str | None, str | None]:
    """``(issue_id, identifier)`` for an identifier or id, looking everywhere the state holds."""
    if trail is not None:
        return trail.issue_id, trail.identifier
    folded = wanted.casefold()
    rows = [row for lane in LANES for row in snapshot.get(lane, ())]
    rows += list(snapshot.get("run_history", ()))
    rows += list(snapshot.get("recent_events", ()))
    for matches in (
        lambda row: row.get("identifier") == wanted,
        lambda row: row.get("issue_id") == wanted,
        lambda row: str(row.get("identifier") or "").casefold() == folded,
    ):
        for row in rows:
            if matches(row) and row.get("issue_id") and row.get("identifier"):
                return str(row["issue_id"]), str(row["identifier"])
    return None, None


def _workspace(
    lanes: Mapping[str, list[dict[str, Any]]],
    *,
    identifier: str,
    issue_id: str,
    workspaces: WorkspaceManager | None,
) -> dict[str, Any]:
    for lane in ("running", "retrying"):
        for row in lanes[lane]:
            if row.get("workspace_path"):
                return {"path": row["workspace_path"], "recorded": True}
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
    lanes: Mapping[str, list[dict[str, Any]]], *, trail: IssueTrail | None
) -> dict[str, Any]:
    attempts = [
        row["attempt"]
        for lane in ("running", "reserving", "retrying")
        for row in lanes[lane]
        if isinstance(row.get("attempt"), int)
    ]
    current = max(attempts) if attempts else None
    return {
        "current_retry_attempt": current,
        "restart_count": max((current or 0) - 1, 0),
        "runs_started": trail.runs_started if trail is not None else None,
    }


def _last_agent(
    running: list[dict[str, Any]], agent_updates: list[dict[str, Any]]
) -> dict[str, Any] | None:
    latest = max(
        (row for row in running if row.get("last_agent_at")),
        key=lambda row: str(row["last_agent_at"]),
        default=None,
    )
    if latest is not None:
        return {
            "slot_key": latest["slot_key"],
            "event": latest.get("last_agent_event"),
            "message": latest.get("last_agent_message"),
            "at": latest["last_agent_at"],
        }
    if agent_updates:
        update = agent_updates[0]
        return {key: update.get(key) for key in ("slot_key", "event", "message", "at")}
    return None


def _usage_of(rows: Iterable[Mapping[str, Any]]) -> TokenUsage:
    total = TokenUsage()
    for row in rows:
        usage = row.get("usage") or {}
        total = total + TokenUsage(
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            total_tokens=int(usage.get("total_tokens", 0)),
        )
    return total


def _tokens(
    running: list[dict[str, Any]],
    *,
    history: list[dict[str, Any]],
    trail: IssueTrail | None,
) -> TokenUsage:
    """Live runs from the lanes, ended runs from the journal (or the bounded history)."""
    finished = trail.finished_usage if trail is not None else _usage_of(history)
    return _usage_of(running) + finished


def _last_error(
    lanes: Mapping[str, list[dict[str, Any]]],
    *,
    history: list[dict[str, Any]],
    trail: IssueTrail | None,
) -> str | None:
    for row in lanes["retrying"] + lanes["blocked"]:
        if row.get("error"):
            return str(row["error"])
    if trail is not None and trail.last_error:
        return trail.last_error
    return next((str(entry["error"]) for entry in history if entry.get("error")), None)
