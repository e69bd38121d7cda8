"""Issue #32 point 3 end to end: a frozen worker is not a dead one.

A real ``lorenz --feature daemon`` runs its agent in a real worker. The agent ticks on stdout
(so it never stalls by itself) and holds a per-slot ``flock`` while it lives: a second agent of
the slot alive at the same time logs ``dup``. The test SIGSTOPs the *worker* (not the agent):
the controller hears nothing more, the stall fires after ``stall_timeout_ms``, and the run is
stopped through the kill path — the worker does not answer its cancel, so its processes (the
agent with them) are killed and waited for — before the slot's retry starts. Never two agents
of the slot at once, and the retry starts once the first agent is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lorenz.workers.states import worker_pid
from tests.daemon.conftest import daemon_env, daemons, root, runtime_dir
from tests.daemon.harness import DaemonProcess, pid_alive, read_agent_log, write_daemon_workflow
from tests.fakes.slot_lock_agent import slot_lock_agent
from tests.waiting import wait_until

__all__ = ["daemon_env", "daemons", "root", "runtime_dir"]  # fixtures used here

WAIT_S = 120.0
"""Hang protection only (a stall, a probe that times out, a kill, a retry on 2 loaded cores)."""

# Ticks (a line a tick: agent activity) for a long while: only a frozen worker makes it stall.
TICKING_AGENT = slot_lock_agent(
    then=(
        "for tick in range(600):\n"
        "    print(f'tick {tick}', flush=True)\n"
        "    time.sleep(0.2)\n"
        "record(event='end', rc=0)\n"
    )
)


@pytest.fixture
def stopped_workers() -> Iterator[list[int]]:
    """Pids the test SIGSTOPped: continued afterwards (so that the cleanup's kill lands)."""
    stopped: list[int] = []
    yield stopped
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_frozen_worker_is_killed_before_its_slot_is_retried(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    stopped_workers: list[int],
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    agent = root / "ticking_agent.py"
    agent.write_text(TICKING_AGENT, encoding="utf-8")
    workflow = write_daemon_workflow(
        root,
        issues=("F-1",),
        agent_command=f"{sys.executable} {agent}",
        front_matter={
            "agents": {
                "recorder": {
                    "protocol": "command",
                    "command": f"{sys.executable} {agent}",
                    "stall_timeout_ms": 8000,
                    "turn_timeout_ms": 600000,
                    "env": {
                        "AGENT_LOG": str(root / "agent.log"),
                        "AGENT_LOCKS": str(root / "locks"),
                    },
                }
            },
            "retry": {"backoff": {"initial_ms": 100, "max_ms": 300}},
        },
    )
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "daemon.log"
    )
    daemons.append(daemon.start())
    daemon.wait_ready()
    log_path = root / "agent.log"

    [first] = wait_until(
        lambda: [e for e in read_agent_log(log_path) if e["event"] == "start"],
        timeout=WAIT_S,
        what="the first agent's start",
    )
    assert not first["dup"]
    state_dir = Path(daemon_env["LORENZ_WORKER_STATE"]) / first["handle"]
    worker = wait_until(
        lambda: worker_pid(state_dir), timeout=WAIT_S, what="the worker's pid file"
    )
    assert psutil.Process(first["pid"]).is_running()
    os.kill(worker, signal.SIGSTOP)
    stopped_workers.append(worker)

    # The stall fires; the retry's agent starts only once the first one is gone.
    starts = wait_until(
        lambda: [e for e in read_agent_log(log_path) if e["event"] == "start"][1:] or None,
        timeout=WAIT_S,
        what=lambda: "the retry's agent; daemon log tail:\n" + daemon.log()[-3000:],
    )
    second = starts[0]
    assert not second["dup"], daemon.log()[-4000:]
    assert second["handle"] != first["handle"]
    assert not pid_alive(first["pid"]), "the first agent still runs beside its retry"
    assert not pid_alive(worker), "the frozen worker was not killed"
    log = daemon.log()
    assert "run_stalled" in log, log[-4000:]
    assert all(not e.get("dup") for e in read_agent_log(log_path)), log[-4000:]
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]
