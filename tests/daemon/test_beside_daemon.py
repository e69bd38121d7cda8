"""A second ``lorenz`` beside a running daemon: it refuses, and the daemon's runs go on alone.

Reproduces issue 32, point 1, with real processes: a daemon (``--feature daemon --feature
durable_claims``) runs two issues in detached workers, each agent held until the test lets it
go; then ``lorenz --once WORKFLOW.md`` and plain ``lorenz WORKFLOW.md`` are started in the same
folder. Before the fix each ran every issue a second time beside the daemon (the agents' per-slot
``flock`` says ``dup``), took the daemon's live workers for a lost controller's and cancelled
them when it stopped. Now each exits 2 with one ``daemon_running`` line naming the daemon's pid
and pointing to ``lorenz refresh``; no agent starts twice and none is cancelled.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.daemon.harness import CLI, DaemonProcess, read_agent_log, write_daemon_workflow
from tests.waiting import wait_until

SECOND_RUN_BOUND_S = 90.0
"""Hang protection only: a refusing run exits long before (a run beside the daemon never)."""


def _second(workflow: Path, env: dict[str, str], args: list[str]) -> tuple[int, str, str]:
    try:
        done = subprocess.run(
            [*CLI, str(workflow), "--no-tui", *args],
            env=env,
            cwd=workflow.parent,
            capture_output=True,
            text=True,
            timeout=SECOND_RUN_BOUND_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"lorenz {' '.join(args)} ran beside the daemon for {SECOND_RUN_BOUND_S} s"
        ) from exc
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("args", [["--once"], []], ids=["once", "plain"])
def test_a_second_lorenz_beside_a_live_daemon_refuses_and_runs_nothing(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], args: list[str]
) -> None:
    hold = root / "release"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1", "A-2"),
        agent_env={"AGENT_HOLD_FILE": str(hold), "AGENT_MIN_S": "0", "AGENT_MAX_S": "0",
                   "AGENT_FAIL_RATE": "0"},
    )
    log = root / "agent.log"
    daemon = DaemonProcess(workflow, env=daemon_env, output=root / "daemon.log")
    daemons.append(daemon.start())
    lease = daemon.wait_ready()

    def started() -> list[str]:
        return [e["slot"] for e in read_agent_log(log) if e["event"] == "start"]

    wait_until(lambda: len(started()) == 2, timeout=120.0, what="the daemon's two agents")

    code, out, err = _second(workflow, daemon_env, args)

    assert code == 2, (out, err)
    (line,) = [text for text in err.splitlines() if text.strip()]
    assert line.startswith("daemon_running: ")
    assert f"pid {daemon.pid}" in line
    assert lease["endpoint"] in line
    assert "lorenz refresh" in line
    assert "lorenz status" in line
    # Nothing ran a second time, and the daemon's workers were neither adopted nor cancelled.
    assert sorted(started()) == sorted(set(started()))
    assert not any(e.get("dup") for e in read_agent_log(log))
    assert not any(e["event"] == "end" for e in read_agent_log(log))
    assert "lost controller" not in out + err
    assert daemon.alive()

    hold.touch()
    wait_until(
        lambda: sum(e["event"] == "end" for e in read_agent_log(log)) == 2,
        timeout=120.0,
        what="the daemon's runs to end",
    )
    ends = [e for e in read_agent_log(log) if e["event"] == "end"]
    assert [e["rc"] for e in ends] == [0, 0]
    assert len(started()) == 2
    assert daemon.alive()


def test_a_dry_run_beside_a_live_daemon_still_previews(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    """``--dry-run`` dispatches, claims and adopts nothing: it is not refused."""
    hold = root / "release"
    workflow = write_daemon_workflow(
        root, issues=("A-1",), agent_env={"AGENT_HOLD_FILE": str(hold), "AGENT_FAIL_RATE": "0"}
    )
    daemon = DaemonProcess(workflow, env=daemon_env, output=root / "daemon.log")
    daemons.append(daemon.start())
    daemon.wait_ready()

    code, out, err = _second(workflow, daemon_env, ["--dry-run"])

    assert code == 0, (out, err)
    assert "daemon_running" not in out + err
    hold.touch()


def test_a_lease_left_by_a_dead_daemon_does_not_refuse(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    workflow = write_daemon_workflow(root, issues=(), agent_env={"AGENT_FAIL_RATE": "0"})
    daemon = DaemonProcess(workflow, env=daemon_env, output=root / "daemon.log")
    daemons.append(daemon.start())
    daemon.wait_ready()
    daemon.kill9()

    code, out, err = _second(workflow, daemon_env, ["--once"])

    assert code == 0, (out, err)
    assert "daemon_running" not in out + err
