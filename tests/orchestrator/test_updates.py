"""Agent progress: last event, sessions and turns, token and cost deltas, rate limits."""

from __future__ import annotations

import dataclasses
import datetime

from lorenz.model import AgentUpdate, SlotKey, TokenUsage, UsageTotals
from tests.orchestrator.claims_helpers import retry_of, run
from tests.orchestrator.factories import SharedClaims, issue, make

K1 = SlotKey("i1#0")


def usage(total: int, *, inp: int | None = None, out: int = 0) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp if inp is not None else total, output_tokens=out, total_tokens=total
    )


async def test_last_event_message_and_timestamp() -> None:
    orchestrator, _, clock = make()
    await run(orchestrator, issue(1))
    clock.advance(100)
    await orchestrator.apply_update(K1, AgentUpdate(event="notification", message="hello"))
    entry = orchestrator.state.running[K1]
    assert entry.last_agent_event == "notification"
    assert entry.last_agent_message == "hello"
    assert entry.last_agent_timestamp_ms == clock.monotonic_ms()
    assert entry.last_agent_at == clock.now()
    # an explicit (earlier) event time is used as given, wall time derived from it
    clock.advance(50)
    await orchestrator.apply_update(
        K1, AgentUpdate(event="later", timestamp_ms=clock.monotonic_ms() - 20)
    )
    assert entry.last_agent_timestamp_ms == clock.monotonic_ms() - 20
    assert entry.last_agent_at == clock.now() - datetime.timedelta(milliseconds=20)
    assert entry.last_agent_message == "hello"  # no message: the last one stays


async def test_an_out_of_order_older_event_does_not_move_activity_back() -> None:
    orchestrator, _, clock = make()
    await run(orchestrator, issue(1))
    clock.advance(100)
    await orchestrator.apply_update(K1, AgentUpdate(event="new"))
    await orchestrator.apply_update(
        K1, AgentUpdate(event="old", timestamp_ms=clock.monotonic_ms() - 90)
    )
    entry = orchestrator.state.running[K1]
    assert entry.last_agent_event == "new"
    assert entry.last_agent_timestamp_ms == clock.monotonic_ms()


async def test_a_new_session_id_counts_a_turn_and_a_repeat_does_not() -> None:
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    for sid in ("s1", "s1", None, "s2", "s2", "s3"):
        await orchestrator.apply_update(K1, AgentUpdate(event="session_started", session_id=sid))
    entry = orchestrator.state.running[K1]
    assert entry.turn_count == 3
    assert entry.session_id == "s3"


async def test_running_totals_become_deltas_without_double_counting() -> None:
    """TOK-04: monotonic totals accumulate; repeats and lower values add nothing."""
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    for reported in (10, 25, 25, 20, 40):
        await orchestrator.apply_update(K1, AgentUpdate(event="usage", usage=usage(reported)))
    entry = orchestrator.state.running[K1]
    assert entry.usage == usage(40)
    assert entry.last_reported == usage(40)
    snapshot = orchestrator.snapshot()
    assert snapshot.usage_totals.total_tokens == 40  # live usage is in the snapshot totals


async def test_thread_totals_continue_across_turns() -> None:
    """Codex reports thread totals while each turn has a new session id: count once."""
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    await orchestrator.apply_update(K1, AgentUpdate(event="s", session_id="t-1", usage=usage(100)))
    await orchestrator.apply_update(K1, AgentUpdate(event="s", session_id="t-2"))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(150)))
    assert orchestrator.state.running[K1].usage == usage(150)


async def test_a_fresh_per_session_counter_counts_from_zero() -> None:
    """A new session whose first totals are lower than the last report is a new counter."""
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", session_id="a", usage=usage(100)))
    await orchestrator.apply_update(K1, AgentUpdate(event="s", session_id="b"))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(30)))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(45)))
    # without a session change a drop is just an out-of-order report
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(10)))
    assert orchestrator.state.running[K1].usage == usage(145)


async def test_cost_is_delta_accounted_too() -> None:
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    for cost in (0.5, 0.5, 1.25, 1.0):
        await orchestrator.apply_update(K1, AgentUpdate(event="c", cost_usd=cost))
    assert orchestrator.state.running[K1].cost_usd == 1.25
    await orchestrator.finish(K1, normal=True)
    assert orchestrator.state.usage_totals.cost_usd == 1.25


