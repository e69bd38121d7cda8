"""Spend control in the run loop: meter every usage update, stop a run at a cap, hold issues back.

The rules are pure (:mod:`lorenz.policies.budget`) and the totals durable (the claim store's
spend ledger, :mod:`lorenz.claims.spend`); this module is the I/O between them and the runs:

- :class:`RunMeter` (one per run) turns each agent update into a priced delta, charges it, and
  asks :func:`~lorenz.policies.budget.check_caps` about the run's, the issue's and the day's
  totals, *synchronously in the runner's update callback*: a cap crossed by an update stops the
  run (``TurnStop.request``) before the next update is read, so the overshoot is at most that
  one update. ``budget_warning`` is emitted once per run and cap, ``budget_exhausted`` once.
- :class:`Spending` (one per runtime) keeps the issue and day totals as the ledger last
  answered plus the charges not written yet, writes charges one at a time in order (so each
  answer contains every earlier charge of this process, and those of every other process using
  the store), and decides admission (:meth:`Spending.holds`): an issue at its cap, or any issue
  while the day's budget is spent, is not dispatched and waits in the ``budget`` lane.

NB: the ledger is the truth across restarts: totals are read from it before a run starts and
before a dispatch, never kept only here. A process killed with ``kill -9`` loses at most the
charges it had not written yet (one update's worth in practice). A write the store refuses is
not lost: its charge is kept and written with the next one (or the next load, or flush).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Collection
from typing import Unpack

from lorenz.agents.base import MODEL_EVENT, TurnStop
from lorenz.claims.memory import MemoryClaimStore
from lorenz.claims.spend import SpendLedger, SpendTotal
from lorenz.codes import ErrorCode
from lorenz.config import WorkflowSettings
from lorenz.config.pricing import MODEL_UNPRICED
from lorenz.config.settings import command_model
from lorenz.model import AgentUpdate, Clock, EventDetails, EventType, Issue, SlotKey
from lorenz.model.spending import (
    BudgetHoldRow,
    BudgetSnapshot,
    IssueSpendRow,
    RunSpendRow,
    SpendFigures,
)
from lorenz.policies.budget import (
    BudgetStatus,
    BudgetVerdict,
    CapName,
    Spend,
    SpendTotals,
    UsageDelta,
    UsageSnapshot,
    admit,
    check_caps,
    day_key,
    price_delta,
    usage_delta,
)
from lorenz.runtime.reporting import Reporting

logger = logging.getLogger("lorenz.runtime")

ISSUES_SHOWN = 50
"""Issues whose spend the snapshot lists (the highest first)."""
ISSUES_KNOWN = 10_000
"""Issues whose totals this process keeps in memory (the least recently read are dropped)."""


def _spend(total: SpendTotal) -> Spend:
    return Spend(tokens=total.tokens, usd=total.usd)


def _figures(spend: Spend) -> SpendFigures:
    return SpendFigures(tokens=spend.tokens, usd=spend.usd)


def _cap_text(cap: CapName, *, spent: float, limit: float) -> str:
    if cap in (CapName.TOKENS_PER_RUN, CapName.TOKENS_PER_ISSUE):
        return f"{cap.setting} {int(limit)} tokens, spent {int(spent)}"
    return f"{cap.setting} {limit:g} USD, spent {spent:.4f}"


class Spending:
    """The runtime's spend totals, ledger writes, meters and ``budget`` lane (module docstring)."""

    def __init__(
        self,
        *,
        reporting: Reporting,
        clock: Clock,
        settings: Callable[[], WorkflowSettings],
        ledger: SpendLedger | None,
    ) -> None:
        self._reporting = reporting
        self._clock = clock
        self._settings = settings
        self._ledger: SpendLedger = ledger if ledger is not None else MemoryClaimStore()
        self._lock = asyncio.Lock()
        """Serializes ledger writes and reads, so answers come in charge order."""
        self._issue_confirmed: dict[str, Spend] = {}
        self._issue_pending: dict[str, Spend] = {}
        self._identifiers: dict[str, str] = {}
        self._day_confirmed: dict[str, Spend] = {}
        self._day_pending: dict[str, Spend] = {}
        self._writes: set[asyncio.Task[None]] = set()
        self._unsaved: dict[tuple[str, str], tuple[str, Spend]] = {}
        """Charges not stored yet, by (issue id, day): the identifier and the sum. A write
        that fails leaves its charge here, and the next write (or load, or flush) takes it."""
        self._meters: dict[SlotKey, RunMeter] = {}
        self._held: dict[str, BudgetHoldRow] = {}
        self.charged_usd = 0.0
        """USD this process charged so far (``lorenz_spend_usd_total``)."""
        self.charged_tokens = 0

    @property
    def ledger(self) -> SpendLedger:
        return self._ledger

    # -- totals ---------------------------------------------------------------------------------

    def today(self) -> str:
        return day_key(self._clock.now())

    def issue_total(self, issue_id: str) -> Spend:
        """The issue's total as last read or answered, plus charges not written yet."""
        return self._issue_confirmed.get(issue_id, Spend()) + self._issue_pending.get(
            issue_id, Spend()
        )

    def day_total(self, day: str | None = None) -> Spend:
        day = day or self.today()
        return self._day_confirmed.get(day, Spend()) + self._day_pending.get(day, Spend())

    async def load(self, issue: Issue) -> None:
        """Read the issue's and today's totals from the ledger (the truth across restarts)."""
        day = self.today()
        async with self._lock:
            if self._unsaved:  # NB: first, so the totals read include them
                await self._write_unsaved()
            try:
                issue_total = await self._ledger.issue_spend(issue.id)
                day_total = await self._ledger.day_spend(day)
            except Exception:  # what is known here still counts
                logger.exception("reading the spend ledger failed issue=%s", issue.identifier)
                return
            self._identifiers[issue.id] = issue.identifier
            self._issue_confirmed.pop(issue.id, None)  # NB: re-inserted last: the newest
            self._issue_confirmed[issue.id] = _spend(issue_total)
            self._day_confirmed[day] = _spend(day_total)
            self._bound()

    def _bound(self) -> None:
        """Keep the issues known here bounded (the ledger keeps them all; a dropped one is
        read again before its next run or dispatch)."""
        while len(self._issue_confirmed) > ISSUES_KNOWN:
            oldest = next(iter(self._issue_confirmed))
            del self._issue_confirmed[oldest]
            if oldest not in self._issue_pending:
                self._identifiers.pop(oldest, None)
        for day in [d for d in self._day_confirmed if d != self.today()][:-7]:
            self._day_confirmed.pop(day, None)

    def charge(self, *, issue_id: str, identifier: str, tokens: int, usd: float) -> None:
        """Count one priced delta now (the totals include it at once) and write it to the
        ledger in the background, after every earlier charge."""
        if tokens <= 0 and usd <= 0:
            return
        day = self.today()
        delta = Spend(tokens=max(tokens, 0), usd=max(usd, 0.0))
        self.charged_usd += delta.usd
        self.charged_tokens += delta.tokens
        self._identifiers[issue_id] = identifier
        self._issue_pending[issue_id] = self._issue_pending.get(issue_id, Spend()) + delta
        self._day_pending[day] = self._day_pending.get(day, Spend()) + delta
        task = asyncio.get_running_loop().create_task(
            self._write(issue_id=issue_id, identifier=identifier, day=day, delta=delta),
            name=f"lorenz-spend:{identifier}",
        )
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, *, issue_id: str, identifier: str, day: str, delta: Spend) -> None:
        async with self._lock:
            key = (issue_id, day)
            earlier = self._unsaved.pop(key, None)
            self._unsaved[key] = (identifier, delta + earlier[1] if earlier else delta)
            wrote = await self._write_unsaved()
        if wrote:
            self._reporting.emit_snapshot(progress_only=True)

    async def _write_unsaved(self) -> bool:
        """Write every charge not written yet, oldest first (the caller holds the lock); one
        that fails stays to go with the next write. Whether anything was written."""
        wrote = False
        for key, (identifier, delta) in list(self._unsaved.items()):
            issue_id, day = key
            try:
                answer = await self._ledger.add_spend(
                    issue_id=issue_id,
                    identifier=identifier,
                    day=day,
                    tokens=delta.tokens,
                    usd=delta.usd,
                )
            except Exception:  # kept: it counts here, and goes with the next write
                logger.exception(
                    "writing a spend charge failed issue=%s; it is tried again with the next "
                    "update", identifier,
                )
                return wrote  # NB: the store is failing: the rest waits too (and keeps order)
            del self._unsaved[key]
            wrote = True
            self._issue_pending[issue_id] = _minus(self._issue_pending.get(issue_id), delta)
            self._day_pending[day] = _minus(self._day_pending.get(day), delta)
            self._issue_confirmed[issue_id] = _spend(answer.issue)
            self._day_confirmed[day] = _spend(answer.day)
        return wrote

    async def flush(self) -> None:
        """Wait until every charge made so far is written (a graceful stop, tests); charges
        an earlier write failed to store are tried once more."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
        if self._unsaved:
            async with self._lock:
                await self._write_unsaved()

    @property
    def unsaved(self) -> Spend:
        """Charges counted here that the ledger has not stored yet (a failed write)."""
        total = Spend()
        for _, delta in self._unsaved.values():
            total = total + delta
        return total

    # -- runs -----------------------------------------------------------------------------------

    def meter(
        self, *, key: SlotKey, slot_index: int, issue: Issue, command: str, stop: TurnStop
    ) -> RunMeter:
        """The meter of one run (its ``on_update`` must call :meth:`RunMeter.observe` first)."""
        meter = RunMeter(
            spending=self, key=key, slot_index=slot_index, issue=issue,
            configured_model=command_model(command), stop=stop,
        )
        self._meters[key] = meter
        return meter

    def forget(self, meter: RunMeter) -> None:
        """The run ended: drop its meter, and say what it spent (``run_spend``, while a cap
        is set)."""
        if self._meters.get(meter.key) is meter:
            del self._meters[meter.key]
        if self._settings().budget.caps_any and (meter.run.tokens or meter.run.usd):
            issue = meter.issue
            total = self.issue_total(issue.id)
            self._reporting.event(
                EventType.RUN_SPEND,
                issue=issue,
                slot=meter.slot_index,
                message=f"run spent {meter.run.tokens} tokens, {meter.run.usd:.4f} USD "
                f"(issue {total.usd:.4f} USD, model {meter.model or 'unknown'})",
                tokens=meter.run.tokens,
                usd=round(meter.run.usd, 6),
            )

    # -- admission ------------------------------------------------------------------------------

    def is_held(self, issue_id: str) -> bool:
        return issue_id in self._held

    async def holds(self, issue: Issue, *, slot: int) -> bool:
        """Whether ``issue`` must not be dispatched now (a cap of it, or of the day, reached):
        it goes to (or stays in) the ``budget`` lane; an issue admitted again leaves it."""
        budget = self._settings().budget
        if not (budget.max_tokens_per_issue or budget.max_usd_per_issue or budget.max_usd_per_day):
            self._held.pop(issue.id, None)
            return False
        await self.load(issue)
        verdict = admit(
            issue=self.issue_total(issue.id), day=self.day_total(), settings=budget
        )
        if verdict.allowed or verdict.cap is None:
            if self._held.pop(issue.id, None) is not None:
                self._reporting.emit_snapshot()
            return False
        previous = self._held.get(issue.id)
        row = BudgetHoldRow(
            issue_id=issue.id,
            identifier=issue.identifier,
            cap=verdict.cap.value,
            limit=verdict.limit,
            spent=verdict.spent,
            held_at=previous.held_at if previous is not None else self._clock.now(),
        )
        self._held[issue.id] = row
        if previous is None or (previous.cap, previous.limit) != (row.cap, row.limit):
            self._reporting.event(
                EventType.BUDGET_HELD,
                issue=issue,
                slot=slot,
                message="not dispatched: "
                + _cap_text(verdict.cap, spent=verdict.spent, limit=verdict.limit)
                + "; raise the cap (reload) or wait for the UTC day to turn",
                reason=verdict.cap.value,
                code=ErrorCode.BUDGET_EXHAUSTED,
            )
        return True

    # -- the snapshot ---------------------------------------------------------------------------

    def snapshot(self, *, candidates: Collection[str]) -> BudgetSnapshot | None:
        """The ``budget`` part of the runtime's snapshot; ``None`` while no cap is set (the
        state document then keeps its shape). The lane keeps only issues still among
        ``candidates``."""
        budget = self._settings().budget
        day = self.today()
        day_total = self.day_total(day)
        for issue_id in [i for i in self._held if i not in candidates]:
            del self._held[issue_id]
        issue_ids = {
            issue_id
            for issue_id in set(self._issue_confirmed) | set(self._issue_pending)
            if self.issue_total(issue_id).tokens or self.issue_total(issue_id).usd
        }
        if not budget.caps_any:
            self._held.clear()
            return None
        issues = sorted(
            (
                IssueSpendRow(
                    issue_id=issue_id,
                    identifier=self._identifiers.get(issue_id, issue_id),
                    spend=_figures(self.issue_total(issue_id)),
                )
                for issue_id in issue_ids
            ),
            key=lambda row: (-row.spend.usd, -row.spend.tokens, row.identifier),
        )[:ISSUES_SHOWN]
        return BudgetSnapshot(
            day=day,
            day_spend=_figures(day_total),
            max_usd_per_day=budget.max_usd_per_day,
            held=tuple(sorted(self._held.values(), key=lambda row: row.held_at)),
            runs=tuple(meter.row() for meter in self._meters.values()),
            issues=tuple(issues),
        )

    # -- for meters -----------------------------------------------------------------------------

    def settings(self) -> WorkflowSettings:
        return self._settings()

    def event(
        self,
        kind: EventType,
        *,
        issue: Issue,
        slot: int,
        message: str,
        **details: Unpack[EventDetails],
    ) -> None:
        self._reporting.event(kind, issue=issue, slot=slot, message=message, **details)


def _minus(total: Spend | None, delta: Spend) -> Spend:
    total = total or Spend()
    return Spend(tokens=max(total.tokens - delta.tokens, 0), usd=max(total.usd - delta.usd, 0.0))


class RunMeter:
    """Meters one run: its agent's running totals to priced deltas, charged and checked.

    Tokens are priced with the price table as they arrive; when the agent reports its own
    cost (Claude Code's ``total_cost_usd`` at a turn's end, ACP's ``usage_update.cost``, a
    ``command`` agent's ``cost_usd``), the run's dollar spend is brought up to that cost: the
    table's estimate of the tokens since the last cost report is provisional (a cost below the
    estimate charges nothing more until the cost passes what was charged).
    """

    def __init__(
        self,
        *,
        spending: Spending,
        key: SlotKey,
        slot_index: int,
        issue: Issue,
        configured_model: str | None,
        stop: TurnStop,
    ) -> None:
        self.key = key
        self.slot_index = slot_index
        self.issue = issue
        self._spending = spending
        self._stop = stop
        self._configured_model = configured_model
        self._reported_model: str | None = None
        self._session: str | None = None
        self._rebase_tokens = False
        self._rebase_cost = False
        self._last = UsageSnapshot()
        self._cost_seen = 0.0
        """The agent's own cost, summed over its sessions."""
        self._cost_reported = False
        self._charged_usd = 0.0
        self.run = Spend()
        self._warned: set[CapName] = set()
        self._unpriced_said = False
        self._replaying = False
        self.verdict = BudgetVerdict(status=BudgetStatus.OK)

    @property
    def model(self) -> str | None:
        return self._reported_model or self._configured_model

    def row(self) -> RunSpendRow:
        return RunSpendRow(
            slot_key=str(self.key),
            issue_id=self.issue.id,
            identifier=self.issue.identifier,
            spend=_figures(self.run),
            model=self.model,
        )

    def replayed(self, update: AgentUpdate) -> None:
        """Take in an update an earlier controller of this run already charged (an adopted
        run's journal): the run's totals and the session's counters move, nothing is charged
        again, no cap is checked; never raises."""
        self._replaying = True
        try:
            self._observe(update)
        except Exception:
            logger.exception("replaying an agent update failed slot=%s", self.key)
        finally:
            self._replaying = False

    def observe(self, update: AgentUpdate) -> None:
        """Meter one update; never raises (it runs in the runner's update callback)."""
        try:
            self._observe(update)
        except Exception:
            logger.exception("metering an agent update failed slot=%s", self.key)

    def _observe(self, update: AgentUpdate) -> None:
        payload = update.payload or {}
        if update.event == MODEL_EVENT:
            model = payload.get("model")
            if isinstance(model, str) and model:
                self._reported_model = model[:200]
        if update.session_id and update.session_id != self._session:
            if self._session is not None:
                self._rebase_tokens = self._rebase_cost = True
            self._session = update.session_id
        if update.usage is None and update.cost_usd is None:
            return
        previous = self._last
        cached = payload.get("cached_input_tokens")
        current = UsageSnapshot(
            input_tokens=update.usage.input_tokens if update.usage else previous.input_tokens,
            cached_input_tokens=(
                cached
                if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0
                else previous.cached_input_tokens
            ),
            output_tokens=update.usage.output_tokens if update.usage else previous.output_tokens,
            cost_usd=(
                update.cost_usd
                if update.cost_usd is not None and math.isfinite(update.cost_usd)
                else previous.cost_usd
            ),
        )
        if update.usage is not None and self._rebase_tokens:
            self._rebase_tokens = False
            if (
                current.input_tokens < previous.input_tokens
                or current.output_tokens < previous.output_tokens
            ):
                previous = dataclasses.replace(
                    previous, input_tokens=0, cached_input_tokens=0, output_tokens=0
                )
        if update.cost_usd is not None and self._rebase_cost:
            self._rebase_cost = False
            if (current.cost_usd or 0.0) < (previous.cost_usd or 0.0):
                previous = dataclasses.replace(previous, cost_usd=0.0)
        delta = usage_delta(previous, current)
        self._last = UsageSnapshot(
            input_tokens=max(previous.input_tokens, current.input_tokens),
            cached_input_tokens=max(previous.cached_input_tokens, current.cached_input_tokens),
            output_tokens=max(previous.output_tokens, current.output_tokens),
            cost_usd=max(previous.cost_usd or 0.0, current.cost_usd or 0.0)
            if current.cost_usd is not None
            else previous.cost_usd,
        )
        self._charge(delta, cost_in_update=update.cost_usd is not None)

    def _charge(self, delta: UsageDelta, *, cost_in_update: bool) -> None:
        settings = self._spending.settings()
        price = settings.price_table().price_for(self.model) if self.model else None
        by_table = price_delta(dataclasses.replace(delta, cost_usd=None), price=price)
        usd = by_table.usd
        if cost_in_update and delta.cost_usd is not None:
            self._cost_reported = True
            self._cost_seen += delta.cost_usd
            usd = max(self._cost_seen - self._charged_usd, 0.0)
        elif (
            not by_table.priced
            and delta.tokens
            and not self._cost_reported
            and settings.budget.caps_usd
            and not self._unpriced_said
        ):
            self._unpriced_said = True
            self._spending.event(
                EventType.BUDGET_WARNING,
                issue=self.issue,
                slot=self.slot_index,
                message=f"{MODEL_UNPRICED}: model {self.model or '(unknown)'} has no price and "
                "the agent reports no cost; add it under pricing (its tokens still count "
                "against token caps)",
                code=MODEL_UNPRICED,
            )
        if delta.tokens <= 0 and usd <= 0:
            return
        self._charged_usd += usd
        self.run = Spend(tokens=self.run.tokens + delta.tokens, usd=self.run.usd + usd)
        if self._replaying:
            return
        self._spending.charge(
            issue_id=self.issue.id,
            identifier=self.issue.identifier,
            tokens=delta.tokens,
            usd=usd,
        )
        self._check(settings)

    def _check(self, settings: WorkflowSettings) -> None:
        totals = SpendTotals(
            run=self.run,
            issue=self._spending.issue_total(self.issue.id),
            day=self._spending.day_total(),
        )
        verdict = check_caps(totals, settings=settings.budget)
        self.verdict = verdict
        for check in verdict.checks:
            if check.status is BudgetStatus.WARN and check.cap not in self._warned:
                self._warned.add(check.cap)
                self._spending.event(
                    EventType.BUDGET_WARNING,
                    issue=self.issue,
                    slot=self.slot_index,
                    message=f"{check.share:.0%} of "
                    + _cap_text(check.cap, spent=check.spent, limit=check.limit),
                    reason=check.cap.value,
                )
        if verdict.status is BudgetStatus.EXHAUSTED and not self._stop.requested:
            worst = next(c for c in verdict.checks if c.cap is verdict.cap)
            reason = "spend cap reached: " + _cap_text(
                worst.cap, spent=worst.spent, limit=worst.limit
            )
            self._stop.request(reason=reason)
            self._spending.event(
                EventType.BUDGET_EXHAUSTED,
                issue=self.issue,
                slot=self.slot_index,
                message=f"{reason}; stopping the run",
                reason=worst.cap.value,
                code=ErrorCode.BUDGET_EXHAUSTED,
            )
