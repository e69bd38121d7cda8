"""Restart recovery from a claim store: takeover, interrupted runs, restored retries, foreign."""

from __future__ import annotations

import datetime

import pytest

from lorenz.model import (
    AgentUpdate,
    ClaimPhase,
    ClaimRecord,
    ManualClock,
    RetryKind,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
    TokenUsage,
)
from lorenz.orchestrator import AlreadyStarted, Orchestrator
from tests.orchestrator.claims_helpers import retry_of, run
from tests.orchestrator.factories import PoolProbe, SharedClaims, issue, make

K1, K2, K3 = SlotKey("i1#0"), SlotKey("i2#0"), SlotKey("i3#0")


async def previous_life(shared: SharedClaims, owner: str) -> Orchestrator:
    """An orchestrator that ran i1, reserved i2 and left i3 waiting for a retry."""
    probe = PoolProbe(governs=False)
    orchestrator, _, _clock = make(store=shared.store(owner), capacity=probe)
    await run(orchestrator, issue(1))
    await orchestrator.apply_update(
        K1, AgentUpdate(event="u", session_id="s", usage=TokenUsage(5, 5, 10))
    )
    await run(orchestrator, issue(3))
    await orchestrator.finish(K3, normal=False, error="boom")  # due 10 s after now
    probe.governing = True
    everything = [issue(1), issue(2), issue(3)]
    [candidate] = [c for c in await orchestrator.eligible_issues(everything) if c.key == K2]
    await orchestrator.claim(candidate)
    return orchestrator


async def test_a_stale_owners_claims_are_taken_over() -> None:
    shared = SharedClaims()
    await previous_life(shared, "dead")
    shared.stale.add("dead")
    # the new process starts 4 s later (wall clock), on a fresh monotonic clock
    from lorenz.model import ManualClock

    clock = ManualClock(
        monotonic_ms=5.0, wall=datetime.datetime(2026, 1, 1, 0, 0, 4, tzinfo=datetime.UTC)
    )
    orchestrator, _store, _ = make(store=shared.store("new"), clock=clock)
    report = await orchestrator.hydrate()
    assert report.taken_over_from == frozenset({"dead"})
    assert sorted(report.interrupted) == [K1, K2]
    assert report.restored_retries == (K3,)
    retries = orchestrator.state.retry_attempts
    # interrupted runs: failure retry, attempt + 1, backoff from now
    assert retries[K1].kind is RetryKind.FAILURE
    assert retries[K1].attempt == 1
    assert retries[K1].error == "interrupted: owner dead lost"
    assert retries[K1].due_at_ms == 5.0 + 10000
    # the pending retry keeps its wall-clock due time, mapped onto this monotonic clock
    assert retries[K3].error == "boom"
    assert retries[K3].attempt == 1
    assert retries[K3].due_at_ms == pytest.approx(5.0 + 6000)
    assert orchestrator.state.claimed == set()
    # every row is ours now; interrupted ones rewritten as pending retries
    assert {r.owner for r in shared.rows.values()} == {"new"}
    assert {r.phase for r in shared.rows.values()} == {ClaimPhase.RETRY_PENDING}
    # the interrupted run's tokens were never in the totals: they are added once
    assert orchestrator.state.usage_totals.total_tokens == 10


async def test_our_own_claims_from_a_previous_life_are_recovered() -> None:
    shared = SharedClaims()
    await previous_life(shared, "me")
    orchestrator, _, _ = make(store=shared.store("me"))
    report = await orchestrator.hydrate()
    assert report.taken_over_from == frozenset({"me"})
    assert sorted(report.interrupted) == [K1, K2]
    assert set(orchestrator.state.retry_attempts) == {K1, K2, K3}


async def test_live_foreign_claims_are_never_read_at_start_nor_dispatched() -> None:
    shared = SharedClaims()
    other = await previous_life(shared, "alive")
    orchestrator, _, clock = make(store=shared.store("me"))
    report = await orchestrator.hydrate()
    assert report.interrupted == ()
    assert report.taken_over_from == frozenset()
    assert orchestrator.state.retry_attempts == {}
    assert orchestrator.state.foreign == {}, "a live owner's rows are not read at start-up"
    issues = [issue(1), issue(2), issue(3), issue(4)]
    candidates = {c.key: c for c in await orchestrator.eligible_issues(issues)}
    # the store refuses the slot when it comes up; it is remembered as foreign from then on
    result = await orchestrator.claim(candidates[K1])
    assert getattr(result, "reason", None) == "claimed_elsewhere"
    assert K1 in orchestrator.state.foreign
    assert K1 not in [c.key for c in await orchestrator.eligible_issues(issues)]
    # after the recheck interval the store decides again: still held → claimed_elsewhere
    clock.advance(30000)
    candidates = {c.key: c for c in await orchestrator.eligible_issues(issues)}
    result = await orchestrator.claim(candidates[K1])
    assert getattr(result, "reason", None) == "claimed_elsewhere"
    assert K1 in other.state.running
    assert {r.owner for r in shared.rows.values()} == {"alive"}


