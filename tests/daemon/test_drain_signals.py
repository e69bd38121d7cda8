"""Killing is asked for by name: a second signal during a drain is ignored; ``--force-kill``
and ``lorenz stop --force`` cancel.

Real daemons (``--feature daemon --feature durable_claims``, runs in detached workers) on a
files tracker, each agent held until the test lets it go:

* SIGTERM twice during the drain: the second is logged and ignored, the run in flight finishes
  normally (rc 0) inside the window and the daemon exits 0 — before, the second signal cancelled
  it;
* a window that ends with the run still going leaves its worker running for the next
  controller — unless the daemon was started with ``--force-kill``, which cancels it;
* ``lorenz stop --force`` ends a drain under way and cancels the run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from lorenz.daemon.discovery import lease_file_for
from lorenz.daemon.shutdown import SHUTDOWN_ORDER
from tests.daemon.harness import (
    CLI,
    DaemonProcess,
    pid_alive,
    read_agent_log,
    write_daemon_workflow,
)
from tests.waiting import wait_until

DAEMON = ["--feature", "daemon", "--feature", "durable_claims"]


def _started_daemon(
    root: Path, env: dict[str, str], daemons: list[DaemonProcess], *, args: list[str]
) -> tuple[DaemonProcess, Path, dict[str, object]]:
    hold = root / "release"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env={"AGENT_HOLD_FILE": str(hold), "AGENT_MIN_S": "0", "AGENT_MAX_S": "0",
                   "AGENT_FAIL_RATE": "0"},
    )
    daemon = DaemonProcess(workflow, env=env, args=[*DAEMON, *args], output=root / "daemon.log")
    daemons.append(daemon.start())
    daemon.wait_ready()
    wait_until(lambda: _events(root, "start"), timeout=120.0, what="the agent to start")
    (agent,) = _events(root, "start")
    return daemon, hold, agent


def _events(root: Path, name: str) -> list[dict[str, object]]:
    return [e for e in read_agent_log(root / "agent.log") if e["event"] == name]


def test_a_second_signal_during_the_drain_is_logged_and_ignored(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon, hold, _agent = _started_daemon(
        root, daemon_env, daemons, args=["--grace-seconds", "300"]
    )

    daemon.terminate()
    wait_until(
        lambda: "draining: no new runs" in daemon.log(),
        timeout=120.0,
        what="the drain to begin",
    )
    daemon.terminate()
    wait_until(
        lambda: "again; ignored" in daemon.log(),
        timeout=120.0,
        what="the second signal to be logged",
    )
    assert not _events(root, "end"), "the second signal cancelled the run in flight"
    assert daemon.alive()

    hold.touch()
    assert daemon.wait() == 0
    (end,) = _events(root, "end")
    assert end["rc"] == 0
    log = daemon.log()
    assert log.count("received signal=SIGTERM") == 2
    assert re.findall(r"shutdown step=(\w+)", log) == list(SHUTDOWN_ORDER)
    assert not lease_file_for(daemon.workflow).exists()


@pytest.mark.parametrize("force_kill", [True, False], ids=["force-kill", "hand-over"])
def test_force_kill_cancels_the_workers_a_drain_would_leave_running(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], force_kill: bool
) -> None:
    extra = ["--grace-seconds", "1", *(["--force-kill"] if force_kill else [])]
    daemon, hold, agent = _started_daemon(root, daemon_env, daemons, args=extra)

    daemon.terminate()
    assert daemon.wait() == 0
    log = daemon.log()
    if force_kill:
        assert "grace ended with runs in flight; cancelling them" in log
        wait_until(
            lambda: not pid_alive(int(str(agent["pid"]))),
            timeout=120.0,
            what="the agent to be gone",
        )
        (end,) = _events(root, "end")
        assert end["rc"] == -15  # the agent's own SIGTERM mark: cancelled, not crashed
    else:
        assert "leaving their workers to the next" in log
        assert pid_alive(int(str(agent["pid"])))
        assert not _events(root, "end")
    hold.touch()


def test_stop_force_ends_a_drain_and_cancels_the_run(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon, _hold, agent = _started_daemon(
        root, daemon_env, daemons, args=["--grace-seconds", "300"]
    )
    daemon.terminate()
    wait_until(
        lambda: "draining: no new runs" in daemon.log(),
        timeout=120.0,
        what="the drain to begin",
    )

    done = subprocess.run(
        [*CLI, "stop", str(daemon.workflow), "--force", "--wait"],
        env=daemon_env,
        cwd=daemon.workflow.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, (done.stdout, done.stderr)
    assert daemon.wait() == 0
    wait_until(
        lambda: not pid_alive(int(str(agent["pid"]))),
        timeout=120.0,
        what="the agent to be gone",
    )
    (end,) = _events(root, "end")
    assert end["rc"] == -15
