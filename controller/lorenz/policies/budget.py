"""Spend control as pure decisions: what a usage update costs, and whether a cap is reached.

The runtime meters every usage update of a run (:func:`usage_delta` between the agent's running
totals), prices it (:func:`price_delta`: the agent's own ``cost_usd`` wins over the price
table), adds it to the run's, the issue's and the UTC day's totals (:meth:`SpendTotals.add`), and
asks :func:`check_caps` whether to go on, warn, or stop the run. Before a dispatch it asks
:func:`admit`. Nothing here does I/O or reads a clock: the caller passes ``now`` and the totals
(the durable ones come from the claim store's spend ledger), so every rule is testable alone.

Caps of ``0`` are off. A cap is *reached* when the spend is at or above it (``>=``): a run that
hits its cap exactly is stopped, and an issue whose spend equals its cap is not dispatched.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math

from lorenz.config.pricing import ModelPrice
from lorenz.config.settings import BudgetSettings

TOKENS_PER_PRICE_UNIT = 1_000_000
"""Prices are USD per million tokens."""


class CapName(enum.StrEnum):
    """The caps of ``budget`` (the setting's name without ``max_``)."""

    TOKENS_PER_RUN = "tokens_per_run"
    TOKENS_PER_ISSUE = "tokens_per_issue"
    USD_PER_ISSUE = "usd_per_issue"
    USD_PER_DAY = "usd_per_day"

    @property
    def setting(self) -> str:
        """The key path of the cap's setting (``budget.max_usd_per_day``)."""
        return f"budget.max_{self.value}"


class BudgetStatus(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    """At or above ``warn_at`` of a cap, below the cap."""
    EXHAUSTED = "exhausted"
    """At or above a cap."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UsageSnapshot:
    """An agent's running totals for one session, as its last usage update gave them."""

    input_tokens: int = 0
    """Prompt tokens, cached ones included."""
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those read from the provider's prompt cache."""
    output_tokens: int = 0
    cost_usd: float | None = None
    """The agent's own running cost, when it reports one."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UsageDelta:
    """What one usage update adds."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    """The agent's own cost of this delta; wins over the price table."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def usage_delta(previous: UsageSnapshot, current: UsageSnapshot) -> UsageDelta:
    """What ``current`` adds over ``previous``: never negative (a counter that went down, as
    after an agent restart of its session, adds nothing until it passes the old figure)."""
    cost: float | None = None
    if current.cost_usd is not None:
        cost = max(current.cost_usd - (previous.cost_usd or 0.0), 0.0)
    new_input = max(current.input_tokens - previous.input_tokens, 0)
    return UsageDelta(
        input_tokens=new_input,
        cached_input_tokens=min(
            max(current.cached_input_tokens - previous.cached_input_tokens, 0), new_input
        ),
        output_tokens=max(current.output_tokens - previous.output_tokens, 0),
        cost_usd=cost,
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PricedDelta:
    """A usage delta in tokens and USD."""

    tokens: int
    usd: float
    priced: bool
    """``False``: the model has no price and the agent gave no cost; ``usd`` is then 0 and the
    tokens still count against token caps."""


def price_delta(delta: UsageDelta, *, price: ModelPrice | None) -> PricedDelta:
    """Price ``delta``: the agent's own ``cost_usd`` wins, else ``price`` (USD per million)."""
    if delta.cost_usd is not None and math.isfinite(delta.cost_usd):
        return PricedDelta(tokens=delta.tokens, usd=max(delta.cost_usd, 0.0), priced=True)
    if price is None:
        return PricedDelta(tokens=delta.tokens, usd=0.0, priced=False)
    cached = min(delta.cached_input_tokens, delta.input_tokens)
    usd = (
        (delta.input_tokens - cached) * price.input
        + cached * price.cached_input
        + delta.output_tokens * price.output
    ) / TOKENS_PER_PRICE_UNIT
    return PricedDelta(tokens=delta.tokens, usd=usd, priced=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Spend:
    """Tokens and USD spent by one run, one issue or one day."""

    tokens: int = 0
    usd: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(tokens=self.tokens + other.tokens, usd=self.usd + other.usd)

    def plus(self, priced: PricedDelta) -> Spend:
        return Spend(tokens=self.tokens + priced.tokens, usd=self.usd + priced.usd)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpendTotals:
    """The three totals one usage update counts against."""

    run: Spend = Spend()
    issue: Spend = Spend()
    day: Spend = Spend()

    def add(self, priced: PricedDelta) -> SpendTotals:
        return SpendTotals(
            run=self.run.plus(priced), issue=self.issue.plus(priced), day=self.day.plus(priced)
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CapCheck:
    """One cap against its spend."""

    cap: CapName
    limit: float
    spent: float
    status: BudgetStatus

    @property
    def share(self) -> float:
        return self.spent / self.limit


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BudgetVerdict:
    """The worst status over every set cap, and the cap that decided it."""

    status: BudgetStatus
    cap: CapName | None = None
    """The cap with the highest share spent among those at the verdict's status."""
    checks: tuple[CapCheck, ...] = ()
    """Every set cap, in :class:`CapName` order."""


_SEVERITY = {BudgetStatus.OK: 0, BudgetStatus.WARN: 1, BudgetStatus.EXHAUSTED: 2}


def _status(spent: float, limit: float, *, warn_at: float) -> BudgetStatus:
    if spent >= limit:
        return BudgetStatus.EXHAUSTED
    if spent >= warn_at * limit:
        return BudgetStatus.WARN
    return BudgetStatus.OK


def _limits(settings: BudgetSettings) -> tuple[tuple[CapName, float], ...]:
    return (
        (CapName.TOKENS_PER_RUN, float(settings.max_tokens_per_run)),
        (CapName.TOKENS_PER_ISSUE, float(settings.max_tokens_per_issue)),
        (CapName.USD_PER_ISSUE, float(settings.max_usd_per_issue)),
        (CapName.USD_PER_DAY, float(settings.max_usd_per_day)),
    )


def _spent(cap: CapName, totals: SpendTotals) -> float:
    if cap is CapName.TOKENS_PER_RUN:
        return float(totals.run.tokens)
    if cap is CapName.TOKENS_PER_ISSUE:
        return float(totals.issue.tokens)
    if cap is CapName.USD_PER_ISSUE:
        return totals.issue.usd
    return totals.day.usd


def _verdict(checks: list[CapCheck]) -> BudgetVerdict:
    if not checks:
        return BudgetVerdict(status=BudgetStatus.OK)
    worst = max(checks, key=lambda check: (_SEVERITY[check.status], check.share))
    return BudgetVerdict(
        status=worst.status,
        cap=worst.cap if worst.status is not BudgetStatus.OK else None,
        checks=tuple(checks),
    )


def check_caps(totals: SpendTotals, *, settings: BudgetSettings) -> BudgetVerdict:
    """Every set cap against ``totals``: ``exhausted`` stops the run (``budget_exhausted``),
    ``warn`` is a ``budget_warning`` event."""
    checks = []
    for cap, limit in _limits(settings):
        if limit > 0:
            spent = _spent(cap, totals)
            checks.append(
                CapCheck(
                    cap=cap,
                    limit=limit,
                    spent=spent,
                    status=_status(spent, limit, warn_at=settings.warn_at),
                )
            )
    return _verdict(checks)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """Whether an issue may be dispatched, and if not which cap holds it back."""

    allowed: bool
    cap: CapName | None = None
    limit: float = 0.0
    spent: float = 0.0


def admit(*, issue: Spend, day: Spend, settings: BudgetSettings) -> Admission:
    """An issue whose spend reached one of its caps, or any issue while the day's budget is
    spent, is not dispatched (it waits in the ``budget`` lane until a cap is raised or the UTC
    day turns). The per-run cap plays no part: every run starts from zero."""
    totals = SpendTotals(issue=issue, day=day)
    for cap, limit in _limits(settings):
        if cap is CapName.TOKENS_PER_RUN or limit <= 0:
            continue
        spent = _spent(cap, totals)
        if spent >= limit:
            return Admission(allowed=False, cap=cap, limit=limit, spent=spent)
    return Admission(allowed=True)


def day_key(now: datetime.datetime) -> str:
    """The UTC day ``now`` falls in (``2026-12-07``): the key of the per-day ledger."""
    if now.tzinfo is None:
        raise ValueError("day_key needs an aware datetime (UTC days, never local ones)")
    return now.astimezone(datetime.UTC).date().isoformat()
