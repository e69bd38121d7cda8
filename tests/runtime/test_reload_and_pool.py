"""Transactional reload under a live loop, and two-phase (pool-governed) dispatch."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from lorenz.model import Issue, SlotKey, slot_key
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.runtime.test_runtime_loop import HEARTBEAT_AGENT, RECORDING_AGENT, issue
from tests.waiting import wait_until_async


async def test_a_broken_reload_keeps_the_last_known_good_workflow_running(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    good = wf.read_text()
    rig = build_rig(wf, issues=[issue(1)])
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        lambda: slot_key("id-1", 0) in rig.orchestrator.state.running,
        timeout=10.0,
        what='slot_key("id-1", 0) in rig.orchestrator.state.running',
    )

    wf.write_text("---\ntracker: [unterminated\n---\nbody\n")
    await wait_until_async(
        lambda: bool(rig.of_type("workflow_reload_failed")),
        timeout=10.0,
        what='bool(rig.of_type("workflow_reload_failed"))',
    )
    failure = rig.of_type("workflow_reload_failed")[0]
    assert failure["code"] == "workflow_parse_error"
    assert "keeping the last known good" in failure["message"]
    assert rig.runtime.settings.polling.interval_ms == 50
    assert slot_key("id-1", 0) in rig.orchestrator.state.running, "the live run is untouched"
    polls = rig.runtime.poll_count
    await wait_until_async(
        lambda: rig.runtime.poll_count >= polls + 3,
        timeout=10.0,
        what="rig.runtime.poll_count >= polls + 3",
    )  # the loop lives on

    wf.write_text(good.replace("interval_ms: 50", "interval_ms: 70")
                  .replace("max_concurrent_agents: 4", "max_concurrent_agents: 2"))
    await wait_until_async(
        lambda: bool(rig.of_type("workflow_reloaded")),
        timeout=10.0,
        what='bool(rig.of_type("workflow_reloaded"))',
    )
    assert rig.runtime.settings.polling.interval_ms == 70
    assert rig.orchestrator.settings.agent.max_concurrent_agents == 2
    assert slot_key("id-1", 0) in rig.orchestrator.state.running
    rig.runtime.stop()
    await asyncio.wait_for(loop, 15)


@dataclasses.dataclass
class Host:
    host: str | None


class CountingPool:
    """The runtime's WorkerPool protocol over a fixed set of named hosts (in-process)."""

    def __init__(self, hosts: list[str]) -> None:
        self.free = list(hosts)
        self.released: list[tuple[str | None, bool]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def acquire(self, *, key: SlotKey, timeout_ms: int) -> Host | None:
        await self.gate.wait()
        return Host(self.free.pop(0)) if self.free else None

    async def release(self, slot: Host, *, poison: bool) -> None:
        self.released.append((slot.host, poison))
        if not poison and slot.host is not None:
            self.free.append(slot.host)

    async def drain(self, *, deadline_ms: int) -> None:
        return None


class Governs:
    def governs(self) -> bool:
        return True

    def has_capacity(self) -> bool:
        return True


async def test_pool_governed_dispatch_reserves_then_binds_or_cancels(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    pool = CountingPool(["h1"])
    pool.gate.clear()
    rig = build_rig(wf, issues=[issue(1), issue(2)], pool=pool, capacity=Governs())
    await rig.runtime.poll_once()
    # both slots are reserved (host-less, counted toward caps) while the pool is thinking
    snapshot = rig.runtime.snapshot().to_dict()
    assert len(snapshot["reserving"]) == 2
    assert not snapshot["running"]
    assert len(rig.of_type("run_reserving")) == 2
    pool.gate.set()
    await rig.runtime.wait_for_runs()
    started = rig.of_type("run_started")
    skipped = rig.of_type("dispatch_skipped")
    # one host: the first reservation binds, the second is cancelled without backoff...
    assert skipped[0]["reason"] == "worker_host_capacity"
    assert skipped[0]["identifier"] != started[0]["identifier"]
    # ...keeps its place (no retry entry consumed), and runs once the host is free again
    await wait_until_async(
        lambda: len(rig.of_type("run_started")) >= 2,
        timeout=10.0,
        what='len(rig.of_type("run_started")) >= 2',
    )
    await rig.runtime.wait_for_runs()
    started = rig.of_type("run_started")
    assert [e["host"] for e in started[:2]] == ["h1", "h1"]
    assert {e["identifier"] for e in started} == {"T-1", "T-2"}
    assert pool.released[:2] == [("h1", False), ("h1", False)]
    assert not rig.orchestrator.state.reserved
    assert all(r.attempt == 1 for r in rig.orchestrator.state.retry_attempts.values())


async def test_a_stalled_pool_run_poisons_its_worker(tmp_path: Path) -> None:
    from lorenz.model import ManualClock

    agent = write_agent(tmp_path, "hang", "note('pid', str(os.getpid()))\ntime.sleep(60)\n")
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={"agents": {"test": {
        "protocol": "command", "command": f"python3 {agent}", "stall_timeout_ms": 1000}}})
    clock = ManualClock()
    pool = CountingPool(["h1"])
    rig = build_rig(wf, issues=[Issue(id="id-1", identifier="T-1", title="t", state="Todo")],
                    pool=pool, capacity=Governs(), clock=clock)
    await rig.runtime.poll_once()
    await wait_until_async(
        (tmp_path / "workspaces" / "T-1" / "pid").exists,
        timeout=10.0,
        what='(tmp_path / "workspaces" / "T-1" / "pid").exists',
    )
    clock.advance(1500)
    await rig.runtime.poll_once()
    await rig.runtime.wait_for_runs()
    assert pool.released == [("h1", True)]


async def test_a_failed_hook_poisons_its_worker_by_code_and_an_agent_echo_does_not(
    tmp_path: Path,
) -> None:
    # An agent that *prints* the hook-failure text and fails is an agent failure: healthy.
    agent = write_agent(tmp_path, "echo", "print('workspace hook failed with status 1', "
                                           "file=sys.stderr)\nsys.exit(3)\n")
    wf = write_workflow(tmp_path, agent_script=agent)
    pool = CountingPool(["h1"])
    rig = build_rig(wf, issues=[issue(1)], pool=pool, capacity=Governs())
    await rig.runtime.poll_once(wait_for_runs=True)
    assert pool.released == [("h1", False)]

    hooked = tmp_path / "hooked"
    hooked.mkdir()
    wf = write_workflow(hooked, agent_script=agent,
                        front_matter={"hooks": {"before_run": "exit 1"}})
    pool = CountingPool(["h2"])
    rig = build_rig(wf, issues=[issue(1)], pool=pool, capacity=Governs())
    await rig.runtime.poll_once(wait_for_runs=True)
    assert pool.released == [("h2", True)]
    [failed] = rig.of_type("run_failed")
    assert failed["message"].startswith("workspace_hook_failed: ")


class RefusingPool(CountingPool):
    """A pool that cannot take its host back (its control channel broke, say)."""

    async def release(self, slot: Host, *, poison: bool) -> None:
        raise ConnectionResetError("pool control channel closed")


async def test_a_pool_that_cannot_take_its_host_back_is_logged_and_the_run_still_settles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)], pool=RefusingPool(["h1"]), capacity=Governs())
    with caplog.at_level(logging.ERROR, logger="lorenz.runtime"):
        await rig.runtime.poll_once(wait_for_runs=True)
    [finished] = rig.of_type("run_finished")
    assert (finished["identifier"], finished["outcome"]) == ("T-1", "success")
    assert not rig.orchestrator.state.running
    [record] = [r for r in caplog.records if "worker pool release failed" in r.getMessage()]
    assert "slot=id-1#0" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is ConnectionResetError
