"""The continuation limit on a single host: an agent that ends cleanly every time while its
issue stays active runs ``1 + agent.max_continuation_runs`` times, then its slot is blocked
(reason ``continuation_limit``) — the same core rule the operator relies on."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

from lorenz.model import BlockReason, Issue, slot_key
from tests.runtime.harness import build_rig, write_agent, write_workflow

WAIT_S = 60.0
"""Generous: three short runs 1 s apart, under a loaded machine."""

KEY = slot_key("id-1", 0)


def issue() -> Issue:
    return Issue(
        id="id-1", identifier="T-1", title="t", state="Todo", priority=2,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


async def test_an_agent_that_never_moves_its_issue_is_blocked_after_the_limit(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", "print('nothing to do', flush=True)\n")
    workflow = write_workflow(
        tmp_path, agent_script=agent, front_matter={"agent": {"max_continuation_runs": 2}}
    )
    rig = build_rig(workflow, issues=[issue()])
    state = rig.orchestrator.state
    task = asyncio.create_task(rig.runtime.start())
    try:
        async with asyncio.timeout(WAIT_S):
            # NB: the slot is blocked in the store before the runtime reports it.
            while KEY not in state.blocked or not rig.of_type("slot_blocked"):
                await asyncio.sleep(0.05)
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
    assert state.blocked[KEY].reason is BlockReason.CONTINUATION_LIMIT
    assert KEY not in state.retry_attempts
    assert KEY not in state.claimed
    # The first run and two continuation re-runs; the third clean exit scheduled nothing.
    assert len(rig.of_type("run_started")) == 3
    assert len(rig.of_type("run_finished")) == 3
    assert [e["retry_kind"] for e in rig.of_type("retry_scheduled")] == ["continuation"] * 2
    # The block is reported like a failure block, so listeners and the log see it.
    (blocked,) = rig.of_type("slot_blocked")
    assert (blocked["identifier"], blocked["reason"]) == ("T-1", "continuation_limit")
    (row,) = rig.runtime.snapshot().to_dict()["blocked"]
    assert (row["identifier"], row["reason"]) == ("T-1", "continuation_limit")
