"""Issue #32 point 3 in the runtime: a stalled run's slot is retried only once its run stopped.

The runner here is an :class:`~lorenz.agents.AgentRunner` whose cancellation takes as long as
the test says — what the worker runner's kill path takes for a frozen worker (probe, kill the
process group, wait until it is gone). Until it is over the slot stays running: counted against
``max_concurrent_agents``, no retry written, no second run. The end to end version, with a
SIGSTOPped worker, is tests/e2e/test_frozen_worker.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lorenz.agents import AgentRunRequest, AgentRunResult
from lorenz.model import ManualClock, RetryKind, slot_key
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.runtime.test_runtime_loop import issue
from tests.waiting import wait_until_async


class SlowToStopRunner:
    """Runs until cancelled; its cancellation ends when ``gone`` is set (the agent proven gone)."""

    def __init__(self) -> None:
        self.runs: list[int | None] = []
        self.stopping = asyncio.Event()
        self.gone = asyncio.Event()

    def __call__(self, protocol: Any) -> SlowToStopRunner:
        del protocol
        return self

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        self.runs.append(request.attempt)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.gone.wait()
            raise
        raise AssertionError("unreachable")


async def test_a_stalled_slot_is_held_until_its_run_stopped_then_retried(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "unused", "pass\n")
    wf = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "agent": {"max_concurrent_agents": 1},
            "agents": {"test": {"protocol": "command", "command": f"python3 {agent}",
                                "stall_timeout_ms": 1000}},
        },
    )
    clock = ManualClock()
    runner = SlowToStopRunner()
    rig = build_rig(wf, issues=[issue(1), issue(2)], clock=clock, runner_factory=runner)
    key = slot_key("id-1", 0)
    await rig.runtime.poll_once()
    await wait_until_async(lambda: runner.runs, timeout=10.0, what="the first run")
    assert runner.runs == [None]

    clock.advance(1001)
    await rig.runtime.poll_once()
    assert runner.stopping.is_set()
    # Its run is still stopping: the slot is running, the cap is full, nothing else starts.
    state = rig.orchestrator.state
    assert key in state.running
    assert key not in state.retry_attempts
    assert rig.orchestrator.available_slots() == 0
    assert rig.of_type("run_stalled") == []
    await rig.runtime.poll_once()
    assert runner.runs == [None]

    runner.gone.set()
    await wait_until_async(
        lambda: key in state.retry_attempts, timeout=10.0, what="the stalled slot's retry"
    )
    retry = state.retry_attempts[key]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)
    assert key not in state.running
    [stalled] = rig.of_type("run_stalled")
    assert "stalled for 1001ms" in stalled["message"]
    # The slot is free again: the other issue starts.
    await rig.runtime.poll_once()
    await wait_until_async(lambda: len(runner.runs) == 2, timeout=10.0, what="the next run")
