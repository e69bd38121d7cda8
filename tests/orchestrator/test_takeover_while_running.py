"""Recovery while running: a stale (or dead) owner's claims come back without a restart.

At start-up :meth:`Orchestrator.hydrate` takes stale owners over; an owner that dies *later*
leaves slots that ``acquire`` refuses forever (stale rows are never overwritten), so the
periodic recovery pass calls :meth:`Orchestrator.take_over`. These cases run on the shared
store double, which keeps the SQL stores' contract (``tests/claims/test_contract.py``).
"""

from __future__ import annotations

from lorenz.model import AgentUpdate, ClaimPhase, ManualClock, RetryKind, SlotKey, TokenUsage
from lorenz.orchestrator import Skipped, SkipReason
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import PoolProbe, SharedClaims, issue, make

K1, K2, K3 = SlotKey("i1#0"), SlotKey("i2#0"), SlotKey("i3#0")
STALE_MS = 30_000


async def test_a_slot_of_an_owner_that_went_stale_stays_refused_until_taken_over() -> None:
    clock = ManualClock()
    shared = SharedClaims(clock=clock, owner_stale_ms=STALE_MS)
    other, _, _ = make(store=shared.store("other"), clock=clock)
    ours, _, _ = make(store=shared.store("ours"), clock=clock)
    assert (await ours.hydrate()).taken_over_from == frozenset()
    await run(other, issue(1))
    clock.advance(STALE_MS + 1)  # "other" dies here: its heartbeat goes stale
    await ours.heartbeat()
    [candidate] = await ours.eligible_issues([issue(1)])
    assert await ours.claim(candidate) == Skipped(SkipReason.CLAIMED_ELSEWHERE)
    clock.advance(STALE_MS)  # however long we wait, acquire never steals the row
    [candidate] = await ours.eligible_issues([issue(1)])
    assert await ours.claim(candidate) == Skipped(SkipReason.CLAIMED_ELSEWHERE)
    assert ours.snapshot().claimed_elsewhere == (K1,)

    report = await ours.take_over(await shared.store("probe").stale_owners())
    assert report.taken_over_from == frozenset({"other"})
    assert report.interrupted == (K1,)
    retry = ours.state.retry_attempts[K1]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)
    assert retry.error == "interrupted: owner other lost"
    assert retry.due_at_ms == clock.monotonic_ms() + 10_000
    assert ours.state.foreign == {}
    assert ours.snapshot().claimed_elsewhere == ()
    assert (shared.rows[K1].owner, shared.rows[K1].phase) == ("ours", ClaimPhase.RETRY_PENDING)
    assert await ours.eligible_issues([issue(1)]) == []  # backoff first
    clock.advance(10_000)
    [candidate] = await ours.eligible_issues([issue(1)])
    entry = await run(ours, issue(1))
    assert (entry.attempt, entry.retry_kind) == (1, RetryKind.FAILURE)
    assert shared.rows[K1].owner == "ours"


async def test_pending_retries_keep_attempt_and_due_time_and_live_owners_keep_theirs() -> None:
    clock = ManualClock()
    shared = SharedClaims(clock=clock, owner_stale_ms=STALE_MS)
    probe = PoolProbe(governs=False)
    dead, _, _ = make(store=shared.store("dead"), clock=clock, capacity=probe)
    live, _, _ = make(store=shared.store("live"), clock=clock)
    ours, _, _ = make(store=shared.store("ours"), clock=clock)
    await run(dead, issue(1))
    await run(dead, issue(2))
    await dead.finish(K2, normal=False, error="boom")  # attempt 1, due in 10 s
    probe.governing = True
    everything = [issue(1), issue(2), issue(3)]
    [reserving] = [c for c in await dead.eligible_issues(everything) if c.key == K3]
    await dead.claim(reserving)
    await run(live, issue(4))
    await dead.apply_update(K1, _usage_update(7))
    shared.stale.add("dead")  # declared dead, as the daemon does for a proven-dead owner
    report = await ours.take_over(["dead", "live", "ours"])
    assert report.taken_over_from == frozenset({"dead"})
    assert sorted(report.interrupted) == [K1, K3]
    assert report.restored_retries == (K2,)
    retries = ours.state.retry_attempts
    assert (retries[K2].attempt, retries[K2].error) == (1, "boom")
    assert retries[K2].due_at_ms == clock.monotonic_ms() + 10_000
    assert retries[K3].attempt == 1
    assert ours.state.usage_totals.total_tokens == 7
    assert shared.rows[SlotKey("i4#0")].owner == "live"
    assert await ours.take_over(["dead"]) == type(report)()  # nothing left: a no-op


def _usage_update(total: int) -> AgentUpdate:
    return AgentUpdate(event="u", usage=TokenUsage(total, 0, total))
