"""Finishing runs, retries, pruning, cleanup, stalls and the persisted form of each step."""

from __future__ import annotations

import datetime

import pytest

from lorenz.model import AgentUpdate, ClaimPhase, RetryKind, SlotKey, StopReason, TokenUsage
from lorenz.orchestrator import Orchestrator, Skipped, SkipReason
from tests.orchestrator.claims_helpers import retry_of, run, start
from tests.orchestrator.factories import EPOCH, issue, make, settings

K1 = SlotKey("i1#0")


async def test_normal_exit_schedules_a_short_continuation() -> None:
    """A normal exit schedules attempt 1 after 1000 ms; the run is completed."""
    orchestrator, store, clock = make()
    await run(orchestrator, issue(1))
    clock.advance(5000)
    retry = retry_of(await orchestrator.finish(K1, normal=True))
    assert retry is not None
    assert (retry.kind, retry.attempt) == (RetryKind.CONTINUATION, 1)
    assert retry.due_at_ms == clock.monotonic_ms() + 1000
    assert retry.due_at == clock.now() + datetime.timedelta(seconds=1)
    assert orchestrator.state.running == {}
    assert orchestrator.state.claimed == set()
    assert orchestrator.state.completed == {"i1"}
    assert orchestrator.state.usage_totals.seconds_running == pytest.approx(5.0)
    assert store.claims[K1].phase is ClaimPhase.RETRY_PENDING
    assert store.claims[K1].due_at == retry.due_at


async def test_abnormal_exits_back_off_exponentially() -> None:
    """Attempts rise, backoff doubles from 10 s, entries carry the facts."""
    # NB: a budget above the three failures, so the third one is still retried.
    orchestrator, _, clock = make(config=settings(retry={"max_attempts": 4}))
    delays = []
    for expected_attempt in (1, 2, 3):
        await run(orchestrator, issue(1))
        retry = retry_of(await orchestrator.finish(
            K1, normal=False, error=f"agent exited: {expected_attempt}"
        ))
        assert retry is not None
        assert retry.attempt == expected_attempt
        assert retry.identifier == "ABC-1"
        assert retry.error == f"agent exited: {expected_attempt}"
        delays.append(retry.due_at_ms - clock.monotonic_ms())
        assert await orchestrator.eligible_issues([issue(1)]) == []  # not due yet
        clock.advance(delays[-1])
    assert delays == [10000, 20000, 40000]


async def test_a_crash_after_a_continuation_is_attempt_two() -> None:
    orchestrator, _, clock = make()
    await run(orchestrator, issue(1))
    await orchestrator.finish(K1, normal=True)
    clock.advance(1000)
    entry = await run(orchestrator, issue(1))
    assert entry.attempt == 1
    assert entry.retry_kind is RetryKind.CONTINUATION
    retry = retry_of(await orchestrator.finish(K1, normal=False))
    assert retry is not None
    assert (retry.attempt, retry.due_at_ms - clock.monotonic_ms()) == (2, 20000)


async def test_backoff_cap_from_config() -> None:
    """Backoff is capped by agent.max_retry_backoff_ms."""
    orchestrator, _, clock = make(config=settings(agent={"max_retry_backoff_ms": 15000}))
    await run(orchestrator, issue(1))
    await orchestrator.finish(K1, normal=False)
    clock.advance(10000)
    await run(orchestrator, issue(1))
    retry = retry_of(await orchestrator.finish(K1, normal=False))
    assert retry is not None
    assert retry.due_at_ms - clock.monotonic_ms() == 15000


async def test_finish_of_an_unknown_key_does_nothing() -> None:
    orchestrator, store, _ = make()
    assert await orchestrator.finish(K1, normal=True) is None
    assert orchestrator.state.retry_attempts == {}
    assert dict(store.claims) == {}


async def test_a_retry_becomes_a_candidate_exactly_when_due() -> None:
    orchestrator, _, clock = make()
    await run(orchestrator, issue(1))
    await orchestrator.finish(K1, normal=False)
    clock.advance(9999)
    assert await orchestrator.eligible_issues([issue(1)]) == []
    assert orchestrator.retry_deadlines() == {K1: clock.monotonic_ms() + 1}
    clock.advance(1)
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    assert candidate.attempt == 1


async def test_retries_of_issues_no_longer_active_are_pruned() -> None:
    orchestrator, store, _ = make(config=settings(tracker={"required_labels": ["agent"]}))
    for n in (1, 2, 3, 4):
        await run(orchestrator, issue(n, labels=["agent"]))
        await orchestrator.finish(SlotKey(f"i{n}#0"), normal=True)
    fresh = [
        issue(1, labels=["agent"]),  # still active: kept
        issue(2, state="Done", labels=["agent"]),  # terminal
        issue(3),  # lost its label
        # i4 missing from the candidate list
    ]
    await orchestrator.eligible_issues(fresh)
    assert set(orchestrator.state.retry_attempts) == {K1}
    assert {r.issue_id for r in orchestrator.last_eligibility.pruned} == {"i2", "i3", "i4"}
    assert set(store.claims) == {K1}


