"""Runs placed in two phases (``worker.kind: pod``): a run that was not placed costs nothing.

The runtime reserves the slot, the runner creates the run's Pod and calls ``on_placed`` once
its worker serves, and only then is the reservation bound. A run whose Pod could not be placed
(no node fits, no image, a quota is full: :class:`PlacementFailed`) gives its reservation back
with the reason — a ``placement_failed`` event, the slot waits for placement — and counts no
attempt and no failure; any other error before the placement is a failed run as always.

The runner here stands in for the operator's Pod runner (the Pods are the remote part; the
real one runs on the node fixture, tests/node/test_pod_runs.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from lorenz.agents import AgentRunError, AgentRunRequest, AgentRunResult, PlacementFailed
from lorenz.claims import MemoryClaimStore
from lorenz.model import ClaimPhase, ClaimRecord, RetryKind, SlotKey, slot_key
from lorenz.policies import placement_wait_ms
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow
from tests.runtime.test_runtime_loop import RECORDING_AGENT, issue
from tests.waiting import wait_until_async

POD = {"worker": {"kind": "pod", "start_timeout_ms": 5000}}


class PodRunnerStandIn:
    """Fails ``failures`` launches the way the Pod runner does, then places the run."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.requests: list[AgentRunRequest] = []
        self.placed: list[bool] = []

    def __call__(self, protocol: object) -> PodRunnerStandIn:
        del protocol
        return self

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        self.requests.append(request)
        if self.failures:
            raise self.failures.pop(0)
        assert request.on_placed is not None
        self.placed.append(await request.on_placed("lzw-t-1-pod"))
        return AgentRunResult(turns=1)


async def test_a_run_that_was_not_placed_gives_its_slot_back_and_counts_no_attempt(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter=POD)
    runner = PodRunnerStandIn([
        PlacementFailed(
            "the run's Pod did not serve its worker within 5000 ms (worker.start_timeout_ms): "
            "Unschedulable: 0/1 nodes are available",
            code="pod_start_timeout",
            reason="unschedulable",
        )
    ])
    rig = build_rig(wf, issues=[issue(1)], runner_factory=runner)
    await rig.runtime.poll_once()
    key = slot_key("id-1", 0)
    # reserved while being placed, never bound: no run started, none failed
    await wait_until_async(
        lambda: bool(rig.of_type("placement_failed")),
        timeout=10.0,
        what='bool(rig.of_type("placement_failed"))',
    )
    [given_back] = rig.of_type("placement_failed")
    assert given_back["reason"] == "unschedulable"
    assert given_back["code"] == "pod_start_timeout"
    assert "Unschedulable: 0/1 nodes" in given_back["message"]
    assert rig.of_type("run_started") == []
    assert rig.of_type("run_failed") == []
    assert rig.of_type("retry_scheduled") == []
    retry = rig.orchestrator.state.retry_attempts[key]
    assert retry.kind is RetryKind.PLACEMENT
    assert retry.error is not None
    assert "Unschedulable" in retry.error
    assert rig.orchestrator.state.failure_streaks == {}
    assert not rig.orchestrator.state.reserved
    [row] = rig.runtime.snapshot().to_dict()["retrying"]
    assert row["kind"] == "placement"
    # after the placement wait the slot is claimed again, as the same first run, and placed
    wait_s = placement_wait_ms() / 1000 + 20
    await wait_until_async(
        lambda: bool(rig.of_type("run_started")),
        timeout=wait_s,
        what='bool(rig.of_type("run_started"))',
    )
    [started] = rig.of_type("run_started")
    assert started["host"] == "lzw-t-1-pod"
    assert runner.placed == [True]
    assert [r.attempt for r in runner.requests] == [None, None]
    assert rig.of_type("run_failed") == []


async def test_an_error_before_placement_that_is_not_about_placing_is_a_failed_run(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter=POD)
    runner = PodRunnerStandIn([
        AgentRunError("worker.kind: pod needs an image", code="worker_image_missing")
    ])
    rig = build_rig(wf, issues=[issue(1)], runner_factory=runner)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: bool(rig.of_type("retry_scheduled")),
        timeout=10.0,
        what='bool(rig.of_type("retry_scheduled"))',
    )
    assert rig.of_type("placement_failed") == []
    [failed] = rig.of_type("run_failed")
    assert "worker_image_missing" in failed["message"]
    retry = rig.orchestrator.state.retry_attempts[slot_key("id-1", 0)]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)
    assert rig.orchestrator.state.failure_streaks == {slot_key("id-1", 0): 1}


def claims_of(rig: RuntimeRig) -> Mapping[SlotKey, ClaimRecord]:
    assert isinstance(rig.store, MemoryClaimStore)
    return rig.store.claims


class PlacingForever:
    """A runner whose worker is placed (its Pod created, its agent started) but whose launch
    has not answered yet: it never calls ``on_placed`` until cancelled."""

    def __init__(self) -> None:
        self.launched = asyncio.Event()
        self.cancelled = False

    def __call__(self, protocol: object) -> PlacingForever:
        del protocol
        return self

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        self.launched.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


async def test_a_hand_over_while_the_worker_is_placed_keeps_the_reservation_for_the_next_leader(
    tmp_path: Path,
) -> None:
    """#37 point 3: a replica handing a Workflow over (an operator Pod deleted) while a run's
    Pod is created but not bound yet must not give the reservation back: its Claim keeps
    saying ``Reserved`` (with the spawn intent the runner wrote), so the next leader adopts
    the Pod instead of sweeping it as an orphan and running the agent again."""
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter=POD)
    runner = PlacingForever()
    rig = build_rig(wf, issues=[issue(1)], runner_factory=runner)
    loop = asyncio.create_task(rig.runtime.start())
    await asyncio.wait_for(runner.launched.wait(), timeout=30)
    key = slot_key("id-1", 0)
    assert claims_of(rig)[key].phase is ClaimPhase.RESERVED
    rig.runtime.stop(hand_over=True)
    await asyncio.wait_for(loop, 30)
    assert runner.cancelled
    kept = claims_of(rig)[key]
    assert kept.phase is ClaimPhase.RESERVED  # not released, not a pending retry
    assert rig.of_type("placement_failed") == []
    assert rig.of_type("run_started") == []
    assert rig.of_type("run_failed") == []


async def test_a_plain_stop_while_the_worker_is_placed_gives_the_reservation_back(
    tmp_path: Path,
) -> None:
    """Without a hand-over (the runtime's runs are cancelled, their workers with them) the
    reservation is given back as before: nothing of the slot is left for anyone."""
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter=POD)
    runner = PlacingForever()
    rig = build_rig(wf, issues=[issue(1)], runner_factory=runner)
    loop = asyncio.create_task(rig.runtime.start())
    await asyncio.wait_for(runner.launched.wait(), timeout=30)
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)
    assert slot_key("id-1", 0) not in claims_of(rig)