async def test_usage_totals_come_back_from_the_checkpoint() -> None:
    shared = SharedClaims()
    first, _, _ = make(store=shared.store("a"))
    await run(first, issue(1))
    await first.apply_update(K1, AgentUpdate(event="u", usage=TokenUsage(1, 2, 3)))
    await first.finish(K1, normal=True)
    await first.release_retry(K1)
    second, _, _ = make(store=shared.store("b"))
    report = await second.hydrate()
    assert report.usage_restored
    assert second.state.usage_totals.total_tokens == 3


@pytest.mark.parametrize(
    "checkpoint",
    [
        {"usage_totals": "lots"},
        {"usage_totals": {"total_tokens": "3"}},
        {"nothing": 1},
        {"usage_totals": {"seconds_running": "soon"}},
    ],
)
async def test_an_unreadable_checkpoint_is_reported_with_a_code(checkpoint: dict) -> None:  # type: ignore[type-arg]
    shared = SharedClaims()
    shared.checkpoint = checkpoint
    orchestrator, _, _ = make(store=shared.store("me"))
    report = await orchestrator.hydrate()
    assert not report.usage_restored
    [problem] = report.problems
    assert problem.code == "claim_checkpoint_invalid"
    assert "usage totals start at zero" in problem.message
    assert orchestrator.state.usage_totals.total_tokens == 0
    assert report.to_dict()["problems"][0]["code"] == "claim_checkpoint_invalid"


async def test_a_claim_row_that_contradicts_its_key_is_skipped_with_a_code() -> None:
    shared = SharedClaims()
    shared.rows[SlotKey("i1#0")] = ClaimRecord(
        slot_key=SlotKey("i1#0"),
        issue_id="i9",
        identifier="X",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="me",
    )
    shared.rows[SlotKey("garbage")] = ClaimRecord(
        slot_key=SlotKey("garbage"),
        issue_id="garbage",
        identifier="X",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="me",
    )
    orchestrator, _, _ = make(store=shared.store("me"))
    report = await orchestrator.hydrate()
    assert [p.code for p in report.problems] == ["claim_record_invalid"] * 2
    assert "delete that claim row" in report.problems[0].message
    assert orchestrator.state.retry_attempts == {}


async def test_hydrate_after_dispatch_is_refused_with_a_code() -> None:
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    with pytest.raises(AlreadyStarted) as caught:
        await orchestrator.hydrate()
    assert caught.value.code == "orchestrator_already_started"


async def test_hydrating_an_empty_memory_store_changes_nothing() -> None:
    orchestrator, _, _ = make()
    report = await orchestrator.hydrate()
    assert report.to_dict() == {
        "interrupted": [],
        "adopting": [],
        "restored_retries": [],
        "taken_over_from": [],
        "usage_restored": False,
        "problems": [],
    }
    await orchestrator.heartbeat()


async def _a_run_left_mid_turn(
    shared: SharedClaims, owner: str, *, failures_before: int
) -> tuple[Orchestrator, ManualClock]:
    """``owner`` runs i1 after ``failures_before`` failed runs; its worker is mid-turn."""
    clock = ManualClock()
    orchestrator, _, _ = make(store=shared.store(owner), clock=clock)
    for _ in range(failures_before):
        await run(orchestrator, issue(1))
        await orchestrator.finish(K1, normal=False, error="boom")
        clock.advance(3_600_000)
    await run(orchestrator, issue(1))
    return orchestrator, clock


@pytest.mark.parametrize("failures_before", [0, 1])
async def test_an_adopted_run_that_fails_is_numbered_as_without_the_restart(
    failures_before: int,
) -> None:
    """The attempt and the failure count carried across an adoption are those the run had: a
    first run stays a first run (``None``), so its failure retry is attempt 1 — as for the same
    run failing under the controller that started it."""
    twin, twin_clock = await _a_run_left_mid_turn(
        SharedClaims(), "twin", failures_before=failures_before
    )
    without_restart = retry_of(await twin.finish(K1, normal=False, error="boom"))
    assert without_restart is not None

    shared = SharedClaims()
    dead, _ = await _a_run_left_mid_turn(shared, "dead", failures_before=failures_before)
    started_attempt = dead.state.running[K1].attempt
    shared.rows[K1].intent = SpawnIntent(
        handle="lzw-I1-s0-a0-g1-0123456789ab", phase=SpawnPhase.RUNNING, generation=1,
        last_seq=4,
    )
    shared.stale.add("dead")
    ours, _, clock = make(store=shared.store("ours"))
    report = await ours.hydrate()
    assert report.adopting == (K1,)
    retry = ours.state.retry_attempts[K1]
    assert retry.kind is RetryKind.ADOPTION
    entry = await run(ours, issue(1))
    assert entry.attempt == started_attempt, "the adopted run keeps the attempt it started as"
    assert shared.rows[K1].attempt == started_attempt
    adopted_failure = retry_of(await ours.finish(K1, normal=False, error="boom"))
    assert adopted_failure is not None
    assert (adopted_failure.attempt, adopted_failure.due_at_ms - clock.monotonic_ms()) == (
        without_restart.attempt,
        without_restart.due_at_ms - twin_clock.monotonic_ms(),
    )
    assert ours.state.failure_streaks.get(K1) == twin.state.failure_streaks.get(K1)

