"""The orchestrator's part of the runtime snapshot: lanes of rows, totals and rate limits.

Rows are frozen copies, taken at one instant, so a UI can serialize them while the state moves
on. ``to_dict()`` gives JSON-safe dicts: ISO-8601 wall-clock timestamps, and for deadlines both
the wall-clock time and the milliseconds from now (what a countdown wants).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from lorenz.model import TokenUsage, UsageTotals


def _iso(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclasses.dataclass(frozen=True, slots=True)
class RunningRow:
    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    state: str
    url: str | None
    host: str | None
    workspace_path: str | None
    session_id: str | None
    agent_pid: int | None
    attempt: int | None
    retry_kind: str | None
    turn_count: int
    last_agent_event: str | None
    last_agent_message: str | None
    last_agent_at: datetime.datetime | None
    started_at: datetime.datetime
    runtime_seconds: float
    usage: TokenUsage
    cost_usd: float
    title: str | None = None
    """The issue title, for the dashboard and terminal view (tracker text: escape it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "title": self.title,
            "slot_index": self.slot_index,
            "state": self.state,
            "url": self.url,
            "host": self.host,
            "workspace_path": self.workspace_path,
            "session_id": self.session_id,
            "agent_pid": self.agent_pid,
            "attempt": self.attempt,
            "retry_kind": self.retry_kind,
            "turn_count": self.turn_count,
            "last_agent_event": self.last_agent_event,
            "last_agent_message": self.last_agent_message,
            "last_agent_at": _iso(self.last_agent_at),
            "started_at": _iso(self.started_at),
            "runtime_seconds": self.runtime_seconds,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost_usd,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class ReservingRow:
    """A slot waiting for a worker host: host-less by design, shown in its own lane."""

    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    state: str
    attempt: int | None
    reserved_at: datetime.datetime
    expires_at: datetime.datetime
    expires_in_ms: float
    title: str | None = None
    """The issue title (tracker text: escape it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "title": self.title,
            "slot_index": self.slot_index,
            "state": self.state,
            "attempt": self.attempt,
            "reserved_at": _iso(self.reserved_at),
            "expires_at": _iso(self.expires_at),
            "expires_in_ms": self.expires_in_ms,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RetryRow:
    slot_key: str
    issue_id: str
    identifier: str
    slot_index: int
    attempt: int
    kind: str
    due_at: datetime.datetime
    due_in_ms: float
    """Milliseconds until the retry is due; ``0`` once it is (never negative)."""
    error: str | None
    host: str | None
    workspace_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "slot_index": self.slot_index,
            "attempt": self.attempt,
            "kind": self.kind,
            "due_at": _iso(self.due_at),
            "due_in_ms": self.due_in_ms,
            "error": self.error,
            "host": self.host,
            "workspace_path": self.workspace_path,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class BlockedRow:
    """A slot waiting for operator input. Not produced by this version; see state.py."""

    slot_key: str
    issue_id: str
    identifier: str
    error: str | None
    blocked_at: datetime.datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "identifier": self.identifier,
            "error": self.error,
            "blocked_at": _iso(self.blocked_at),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class OrchestratorSnapshot:
    """The scheduling lanes at one instant, plus usage and rate limits."""

    generated_at: datetime.datetime
    running: tuple[RunningRow, ...]
    reserving: tuple[ReservingRow, ...]
    retrying: tuple[RetryRow, ...]
    blocked: tuple[BlockedRow, ...]
    usage_totals: UsageTotals
    """Ended runs plus the usage and elapsed time of the runs still going."""
    rate_limits: Mapping[str, Any] | None
    claimed_elsewhere: tuple[str, ...] = ()
    """Slot keys other live owners hold (durable stores only)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "generated_at": _iso(self.generated_at),
            "running": [row.to_dict() for row in self.running],
            "reserving": [row.to_dict() for row in self.reserving],
            "retrying": [row.to_dict() for row in self.retrying],
            "blocked": [row.to_dict() for row in self.blocked],
            "usage_totals": self.usage_totals.to_dict(),
            "rate_limits": dict(self.rate_limits) if self.rate_limits is not None else None,
            "claimed_elsewhere": list(self.claimed_elsewhere),
        }
