"""The operator's spend ledger: spend per issue and per UTC day in the Workflow's status.

Budgets must not reset because a leader died, so the totals live where a new leader reads its
state from: ``status.spend.ledger`` of the Workflow (the claim store's other half, beside
``status.checkpoint``). The leader keeps the ledger in memory (the same bounded book as the
memory store's, :class:`~lorenz.claims.memory.MemoryClaimStore`) and writes it whole, at most
once per :data:`SPEND_FLUSH_S` and at close: a usage update does not cost an API request.

What a failover may lose is the last flush interval's charges of a leader killed outright (a
graceful stop writes them). Lists rather than maps, so that a merge patch replaces the ledger
whole (pruned rows go with it). Bounded tighter than on a single host (an object's status is
not a database): :data:`KUBE_ISSUE_SPEND_KEPT` issues, :data:`KUBE_DAY_SPEND_KEPT` days.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from lorenz.claims.memory import MemoryClaimStore, MemoryClaimTable
from lorenz.claims.spend import IssueSpend, SpendTotal

SPEND_FLUSH_S: Final = 1.0
"""At most one ledger write per this many seconds."""
KUBE_ISSUE_SPEND_KEPT: Final = 500
"""Issues whose spend a Workflow's status keeps (the most recently charged)."""
KUBE_DAY_SPEND_KEPT: Final = 31
"""UTC days whose spend a Workflow's status keeps."""
MAX_TEXT: Final = 256
"""Longest identifier or day kept from a stored ledger (it is outside input on load)."""


def spend_book(ledger: object) -> MemoryClaimStore:
    """A memory ledger filled from a stored ``status.spend.ledger`` (malformed rows skipped)."""
    table = MemoryClaimTable()
    if isinstance(ledger, Mapping):
        issues = ledger.get("issues")
        if isinstance(issues, list):
            rows = [row for row in (_issue_row(item) for item in issues) if row is not None]
            rows.sort(key=lambda row: row.updated_at_ms)
            for row in rows[-KUBE_ISSUE_SPEND_KEPT:]:
                table.issue_spend[row.issue_id] = row
        days = ledger.get("days")
        if isinstance(days, list):
            for item in days[-KUBE_DAY_SPEND_KEPT * 2 :]:
                parsed = _day_row(item)
                if parsed is not None:
                    table.day_spend[parsed[0]] = parsed[1]
    return MemoryClaimStore(
        table=table,
        issue_spend_kept=KUBE_ISSUE_SPEND_KEPT,
        day_spend_kept=KUBE_DAY_SPEND_KEPT,
    )


def ledger_document(book: MemoryClaimStore) -> dict[str, Any]:
    """The ledger as stored in ``status.spend.ledger`` (issues in charge order)."""
    table = book.table
    return {
        "days": [
            {"day": day, "tokens": total.tokens, "usd": total.usd}
            for day, total in sorted(table.day_spend.items())
        ],
        "issues": [
            {
                "id": row.issue_id,
                "identifier": row.identifier,
                "tokens": row.total.tokens,
                "usd": row.total.usd,
                "at": row.updated_at_ms,
            }
            for row in table.issue_spend.values()
        ],
    }


def _amounts(item: Mapping[str, Any]) -> SpendTotal | None:
    tokens, usd = item.get("tokens"), item.get("usd")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return None
    if isinstance(usd, bool) or not isinstance(usd, int | float) or not math.isfinite(usd):
        return None
    if usd < 0:
        return None
    return SpendTotal(tokens=tokens, usd=float(usd))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_TEXT else None


def _issue_row(item: object) -> IssueSpend | None:
    if not isinstance(item, Mapping):
        return None
    issue_id, identifier = _text(item.get("id")), _text(item.get("identifier"))
    total = _amounts(item)
    at = item.get("at")
    if issue_id is None or identifier is None or total is None:
        return None
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        at = 0.0
    return IssueSpend(issue_id=issue_id, identifier=identifier, total=total, updated_at_ms=at)


def _day_row(item: object) -> tuple[str, SpendTotal] | None:
    if not isinstance(item, Mapping):
        return None
    day, total = _text(item.get("day")), _amounts(item)
    if day is None or total is None:
        return None
    return day, total
