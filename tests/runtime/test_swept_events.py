"""What the orchestrator drops without a run ending says so: ``retry_released`` for a pending
retry that will not run, ``reservation_expired`` for a reservation swept before its worker came.

Without these events a retry that vanished (an issue closed or assigned elsewhere while it
waited) or a slot whose acquire never returned left no trace in the event stream."""

from __future__ import annotations

from pathlib import Path

from lorenz.model import ManualClock, slot_key
from lorenz.policies.backoff import reservation_lifetime_ms
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.runtime.test_reload_and_pool import CountingPool, Governs
from tests.runtime.test_runtime_loop import RECORDING_AGENT, issue

FAILING_AGENT = "sys.exit(3)\n"


async def test_a_pending_retry_of_an_issue_that_turned_terminal_is_released(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "fail", FAILING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    clock = ManualClock()  # the failure retry (due in 10 s) never comes due by itself
    rig = build_rig(wf, issues=[issue(1)], clock=clock)
    await rig.runtime.poll_once(wait_for_runs=True)
    assert slot_key("id-1", 0) in rig.orchestrator.state.retry_attempts
    assert not rig.of_type("retry_released")

    rig.tracker.set_state("id-1", "Done")
    await rig.runtime.poll_once(wait_for_runs=True)

    assert slot_key("id-1", 0) not in rig.orchestrator.state.retry_attempts
    [released] = rig.of_type("retry_released")
    assert (released["issue_id"], released["identifier"], released["slot"]) == ("id-1", "T-1", 0)
    assert (released["retry_kind"], released["attempt"], released["reason"]) == (
        "failure", 1, "terminal")
    assert released["message"] == "failure retry #1 released: terminal"


async def test_the_retry_of_a_slot_beyond_a_shrunk_ensemble_is_released(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "fail", FAILING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={"agent": {
        "kind": "test", "max_concurrent_agents": 4, "max_turns": 1, "ensemble_size": 2}})
    clock = ManualClock()
    rig = build_rig(wf, issues=[issue(1)], clock=clock)
    await rig.runtime.poll_once(wait_for_runs=True)
    assert set(rig.orchestrator.state.retry_attempts) == {
        slot_key("id-1", 0), slot_key("id-1", 1)}

    # The issue stays a candidate (reconciliation keeps it); its second slot no longer exists,
    # so the eligibility pass after the reload prunes that slot's retry.
    wf.write_text(wf.read_text().replace("ensemble_size: 2", "ensemble_size: 1"))
    await rig.runtime.poll_once(wait_for_runs=True)
    assert rig.runtime.settings.agent.ensemble_size == 1

    assert set(rig.orchestrator.state.retry_attempts) == {slot_key("id-1", 0)}
    [released] = rig.of_type("retry_released")
    assert (released["identifier"], released["slot"], released["attempt"]) == ("T-1", 1, 1)
    assert released["reason"] == "slot_beyond_ensemble"
    assert not rig.of_type("run_canceled"), "nothing was running"


async def test_a_reservation_whose_acquire_never_returns_expires_with_an_event(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    clock = ManualClock()
    pool = CountingPool(["h1", "h2"])
    pool.gate.clear()  # the pool never answers
    rig = build_rig(wf, issues=[issue(1)], pool=pool, capacity=Governs(), clock=clock)
    await rig.runtime.poll_once()
    assert len(rig.runtime.snapshot().lanes.reserving) == 1
    assert not rig.of_type("reservation_expired")

    lifetime = reservation_lifetime_ms(rig.runtime.settings.worker.worker_pool.acquire_timeout_ms)
    clock.advance(lifetime)
    await rig.runtime.poll_once()

    [expired] = rig.of_type("reservation_expired")
    assert (expired["issue_id"], expired["identifier"], expired["slot"]) == ("id-1", "T-1", 0)
    assert expired["reason"] == "reservation_expired"
    assert expired["message"] == (
        "reservation expired before a worker was bound; the slot is free again")
    rig.runtime.stop()
    pool.gate.set()
    await rig.runtime.wait_for_runs()
