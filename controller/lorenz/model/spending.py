"""What spend control shows: the day's spend against its cap, spend per run and per issue, and
the ``budget`` lane of issues held back at a cap.

Part of :class:`~lorenz.model.snapshots.RuntimeSnapshot` (``budget`` in ``GET /api/v1/state``),
read by ``lorenz status``, the dashboard, the terminal view, metrics and the operator's Workflow
status. Built by the runtime's spend meter (:mod:`lorenz.runtime.spending`) from the durable
ledger's totals (:mod:`lorenz.claims.spend`).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from lorenz.model.clocks import iso_or_none


@dataclasses.dataclass(frozen=True, slots=True)
class SpendFigures:
    """Tokens and USD."""

    tokens: int = 0
    usd: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "usd": round(self.usd, 6)}


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetHoldRow:
    """An issue not dispatched because a cap is reached (the ``budget`` lane)."""

    issue_id: str
    identifier: str
    cap: str
    """The cap that holds it (``usd_per_issue``, ``tokens_per_issue``, ``usd_per_day``)."""
    limit: float
    spent: float
    held_at: datetime.datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_id": self.issue_id,
            "issue_identifier": self.identifier,
            "cap": self.cap,
            "limit": self.limit,
            "spent": round(self.spent, 6),
            "held_at": iso_or_none(self.held_at),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class RunSpendRow:
    """What one run in flight has spent so far."""

    slot_key: str
    issue_id: str
    identifier: str
    spend: SpendFigures
    model: str | None
    """The model priced (reported by the agent, else the configured one)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot_key": self.slot_key,
            "issue_id": self.issue_id,
            "issue_identifier": self.identifier,
            **self.spend.to_dict(),
            "model": self.model,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class IssueSpendRow:
    """An issue's spend over all its runs (the durable ledger's total)."""

    issue_id: str
    identifier: str
    spend: SpendFigures

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_id": self.issue_id,
            "issue_identifier": self.identifier,
            **self.spend.to_dict(),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    """Spend control at one instant."""

    day: str
    """The UTC day counted (``2026-12-07``)."""
    day_spend: SpendFigures
    max_usd_per_day: float
    """``0``: no daily cap."""
    held: tuple[BudgetHoldRow, ...] = ()
    """The ``budget`` lane: issues held back at a cap, oldest first."""
    runs: tuple[RunSpendRow, ...] = ()
    issues: tuple[IssueSpendRow, ...] = ()
    """Issues this process knows the spend of (charged or checked), highest spend first."""

    @property
    def remaining_usd(self) -> float | None:
        """What the day's cap leaves (never negative); ``None`` without a daily cap."""
        if self.max_usd_per_day <= 0:
            return None
        return max(self.max_usd_per_day - self.day_spend.usd, 0.0)

    def to_dict(self) -> dict[str, Any]:
        remaining = self.remaining_usd
        return {
            "day": self.day,
            "day_spend": self.day_spend.to_dict(),
            "max_usd_per_day": self.max_usd_per_day,
            "remaining_usd": round(remaining, 6) if remaining is not None else None,
            "held": [row.to_dict() for row in self.held],
            "runs": [row.to_dict() for row in self.runs],
            "issues": [row.to_dict() for row in self.issues],
        }
