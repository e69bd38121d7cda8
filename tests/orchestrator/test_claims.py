"""Claiming slots: caps, hosts, the two dispatch paths, reservations and their ABA guard."""

from __future__ import annotations

import copy

from lorenz.model import ClaimPhase, RetryKind, SlotKey
from lorenz.orchestrator import (
    DispatchCandidate,
    Orchestrator,
    Reserved,
    Skipped,
    SkipReason,
    Started,
)
from lorenz.policies import placement_wait_ms
from tests.orchestrator.claims_helpers import retry_of
from tests.orchestrator.factories import PoolProbe, SharedClaims, issue, make, settings


async def start(orchestrator: Orchestrator, candidate: DispatchCandidate) -> Started:
    result = await orchestrator.claim(candidate)
    assert isinstance(result, Started), result
    return result


async def reserve(orchestrator: Orchestrator, candidate: DispatchCandidate) -> Reserved:
    result = await orchestrator.claim(candidate)
    assert isinstance(result, Reserved), result
    return result


def key(n: int, slot: int = 0) -> SlotKey:
    return SlotKey(f"i{n}#{slot}")


async def test_static_claim_goes_straight_to_running_and_is_persisted() -> None:
    orchestrator, store, clock = make()
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    started = await start(orchestrator, candidate)
    assert started.entry.key == key(1)
    assert started.entry.attempt is None
    assert started.entry.host is None  # no ssh hosts: local
    assert started.entry.started_at_ms == clock.monotonic_ms()
    assert orchestrator.state.claimed == {key(1)}
    assert store.claims[key(1)].phase is ClaimPhase.RUNNING


async def test_claimed_slots_are_not_candidates_and_cannot_be_claimed_twice() -> None:
    orchestrator, _, _ = make()
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, candidate)
    assert await orchestrator.eligible_issues([issue(1)]) == []
    assert await orchestrator.claim(candidate) == Skipped(SkipReason.ALREADY_CLAIMED)


async def test_global_cap_counts_running_and_reserved() -> None:
    probe = PoolProbe(governs=False)
    orchestrator, _, _ = make(config=settings(agent={"max_concurrent_agents": 2}), capacity=probe)
    c1, c2, c3 = await orchestrator.eligible_issues([issue(1), issue(2), issue(3)])
    await start(orchestrator, c1)
    probe.governing = True
    await reserve(orchestrator, c2)
    assert await orchestrator.claim(c3) == Skipped(SkipReason.GLOBAL_CAPACITY)
    assert orchestrator.available_slots() == 0


async def test_per_state_cap_counts_the_current_issue_state() -> None:
    orchestrator, _, _ = make(
        config=settings(
            agent={"max_concurrent_agents": 5, "max_concurrent_agents_by_state": {"todo": 1}}
        )
    )
    todo1, todo2, doing = await orchestrator.eligible_issues(
        [issue(1, priority=1), issue(2, priority=2), issue(3, priority=3, state="In Progress")]
    )
    await start(orchestrator, todo1)
    assert await orchestrator.claim(todo2) == Skipped(SkipReason.STATE_CAPACITY)
    await start(orchestrator, doing)
    # A refresh moves the running entry to its new state, and with it the count.
    await orchestrator.refresh_running_issue(issue(1, priority=1, state="In Progress"))
    assert orchestrator.state.running[key(1)].issue.state == "In Progress"
    await start(orchestrator, todo2)


async def test_hosts_least_loaded_first_then_full_means_no_dispatch() -> None:
    orchestrator, _, _ = make(
        config=settings(worker={"ssh_hosts": ["a", "b"], "max_concurrent_agents_per_host": 1})
    )
    c1, c2, c3 = await orchestrator.eligible_issues([issue(1), issue(2), issue(3)])
    assert (await start(orchestrator, c1)).entry.host == "a"
    assert (await start(orchestrator, c2)).entry.host == "b"
    # All hosts full → no dispatch, never a local fallback
    assert await orchestrator.claim(c3) == Skipped(SkipReason.WORKER_HOST_CAPACITY)
    assert key(3) not in orchestrator.state.claimed


async def test_a_retry_goes_back_to_its_previous_host_when_it_has_room() -> None:
    orchestrator, _, clock = make(
        config=settings(worker={"ssh_hosts": ["a", "b"], "max_concurrent_agents_per_host": 2})
    )
    c1, c2 = await orchestrator.eligible_issues([issue(1), issue(2)])
    await start(orchestrator, c1)  # a
    assert (await start(orchestrator, c2)).entry.host == "b"
    retry = retry_of(await orchestrator.finish(key(2), normal=False, error="boom"))
    assert retry is not None
    assert retry.host == "b"
    clock.advance(10000)
    [again] = await orchestrator.eligible_issues([issue(1), issue(2)])
    assert again.preferred_host == "b"
    # least-loaded would be "b" anyway; load "a" less to make the preference visible
    await orchestrator.finish(key(1), normal=True)
    started = await start(orchestrator, again)
    assert started.entry.host == "b"
    assert started.entry.attempt == 1


