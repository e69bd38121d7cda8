"""SIGTERM means one graceful shutdown, however many times it is sent."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from lorenz.daemon.discovery import lease_file_for
from lorenz.daemon.shutdown import SHUTDOWN_ORDER
from tests.daemon.harness import DaemonProcess, in_process, read_agent_log, write_daemon_workflow

STUBBORN = {
    "AGENT_MIN_S": "60",
    "AGENT_MAX_S": "60",
    "AGENT_FAIL_RATE": "0",
    "AGENT_IGNORE_TERM": "1",
}


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    """In-process runs (the suite's test-only switch): these tests are about signal handling,
    with runs that end when the runtime stops (the drain: test_drain.py)."""
    return in_process(daemon_env)


def test_sigterm_twice_is_one_graceful_shutdown(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:

    workflow = write_daemon_workflow(root, issues=("A-1",), agent_env=STUBBORN)
    daemon = DaemonProcess(workflow, env=daemon_env, output=root / "daemon.log")
    daemons.append(daemon.start())
    daemon.wait_ready()
    deadline = time.monotonic() + 60
    while not any(e["event"] == "ignoring_term" for e in read_agent_log(root / "agent.log")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    daemon.terminate()
    # The agent ignores SIGTERM, so stopping the runtime waits out the runner's grace period
    # (2 s) before SIGKILL: the second signal lands in the middle of the shutdown.
    while "received signal=SIGTERM" not in daemon.log():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    daemon.terminate()
    assert daemon.wait() == 0
    log = daemon.log()
    assert log.count("received signal=SIGTERM") == 2
    steps = re.findall(r"shutdown step=(\w+)", log)
    assert steps == list(SHUTDOWN_ORDER)
    assert not lease_file_for(workflow).exists()
    (agent,) = [e for e in read_agent_log(root / "agent.log") if e["event"] == "start"]
    assert not any(e["event"] == "end" for e in read_agent_log(root / "agent.log"))
    import psutil

    assert not psutil.pid_exists(agent["pid"]) or psutil.Process(agent["pid"]).status() == "zombie"
