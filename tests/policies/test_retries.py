"""The retry budget as pure rules (``lorenz.policies.retries``) and as the orchestrator keeps
it: consecutive failures only, continuations free, input requests blocked at once, blocked
slots out of dispatch until a refresh or a change of their issue, and all of it back after a
restart from the claim store's rows and checkpoint."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from lorenz.claims import MemoryClaimStore
from lorenz.codes import ErrorCode
from lorenz.config import RetrySettings, TerminalAction
from lorenz.model import BlockReason, ClaimPhase, ManualClock, RetryKind, SlotKey
from lorenz.orchestrator import Finished, Orchestrator
from lorenz.policies import failure_backoff_ms
from lorenz.policies.retries import (
    INFRASTRUCTURE_CODES,
    escalation_body,
    issue_version,
    settle_decision,
    terminal_action_key,
)
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import EPOCH, issue, make, settings

K1 = SlotKey("i1#0")


async def _checkpoint(store: MemoryClaimStore) -> dict[str, Any]:
    checkpoint = (await store.load()).checkpoint
    assert checkpoint is not None
    return dict(checkpoint)


def _retry(**data: object) -> RetrySettings:
    return RetrySettings.model_validate(data)


# -- pure rules ---------------------------------------------------------------------------------


def test_default_backoff_is_ten_seconds_doubling_capped_at_five_minutes() -> None:
    delays = [failure_backoff_ms(n, max_backoff_ms=300000) for n in range(1, 8)]
    assert delays == [10000, 20000, 40000, 80000, 160000, 300000, 300000]


def test_the_seed_profile_is_sixty_seconds_times_five() -> None:
    delays = [
        failure_backoff_ms(n, max_backoff_ms=3600000, initial_ms=60000, multiplier=5)
        for n in range(1, 5)
    ]
    assert delays == [60000, 300000, 1500000, 3600000]


def test_a_huge_attempt_number_stays_cheap_and_capped() -> None:
    assert failure_backoff_ms(10**9, max_backoff_ms=7, initial_ms=5, multiplier=100) == 7
    assert failure_backoff_ms(10**9, max_backoff_ms=10**30, multiplier=1) == 10000


def test_failures_count_up_to_the_budget_then_the_terminal_action() -> None:
    retry = _retry(max_attempts=3, terminal_action="escalate")
    first = settle_decision(normal=False, failure_code="turn_failed", previous_attempt=None,
                            previous_failures=0, retry=retry)
    assert (first.kind, first.attempt, first.delay_ms, first.failures) == (
        RetryKind.FAILURE, 1, 10000, 1,
    )
    second = settle_decision(normal=False, failure_code="turn_failed", previous_attempt=1,
                             previous_failures=1, retry=retry)
    assert (second.kind, second.failures, second.blocked) == (RetryKind.FAILURE, 2, None)
    third = settle_decision(normal=False, failure_code="turn_failed", previous_attempt=2,
                            previous_failures=2, retry=retry)
    assert third.kind is None
    assert third.blocked is BlockReason.RETRY_BUDGET_EXHAUSTED
    assert third.action is TerminalAction.ESCALATE
    assert (third.failures, third.attempt) == (3, 3)


def test_a_budget_of_one_stops_at_the_first_failure() -> None:
    decision = settle_decision(normal=False, failure_code=None, previous_attempt=None,
                               previous_failures=0, retry=_retry(max_attempts=1))
    assert decision.blocked is BlockReason.RETRY_BUDGET_EXHAUSTED
    assert decision.action is TerminalAction.BLOCK


def test_a_clean_exit_is_a_continuation_and_resets_the_count() -> None:
    decision = settle_decision(normal=True, failure_code=None, previous_attempt=2,
                               previous_failures=2, retry=_retry(max_attempts=3))
    assert (decision.kind, decision.attempt, decision.delay_ms, decision.failures) == (
        RetryKind.CONTINUATION, 1, 1000, 0,
    )
    assert decision.blocked is None


def test_an_input_request_blocks_at_once_and_is_never_cancelled() -> None:
    for code, reason in (("input_required", BlockReason.INPUT_REQUIRED),
                         ("approval_required", BlockReason.APPROVAL_REQUIRED)):
        decision = settle_decision(
            normal=False, failure_code=code, previous_attempt=None, previous_failures=0,
            retry=_retry(max_attempts=100, terminal_action="cancel", cancel_state="Cancelled"),
        )
        assert decision.blocked is reason
        assert decision.action is TerminalAction.BLOCK
    escalated = settle_decision(normal=False, failure_code="input_required",
                                previous_attempt=None, previous_failures=0,
                                retry=_retry(terminal_action="escalate"))
    assert escalated.action is TerminalAction.ESCALATE


def test_an_infrastructure_failure_is_retried_but_never_spends_the_budget() -> None:
    """A full or read-only worker state root, a stopped launcher or another live controller's
    worker fail the run with a host-side code: the slot is retried with a growing backoff, its
    failure streak does not move, and the terminal action never comes (issue #32 point 2)."""
    retry = _retry(max_attempts=1, terminal_action="cancel", cancel_state="Cancelled")
    previous_attempt: int | None = None
    delays = []
    for _ in range(6):
        for code in sorted(INFRASTRUCTURE_CODES):
            decision = settle_decision(normal=False, failure_code=code,
                                       previous_attempt=previous_attempt, previous_failures=0,
                                       retry=retry)
            assert decision.blocked is None, code
            assert decision.action is None, code
            assert (decision.kind, decision.failures) == (RetryKind.FAILURE, 0), code
        previous_attempt = decision.attempt
        delays.append(decision.delay_ms)
    assert delays == sorted(delays)
    assert delays[-1] > delays[0]
    # The same budget of one is spent at once by an agent's own failure.
    agent = settle_decision(normal=False, failure_code="turn_failed", previous_attempt=None,
                            previous_failures=0, retry=retry)
    assert agent.blocked is BlockReason.RETRY_BUDGET_EXHAUSTED
    assert agent.action is TerminalAction.CANCEL


def test_the_infrastructure_codes_are_registered_codes() -> None:
    registered = {code.value for code in ErrorCode}
    assert INFRASTRUCTURE_CODES - registered == set()


def test_the_action_key_is_deterministic_and_per_block() -> None:
    at = EPOCH
    key = terminal_action_key(issue_id="i1", slot_index=0, blocked_at=at,
                              reason=BlockReason.RETRY_BUDGET_EXHAUSTED)
    again = terminal_action_key(issue_id="i1", slot_index=0, blocked_at=at,
                                reason=BlockReason.RETRY_BUDGET_EXHAUSTED)
    later = terminal_action_key(issue_id="i1", slot_index=0,
                                blocked_at=at + datetime.timedelta(seconds=1),
                                reason=BlockReason.RETRY_BUDGET_EXHAUSTED)
    other_slot = terminal_action_key(issue_id="i1", slot_index=1, blocked_at=at,
                                     reason=BlockReason.RETRY_BUDGET_EXHAUSTED)
    assert key == again
    assert len({key, later, other_slot}) == 3
    assert key.startswith("lz-")


def test_the_escalation_quotes_the_question_bounded() -> None:
    body = escalation_body(identifier="ABC-1", reason=BlockReason.INPUT_REQUIRED, failures=1,
                           detail="Which branch?\nmain or dev")
    assert "ABC-1" in body
    assert "> Which branch?\n> main or dev" in body
    long = escalation_body(identifier="ABC-1", reason=BlockReason.RETRY_BUDGET_EXHAUSTED,
                           failures=3, detail="x" * 10000)
    assert len(long) < 2300
    assert "3 consecutive failed runs" in long


def test_issue_version_follows_updated_at_else_content() -> None:
    plain = issue(1)
    assert issue_version(plain) == issue_version(dataclasses.replace(plain))
    assert issue_version(plain) != issue_version(dataclasses.replace(plain, state="In Progress"))
    stamped = dataclasses.replace(plain, updated_at=EPOCH)
    assert issue_version(stamped) == EPOCH.isoformat()
    assert issue_version(stamped) != issue_version(
        dataclasses.replace(plain, updated_at=EPOCH + datetime.timedelta(seconds=1))
    )


# -- the orchestrator keeps the budget ---------------------------------------------------------


async def _fail(orchestrator: Orchestrator, clock: ManualClock, *, code: str | None = None,
                error: str = "boom") -> Finished:
    await run(orchestrator, issue(1))
    finished = await orchestrator.finish(K1, normal=False, error=error, failure_code=code)
    assert finished is not None
    retry = orchestrator.state.retry_attempts.get(K1)
    if retry is not None:
        clock.advance(retry.due_at_ms - clock.monotonic_ms())
    return finished


async def test_three_consecutive_failures_block_the_slot() -> None:
    orchestrator, store, clock = make()
    await _fail(orchestrator, clock)
    await _fail(orchestrator, clock)
    assert orchestrator.state.failure_streaks[K1] == 2
    finished = await _fail(orchestrator, clock, error="still broken")
    blocked = finished.blocked
    assert blocked is not None
    assert finished.retry is None
    assert (blocked.reason, blocked.failures, blocked.attempt, blocked.error) == (
        BlockReason.RETRY_BUDGET_EXHAUSTED, 3, 3, "still broken",
    )
    assert blocked.action is TerminalAction.BLOCK
    assert blocked.action_done
    assert K1 not in orchestrator.state.retry_attempts
    assert K1 not in orchestrator.state.claimed
    # The row keeps the slot ours; the checkpoint says why it waits.
    assert store.claims[K1].phase is ClaimPhase.RETRY_PENDING
    assert [b["slot_key"] for b in (await _checkpoint(store))["blocked"]] == [K1]
    # Never a candidate again by itself, however long one waits.
    clock.advance(10**9)
    assert await orchestrator.eligible_issues([issue(1)]) == []
    row = orchestrator.snapshot().to_dict()["blocked"][0]
    assert (row["identifier"], row["reason"], row["failures"], row["error"]) == (
        "ABC-1", "retry_budget_exhausted", 3, "still broken",
    )


async def test_continuations_do_not_consume_the_budget() -> None:
    orchestrator, _, clock = make(config=settings(retry={"max_attempts": 2}))
    for _ in range(5):
        await _fail(orchestrator, clock)
        assert orchestrator.state.blocked == {}
        await run(orchestrator, issue(1))
        await orchestrator.finish(K1, normal=True)
        clock.advance(1000)
        assert K1 not in orchestrator.state.failure_streaks
    finished = await _fail(orchestrator, clock)
    assert finished.blocked is None
    finished = await _fail(orchestrator, clock)
    assert finished.blocked is not None


async def test_an_input_request_blocks_with_its_question() -> None:
    orchestrator, _, clock = make()
    finished = await _fail(orchestrator, clock, code="input_required",
                           error="the agent asked: which database?")
    blocked = finished.blocked
    assert blocked is not None
    assert blocked.reason is BlockReason.INPUT_REQUIRED
    assert orchestrator.snapshot().blocked[0].error == "the agent asked: which database?"


async def test_a_refresh_unblocks_with_a_fresh_budget() -> None:
    orchestrator, store, clock = make(config=settings(retry={"max_attempts": 1}))
    await _fail(orchestrator, clock)
    assert orchestrator.state.blocked
    unblocked = await orchestrator.unblock()
    assert [b.key for b in unblocked] == [K1]
    assert orchestrator.state.blocked == {}
    assert K1 not in orchestrator.state.failure_streaks
    candidates = await orchestrator.eligible_issues([issue(1)])
    assert [c.key for c in candidates] == [K1]
    assert candidates[0].retry is not None
    assert candidates[0].retry.attempt == 1
    assert "blocked" not in await _checkpoint(store)


async def test_a_change_of_the_issue_unblocks_but_its_first_sighting_does_not() -> None:
    orchestrator, _, clock = make(config=settings(retry={"max_attempts": 1}))
    await _fail(orchestrator, clock)
    seen = dataclasses.replace(issue(1), updated_at=EPOCH)
    assert await orchestrator.eligible_issues([seen]) == []  # baseline noted (our own writes)
    assert await orchestrator.eligible_issues([seen]) == []
    changed = dataclasses.replace(seen, updated_at=EPOCH + datetime.timedelta(minutes=1))
    candidates = await orchestrator.eligible_issues([changed])
    assert [c.key for c in candidates] == [K1]
    assert [b.key for b in orchestrator.last_eligibility.unblocked] == [K1]


async def test_a_pending_action_waits_for_its_receipt_before_the_baseline() -> None:
    orchestrator, _, clock = make(
        config=settings(retry={"max_attempts": 1, "terminal_action": "escalate"})
    )
    finished = await _fail(orchestrator, clock)
    blocked = finished.blocked
    assert blocked is not None
    assert not blocked.action_done
    assert orchestrator.pending_terminal_actions() == (blocked,)
    v1 = dataclasses.replace(issue(1), updated_at=EPOCH)
    assert await orchestrator.eligible_issues([v1]) == []
    assert blocked.issue_version is None
    # A stale receipt (another block's key) changes nothing.
    assert await orchestrator.record_terminal_action(K1, action_key="lz-old", error=None) is None
    await orchestrator.record_terminal_action(K1, action_key=blocked.action_key, error=None)
    assert orchestrator.pending_terminal_actions() == ()
    # Our escalation moved updated_at: the first sighting after the receipt is the baseline.
    v2 = dataclasses.replace(v1, updated_at=EPOCH + datetime.timedelta(seconds=5))
    assert await orchestrator.eligible_issues([v2]) == []
    assert blocked.issue_version == issue_version(v2)


async def test_a_blocked_issue_that_leaves_the_active_states_is_released() -> None:
    orchestrator, store, clock = make(config=settings(retry={"max_attempts": 1}))
    await _fail(orchestrator, clock)
    assert await orchestrator.eligible_issues([issue(1, state="Done")]) == []
    assert orchestrator.state.blocked == {}
    assert K1 not in store.claims
    assert [b.key for b in orchestrator.last_eligibility.released_blocked] == [K1]


async def test_cleanup_forgets_blocked_slots() -> None:
    orchestrator, store, clock = make(config=settings(retry={"max_attempts": 1}))
    await _fail(orchestrator, clock)
    await orchestrator.cleanup_issue("i1")
    assert orchestrator.state.blocked == {}
    assert K1 not in store.claims
    assert "blocked" not in await _checkpoint(store)


async def test_blocked_state_and_failure_counts_survive_a_restart() -> None:
    store = MemoryClaimStore(owner="me")
    clock = ManualClock()
    config = settings(retry={"max_attempts": 2, "terminal_action": "escalate"})
    first = Orchestrator(settings=config, store=store, clock=clock)
    await _fail(first, clock)
    await run(first, issue(2))
    await first.finish(SlotKey("i2#0"), normal=False, error="once")
    await run(first, issue(1))
    await first.finish(K1, normal=False, error="twice")
    blocked = first.state.blocked[K1]

    later = ManualClock()
    second = Orchestrator(settings=config, store=store, clock=later)
    report = await second.hydrate()
    assert report.problems == ()
    restored = second.state.blocked[K1]
    assert restored == blocked
    assert K1 not in second.state.retry_attempts
    assert second.pending_terminal_actions() == (restored,)
    assert second.state.failure_streaks == {SlotKey("i2#0"): 1}
    # The second slot's next failure uses up its budget of two, as before the restart.
    retry = second.state.retry_attempts[SlotKey("i2#0")]
    later.advance(retry.due_at_ms - later.monotonic_ms())
    await run(second, issue(2))
    finished = await second.finish(SlotKey("i2#0"), normal=False)
    assert finished is not None
    assert finished.blocked is not None


async def test_an_unreadable_checkpoint_entry_is_reported_and_the_slot_retries() -> None:
    store = MemoryClaimStore(owner="me")
    clock = ManualClock()
    first = Orchestrator(settings=settings(retry={"max_attempts": 1}), store=store, clock=clock)
    await _fail(first, clock)
    checkpoint = dict(await _checkpoint(store))
    checkpoint["blocked"] = [{"slot_key": K1, "issue_id": 7}]
    await store.save_checkpoint(checkpoint)
    second = Orchestrator(settings=settings(), store=store, clock=ManualClock())
    report = await second.hydrate()
    assert [p.code for p in report.problems] == ["claim_checkpoint_invalid"]
    assert second.state.blocked == {}
    assert K1 in second.state.retry_attempts


def test_a_run_stopped_at_a_spend_cap_is_blocked_with_the_budgets_action() -> None:
    """``budget_exhausted`` is never retried, whatever ``retry.max_attempts`` leaves, and its
    terminal action is ``budget.on_exhausted`` (here escalate), not ``retry.terminal_action``."""
    decision = settle_decision(
        normal=False, failure_code="budget_exhausted", previous_attempt=None,
        previous_failures=0, retry=RetrySettings(max_attempts=5),
        on_budget_exhausted=TerminalAction.ESCALATE,
    )
    assert decision.blocked is BlockReason.BUDGET_EXHAUSTED
    assert decision.action is TerminalAction.ESCALATE
    assert decision.kind is None
    body = escalation_body(identifier="ABC-1", reason=BlockReason.BUDGET_EXHAUSTED, failures=1,
                           detail="spend cap reached: budget.max_usd_per_issue 5 USD")
    assert body.startswith("Lorenz stopped the agent working on ABC-1: it reached a spend cap")
    assert body.endswith("> spend cap reached: budget.max_usd_per_issue 5 USD")


async def test_the_orchestrator_blocks_a_capped_run_with_budget_on_exhausted() -> None:
    orchestrator, _, clock = make(config=settings(
        retry={"terminal_action": "escalate"}, budget={"on_exhausted": "block"},
    ))
    finished = await _fail(orchestrator, clock, code="budget_exhausted",
                           error="budget_exhausted: spend cap reached")
    blocked = finished.blocked
    assert blocked is not None
    assert blocked.reason is BlockReason.BUDGET_EXHAUSTED
    assert blocked.action is TerminalAction.BLOCK
    assert blocked.action_done  # block: nothing to apply
    assert K1 not in orchestrator.state.retry_attempts