async def test_governing_pool_reserves_and_bind_makes_it_run() -> None:
    probe = PoolProbe()
    orchestrator, store, clock = make(capacity=probe)
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert orchestrator.state.claimed == {key(1)}
    assert store.claims[key(1)].phase is ClaimPhase.RESERVED
    assert store.claims[key(1)].reservation_token == reservation.token
    assert reservation.expires_at_ms == clock.monotonic_ms() + 30000 * 2 + 60000
    clock.advance(250)
    entry = await orchestrator.bind_reservation(reservation, host="w1")
    assert entry is not None
    assert entry.host == "w1"
    assert entry.started_at_ms == clock.monotonic_ms()
    assert orchestrator.state.reserved == {}
    assert set(orchestrator.state.running) == {key(1)}
    assert orchestrator.state.claimed == {key(1)}
    assert store.claims[key(1)].phase is ClaimPhase.RUNNING


async def test_a_full_governing_pool_skips_without_reserving() -> None:
    orchestrator, store, _ = make(capacity=PoolProbe(room=False))
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    assert await orchestrator.claim(candidate) == Skipped(SkipReason.WORKER_HOST_CAPACITY)
    assert orchestrator.state.claimed == set()
    assert dict(store.claims) == {}


async def test_a_disabled_pool_falls_through_to_the_static_path() -> None:
    orchestrator, _, _ = make(capacity=PoolProbe(governs=False, room=False))
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, candidate)


async def test_cancel_restores_the_consumed_retry_without_backoff() -> None:
    probe = PoolProbe(governs=False)
    orchestrator, store, clock = make(capacity=probe)
    [first] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, first)
    retry = retry_of(await orchestrator.finish(key(1), normal=False, error="boom"))
    assert retry is not None
    clock.advance(10000)
    probe.governing = True
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    assert candidate.retry is retry
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert reservation.consumed_retry is retry
    assert reservation.attempt == 1
    assert orchestrator.state.retry_attempts == {}
    assert await orchestrator.cancel_reservation(reservation) is True
    assert orchestrator.state.retry_attempts == {key(1): retry}
    assert orchestrator.state.retry_attempts[key(1)].due_at_ms == retry.due_at_ms
    assert orchestrator.state.claimed == set()
    assert store.claims[key(1)].phase is ClaimPhase.RETRY_PENDING
    # no backoff: the restored retry is due right away, same attempt, same slot
    [again] = await orchestrator.eligible_issues([issue(1)])
    assert again.key == key(1)
    assert again.attempt == 1


async def test_cancel_of_a_first_run_reservation_releases_the_row() -> None:
    orchestrator, store, _ = make(capacity=PoolProbe())
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert await orchestrator.cancel_reservation(reservation)
    assert dict(store.claims) == {}
    assert orchestrator.state.retry_attempts == {}


async def test_stale_tokens_change_nothing() -> None:
    """ABA: a stale acquire resolving after its reservation was swept and re-made is a no-op."""
    orchestrator, store, clock = make(capacity=PoolProbe())
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    old = (await reserve(orchestrator, candidate)).reservation
    clock.advance(120000)
    [again] = await orchestrator.eligible_issues([issue(1)])  # sweeps `old`
    assert orchestrator.last_eligibility.expired == (old,)
    new = (await reserve(orchestrator, again)).reservation
    assert new.token != old.token
    before = copy.deepcopy((orchestrator.state, dict(store.claims)))
    assert await orchestrator.bind_reservation(old, host="w") is None
    assert await orchestrator.cancel_reservation(old) is False
    assert copy.deepcopy((orchestrator.state, dict(store.claims))) == before
    assert await orchestrator.bind_reservation(new, host="w") is not None
    # a bound reservation is gone: binding or cancelling it again is stale too
    assert await orchestrator.bind_reservation(new, host="w") is None
    assert await orchestrator.cancel_reservation(new) is False


async def test_expiry_sweep_is_exact_and_restores_retries() -> None:
    probe = PoolProbe(governs=False)
    orchestrator, _, clock = make(
        config=settings(worker={"worker_pool": {"acquire_timeout_ms": 1000}}), capacity=probe
    )
    [c] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, c)
    retry = retry_of(await orchestrator.finish(key(1), normal=True))
    clock.advance(1000)
    probe.governing = True
    [c] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, c)).reservation
    assert reservation.expires_at_ms - reservation.reserved_at_ms == 62000
    clock.advance(61999)
    assert await orchestrator.sweep_expired_reservations() == []
    clock.advance(1)
    assert await orchestrator.sweep_expired_reservations() == [reservation]
    assert orchestrator.state.retry_attempts == {key(1): retry}
    assert orchestrator.state.claimed == set()


