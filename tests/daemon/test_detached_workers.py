"""``worker.detached``: a run in flight survives ``kill -9`` of its daemon and is adopted.

A real daemon on a files tracker runs one slow agent in a detached ``lorenz worker``; the test
SIGKILLs the daemon mid-run and starts the next one. From the agent's own append-only log: the
agent that was running when its daemon died ran to its normal end (it was neither killed by the
next daemon's orphan sweep nor started a second time beside itself), and the next daemon says
it adopted the worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import (
    DaemonProcess,
    kill_marked,
    pid_alive,
    read_agent_log,
    write_daemon_workflow,
)

SLOW = {"AGENT_MIN_S": "6", "AGENT_MAX_S": "6", "AGENT_FAIL_RATE": "0"}


@pytest.fixture
def worker_state(runtime_dir: Path) -> Iterator[Path]:
    path = runtime_dir / "w"
    yield path
    # Workers outlive daemons by design: the test stops the ones it started.
    kill_marked("LORENZ_WORKER_STATE", str(path))


def _wait(predicate: object, what: str, *, timeout_s: float = 120.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_run_in_flight_survives_kill_9_of_its_daemon_and_is_adopted(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    workflow = write_daemon_workflow(
        root, issues=("A-1",), agent_env=SLOW, front_matter={"worker": {"detached": True}}
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    log = root / "agent.log"

    first = DaemonProcess(
        workflow, env=env, args=["--feature", "daemon"], output=root / "daemon-0.log"
    )
    daemons.append(first.start())
    first.wait_ready()
    _wait(lambda: any(r["event"] == "start" for r in read_agent_log(log)), "the agent to start")
    [started] = [r for r in read_agent_log(log) if r["event"] == "start"]
    first.kill9()
    assert pid_alive(started["pid"]), "the agent died with its daemon: it was not detached"

    second = DaemonProcess(
        workflow, env=env, args=["--feature", "daemon"], output=root / "daemon-1.log"
    )
    daemons.append(second.start())
    second.wait_ready()

    def first_run_ended() -> bool:
        return any(
            r["event"] == "end" and r["pid"] == started["pid"] for r in read_agent_log(log)
        )

    _wait(first_run_ended, "the first agent to end")
    records = read_agent_log(log)
    [ended] = [r for r in records if r["event"] == "end" and r["pid"] == started["pid"]]
    assert ended["rc"] == 0, "the adopted agent was stopped instead of finishing"
    # Nothing else started on the slot while the first agent ran, and nothing found it locked.
    overlapping = [
        r
        for r in records
        if r["event"] == "start" and r["pid"] != started["pid"] and r["t"] < ended["t"]
    ]
    assert overlapping == []
    assert not any(r.get("dup") for r in records)
    _wait(lambda: "adopting the worker of an earlier controller" in second.log(), "adoption")
