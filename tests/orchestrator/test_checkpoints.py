"""The typed checkpoint (``lorenz.orchestrator.checkpoints.Checkpoint``): the persisted form is
the one stores already hold, written and read back the same, and the orchestrator writes it."""

from __future__ import annotations

from typing import Any

from lorenz.config import TerminalAction
from lorenz.model import BlockReason, SlotKey, UsageTotals
from lorenz.orchestrator import CHECKPOINT_SCHEMA, Checkpoint, CheckpointInvalid
from lorenz.orchestrator.state import BlockedEntry
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import EPOCH, issue, make, settings

STORED: dict[str, Any] = {
    "schema": 1,
    "usage_totals": {
        "input_tokens": 10, "output_tokens": 4, "total_tokens": 14,
        "seconds_running": 2.5, "cost_usd": 0.25,
    },
    "failure_streaks": [{"slot_key": "i1#0", "failures": 2}, {"slot_key": "i2#1", "failures": 1}],
    "blocked": [
        {
            "slot_key": "i3#0", "issue_id": "i3", "identifier": "ABC-3", "slot_index": 0,
            "reason": "input_required", "error": "which database?", "failures": 1,
            "attempt": 1, "blocked_at": "2026-01-01T00:00:00+00:00", "action": "block",
            "action_key": "lz-abc", "action_done": True, "action_error": None,
            "issue_version": None, "host": None, "workspace_path": "/w/ABC-3",
        },
    ],
}
"""A checkpoint as the stores hold it since schema 1 (hand-written: the form is a contract)."""


def test_a_stored_checkpoint_reads_and_writes_back_identical() -> None:
    checkpoint, problems = Checkpoint.from_json(STORED)
    assert problems == ()
    assert checkpoint.usage_totals == UsageTotals(10, 4, 14, 2.5, 0.25)
    assert checkpoint.failure_streaks == {SlotKey("i1#0"): 2, SlotKey("i2#1"): 1}
    (blocked,) = checkpoint.blocked
    assert (blocked.key, blocked.reason, blocked.action) == (
        "i3#0", BlockReason.INPUT_REQUIRED, TerminalAction.BLOCK,
    )
    assert checkpoint.to_json() == STORED


def test_empty_parts_are_left_out() -> None:
    checkpoint = Checkpoint.of(usage_totals=UsageTotals(), failure_streaks={}, blocked={})
    assert checkpoint.to_json() == {
        "schema": CHECKPOINT_SCHEMA,
        "usage_totals": UsageTotals().to_dict(),
    }


def test_of_orders_by_slot_key() -> None:
    def blocked(issue_id: str) -> BlockedEntry:
        return BlockedEntry(
            issue_id=issue_id, identifier=issue_id.upper(), slot_index=0,
            reason=BlockReason.CONTINUATION_LIMIT, error=None, failures=0, attempt=1,
            blocked_at=EPOCH, action=TerminalAction.BLOCK, action_key="k",
        )

    checkpoint = Checkpoint.of(
        usage_totals=UsageTotals(),
        failure_streaks={SlotKey("b#0"): 1, SlotKey("a#0"): 2},
        blocked={SlotKey("z#0"): blocked("z"), SlotKey("y#0"): blocked("y")},
    )
    document = checkpoint.to_json()
    assert [s["slot_key"] for s in document["failure_streaks"]] == ["a#0", "b#0"]
    assert [b["slot_key"] for b in document["blocked"]] == ["y#0", "z#0"]


def test_unreadable_parts_are_left_out_and_reported() -> None:
    checkpoint, problems = Checkpoint.from_json(
        {"usage_totals": "x", "failure_streaks": [{"slot_key": "i1#0"}], "blocked": [{}]}
    )
    assert checkpoint.usage_totals is None
    assert checkpoint.failure_streaks == {}
    assert checkpoint.blocked == ()
    assert len(problems) == 2
    assert all(isinstance(problem, CheckpointInvalid) for problem in problems)


async def test_the_orchestrator_writes_the_typed_form() -> None:
    orchestrator, store, _ = make(config=settings(retry={"max_attempts": 5}))
    await run(orchestrator, issue(1))
    await orchestrator.finish(SlotKey("i1#0"), normal=False, error="boom")
    document = (await store.load()).checkpoint
    assert document is not None
    checkpoint, problems = Checkpoint.from_json(document)
    assert problems == ()
    assert checkpoint.failure_streaks == {SlotKey("i1#0"): 1}
    assert checkpoint.to_json() == document
