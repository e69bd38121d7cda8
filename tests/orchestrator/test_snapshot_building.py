"""Snapshot building as pure functions: the lanes of a hand-made state at two clock readings.

No orchestrator, no store, no runtime: :func:`orchestrator_snapshot` reads an
:class:`OrchestratorState` and the time, and nothing else.
"""

from __future__ import annotations

import datetime

from lorenz.model import (
    Issue,
    ReservationRecord,
    RetryEntry,
    RetryKind,
    RunningEntry,
    SlotKey,
    TokenUsage,
    UsageTotals,
)
from lorenz.orchestrator import ForeignClaim, OrchestratorState
from lorenz.orchestrator.snapshots import orchestrator_snapshot, totals_with_running

WALL = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
NOW_MS = 100_000.0


def _issue(n: int) -> Issue:
    return Issue(id=f"i{n}", identifier=f"T-{n}", title=f"Issue {n}", state="Todo")


def _state() -> OrchestratorState:
    state = OrchestratorState(usage_totals=UsageTotals(input_tokens=5, seconds_running=1.0))
    state.running[SlotKey("i1#0")] = RunningEntry(
        issue=_issue(1), slot_index=0, attempt=None, started_at_ms=NOW_MS - 2500,
        started_at=WALL - datetime.timedelta(milliseconds=2500), host="h1",
        usage=TokenUsage(10, 4, 14), cost_usd=0.25, retry_kind=RetryKind.FAILURE,
    )
    state.reserved[SlotKey("i2#0")] = ReservationRecord(
        issue=_issue(2), slot_index=0, token="tok", attempt=2, reserved_at_ms=NOW_MS - 1000,
        expires_at_ms=NOW_MS + 60_000, reserved_at=WALL - datetime.timedelta(seconds=1),
    )
    for n, due_in in ((3, 9000.0), (4, -50.0)):
        state.retry_attempts[SlotKey(f"i{n}#0")] = RetryEntry(
            issue_id=f"i{n}", identifier=f"T-{n}", slot_index=0, attempt=1,
            kind=RetryKind.FAILURE, due_at_ms=NOW_MS + due_in,
            due_at=WALL + datetime.timedelta(milliseconds=due_in), error="boom",
        )
    state.foreign[SlotKey("i5#0")] = ForeignClaim(owner="other", recheck_at_ms=NOW_MS + 1)
    state.foreign[SlotKey("i6#0")] = ForeignClaim(owner=None, recheck_at_ms=NOW_MS - 1)
    state.rate_limits = {"primary": {"used_percent": 12}}
    return state


def test_lanes_rows_and_countdowns_come_from_the_state_and_the_clock() -> None:
    snapshot = orchestrator_snapshot(_state(), now_ms=NOW_MS, wall=WALL)

    assert snapshot.generated_at == WALL
    [running] = snapshot.running
    assert (running.slot_key, running.identifier, running.host) == ("i1#0", "T-1", "h1")
    assert running.runtime_seconds == 2.5
    assert running.retry_kind == "failure"
    [reserving] = snapshot.reserving
    assert reserving.expires_in_ms == 60_000
    assert reserving.expires_at == WALL + datetime.timedelta(minutes=1)
    # Retries: the next one due first; one already due counts down to 0, never below.
    assert [(r.slot_key, r.due_in_ms) for r in snapshot.retrying] == [
        ("i4#0", 0.0), ("i3#0", 9000.0)
    ]
    assert snapshot.blocked == ()
    # Only foreign claims not yet due for a recheck are shown as held elsewhere.
    assert snapshot.claimed_elsewhere == ("i5#0",)
    assert snapshot.rate_limits == {"primary": {"used_percent": 12}}
    # Totals: ended runs plus the run still going (tokens, cost, elapsed time).
    assert snapshot.usage_totals == UsageTotals(
        input_tokens=15, output_tokens=4, total_tokens=14, seconds_running=3.5, cost_usd=0.25
    )


def test_a_later_clock_reading_moves_the_countdowns_and_nothing_else() -> None:
    state = _state()
    before = orchestrator_snapshot(state, now_ms=NOW_MS, wall=WALL)
    later = orchestrator_snapshot(
        state, now_ms=NOW_MS + 1000, wall=WALL + datetime.timedelta(seconds=1)
    )

    assert later.running[0].runtime_seconds == before.running[0].runtime_seconds + 1
    assert later.reserving[0].expires_in_ms == before.reserving[0].expires_in_ms - 1000
    assert later.reserving[0].expires_at == before.reserving[0].expires_at
    assert later.claimed_elsewhere == ()  # i5's recheck time has come
    assert state.running[SlotKey("i1#0")].usage == TokenUsage(10, 4, 14)  # state untouched


def test_an_empty_state_is_empty_lanes_and_its_own_totals() -> None:
    totals = UsageTotals(input_tokens=1, cost_usd=0.5)
    snapshot = orchestrator_snapshot(
        OrchestratorState(usage_totals=totals), now_ms=NOW_MS, wall=WALL
    )

    assert (snapshot.running, snapshot.reserving, snapshot.retrying) == ((), (), ())
    assert snapshot.usage_totals == totals
    assert totals_with_running(totals, ()) == totals
    assert snapshot.to_dict()["usage_totals"] == totals.to_dict()