async def test_an_expired_but_unswept_reservation_still_binds() -> None:
    orchestrator, _, clock = make(capacity=PoolProbe())
    [c] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, c)).reservation
    clock.advance(10**6)
    assert await orchestrator.bind_reservation(reservation, host=None) is not None


async def test_a_refused_acquire_leaves_scheduling_state_unchanged() -> None:
    shared = SharedClaims()
    other, _, clock = make(store=shared.store("other"))
    ours, _, _ = make(store=shared.store("ours"), clock=clock)
    [candidate] = await other.eligible_issues([issue(1)])
    await start(other, candidate)
    [mine] = await ours.eligible_issues([issue(1)])
    before = copy.deepcopy(
        (ours.state.running, ours.state.reserved, ours.state.claimed, ours.state.retry_attempts)
    )
    assert await ours.claim(mine) == Skipped(SkipReason.CLAIMED_ELSEWHERE)
    assert (
        ours.state.running,
        ours.state.reserved,
        ours.state.claimed,
        ours.state.retry_attempts,
    ) == before
    # the slot is remembered as foreign: no candidate, no store call until the recheck time
    assert await ours.eligible_issues([issue(1)]) == []
    assert ours.snapshot().claimed_elsewhere == (key(1),)
    clock.advance(30000)
    [retry_candidate] = await ours.eligible_issues([issue(1)])
    await other.finish(key(1), normal=True)
    await other.release_retry(key(1))
    await start(ours, retry_candidate)
    assert key(1) not in ours.state.foreign


async def test_ensemble_slots_are_independent() -> None:
    orchestrator, _, _ = make(config=settings(agent={"ensemble_size": 3}))
    candidates = await orchestrator.eligible_issues([issue(1)])
    assert [c.key for c in candidates] == [key(1, 0), key(1, 1), key(1, 2)]
    await start(orchestrator, candidates[1])
    retry = retry_of(await orchestrator.finish(key(1, 1), normal=False))
    assert retry is not None
    assert retry.slot_index == 1
    left = await orchestrator.eligible_issues([issue(1)])
    assert [c.key for c in left] == [key(1, 0), key(1, 2)]


async def test_a_candidate_whose_retry_vanished_is_stale() -> None:
    orchestrator, _, clock = make()
    [c] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, c)
    await orchestrator.finish(key(1), normal=True)
    clock.advance(1000)
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    await orchestrator.release_retry(key(1))
    assert await orchestrator.claim(candidate) == Skipped(SkipReason.STALE_CANDIDATE)


async def test_claim_refuses_a_retry_that_is_not_due() -> None:
    orchestrator, _, _ = make()
    [c] = await orchestrator.eligible_issues([issue(1)])
    await start(orchestrator, c)
    await orchestrator.finish(key(1), normal=True)
    # a first-run candidate made before the retry existed: the retry is what counts
    assert await orchestrator.claim(c) == Skipped(SkipReason.NOT_DUE)


async def test_foreign_slots_of_issues_no_longer_eligible_are_forgotten() -> None:
    shared = SharedClaims()
    other, _, clock = make(store=shared.store("other"))
    ours, _, _ = make(store=shared.store("ours"), clock=clock)
    [candidate] = await other.eligible_issues([issue(1)])
    await start(other, candidate)
    [mine] = await ours.eligible_issues([issue(1)])
    assert await ours.claim(mine) == Skipped(SkipReason.CLAIMED_ELSEWHERE)
    assert key(1) in ours.state.foreign
    await ours.eligible_issues([issue(1, state="Done")])
    assert ours.state.foreign == {}


# -- runs in Pods: two-phase placement and the give-back of a run that was not placed ----------

POD_WORKER = {"kind": "pod", "start_timeout_ms": 200000}


async def test_a_run_in_a_pod_is_reserved_for_as_long_as_its_pod_may_take_to_start() -> None:
    orchestrator, store, clock = make(config=settings(worker=POD_WORKER))
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert store.claims[key(1)].phase is ClaimPhase.RESERVED
    # swept only well after the Pod's start timeout, not after the pool's acquire timeout
    assert reservation.expires_at_ms == clock.monotonic_ms() + 200000 * 2 + 60000
    entry = await orchestrator.bind_reservation(reservation, host="lzw-pod")
    assert entry is not None
    assert entry.host == "lzw-pod"
    assert store.claims[key(1)].phase is ClaimPhase.RUNNING
    assert store.claims[key(1)].host == "lzw-pod"


