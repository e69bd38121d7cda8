"""The run meter's arithmetic, update by update: running totals to priced charges, the agent's
own cost over the table's estimate, a new session's counters, the warning and the stop."""

from __future__ import annotations

import asyncio
import datetime
import sqlite3
from pathlib import Path
from typing import Any

from lorenz.agents.base import MODEL_EVENT, TurnStop
from lorenz.claims.spend import SpendCharge
from lorenz.claims.sqlite import SqliteClaimStore
from lorenz.model import AgentUpdate, Issue, ManualClock, RuntimeEvent, TokenUsage, slot_key
from lorenz.runtime.providers import InForce
from lorenz.runtime.reporting import Reporting
from lorenz.runtime.spending import RunMeter, Spending
from lorenz.workflow import load_workflow

ISSUE = Issue(id="id-1", identifier="T-1", title="t", state="Todo")
NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)


def rig(
    tmp_path: Path, budget: dict[str, Any]
) -> tuple[Spending, list[RuntimeEvent], ManualClock]:
    path = tmp_path / "WORKFLOW.md"
    caps = ", ".join(f"{key}: {value}" for key, value in budget.items())
    path.write_text(f"---\ntracker: {{kind: memory}}\nbudget: {{{caps}}}\n---\nwork\n")
    in_force = InForce(load_workflow(path, environ={}))
    clock = ManualClock(wall=NOW)
    reporting = Reporting(clock=clock, workflow=in_force, base_env={})
    events: list[RuntimeEvent] = []
    reporting.add_event_listener(events.append)
    spending = Spending(
        reporting=reporting, clock=clock, settings=lambda: in_force.current.settings, ledger=None
    )
    return spending, events, clock


def meter(spending: Spending, *, command: str = "agent") -> tuple[RunMeter, TurnStop]:
    stop = TurnStop()
    return (
        spending.meter(key=slot_key("id-1", 0), slot_index=0, issue=ISSUE, command=command,
                       stop=stop),
        stop,
    )


def usage(input_tokens: int, output_tokens: int = 0, **fields: Any) -> AgentUpdate:
    return AgentUpdate(
        event="usage", usage=TokenUsage(input_tokens, output_tokens, input_tokens + output_tokens),
        **fields,
    )


async def test_the_agents_cost_replaces_the_tables_estimate(tmp_path: Path) -> None:
    """Claude Code style: tokens as they arrive (priced by the table), the real cost at the
    turn's end; the run's dollars end at the agent's cost, not at the sum of both."""
    spending, _, _ = rig(tmp_path, {"max_usd_per_day": 100})
    run, _ = meter(spending)
    run.observe(AgentUpdate(event=MODEL_EVENT, payload={"model": "gpt-5", "source": "x"}))
    run.observe(usage(1_000_000))  # 1.25 USD by the table
    assert abs(run.run.usd - 1.25) < 1e-9
    run.observe(AgentUpdate(event="result", cost_usd=1.0))  # cheaper than the estimate
    assert abs(run.run.usd - 1.25) < 1e-9  # nothing more until the cost passes the charge
    run.observe(AgentUpdate(event="result", cost_usd=2.0))
    assert abs(run.run.usd - 2.0) < 1e-9
    assert run.run.tokens == 1_000_000
    await spending.flush()
    assert abs((await spending.ledger.day_spend("2026-12-07")).usd - 2.0) < 1e-9


async def test_a_new_session_that_counts_from_zero_is_counted_again(tmp_path: Path) -> None:
    spending, _, _ = rig(tmp_path, {"max_tokens_per_run": 10_000})
    run, _ = meter(spending)
    run.observe(usage(300, 100, session_id="s-1"))
    run.observe(usage(300, 100, session_id="s-1"))  # a repeat adds nothing
    run.observe(usage(50, 10, session_id="s-2"))  # a fresh counter: all of it is new
    run.observe(usage(80, 20))
    assert run.run.tokens == 400 + 60 + 40
    # Codex: a new turn's thread totals continue the old counter.
    run.observe(usage(200, 50, session_id="s-3"))
    assert run.run.tokens == 500 + 150


