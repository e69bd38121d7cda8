"""A drain that begins while a poll is already under way starts nothing, and the stop ends.

The drain's promise (docs/daemon.md, *Drain on stop*) covers work already in flight: a poll
that was reading candidates, or writing the claim of one, when the stop began must not start a
run afterwards — such a run was dispatched after the final cancel, so nothing cancelled it and
the runtime's stop waited for it for ever (a chaos soak's survivor never exited). Each test
holds one await of the poll (the candidate read, the claim write) until the stop has begun,
then lets it go, exactly as :class:`lorenz.daemon.shutdown.GracefulStop` drives a daemon.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path
from typing import Any

import pytest

from lorenz.claims import MemoryClaimStore
from lorenz.daemon.shutdown import GracefulStop
from lorenz.model import ClaimPhase, ClaimRecord, Issue
from lorenz.trackers.memory import MemoryTracker
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow

BOUND_S = 60.0
"""Hang protection only: without the fix the stop waits for an agent that never ends."""

WAITS_FOREVER = """
note("started", str(os.getpid()))
while True:
    time.sleep(0.05)
"""


class HeldTracker(MemoryTracker):
    """A memory tracker whose candidate read waits until the test lets it go."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__(issues)
        self.entered = asyncio.Event()
        self.let_go = asyncio.Event()

    async def fetch_candidate_issues(self) -> list[Issue]:
        self.entered.set()
        await self.let_go.wait()
        return await super().fetch_candidate_issues()


class HeldStore(MemoryClaimStore):
    """A memory claim store whose claim write waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(owner="test")
        self.entered = asyncio.Event()
        self.let_go = asyncio.Event()

    async def acquire(self, record: ClaimRecord) -> bool:
        self.entered.set()
        await self.let_go.wait()
        return await super().acquire(record)


def _issue(n: int) -> Issue:
    return Issue(
        id=f"id-{n}", identifier=f"T-{n}", title=f"Issue {n}", state="Todo", priority=2,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


def _rig(tmp_path: Path, **kwargs: Any) -> RuntimeRig:
    agent = write_agent(tmp_path, "waits", WAITS_FOREVER)
    workflow = write_workflow(tmp_path, agent_script=agent, front_matter={
        "polling": {"interval_ms": 600000},
        "agents": {"test": {
            "protocol": "command", "command": f"python3 {agent}",
            "stall_timeout_ms": 3600000, "turn_timeout_ms": 3600000,
        }},
    })
    return build_rig(workflow, reload=False, **kwargs)


async def _stop_while_held(
    rig: RuntimeRig, held: HeldTracker | HeldStore, *, grace_s: float
) -> None:
    runtime = rig.runtime
    loop_task = asyncio.create_task(runtime.start())
    await asyncio.wait_for(held.entered.wait(), BOUND_S)
    stop = GracefulStop(runtime=runtime, grace_s=grace_s, hand_over=False)
    stop.request()
    # NB: the drain has begun (and, with no run in flight, so has the stop) before the held
    # await goes on: the order of the chaos soak's survivor.
    await asyncio.sleep(0)
    assert runtime.draining or runtime.stopped
    held.let_go.set()
    await asyncio.wait_for(stop.finish(), BOUND_S)
    await asyncio.wait_for(loop_task, BOUND_S)


def _assert_nothing_started(rig: RuntimeRig, tmp_path: Path) -> None:
    assert rig.of_type("run_started") == []
    assert not list((tmp_path / "workspaces").glob("*/started"))
    assert rig.runtime.snapshot().lanes.running == ()


@pytest.mark.parametrize("grace_s", [0.0, 3600.0])
async def test_a_candidate_read_under_way_when_the_drain_began_starts_nothing(
    tmp_path: Path, grace_s: float
) -> None:
    tracker = HeldTracker([_issue(1), _issue(2)])
    rig = _rig(tmp_path, tracker=tracker)

    await _stop_while_held(rig, tracker, grace_s=grace_s)

    _assert_nothing_started(rig, tmp_path)
    assert (await rig.store.load()).claims == []


@pytest.mark.parametrize("grace_s", [0.0, 3600.0])
async def test_a_claim_written_while_the_drain_began_starts_no_run(
    tmp_path: Path, grace_s: float
) -> None:
    store = HeldStore()
    rig = _rig(tmp_path, issues=[_issue(1)], store=store)

    await _stop_while_held(rig, store, grace_s=grace_s)

    _assert_nothing_started(rig, tmp_path)
    # The claim written meanwhile is given back as a clean shutdown's: a pending
    # continuation, so the next controller picks the issue up without counting a failure.
    claims = (await store.load()).claims
    assert [(c.slot_key, c.phase) for c in claims] == [("id-1#0", ClaimPhase.RETRY_PENDING)]