async def test_retries_of_slots_beyond_a_shrunk_ensemble_are_pruned() -> None:
    orchestrator, _, _ = make(config=settings(agent={"ensemble_size": 2}))
    for candidate in await orchestrator.eligible_issues([issue(1)]):
        await start(orchestrator, candidate)
    await orchestrator.finish(SlotKey("i1#0"), normal=True)
    await orchestrator.finish(SlotKey("i1#1"), normal=True)
    orchestrator.update_settings(settings(agent={"ensemble_size": 1}))
    await orchestrator.eligible_issues([issue(1)])
    assert set(orchestrator.state.retry_attempts) == {SlotKey("i1#0")}


async def test_exhausted_slots_keep_the_retry_with_an_explicit_reason() -> None:
    """When slots run out the retry stays pending and the skip says why."""
    orchestrator, _, clock = make(config=settings(agent={"max_concurrent_agents": 1}))
    await run(orchestrator, issue(1))
    await orchestrator.finish(K1, normal=False, error="boom")
    await run(orchestrator, issue(2))
    clock.advance(10000)
    [candidate] = await orchestrator.eligible_issues([issue(1), issue(2)])
    assert candidate.key == K1
    assert await orchestrator.claim(candidate) == Skipped(SkipReason.GLOBAL_CAPACITY)
    assert orchestrator.state.retry_attempts[K1].attempt == 1
    assert orchestrator.state.retry_attempts[K1].error == "boom"


async def test_cleanup_issue_releases_every_slot_and_returns_those_to_abort() -> None:
    """A stop releases claims, schedules no retry, keeps totals."""
    orchestrator, store, clock = make(config=settings(agent={"ensemble_size": 3}))
    c0, c1, c2 = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, c0)
    await start(orchestrator, c1)
    await orchestrator.finish(SlotKey("i1#1"), normal=True)  # retrying
    await start(orchestrator, c2)
    await orchestrator.apply_update(
        SlotKey("i1#2"), AgentUpdate(event="e", usage=TokenUsage(1, 2, 3))
    )
    await run(orchestrator, issue(2))
    clock.advance(2000)
    released = await orchestrator.cleanup_issue("i1")
    assert sorted(released.aborted) == [SlotKey("i1#0"), SlotKey("i1#2")]
    assert [e.key for e in released.runs] == [SlotKey("i1#0"), SlotKey("i1#2")]
    assert [r.key for r in released.retries] == [SlotKey("i1#1")]
    assert released.runs[1].usage.total_tokens == 3
    assert released.identifier == "ABC-1"
    assert set(orchestrator.state.running) == {SlotKey("i2#0")}
    assert orchestrator.state.claimed == {SlotKey("i2#0")}
    assert orchestrator.state.retry_attempts == {}
    assert set(store.claims) == {SlotKey("i2#0")}
    totals = orchestrator.state.usage_totals
    assert totals.total_tokens == 3
    assert totals.seconds_running == pytest.approx(4.0)  # two runs of 2 s each
    assert orchestrator.tracked_issue_ids() == {"i2"}


async def test_reconciliation_decisions_through_the_orchestrator() -> None:
    """Refresh decisions; nothing tracked means nothing to refetch."""
    orchestrator, _, _ = make()
    assert orchestrator.tracked_issue_ids() == set()
    await run(orchestrator, issue(1))
    assert orchestrator.tracked_issue_ids() == {"i1"}
    assert orchestrator.reconciliation_decision(issue(1, state="In Progress")) is None
    assert orchestrator.reconciliation_decision(issue(1, state="Backlog")) is StopReason.INACTIVE
    assert orchestrator.reconciliation_decision(issue(1, state="Done")) is StopReason.TERMINAL
    assert orchestrator.reconciliation_decision(None) is StopReason.MISSING
    # hot reload of the state lists applies to the next decision
    orchestrator.update_settings(settings(tracker={"active_states": ["Backlog"]}))
    assert orchestrator.reconciliation_decision(issue(1, state="Backlog")) is None


