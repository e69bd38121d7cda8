"""The continuation limit (``lorenz.policies.continuations``, ``agent.max_continuation_runs``):
as pure rules, and as the orchestrator applies them on every host — clean runs in a row are
counted per slot, and past the limit a clean exit blocks the slot instead of running it again."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from lorenz.claims import MemoryClaimStore
from lorenz.config import TerminalAction
from lorenz.model import BlockReason, ManualClock, RetryKind, SlotKey
from lorenz.orchestrator import Finished, Orchestrator
from lorenz.policies import DEFAULT_MAX_CONTINUATION_RUNS
from lorenz.policies.continuations import continuation_limit_reached, next_continuation_streak
from lorenz.policies.retries import escalation_body, settle_decision
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import EPOCH, issue, make, settings

K1 = SlotKey("i1#0")


def test_the_streak_counts_clean_runs_and_anything_else_resets_it() -> None:
    assert next_continuation_streak(0, kind=RetryKind.CONTINUATION) == 1
    assert next_continuation_streak(4, kind=RetryKind.CONTINUATION) == 5
    for kind in (RetryKind.FAILURE, RetryKind.ADOPTION, RetryKind.PLACEMENT, None):
        assert next_continuation_streak(4, kind=kind) == 0


def test_the_limit_holds_after_the_first_run_and_limit_re_runs() -> None:
    assert not continuation_limit_reached(3, limit=3)
    assert continuation_limit_reached(4, limit=3)
    assert not continuation_limit_reached(10**6, limit=0)


def test_the_default_is_the_settings_default() -> None:
    assert settings().agent.max_continuation_runs == DEFAULT_MAX_CONTINUATION_RUNS == 10


def test_a_clean_exit_past_the_limit_is_blocked_and_escalated_only_when_configured() -> None:
    retry = settings(retry={"terminal_action": "cancel", "cancel_state": "Cancelled"}).retry
    under = settle_decision(normal=True, failure_code=None, previous_attempt=1,
                            previous_failures=0, retry=retry, previous_continuations=1,
                            max_continuation_runs=2)
    assert (under.kind, under.blocked, under.continuations) == (RetryKind.CONTINUATION, None, 2)
    over = settle_decision(normal=True, failure_code=None, previous_attempt=1,
                           previous_failures=0, retry=retry, previous_continuations=2,
                           max_continuation_runs=2)
    assert (over.kind, over.blocked, over.action) == (
        None, BlockReason.CONTINUATION_LIMIT, TerminalAction.BLOCK,
    )
    escalating = retry.model_copy(update={"terminal_action": TerminalAction.ESCALATE})
    escalated = settle_decision(normal=True, failure_code=None, previous_attempt=1,
                                previous_failures=0, retry=escalating,
                                previous_continuations=2, max_continuation_runs=2)
    assert escalated.action is TerminalAction.ESCALATE


def test_the_escalation_says_what_to_do() -> None:
    body = escalation_body(identifier="ABC-1", reason=BlockReason.CONTINUATION_LIMIT,
                           failures=0, detail=None)
    assert "ABC-1" in body
    assert "agent.max_continuation_runs" in body


async def _clean_run(orchestrator: Orchestrator, clock: ManualClock) -> Finished:
    await run(orchestrator, issue(1))
    finished = await orchestrator.finish(K1, normal=True)
    assert finished is not None
    clock.advance(1000)
    return finished


async def test_the_orchestrator_blocks_the_slot_after_limit_continuations() -> None:
    orchestrator, store, clock = make(config=settings(agent={"max_continuation_runs": 2}))
    for streak in (1, 2):
        finished = await _clean_run(orchestrator, clock)
        assert finished.retry is not None
        assert finished.retry.kind is RetryKind.CONTINUATION
        assert orchestrator.state.continuation_streaks[K1] == streak
    finished = await _clean_run(orchestrator, clock)
    assert finished.retry is None
    blocked = finished.blocked
    assert blocked is not None
    assert (blocked.reason, blocked.failures, blocked.action) == (
        BlockReason.CONTINUATION_LIMIT, 0, TerminalAction.BLOCK,
    )
    assert K1 not in orchestrator.state.continuation_streaks
    clock.advance(10**9)
    assert await orchestrator.eligible_issues([issue(1)]) == []
    assert orchestrator.snapshot().to_dict()["blocked"][0]["reason"] == "continuation_limit"
    # The checkpoint keeps the block (a restart does not run the slot again), in its old form.
    checkpoint = (await store.load()).checkpoint
    assert checkpoint is not None
    assert [b["reason"] for b in checkpoint["blocked"]] == ["continuation_limit"]
    assert set(checkpoint) == {"schema", "usage_totals", "blocked"}


async def test_a_change_of_the_issue_runs_it_again_as_a_continuation_with_a_fresh_count() -> (
    None
):
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 1}))
    await _clean_run(orchestrator, clock)
    assert (await _clean_run(orchestrator, clock)).blocked is not None
    seen = dataclasses.replace(issue(1), updated_at=EPOCH)
    assert await orchestrator.eligible_issues([seen]) == []
    changed = dataclasses.replace(seen, updated_at=EPOCH + datetime.timedelta(minutes=1))
    candidates = await orchestrator.eligible_issues([changed])
    assert [c.key for c in candidates] == [K1]
    assert candidates[0].retry is not None
    assert candidates[0].retry.kind is RetryKind.CONTINUATION
    assert (await _clean_run(orchestrator, clock)).blocked is None  # the count starts again


async def test_a_failure_between_clean_runs_starts_the_count_again() -> None:
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 2}))
    for _ in range(3):
        await _clean_run(orchestrator, clock)
        await _clean_run(orchestrator, clock)
        await run(orchestrator, issue(1))
        failed = await orchestrator.finish(K1, normal=False, error="boom")
        assert failed is not None
        assert failed.blocked is None
        assert K1 not in orchestrator.state.continuation_streaks
        clock.advance(10**7)


@pytest.mark.parametrize("how", ["cleanup", "release_slot", "prune"])
async def test_the_issue_leaving_or_the_slot_released_starts_the_count_again(how: str) -> None:
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 1}))
    await _clean_run(orchestrator, clock)
    assert orchestrator.state.continuation_streaks[K1] == 1
    if how == "cleanup":
        await orchestrator.cleanup_issue("i1")
    elif how == "release_slot":
        await orchestrator.release_slot(K1)
    else:
        assert await orchestrator.eligible_issues([issue(1, state="Done")]) == []
    assert K1 not in orchestrator.state.continuation_streaks
    assert (await _clean_run(orchestrator, clock)).blocked is None


async def test_zero_never_blocks() -> None:
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 0}))
    for _ in range(DEFAULT_MAX_CONTINUATION_RUNS + 5):
        assert (await _clean_run(orchestrator, clock)).blocked is None


async def test_a_reload_applies_the_new_limit_to_the_running_count() -> None:
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 5}))
    for _ in range(3):
        await _clean_run(orchestrator, clock)
    orchestrator.update_settings(settings(agent={"max_continuation_runs": 2}))
    assert (await _clean_run(orchestrator, clock)).blocked is not None


async def test_a_shutdown_neither_counts_nor_blocks() -> None:
    orchestrator, _, clock = make(config=settings(agent={"max_continuation_runs": 1}))
    await _clean_run(orchestrator, clock)
    for _ in range(3):
        await run(orchestrator, issue(1))
        stopped = await orchestrator.finish(K1, normal=True, count_continuation=False)
        assert stopped is not None
        assert stopped.blocked is None
        assert stopped.retry is not None
        assert stopped.retry.kind is RetryKind.CONTINUATION
        assert orchestrator.state.continuation_streaks[K1] == 1
        clock.advance(1000)
    assert (await _clean_run(orchestrator, clock)).blocked is not None


async def test_a_continuation_limit_block_survives_a_restart_and_the_count_does_not() -> None:
    store = MemoryClaimStore(owner="me")
    clock = ManualClock()
    config = settings(agent={"max_continuation_runs": 1})
    first = Orchestrator(settings=config, store=store, clock=clock)
    await _clean_run(first, clock)
    blocked = (await _clean_run(first, clock)).blocked
    assert blocked is not None
    await run(first, issue(2))
    await first.finish(SlotKey("i2#0"), normal=True)  # one clean run: a count of 1

    second = Orchestrator(settings=config, store=store, clock=ManualClock())
    report = await second.hydrate()
    assert report.problems == ()
    assert second.state.blocked[K1] == blocked
    assert K1 not in second.state.retry_attempts
    assert second.state.continuation_streaks == {}  # memory only: counted afresh
