"""The orchestrator's snapshot: lanes, rows and their JSON form."""

from __future__ import annotations

import json

from lorenz.model import AgentUpdate, SlotKey, TokenUsage
from lorenz.orchestrator import Reserved
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import PoolProbe, issue, make


async def test_snapshot_lanes_and_json_form() -> None:
    probe = PoolProbe(governs=False)
    orchestrator, _, clock = make(capacity=probe)
    await run(orchestrator, issue(1))
    await orchestrator.apply_update(
        SlotKey("i1#0"),
        AgentUpdate(event="turn", message="working", session_id="s", usage=TokenUsage(1, 1, 2)),
    )
    await run(orchestrator, issue(2))
    await orchestrator.finish(SlotKey("i2#0"), normal=False, error="boom")
    probe.governing = True
    [candidate] = [
        c
        for c in await orchestrator.eligible_issues([issue(1), issue(2), issue(3)])
        if c.key == "i3#0"
    ]
    assert isinstance(await orchestrator.claim(candidate), Reserved)
    clock.advance(4000)

    snapshot = orchestrator.snapshot()
    [running] = snapshot.running
    assert (running.identifier, running.turn_count, running.session_id) == ("ABC-1", 1, "s")
    assert running.runtime_seconds == 4.0
    [reserving] = snapshot.reserving
    assert reserving.slot_key == "i3#0"
    assert reserving.expires_in_ms == 120000 - 4000
    [retrying] = snapshot.retrying
    assert (retrying.attempt, retrying.error, retrying.due_in_ms) == (1, "boom", 6000)
    assert snapshot.blocked == ()
    assert snapshot.usage_totals.total_tokens == 2
    assert snapshot.usage_totals.seconds_running == 4.0  # live run; the failed one ran 0 s

    data = snapshot.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["running"][0]["started_at"] == "2026-01-01T00:00:00+00:00"
    assert data["retrying"][0]["due_at"] == "2026-01-01T00:00:10+00:00"
    assert data["reserving"][0]["expires_at"] == "2026-01-01T00:02:00+00:00"
    assert data["running"][0]["usage"] == {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}

    clock.advance(10000)
    assert orchestrator.snapshot().retrying[0].due_in_ms == 0  # never negative
