"""The budget policy: pricing usage deltas, totals, cap verdicts, admission, the UTC day key."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lorenz.config.pricing import ModelPrice
from lorenz.config.settings import BudgetSettings
from lorenz.policies.budget import (
    BudgetStatus,
    CapName,
    PricedDelta,
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

GPT5 = ModelPrice(input=1.25, cached_input=0.125, output=10.0)

counts = st.integers(min_value=0, max_value=10**9)
money = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
snapshots = st.builds(
    UsageSnapshot,
    input_tokens=counts,
    cached_input_tokens=counts,
    output_tokens=counts,
    cost_usd=st.none() | money,
)
prices = st.builds(ModelPrice, input=money, cached_input=money, output=money)
budgets = st.builds(
    BudgetSettings,
    max_tokens_per_run=st.integers(min_value=0, max_value=10**7),
    max_tokens_per_issue=st.integers(min_value=0, max_value=10**7),
    max_usd_per_issue=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    max_usd_per_day=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    warn_at=st.floats(min_value=0.01, max_value=1.0),
)
spends = st.builds(
    Spend,
    tokens=st.integers(min_value=0, max_value=2 * 10**7),
    usd=st.floats(min_value=0, max_value=2e4, allow_nan=False),
)


def test_a_delta_is_priced_by_kind_per_million_tokens() -> None:
    delta = UsageDelta(input_tokens=1_000_000, cached_input_tokens=400_000, output_tokens=100_000)
    priced = price_delta(delta, price=GPT5)
    # 600k fresh input at 1.25, 400k cached at 0.125, 100k output at 10.0
    assert priced.usd == pytest.approx(0.75 + 0.05 + 1.0)
    assert priced.tokens == 1_100_000
    assert priced.priced


def test_the_agents_own_cost_wins_over_the_price() -> None:
    delta = UsageDelta(input_tokens=1_000_000, output_tokens=0, cost_usd=0.01)
    assert price_delta(delta, price=GPT5).usd == 0.01
    assert price_delta(delta, price=None) == PricedDelta(tokens=1_000_000, usd=0.01, priced=True)


def test_an_unpriced_model_still_counts_its_tokens() -> None:
    priced = price_delta(UsageDelta(input_tokens=10, output_tokens=5), price=None)
    assert priced == PricedDelta(tokens=15, usd=0.0, priced=False)


@given(previous=snapshots, current=snapshots)
def test_a_delta_is_never_negative(previous: UsageSnapshot, current: UsageSnapshot) -> None:
    delta = usage_delta(previous, current)
    assert delta.input_tokens >= 0
    assert delta.output_tokens >= 0
    assert 0 <= delta.cached_input_tokens <= delta.input_tokens
    assert delta.cost_usd is None or delta.cost_usd >= 0


@given(first=snapshots, second=snapshots)
def test_deltas_of_growing_totals_add_up(first: UsageSnapshot, second: UsageSnapshot) -> None:
    grown = UsageSnapshot(
        input_tokens=first.input_tokens + second.input_tokens,
        cached_input_tokens=first.cached_input_tokens,
        output_tokens=first.output_tokens + second.output_tokens,
    )
    start = UsageSnapshot()
    one = usage_delta(start, first)
    two = usage_delta(first, grown)
    assert one.input_tokens + two.input_tokens == grown.input_tokens
    assert one.output_tokens + two.output_tokens == grown.output_tokens


@given(
    delta=st.builds(
        UsageDelta, input_tokens=counts, cached_input_tokens=counts, output_tokens=counts
    ),
    price=prices,
)
def test_a_price_is_never_negative_nor_above_all_fresh(
    delta: UsageDelta, price: ModelPrice
) -> None:
    priced = price_delta(delta, price=price)
    ceiling = (
        delta.input_tokens * max(price.input, price.cached_input)
        + delta.output_tokens * price.output
    ) / 1e6
    assert 0 <= priced.usd <= ceiling * (1 + 1e-9) + 1e-12
    assert priced.tokens == delta.input_tokens + delta.output_tokens


@given(
    deltas=st.lists(
        st.builds(PricedDelta, tokens=counts, usd=money, priced=st.booleans()), max_size=20
    )
)
def test_totals_add_each_delta_to_run_issue_and_day(deltas: list[PricedDelta]) -> None:
    totals = SpendTotals(issue=Spend(tokens=7, usd=1.0), day=Spend(tokens=9, usd=2.0))
    for delta in deltas:
        totals = totals.add(delta)
    tokens = sum(d.tokens for d in deltas)
    usd = sum(d.usd for d in deltas)
    assert totals.run.tokens == tokens
    assert totals.issue.tokens == tokens + 7
    assert totals.day.tokens == tokens + 9
    assert totals.day.usd == pytest.approx(usd + 2.0)


def test_no_cap_set_is_always_ok() -> None:
    huge = Spend(tokens=10**12, usd=1e9)
    verdict = check_caps(SpendTotals(run=huge, issue=huge, day=huge), settings=BudgetSettings())
    assert verdict.status is BudgetStatus.OK
    assert verdict.cap is None
    assert verdict.checks == ()


def test_each_cap_reports_itself() -> None:
    settings = BudgetSettings(
        max_tokens_per_run=100, max_tokens_per_issue=1000, max_usd_per_issue=5, max_usd_per_day=50
    )
    at = check_caps(SpendTotals(run=Spend(tokens=100)), settings=settings)
    assert (at.status, at.cap) == (BudgetStatus.EXHAUSTED, CapName.TOKENS_PER_RUN)
    warn = check_caps(SpendTotals(issue=Spend(tokens=850)), settings=settings)
    assert (warn.status, warn.cap) == (BudgetStatus.WARN, CapName.TOKENS_PER_ISSUE)
    usd = check_caps(SpendTotals(issue=Spend(usd=5.0), day=Spend(usd=45.0)), settings=settings)
    assert (usd.status, usd.cap) == (BudgetStatus.EXHAUSTED, CapName.USD_PER_ISSUE)
    day = check_caps(SpendTotals(day=Spend(usd=51.0)), settings=settings)
    assert (day.status, day.cap) == (BudgetStatus.EXHAUSTED, CapName.USD_PER_DAY)
    assert CapName.USD_PER_DAY.setting == "budget.max_usd_per_day"
    ok = check_caps(SpendTotals(run=Spend(tokens=79)), settings=settings)
    assert ok.status is BudgetStatus.OK
    assert [c.cap for c in ok.checks] == list(CapName)


@given(totals=st.builds(SpendTotals, run=spends, issue=spends, day=spends), settings=budgets)
def test_the_verdict_is_the_worst_cap(totals: SpendTotals, settings: BudgetSettings) -> None:
    verdict = check_caps(totals, settings=settings)
    statuses = {check.status for check in verdict.checks}
    for check in verdict.checks:
        assert check.limit > 0
        expected = (
            BudgetStatus.EXHAUSTED
            if check.spent >= check.limit
            else BudgetStatus.WARN
            if check.spent >= settings.warn_at * check.limit
            else BudgetStatus.OK
        )
        assert check.status is expected
    if BudgetStatus.EXHAUSTED in statuses:
        assert verdict.status is BudgetStatus.EXHAUSTED
    elif BudgetStatus.WARN in statuses:
        assert verdict.status is BudgetStatus.WARN
    else:
        assert verdict.status is BudgetStatus.OK
    assert (verdict.cap is None) == (verdict.status is BudgetStatus.OK)


@given(issue=spends, day=spends, settings=budgets)
def test_admission_refuses_exactly_a_reached_issue_or_day_cap(
    issue: Spend, day: Spend, settings: BudgetSettings
) -> None:
    decision = admit(issue=issue, day=day, settings=settings)
    reached = (
        (0 < settings.max_tokens_per_issue <= issue.tokens)
        or (0 < settings.max_usd_per_issue <= issue.usd)
        or (0 < settings.max_usd_per_day <= day.usd)
    )
    assert decision.allowed is not reached
    if not decision.allowed:
        assert decision.cap is not None
        assert decision.cap is not CapName.TOKENS_PER_RUN
        assert decision.spent >= decision.limit > 0


def test_admission_names_the_cap_and_the_spend() -> None:
    settings = BudgetSettings(max_usd_per_day=10, max_tokens_per_run=5)
    held = admit(issue=Spend(), day=Spend(usd=10.0), settings=settings)
    assert not held.allowed
    assert (held.cap, held.limit, held.spent) == (CapName.USD_PER_DAY, 10.0, 10.0)
    # the per-run cap never holds an issue back: every run starts from zero
    assert admit(issue=Spend(tokens=10**9), day=Spend(), settings=settings).allowed


def test_day_key_is_the_utc_date() -> None:
    late = datetime.datetime(
        2026, 12, 7, 23, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))
    )
    assert day_key(late) == "2026-12-08"
    assert day_key(datetime.datetime(2026, 12, 7, 0, 0, tzinfo=datetime.UTC)) == "2026-12-07"
    with pytest.raises(ValueError, match="aware"):
        day_key(datetime.datetime(2026, 12, 7))


@given(
    moment=st.datetimes(
        min_value=datetime.datetime(1971, 1, 1),
        max_value=datetime.datetime(2200, 1, 1),
        timezones=st.timezones(),
    )
)
def test_day_key_agrees_with_utc(moment: datetime.datetime) -> None:
    seconds = int(moment.timestamp())
    days_since_epoch = seconds // 86400
    expected = datetime.date(1970, 1, 1) + datetime.timedelta(days=days_since_epoch)
    assert day_key(moment) == expected.isoformat()
