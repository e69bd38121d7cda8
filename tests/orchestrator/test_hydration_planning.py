"""The hydration rules as pure functions: each rule of recovery, without a store or a loop."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from lorenz.config import RetryBackoffSettings, TerminalAction
from lorenz.model import (
    BlockReason,
    ClaimPhase,
    ClaimRecord,
    RecoveredClaims,
    RetryKind,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
    TokenUsage,
    slot_key,
)
from lorenz.orchestrator.checkpoints import (
    blocked_to_checkpoint,
    checkpoint_retry_state,
    checkpoint_usage,
)
from lorenz.orchestrator.hydration import (
    plan_hydration,
    record_problem,
    recover_slots,
    retry_of_recovered,
    valid_records,
)
from lorenz.orchestrator.state import BlockedEntry
from lorenz.policies import retry_host

WALL = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)
NOW_MS = 1_000_000.0
BACKOFF = RetryBackoffSettings(initial_ms=10_000, multiplier=2, max_ms=300_000)


def row(
    issue: str, phase: ClaimPhase, *, owner: str = "a", index: int = 0, **fields: Any
) -> ClaimRecord:
    return ClaimRecord(
        slot_key=slot_key(issue, index),
        issue_id=issue,
        identifier=issue.upper(),
        slot_index=index,
        phase=phase,
        owner=owner,
        **fields,
    )


def test_a_row_whose_key_disagrees_with_its_issue_is_a_problem_never_recovered() -> None:
    good = row("i1", ClaimPhase.RUNNING)
    bad = ClaimRecord(
        slot_key=SlotKey("i2#0"),
        issue_id="i3",
        identifier="I3",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="a",
    )
    assert record_problem(good) is None
    problem = record_problem(bad)
    assert problem is not None
    assert "delete that claim row" in problem.message
    valid = valid_records([good, bad])
    assert list(valid.by_key) == [good.slot_key]
    assert len(valid.problems) == 1


def test_a_pending_retry_keeps_its_attempt_kind_and_wall_due_time_on_this_clock() -> None:
    record = row(
        "i1",
        ClaimPhase.RETRY_PENDING,
        attempt=4,
        retry_kind=RetryKind.CONTINUATION,
        due_at=WALL + datetime.timedelta(seconds=5),
        last_error="boom",
        host="h1",
    )
    retry = retry_of_recovered(
        record, previous_owner="x", now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
    )
    assert (retry.attempt, retry.kind, retry.error, retry.host) == (
        4,
        RetryKind.CONTINUATION,
        "boom",
        "h1",
    )
    assert retry.due_at_ms == NOW_MS + 5000.0
    assert retry.due_at == WALL + datetime.timedelta(seconds=5)


def test_a_stored_failure_comes_back_with_its_code_so_an_unreachable_host_is_avoided() -> None:
    """A claim row keeps a failure's text only; its code is read back at hydration, so the
    host choice after a restart is the one the live retry would have made."""
    unreachable = row(
        "i1",
        ClaimPhase.RETRY_PENDING,
        attempt=1,
        last_error="worker_host_unreachable: the worker host h1 could not be reached",
        host="h1",
    )
    crashed = row("i2", ClaimPhase.RETRY_PENDING, attempt=1, last_error="agent exited: 1",
                  host="h1")
    codes = [
        retry_of_recovered(r, previous_owner="x", now_ms=NOW_MS, wall=WALL, backoff=BACKOFF)
        for r in (unreachable, crashed)
    ]
    assert [c.error_code for c in codes] == ["worker_host_unreachable", None]
    assert [retry_host(c.host, error_code=c.error_code) for c in codes] == [None, "h1"]
    stored = dataclasses.replace(blocked("i3"), error="worker_host_unreachable: h1 is down")
    restore = checkpoint_retry_state(
        {"blocked": [blocked_to_checkpoint(stored)]},
        recovered={r.slot_key: r for r in (row("i3", ClaimPhase.RETRY_PENDING),)},
    )
    assert restore.blocked[slot_key("i3", 0)].error_code == "worker_host_unreachable"


def test_a_pending_retry_without_a_due_time_or_attempt_is_due_now_as_a_first_run() -> None:
    """No attempt (``0`` on a Claim) is a first run retried without counting (its worker never
    started): it comes back as that first run, not as attempt 1."""
    retry = retry_of_recovered(
        row("i1", ClaimPhase.RETRY_PENDING),
        previous_owner="x",
        now_ms=NOW_MS,
        wall=WALL,
        backoff=BACKOFF,
    )
    assert (retry.attempt, retry.kind, retry.due_at_ms) == (0, RetryKind.FAILURE, NOW_MS)
    assert retry.run_attempt is None


def test_a_run_lost_with_its_owner_is_a_failure_retry_with_the_next_attempt_and_backoff() -> None:
    for phase in (ClaimPhase.RUNNING, ClaimPhase.RESERVED):
        record = row("i1", phase, attempt=2, workspace_path="/w/i1")
        retry = retry_of_recovered(
            record, previous_owner="old-owner", now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
        )
        assert retry.kind is RetryKind.FAILURE
        assert retry.attempt == 3
        # attempt 3 -> the backoff's third step: 10 s * 2^(3-1)
        assert retry.due_at_ms == NOW_MS + 40_000
        assert retry.due_at == WALL + datetime.timedelta(seconds=40)
        assert retry.error == "interrupted: owner old-owner lost"
        assert retry.workspace_path == "/w/i1"


def test_recovered_slots_report_interrupted_and_restored_and_add_only_lost_runs_usage() -> None:
    rows = {
        r.slot_key: r
        for r in (
            row("run", ClaimPhase.RUNNING, usage=TokenUsage(1, 2, 3)),
            row("pend", ClaimPhase.RETRY_PENDING, index=2, usage=TokenUsage(100, 100, 200)),
            row("res", ClaimPhase.RESERVED, usage=TokenUsage(0, 1, 1)),
        )
    }
    owners = {slot_key("run", 0): "a", slot_key("pend", 2): "b", slot_key("res", 0): "c"}
    slots = recover_slots(
        rows, previous_owner=owners.__getitem__, now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
    )
    assert slots.interrupted == (slot_key("run", 0), slot_key("res", 0))
    assert slots.restored == (slot_key("pend", 2),)
    assert slots.usage == TokenUsage(1, 3, 4)
    assert slots.slot_span == 3
    assert set(slots.retries) == set(rows)
    assert slots.retries[slot_key("res", 0)].error == "interrupted: owner c lost"
    empty = recover_slots(
        {}, previous_owner=owners.__getitem__, now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
    )
    assert (empty.retries, empty.interrupted, empty.slot_span) == ({}, (), 0)


def test_checkpoint_usage_totals_are_read_or_refused_with_a_hint() -> None:
    totals = checkpoint_usage(
        {
            "usage_totals": {
                "input_tokens": 1,
                "output_tokens": 2,
                "total_tokens": 3,
                "seconds_running": 4.5,
                "cost_usd": 0.25,
            }
        }
    )
    assert not hasattr(totals, "message")
    assert (totals.input_tokens, totals.total_tokens, totals.seconds_running) == (1, 3, 4.5)  # type: ignore[union-attr]
    for bad in ({}, {"usage_totals": {"input_tokens": True}}, {"usage_totals": {"cost_usd": "x"}}):
        refused = checkpoint_usage(bad)
        assert "delete the checkpoint row" in refused.message  # type: ignore[union-attr]


def blocked(issue: str) -> BlockedEntry:
    return BlockedEntry(
        issue_id=issue,
        identifier=issue.upper(),
        slot_index=0,
        reason=BlockReason.RETRY_BUDGET_EXHAUSTED,
        error="e",
        failures=3,
        attempt=3,
        blocked_at=WALL,
        action=TerminalAction.BLOCK,
        action_key="k",
        action_done=False,
        action_error=None,
        issue_version=None,
        host=None,
        workspace_path=None,
    )


def test_streaks_come_back_for_recovered_slots_and_blocks_only_for_pending_retries() -> None:
    recovered = {
        r.slot_key: r
        for r in (row("pend", ClaimPhase.RETRY_PENDING), row("run", ClaimPhase.RUNNING))
    }
    checkpoint = {
        "failure_streaks": [
            {"slot_key": "pend#0", "failures": 2},
            {"slot_key": "run#0", "failures": 1},
            {"slot_key": "gone#0", "failures": 5},  # no row: stale, dropped
            {"slot_key": "zero#0", "failures": 0},
        ],
        "blocked": [blocked_to_checkpoint(blocked("pend")), blocked_to_checkpoint(blocked("run"))],
    }
    restore = checkpoint_retry_state(checkpoint, recovered=recovered)
    assert restore.failure_streaks == {slot_key("pend", 0): 2, slot_key("run", 0): 1}
    assert list(restore.blocked) == [slot_key("pend", 0)]  # a lost run is not blocked
    assert restore.blocked[slot_key("pend", 0)] == blocked("pend")
    assert restore.problem is None


def test_unreadable_retry_state_is_one_problem_and_the_readable_rest_still_counts() -> None:
    recovered = {r.slot_key: r for r in (row("pend", ClaimPhase.RETRY_PENDING),)}
    restore = checkpoint_retry_state(
        {
            "failure_streaks": [{"slot_key": "pend#0"}, {"slot_key": "pend#0", "failures": 2}],
            "blocked": [{"nonsense": 1}],
        },
        recovered=recovered,
    )
    assert restore.failure_streaks == {slot_key("pend", 0): 2}
    assert restore.blocked == {}
    assert restore.problem is not None
    assert "retry state" in restore.problem.message
    assert checkpoint_retry_state({"blocked": "x"}, recovered=recovered).problem is not None


def _intent(phase: SpawnPhase, *, last_seq: int = 7, placement: str | None = None) -> SpawnIntent:
    return SpawnIntent(
        handle="lzw-I1-s0-a2-g3-0123456789ab",
        phase=phase,
        generation=3,
        last_seq=last_seq,
        placement=placement,
    )


def test_a_lost_run_whose_worker_may_live_on_is_adopted_at_once_with_its_attempt_kept() -> None:
    intent = _intent(SpawnPhase.RUNNING, placement="build-1")
    record = row(
        "i1",
        ClaimPhase.RUNNING,
        attempt=2,
        intent=intent,
        usage=TokenUsage(input_tokens=5, output_tokens=5, total_tokens=10),
    )
    retry = retry_of_recovered(
        record, previous_owner="old", now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
    )
    assert (retry.kind, retry.attempt, retry.due_at_ms, retry.due_at) == (
        RetryKind.ADOPTION,
        2,
        NOW_MS,
        WALL,
    )
    assert retry.resume == intent
    assert retry.host == "build-1", "an adopted worker runs where it was started"
    slots = recover_slots(
        {record.slot_key: record},
        previous_owner=lambda key: "old",
        now_ms=NOW_MS,
        wall=WALL,
        backoff=BACKOFF,
    )
    assert (slots.adopting, slots.interrupted) == ((record.slot_key,), ())
    assert slots.usage == TokenUsage(), "the adopted run reports its usage again"


def test_every_unsettled_spawn_phase_is_probed_and_a_compensated_one_is_a_failure_retry() -> None:
    for phase in SpawnPhase:
        record = row("i1", ClaimPhase.RUNNING, attempt=None, intent=_intent(phase))
        retry = retry_of_recovered(
            record, previous_owner="old", now_ms=NOW_MS, wall=WALL, backoff=BACKOFF
        )
        if phase is SpawnPhase.COMPENSATED:
            assert (retry.kind, retry.attempt, retry.resume) == (RetryKind.FAILURE, 1, None)
            assert retry.due_at_ms == NOW_MS + 10_000
        else:
            assert (retry.kind, retry.attempt) == (RetryKind.ADOPTION, 0), phase
            assert retry.run_attempt is None, "a first run is adopted as a first run"
            assert retry.resume is not None
            assert retry.resume.phase is phase


def test_a_lost_run_without_an_intent_and_a_pending_retry_with_one_are_not_adopted() -> None:
    lost = row("i1", ClaimPhase.RESERVED, attempt=1)
    pending = row(
        "i2",
        ClaimPhase.RETRY_PENDING,
        attempt=3,
        retry_kind=RetryKind.FAILURE,
        due_at=WALL,
        intent=_intent(SpawnPhase.RUNNING),
    )
    slots = recover_slots(
        {lost.slot_key: lost, pending.slot_key: pending},
        previous_owner=lambda key: "old",
        now_ms=NOW_MS,
        wall=WALL,
        backoff=BACKOFF,
    )
    assert slots.adopting == ()
    assert slots.interrupted == (lost.slot_key,)
    assert slots.restored == (pending.slot_key,)
    assert all(retry.resume is None for retry in slots.retries.values())


def plan(
    rows: list[ClaimRecord],
    *,
    previous: dict[SlotKey, str] | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> Any:
    """The plan of ``rows``, the claims a store rebound to "me" (each taken from its
    ``previous`` owner, by default the owner the row names)."""
    recovered = RecoveredClaims(
        claims=rows,
        previous_owners=previous or {r.slot_key: r.owner for r in rows},
        checkpoint=checkpoint,
    )
    return plan_hydration(
        valid_records(rows),
        recovered=recovered,
        own="me",
        now_ms=NOW_MS,
        wall=WALL,
        backoff=BACKOFF,
    )


def malformed(*, owner: str) -> ClaimRecord:
    """A row whose slot key names another issue than the row's own."""
    return dataclasses.replace(row("y", ClaimPhase.RUNNING, owner=owner), slot_key=SlotKey("x#0"))