async def test_warn_once_then_stop_at_the_cap_within_the_crossing_update(tmp_path: Path) -> None:
    spending, events, _ = rig(tmp_path, {"max_tokens_per_issue": 1000, "warn_at": 0.5})
    run, stop = meter(spending)
    for total in (200, 600, 700):
        run.observe(usage(total))
    assert not stop.requested
    assert [e.reason for e in events if e.type == "budget_warning"] == ["tokens_per_issue"]
    run.observe(usage(1000))
    assert stop.requested
    assert stop.error().code == "budget_exhausted"
    assert "budget.max_tokens_per_issue 1000 tokens, spent 1000" in stop.reason
    (exhausted,) = [e for e in events if e.type == "budget_exhausted"]
    assert exhausted.identifier == "T-1"
    assert exhausted.code == "budget_exhausted"


async def test_an_unpriced_model_with_a_dollar_cap_warns_once_and_counts_tokens(
    tmp_path: Path,
) -> None:
    spending, events, _ = rig(tmp_path, {"max_usd_per_day": 1, "max_tokens_per_run": 500})
    run, stop = meter(spending, command="agent --model mystery-9")
    run.observe(usage(100))
    run.observe(usage(200))
    warnings = [e for e in events if e.type == "budget_warning"]
    assert [w.code for w in warnings] == ["model_unpriced"]
    assert "mystery-9" in (warnings[0].message or "")
    assert run.run.usd == 0.0
    run.observe(usage(600))
    assert stop.requested  # the token cap holds without a price


async def test_the_day_turning_starts_a_new_days_total(tmp_path: Path) -> None:
    spending, _, clock = rig(tmp_path, {"max_usd_per_day": 10})
    run, _ = meter(spending)
    run.observe(usage(0, 0, cost_usd=3.0))
    assert spending.day_total().usd == 3.0
    clock.advance(12 * 3600 * 1000)
    assert spending.today() == "2026-12-08"
    assert spending.day_total().usd == 0.0
    run.observe(usage(0, 0, cost_usd=4.0))
    await spending.flush()
    assert (await spending.ledger.day_spend("2026-12-07")).usd == 3.0
    assert (await spending.ledger.day_spend("2026-12-08")).usd == 1.0


class FailsOnce(SqliteClaimStore):
    """A real sqlite ledger whose first ``add_spend`` fails (a locked file, a full disk)."""

    failures = 1

    async def add_spend(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database is locked")
        return await super().add_spend(
            issue_id=issue_id, identifier=identifier, day=day, tokens=tokens, usd=usd
        )


async def test_a_charge_the_store_refused_goes_with_the_next_write(tmp_path: Path) -> None:
    """A failed ledger write is not lost: it still counts here, and the next update's write
    (or a flush) stores it, so the durable ledger does not undercount."""
    spending, _, _ = rig(tmp_path, {"max_tokens_per_issue": 100_000})
    store = await FailsOnce.open(tmp_path / "claims.db", owner="host:1:test")
    try:
        spending = Spending(
            reporting=spending._reporting, clock=spending._clock,
            settings=spending._settings, ledger=store,
        )
        run, _ = meter(spending)
        run.observe(usage(1000))
        await spending.flush()  # the first write failed; flush tried it once more
        assert store.failures == 0
        assert (await store.issue_spend("id-1")).tokens == 1000
        assert spending.unsaved.tokens == 0

        store.failures = 1
        run.observe(usage(3000))  # +2000, refused
        while spending._writes:
            await asyncio.gather(*list(spending._writes))
        assert spending.unsaved.tokens == 2000
        assert spending.issue_total("id-1").tokens == 3000  # still counted here
        assert (await store.issue_spend("id-1")).tokens == 1000
        run.observe(usage(3500))  # +500: written together with the refused 2000
        while spending._writes:
            await asyncio.gather(*list(spending._writes))
        assert spending.unsaved.tokens == 0
        assert (await store.issue_spend("id-1")).tokens == 3500
        assert (await store.day_spend(spending.today())).tokens == 3500
        assert spending.issue_total("id-1").tokens == 3500
    finally:
        await store.close()