async def test_a_first_run_that_was_not_placed_waits_and_comes_back_as_a_first_run() -> None:
    orchestrator, store, clock = make(config=settings(worker=POD_WORKER))
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    retry = await orchestrator.give_back(
        reservation, error="pod_start_timeout: Unschedulable", code="pod_start_timeout"
    )
    assert retry is not None
    assert retry.kind is RetryKind.PLACEMENT
    assert retry.attempt == 0
    assert retry.due_at_ms == clock.monotonic_ms() + placement_wait_ms()
    assert orchestrator.state.claimed == set()
    assert orchestrator.state.failure_streaks == {}
    row = store.claims[key(1)]
    assert row.phase is ClaimPhase.RETRY_PENDING
    assert row.retry_kind is RetryKind.PLACEMENT
    assert row.last_error == "pod_start_timeout: Unschedulable"
    # a placement wait, not a retry due at once...
    assert await orchestrator.eligible_issues([issue(1)]) == []
    clock.advance(placement_wait_ms())
    [again] = await orchestrator.eligible_issues([issue(1)])
    # ...after which it is the same first run: no attempt counted
    second = (await reserve(orchestrator, again)).reservation
    assert second.attempt is None
    entry = await orchestrator.bind_reservation(second, host="lzw-pod")
    assert entry is not None
    assert entry.attempt is None
    assert entry.retry_kind is None
    # and a stale token changes nothing
    assert await orchestrator.give_back(reservation, error="late", code="x") is None


async def test_a_retry_that_was_not_placed_keeps_its_attempt_and_failure_count() -> None:
    orchestrator, store, clock = make(
        config=settings(worker=POD_WORKER, retry={"max_attempts": 2})
    )
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    first = (await reserve(orchestrator, candidate)).reservation
    assert await orchestrator.bind_reservation(first, host="lzw-a") is not None
    failed = retry_of(await orchestrator.finish(key(1), normal=False, error="boom"))
    assert failed is not None
    assert failed.attempt == 1
    assert orchestrator.state.failure_streaks == {key(1): 1}
    for n in range(1, 4):  # however often the cluster has no room for it
        clock.advance(failed.due_at_ms - clock.monotonic_ms() + placement_wait_ms(n))
        [candidate] = await orchestrator.eligible_issues([issue(1)])
        reservation = (await reserve(orchestrator, candidate)).reservation
        assert reservation.attempt == 1
        back = await orchestrator.give_back(reservation, error="quota", code="pod_refused")
        assert back is not None
        assert (back.kind, back.attempt) == (RetryKind.FAILURE, 1)
        assert back.error == "quota"
        # the wait doubles with each failure in a row (#37); the attempt does not move
        assert back.due_at_ms == clock.monotonic_ms() + placement_wait_ms(n)
        assert placement_wait_ms(n) == 5000 * 2 ** (n - 1)
        assert orchestrator.state.failure_streaks == {key(1): 1}
        assert store.claims[key(1)].attempt == 1
        failed = back
    # the run that is finally placed and fails is the second failure, not the fifth
    clock.advance(placement_wait_ms(3))
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert await orchestrator.bind_reservation(reservation, host="lzw-b") is not None
    finished = await orchestrator.finish(key(1), normal=False, error="boom again")
    assert finished is not None
    assert finished.blocked is not None
    assert finished.blocked.failures == 2


async def test_placement_waits_double_in_a_row_and_start_over_once_a_run_is_placed() -> None:
    """#37: an image that never pulls is not tried every 5 s for ever."""
    orchestrator, _store, clock = make(config=settings(worker=POD_WORKER))
    waits = []
    for _ in range(3):
        [candidate] = await orchestrator.eligible_issues([issue(1)])
        reservation = (await reserve(orchestrator, candidate)).reservation
        back = await orchestrator.give_back(reservation, error="ErrImagePull", code="x")
        assert back is not None
        waits.append(back.due_at_ms - clock.monotonic_ms())
        clock.advance(back.due_at_ms - clock.monotonic_ms())
    assert waits == [5000, 10000, 20000]
    assert placement_wait_ms(100) == 300_000  # capped
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    assert await orchestrator.bind_reservation(reservation, host="lzw-pod") is not None
    await orchestrator.finish(key(1), normal=True)
    clock.advance(60_000)
    [candidate] = await orchestrator.eligible_issues([issue(1)])
    reservation = (await reserve(orchestrator, candidate)).reservation
    back = await orchestrator.give_back(reservation, error="ErrImagePull", code="x")
    assert back is not None
    assert back.due_at_ms - clock.monotonic_ms() == placement_wait_ms()
