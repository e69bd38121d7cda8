"""The spend ledger: tokens and USD per issue and per UTC day, kept beside the claims.

Budgets (``budget.max_*_per_issue``, ``budget.max_usd_per_day``) must never reset because a
process restarted or a replica died, so the totals live where the claims live: in the same
SQLite/Turso file (durable, shared by every process on the host) or, for the memory store, the
same process-lifetime table. This is a separate, small port (:class:`SpendLedger`) rather than
part of :class:`~lorenz.model.ClaimStore`: the run loop that meters usage is the only user.

Every :meth:`SpendLedger.add_spend` adds one usage delta to its issue's and its day's totals in
one transaction, so the two never disagree, and a process killed at any point leaves either
both additions or neither. Spend is a fact (money was spent), so these writes are *not* fenced:
a deposed leader's last usage update still counts.

Bounded: the ledger keeps the :data:`ISSUE_SPEND_KEPT` most recently charged issues (finished
ones included, so a reopened issue keeps its count) and the :data:`DAY_SPEND_KEPT` newest days;
older rows are pruned in the transaction that adds a new row.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, runtime_checkable

ISSUE_SPEND_KEPT = 10_000
"""Issues whose spend the ledger keeps; the least recently charged beyond this are pruned (a
pruned issue's per-issue count starts again from zero)."""
DAY_SPEND_KEPT = 400
"""UTC days whose spend the ledger keeps (a little over a year, for reports)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpendTotal:
    """Tokens and USD charged to one issue or one day."""

    tokens: int = 0
    usd: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpendCharge:
    """The totals right after one :meth:`SpendLedger.add_spend`."""

    issue: SpendTotal
    day: SpendTotal


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IssueSpend:
    """One row of the per-issue ledger."""

    issue_id: str
    identifier: str
    total: SpendTotal
    updated_at_ms: float
    """Wall-clock epoch milliseconds of the last charge (the pruning order)."""


def check_charge(*, tokens: int, usd: float) -> None:
    """Refuse a charge that would corrupt the ledger (a negative or non-finite amount)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"a spend charge needs tokens >= 0, got {tokens!r}")
    if not math.isfinite(usd) or usd < 0:
        raise ValueError(f"a spend charge needs a finite usd >= 0, got {usd!r}")


@runtime_checkable
class SpendLedger(Protocol):
    """Durable spend per issue and per UTC day (see the module docstring)."""

    async def add_spend(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        """Add one usage delta to the issue's and the day's totals, atomically; return both
        new totals. ``day`` is :func:`lorenz.policies.budget.day_key` of the update."""
        ...

    async def issue_spend(self, issue_id: str) -> SpendTotal:
        """The issue's total (zero when it never spent anything, or was pruned)."""
        ...

    async def day_spend(self, day: str) -> SpendTotal:
        """The day's total (zero when nothing was charged to it)."""
        ...

    async def issue_spends(self, *, limit: int = 100) -> list[IssueSpend]:
        """The most recently charged issues, newest first (for status views)."""
        ...