def test_the_plan_recovers_every_rebound_row_and_names_whom_it_took_over_from() -> None:
    dead = row("dead", ClaimPhase.RUNNING, owner="me", attempt=2)
    mine = row("mine", ClaimPhase.RETRY_PENDING, owner="me")
    result = plan([dead, mine], previous={dead.slot_key: "stale", mine.slot_key: "me"})
    assert set(result.slots.retries) == {slot_key("dead", 0), slot_key("mine", 0)}
    assert result.slots.interrupted == (slot_key("dead", 0),)
    assert result.slots.retries[slot_key("dead", 0)].attempt == 3
    assert result.slots.retries[slot_key("dead", 0)].error == "interrupted: owner stale lost"
    assert result.taken_over_from == {"stale", "me"}
    assert plan([]).taken_over_from == frozenset(), "nothing rebound: nobody"


def test_a_malformed_rebound_row_is_a_problem_never_recovered() -> None:
    bad = malformed(owner="me")
    result = plan([bad], previous={bad.slot_key: "stale"})
    assert result.slots.retries == {}
    assert [p.code for p in result.problems] == ["claim_record_invalid"]
    assert result.taken_over_from == frozenset()


def test_a_blocked_slot_from_the_checkpoint_replaces_its_recovered_retry() -> None:
    rows = [
        row("held", ClaimPhase.RETRY_PENDING, owner="me"),
        row("other", ClaimPhase.RETRY_PENDING, owner="me"),
    ]
    checkpoint = {
        "usage_totals": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11},
        "failure_streaks": [{"slot_key": slot_key("held", 0), "failures": 3}],
        "blocked": [blocked_to_checkpoint(blocked("held"))],
    }
    result = plan(rows, checkpoint=checkpoint)
    assert set(result.blocked) == {slot_key("held", 0)}
    assert set(result.slots.retries) == {slot_key("other", 0)}, "blocked: no retry of its own"
    assert result.failure_streaks == {slot_key("held", 0): 3}
    assert result.usage_totals is not None
    assert result.usage_totals.total_tokens == 11
    assert result.problems == ()


def test_an_unreadable_checkpoint_is_a_problem_and_leaves_the_totals_unset() -> None:
    result = plan([malformed(owner="me")], checkpoint={"usage_totals": "lots", "blocked": "nope"})
    assert result.usage_totals is None
    assert len(result.problems) == 3, "the row, the totals and the retry state: one each"