async def test_usage_reaches_the_totals_once_at_finish() -> None:
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(7, inp=4, out=3)))
    assert orchestrator.state.usage_totals.total_tokens == 0  # ended runs only
    await orchestrator.finish(K1, normal=True)
    totals = orchestrator.state.usage_totals
    assert (totals.input_tokens, totals.output_tokens, totals.total_tokens) == (4, 3, 7)
    assert orchestrator.snapshot().usage_totals.total_tokens == 7  # not counted twice


async def test_pid_and_rate_limits() -> None:
    orchestrator, _, _ = make()
    await run(orchestrator, issue(1))
    limits = {"limit_id": "codex", "primary": {"used_percent": 12}}
    await orchestrator.apply_update(K1, AgentUpdate(event="x", pid=4242, rate_limits=limits))
    assert orchestrator.state.running[K1].agent_pid == 4242
    assert orchestrator.state.rate_limits == limits
    assert orchestrator.snapshot().to_dict()["rate_limits"] == limits


async def test_updates_for_keys_not_running_are_ignored() -> None:
    orchestrator, store, _ = make()
    await orchestrator.apply_update(K1, AgentUpdate(event="x", session_id="s", usage=usage(5)))
    assert orchestrator.state.running == {}
    assert dict(store.claims) == {}


async def test_only_restart_relevant_changes_are_persisted() -> None:
    shared = SharedClaims()
    store = shared.store("me")
    orchestrator, _, _ = make(store=store)
    await run(orchestrator, issue(1))
    store.calls.clear()
    await orchestrator.apply_update(K1, AgentUpdate(event="delta", message="streaming..."))
    assert store.calls == []
    await orchestrator.apply_update(K1, AgentUpdate(event="s", session_id="s1"))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(3)))
    await orchestrator.apply_update(K1, AgentUpdate(event="u", usage=usage(3)))  # no change
    assert store.calls == ["save i1#0 Running", "save i1#0 Running"]
    row = shared.rows[K1]
    assert (row.session_id, row.turn_count, row.usage) == ("s1", 1, usage(3))


async def test_set_workspace_is_recorded_and_carried_into_the_retry() -> None:
    orchestrator, store, clock = make()
    await run(orchestrator, issue(1))
    await orchestrator.set_workspace(K1, "/w/ABC-1")
    assert store.claims[K1].workspace_path == "/w/ABC-1"
    retry = retry_of(await orchestrator.finish(K1, normal=False))
    assert retry is not None
    assert retry.workspace_path == "/w/ABC-1"
    clock.advance(10000)
    entry = await run(orchestrator, issue(1))
    assert entry.workspace_path == "/w/ABC-1"
    await orchestrator.set_workspace(SlotKey("nope#0"), "/x")  # not running: ignored


async def test_an_update_answers_what_the_slot_shows_now_and_nothing_for_a_free_slot() -> None:
    """``apply_update()`` returns the progress listeners need, so none reads the state."""
    orchestrator, _, clock = make()
    await run(orchestrator, issue(1))
    first = await orchestrator.apply_update(
        K1, AgentUpdate(event="turn", message="working", usage=usage(14))
    )
    assert first is not None
    entry = orchestrator.state.running[K1]
    assert (first.issue_id, first.identifier) == (entry.issue.id, entry.issue.identifier)
    assert (first.usage, first.message, first.at) == (usage(14), "working", clock.now())
    clock.advance(10)
    second = await orchestrator.apply_update(K1, AgentUpdate(event="delta", usage=usage(20)))
    assert second is not None
    assert (second.usage, second.message) == (usage(20), "working")  # the message stays
    assert await orchestrator.apply_update(SlotKey("gone#0"), AgentUpdate(event="x")) is None


def test_usage_records_serialise_every_field_in_order() -> None:
    """``to_dict`` is spelled out (for speed): it must keep up with the fields."""
    for record in (TokenUsage(1, 2, 3), UsageTotals(1, 2, 3, 4.5, 0.25)):
        assert list(record.to_dict().items()) == list(dataclasses.asdict(record).items())
