"""Issue #32 point 3 over SSH: a frozen remote worker is killed on its host before its retry.

The runtime runs its slot in a worker placed over ssh (the real sshd of ``test_ssh.py``, on
127.0.0.1: the "remote" worker is a real process of this machine reached through ssh). The
agent holds a per-slot ``flock`` while it lives and logs its start: a second agent of the slot
alive at the same time logs ``dup``. The test SIGSTOPs the *worker* (not the agent); the stall
fires; the worker does not answer its cancel, so the kill path runs ``lorenz worker --kill``
on the host over ssh — and the slot is retried only once that confirmed the agent gone. With
the host unreachable the slot stays held (``worker_kill_unconfirmed``), however long, until a
kill gets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.daemon import shutdown
from lorenz.daemon.host import wait_for_runs_or_leave
from lorenz.model import ManualClock, RetryKind, slot_key
from lorenz.workers.runner import Departure, WorkerRunner
from lorenz.workers.ssh import SshTransport
from lorenz.workers.states import worker_pid
from tests.fakes.slot_lock_agent import slot_lock_agent
from tests.runtime.harness import LIVE_RUNTIMES, RuntimeRig, build_rig, write_workflow
from tests.runtime.test_runtime_loop import issue
from tests.waiting import wait_until_async
from tests.workers.test_ssh import Sshd, _wait_for_login, sshd

__all__ = ["sshd"]  # the module's sshd fixture, used here

WAIT_S = 120.0
"""Hang protection only (ssh round trips, a probe that times out, a kill, on 2 loaded cores)."""

LOCKING_AGENT = slot_lock_agent(
    then="time.sleep(3600)  # works on the issue, silently, until killed\n"
)


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def starts(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [entry for entry in map(json.loads, lines) if entry["event"] == "start"]


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Pids the test SIGSTOPped, and the agents it started: continued, then killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def ssh(sshd: Sshd) -> AsyncIterator[SshTransport]:
    if sshd.process is None:
        sshd.start()
        _wait_for_login(sshd)
    transport = sshd.transport(probe_timeout_s=15.0)
    try:
        yield transport
    finally:
        while LIVE_RUNTIMES:
            runtime = LIVE_RUNTIMES.pop()
            runtime.stop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.wait_for_runs(), timeout=60)
        await transport.close()


def ssh_rig(
    tmp_path: Path,
    *,
    transport: SshTransport,
    clock: ManualClock,
    runners: list[WorkerRunner],
    departure: Departure | None = None,
) -> RuntimeRig:
    """A runtime whose runs are workers over ``transport``; each runner made joins ``runners``."""
    agent = tmp_path / "locking_agent.py"
    agent.write_text(LOCKING_AGENT, encoding="utf-8")
    (tmp_path / "locks").mkdir()
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "agent": {"max_concurrent_agents": 1},
            "agents": {
                "test": {
                    "protocol": "command",
                    "command": f"{sys.executable} {agent}",
                    "stall_timeout_ms": 1000,
                    "turn_timeout_ms": 600000,
                    "env": {
                        "AGENT_LOG": str(tmp_path / "agent.log"),
                        "AGENT_LOCKS": str(tmp_path / "locks"),
                    },
                }
            },
            "retry": {"backoff": {"initial_ms": 100, "max_ms": 300}},
        },
    )

    def runner(protocol: object) -> WorkerRunner:
        del protocol
        made = WorkerRunner(
            workflow=str(workflow),
            transport=transport,
            placement=transport.host,
            quarantine_probe_s=0.5,
            leaving=departure,
        )
        runners.append(made)
        return made

    return build_rig(workflow, issues=[issue(1)], clock=clock, runner_factory=runner)


async def freeze_the_first_worker(
    rig: RuntimeRig, *, sshd: Sshd, log: Path, stopped: list[int], runners: list[WorkerRunner]
) -> tuple[dict[str, Any], int]:
    """Dispatch the slot, wait for its agent and for its launch to have answered (a launch
    has a bound of its own), SIGSTOP its worker: (the agent's start, the worker's pid)."""
    await rig.runtime.poll_once()
    await wait_until_async(lambda: starts(log), timeout=WAIT_S, what="the first agent's start")
    await wait_until_async(
        lambda: runners and runners[0].last_handle, timeout=WAIT_S, what="the launch's answer"
    )
    [first] = starts(log)
    assert not first["dup"]
    stopped.append(first["pid"])
    state_dir = sshd.remote_root / first["handle"]
    worker = await wait_until_async(
        lambda: worker_pid(state_dir), timeout=WAIT_S, what="the remote worker's pid"
    )
    os.kill(worker, signal.SIGSTOP)
    stopped.append(worker)
    return first, worker


async def test_a_frozen_remote_worker_is_killed_over_ssh_before_its_slot_is_retried(
    sshd: Sshd, ssh: SshTransport, tmp_path: Path, stopped: list[int]
) -> None:
    clock, runners = ManualClock(), list[WorkerRunner]()
    rig = ssh_rig(tmp_path, transport=ssh, clock=clock, runners=runners)
    log = tmp_path / "agent.log"
    key = slot_key("id-1", 0)
    first, worker = await freeze_the_first_worker(
        rig, sshd=sshd, log=log, stopped=stopped, runners=runners
    )

    clock.advance(1001)
    await rig.runtime.poll_once()  # the stall fires: the run is stopped through the kill path
    state = rig.orchestrator.state
    await wait_until_async(
        lambda: key in state.retry_attempts, timeout=WAIT_S, what="the stalled slot's retry"
    )
    # The slot was settled: by then the first agent (and its frozen worker) must be gone.
    assert not pid_alive(first["pid"]), "the first agent still runs beside its retry"
    assert not pid_alive(worker), "the frozen remote worker was not killed"
    retry = state.retry_attempts[key]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)
    assert rig.of_type("run_stalled")

    clock.advance(1000)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(starts(log)) >= 2, timeout=WAIT_S, what="the retry's agent"
    )
    second = starts(log)[1]
    stopped.append(second["pid"])
    assert second["handle"] != first["handle"]
    assert all(not entry["dup"] for entry in starts(log)), "two agents of the slot at once"


async def test_an_unreachable_host_keeps_the_frozen_runs_slot_held_until_a_kill_gets_through(
    sshd: Sshd, ssh: SshTransport, tmp_path: Path, stopped: list[int]
) -> None:
    clock, runners = ManualClock(), list[WorkerRunner]()
    rig = ssh_rig(tmp_path, transport=ssh, clock=clock, runners=runners)
    log = tmp_path / "agent.log"
    key = slot_key("id-1", 0)
    first, _ = await freeze_the_first_worker(
        rig, sshd=sshd, log=log, stopped=stopped, runners=runners
    )
    sshd.stop()  # only the listener: the run's forward lives on, new ssh connections fail
    try:
        clock.advance(1001)
        await rig.runtime.poll_once()
        state = rig.orchestrator.state
        await wait_until_async(
            lambda: [e for e in rig.events if e.get("event") == "worker_quarantined"],
            timeout=WAIT_S,
            what="the held slot's worker_quarantined update",
        )
        # The snapshot's running entry says why, with the code.
        said = state.running[key].last_agent_message or ""
        assert said.startswith("worker_kill_unconfirmed: "), said
        assert "lorenz-test" in said
        # Held however long the controller's clock runs: counted, not retried, agent alive.
        for _ in range(3):
            clock.advance(60_000)
            await rig.runtime.poll_once()
            assert key in state.running
            assert key not in state.retry_attempts
            assert rig.orchestrator.available_slots() == 0
        assert pid_alive(first["pid"])
    finally:
        sshd.start()
        _wait_for_login(sshd)
    await wait_until_async(
        lambda: key in state.retry_attempts, timeout=WAIT_S, what="the slot's retry"
    )
    assert not pid_alive(first["pid"]), "the first agent still runs beside its retry"


async def test_a_stop_whose_kill_cannot_get_through_ends_and_leaves_the_slot_to_the_next_controller(
    sshd: Sshd,
    ssh: SshTransport,
    tmp_path: Path,
    stopped: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--force-kill`` (or ``--now``) with the frozen worker's host unreachable: the stop
    cannot prove the agent gone, yet must end; the run is left unsettled — no retry written for
    a successor to start beside the live agent — for the next controller to probe and kill."""
    monkeypatch.setattr(shutdown, "KILL_CONFIRM_BOUND_S", 2.0)
    clock, runners, departure = ManualClock(), list[WorkerRunner](), Departure()
    rig = ssh_rig(tmp_path, transport=ssh, clock=clock, runners=runners, departure=departure)
    log = tmp_path / "agent.log"
    key = slot_key("id-1", 0)
    first, _ = await freeze_the_first_worker(
        rig, sshd=sshd, log=log, stopped=stopped, runners=runners
    )
    sshd.stop()
    try:
        rig.runtime.stop()  # a stop that kills: the runs are cancelled, not handed over
        await asyncio.wait_for(
            wait_for_runs_or_leave(rig.runtime, departure=departure), timeout=WAIT_S
        )
        state = rig.orchestrator.state
        assert departure() == shutdown.KILL_UNCONFIRMED
        assert key not in state.retry_attempts, "a retry was written beside a live agent"
        assert pid_alive(first["pid"]), "the agent is the next controller's to kill"
    finally:
        sshd.start()
        _wait_for_login(sshd)
