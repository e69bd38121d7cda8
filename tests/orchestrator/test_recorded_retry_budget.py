"""A restart decides a recovered failure streak with the budget it was recorded under.

Issue #32 point 6 (seed 004: "the daemon persists the count, configured maximum, ... failure
class, terminal action ... Restarts apply the terminal action recorded in the checkpoint, not a
possibly changed workflow.md"). Each failure streak's checkpoint entry carries
``max_attempts``, ``terminal_action`` and the last failure's code; a restarted controller with a
changed WORKFLOW.md (here: ``max_attempts`` 2 → 5, ``escalate`` → ``block``) blocks the slot at
the recorded limit with the recorded action. Before, the restart used the new settings: the
second failure was retried. An explicit reload while running still applies, as before.
"""

from __future__ import annotations

from lorenz.claims import MemoryClaimStore
from lorenz.claims.memory import MemoryClaimTable
from lorenz.config import TerminalAction
from lorenz.model import BlockReason, SlotKey
from lorenz.orchestrator import Checkpoint, Orchestrator
from lorenz.orchestrator.state import RetryBudget
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import issue, make, settings

K1 = SlotKey("i1#0")
BEFORE = settings(retry={"max_attempts": 2, "terminal_action": "escalate"})
CHANGED = settings(retry={"max_attempts": 5, "terminal_action": "block"})


async def _first_life(table: MemoryClaimTable) -> None:
    first, _, _ = make(config=BEFORE, store=MemoryClaimStore(owner="a", table=table))
    await first.hydrate()
    await run(first, issue(1))
    finished = await first.finish(
        K1, normal=False, error="turn_timeout: no answer", failure_code="turn_timeout"
    )
    assert finished is not None
    assert finished.retry is not None


async def _restarted(table: MemoryClaimTable) -> Orchestrator:
    second, _, clock = make(config=CHANGED, store=MemoryClaimStore(owner="a", table=table))
    report = await second.hydrate()
    assert report.restored_retries == (K1,)
    clock.advance(3_600_000)
    return second


async def test_the_checkpoint_records_the_budget_of_each_streak() -> None:
    table = MemoryClaimTable()
    await _first_life(table)
    assert table.checkpoint is not None
    (entry,) = table.checkpoint["failure_streaks"]
    assert entry["max_attempts"] == 2
    assert entry["terminal_action"] == "escalate"
    assert entry["failure_code"] == "turn_timeout"
    checkpoint, problems = Checkpoint.from_json(table.checkpoint)
    assert problems == ()
    assert checkpoint.retry_budgets == {
        K1: RetryBudget(
            max_attempts=2, terminal_action=TerminalAction.ESCALATE, failure_code="turn_timeout"
        )
    }
    assert checkpoint.to_json() == table.checkpoint


async def test_a_restart_applies_the_recorded_limit_and_action() -> None:
    table = MemoryClaimTable()
    await _first_life(table)
    second = await _restarted(table)
    await run(second, issue(1))
    finished = await second.finish(K1, normal=False, error="boom")
    assert finished is not None
    assert finished.retry is None
    assert finished.blocked is not None
    assert finished.blocked.reason is BlockReason.RETRY_BUDGET_EXHAUSTED
    assert finished.blocked.failures == 2
    assert finished.blocked.action is TerminalAction.ESCALATE


async def test_a_reload_after_the_restart_applies_the_new_settings() -> None:
    table = MemoryClaimTable()
    await _first_life(table)
    second = await _restarted(table)
    second.update_settings(CHANGED)
    await run(second, issue(1))
    finished = await second.finish(K1, normal=False, error="boom")
    assert finished is not None
    assert finished.blocked is None
    assert finished.retry is not None
    (entry,) = (table.checkpoint or {})["failure_streaks"]
    assert (entry["failures"], entry["max_attempts"], entry["terminal_action"]) == (
        2,
        5,
        "block",
    )