async def test_release_retry_and_release_slot() -> None:
    orchestrator, store, clock = make()
    await run(orchestrator, issue(1))
    await orchestrator.release_retry(K1)  # claimed: a no-op
    assert K1 in store.claims
    assert K1 in orchestrator.state.running
    await orchestrator.finish(K1, normal=True)
    await orchestrator.release_retry(K1)
    assert orchestrator.state.retry_attempts == {}
    assert dict(store.claims) == {}
    await run(orchestrator, issue(1))
    clock.advance(3000)
    released = await orchestrator.release_slot(K1)
    assert [e.key for e in released.runs] == [K1]
    assert released.aborted == (K1,)
    assert orchestrator.state.claimed == set()
    assert dict(store.claims) == {}
    assert orchestrator.state.retry_attempts == {}
    assert orchestrator.state.usage_totals.seconds_running == pytest.approx(3.0)
    assert not await orchestrator.release_slot(K1)
    # released: it is a plain first-run candidate again
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    assert candidate.retry is None


async def test_stall_detection_uses_the_agent_kinds_threshold() -> None:
    """Stalled runs are listed; finishing them schedules a failure retry."""
    config = settings(
        agents={"slow": {"command": "x", "stall_timeout_ms": 1000}}, agent={"kind": "slow"}
    )
    orchestrator, _, clock = make(config=config)
    await run(orchestrator, issue(1))
    await run(orchestrator, issue(2))
    clock.advance(600)
    await orchestrator.apply_update(SlotKey("i2#0"), AgentUpdate(event="tick"))
    clock.advance(401)
    assert orchestrator.stalled_runs() == {K1: 1001}
    [stalled] = await orchestrator.finish_stalled()
    assert (stalled.entry.key, stalled.silent_ms) == (K1, 1001)
    assert stalled.error == "stalled for 1001ms without agent activity"
    assert stalled.retry is not None
    assert stalled.retry.kind is RetryKind.FAILURE
    assert stalled.retry.attempt == 1
    assert stalled.retry.error == stalled.error
    assert orchestrator.stalled_runs() == {}
    assert await orchestrator.finish_stalled() == ()
    orchestrator.update_settings(
        settings(agents={"slow": {"command": "x", "stall_timeout_ms": 0}}, agent={"kind": "slow"})
    )
    clock.advance(10**7)
    assert orchestrator.stalled_runs() == {}


async def test_finish_returns_the_ended_entry_and_can_release_instead_of_retrying() -> None:
    orchestrator, store, clock = make()
    entry = await run(orchestrator, issue(1))
    clock.advance(1500)
    finished = await orchestrator.finish(K1, normal=True, release=True)
    assert finished is not None
    assert finished.entry is entry
    assert finished.retry is None
    assert orchestrator.state.retry_attempts == {}
    assert orchestrator.state.claimed == set()
    assert dict(store.claims) == {}
    assert orchestrator.state.usage_totals.seconds_running == pytest.approx(1.5)
    assert await orchestrator.finish(K1, normal=True) is None


async def test_finish_persists_the_retry_before_the_checkpoint() -> None:
    from tests.orchestrator.factories import SharedClaims

    shared = SharedClaims()
    store = shared.store("me")
    orchestrator, _, _ = make(store=store)
    await run(orchestrator, issue(1))
    store.calls.clear()
    await orchestrator.finish(K1, normal=True)
    assert store.calls == ["save i1#0 RetryPending", "save_checkpoint"]
    assert shared.checkpoint is not None
    assert shared.checkpoint["usage_totals"]["seconds_running"] == 0.0


def test_epoch_is_the_manual_clock_start() -> None:
    _, _, clock = make()
    assert clock.now() == EPOCH


async def test_run_helper_claims_in_one_step() -> None:
    orchestrator, _, _ = make()
    entry = await run(orchestrator, issue(7))
    assert isinstance(orchestrator, Orchestrator)
    assert entry.key == SlotKey("i7#0")


@pytest.mark.parametrize("failures_before", [0, 1])
async def test_a_run_whose_worker_never_started_is_retried_as_the_same_attempt_uncounted(
    failures_before: int,
) -> None:
    """``worker_never_started`` (a controller killed mid-launch) is not the agent's failure:
    the retry is the same attempt after the short delay, the failure count unchanged — even
    with one failure left in the budget, nothing is blocked."""
    orchestrator, _, clock = make(config=settings(retry={"max_attempts": 2}))
    for _ in range(failures_before):
        await run(orchestrator, issue(1))
        await orchestrator.finish(K1, normal=False, error="boom")
        clock.advance(3_600_000)
    entry = await run(orchestrator, issue(1))
    finished = await orchestrator.finish(
        K1, normal=False, error="never started", failure_code="worker_never_started"
    )
    assert finished is not None
    assert finished.blocked is None
    retry = retry_of(finished)
    assert retry is not None
    assert (retry.kind, retry.run_attempt) == (RetryKind.FAILURE, entry.attempt)
    assert retry.due_at_ms == clock.monotonic_ms() + 1000
    assert orchestrator.state.failure_streaks.get(K1, 0) == failures_before
    clock.advance(1000)
    again = await run(orchestrator, issue(1))
    assert again.attempt == entry.attempt
