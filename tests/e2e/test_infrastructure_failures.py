"""Issue #32 point 2 end to end: a host that cannot start workers never spends an issue's retry
budget.

A real ``lorenz --feature daemon`` on a files tracker runs every agent in a real worker. Its
worker state root is unusable (a read-only bind mount of it: root ignores permission bits, but
not a read-only mount), so every launch fails with a host-side code. With
``retry.max_attempts: 1`` and ``terminal_action: cancel`` one counted failure would cancel the
issue; these never count (``lorenz.policies.retries.INFRASTRUCTURE_CODES``), so the issue stays
where it was and runs once the state root is usable again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.daemon.conftest import daemon_env, daemons, root, runtime_dir
from tests.daemon.harness import (
    CLI,
    DaemonProcess,
    get_state,
    read_agent_log,
    write_daemon_workflow,
    write_issues,
)
from tests.waiting import wait_until

__all__ = ["daemon_env", "daemons", "root", "runtime_dir"]  # fixtures used here

WAIT_S = 90.0
"""Hang protection only: failed launches a few hundred ms apart on a loaded 2-core machine."""

HOST_FAILURE = re.compile(r"run_failed (worker_launch_failed|worker_state_error)")


@pytest.fixture
def read_only_state_root(daemon_env: dict[str, str]) -> Iterator[Path]:
    """The daemon's worker state root, bind-mounted read-only on itself (unmounted after)."""
    if os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    state_root = Path(daemon_env["LORENZ_WORKER_STATE"])
    state_root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(state_root), str(state_root)], check=True)
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(state_root)], check=True
        )
        yield state_root
    finally:
        # NB: lazy, so a worker that kept a file open cannot keep the mount alive.
        subprocess.run(["umount", "-l", str(state_root)], check=False)


def issue_state(root: Path, identifier: str) -> str:
    text = (root / "issues" / f"{identifier}.md").read_text(encoding="utf-8")
    match = re.search(r"^state: (.+)$", text, flags=re.MULTILINE)
    assert match is not None, text
    return match.group(1).strip()


def test_a_host_that_cannot_start_workers_never_cancels_the_issue(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    read_only_state_root: Path,
) -> None:
    workflow = write_daemon_workflow(
        root,
        issues=("B-1",),
        front_matter={
            "tracker": {
                "kind": "files",
                "path": "issues",
                "active_states": ["Todo"],
                "terminal_states": ["Done", "Canceled"],
            },
            "retry": {
                "max_attempts": 1,
                "terminal_action": "cancel",
                "cancel_state": "Canceled",
                "backoff": {"initial_ms": 100, "max_ms": 300},
            },
        },
    )
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "daemon.log"
    )
    daemons.append(daemon.start())
    daemon.wait_ready()

    # Three host-side failures in a row: with a budget of one, a counted one would cancel.
    deadline = time.monotonic() + WAIT_S
    while len(HOST_FAILURE.findall(daemon.log())) < 3 and "slot_blocked" not in daemon.log():
        assert daemon.alive(), daemon.log()[-4000:]
        assert time.monotonic() < deadline, daemon.log()[-4000:]
        time.sleep(0.05)
    log = daemon.log()
    assert "slot_blocked" not in log, log[-4000:]
    assert "terminal_action" not in log, log[-4000:]
    assert issue_state(root, "B-1") == "Todo"
    assert read_agent_log(root / "agent.log") == []

    # Writable again: the next retry's worker starts.
    subprocess.run(["umount", str(read_only_state_root)], check=True)
    deadline = time.monotonic() + WAIT_S
    while not read_agent_log(root / "agent.log"):
        assert daemon.alive(), daemon.log()[-4000:]
        assert time.monotonic() < deadline, daemon.log()[-4000:]
        time.sleep(0.05)
    assert "terminal_action" not in daemon.log()
    assert issue_state(root, "B-1") == "Todo"
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]


def test_a_host_that_cannot_start_workers_pauses_dispatch_until_a_probe_starts_one(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    read_only_state_root: Path,
) -> None:
    """The host fault pauses dispatch with its code — the snapshot, ``lorenz status`` — one
    probe run at a time goes on, and dispatch resumes by itself once a worker starts."""
    workflow = write_daemon_workflow(
        root,
        issues=("P-1", "P-2", "P-3"),
        front_matter={"retry": {"backoff": {"initial_ms": 100, "max_ms": 300}}},
    )
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "daemon.log"
    )
    daemons.append(daemon.start())
    endpoint = daemon.wait_ready()["endpoint"]

    paused = wait_until(
        lambda: get_state(endpoint)["poll"]["dispatch_paused"],
        timeout=WAIT_S,
        what=lambda: "dispatch to pause; daemon log tail:\n" + daemon.log()[-3000:],
    )
    assert paused["code"] in ("worker_launch_failed", "worker_state_error"), paused
    assert paused["since"]
    # Several more failed probes: one at a time, each a retry that counts nothing.
    wait_until(
        lambda: len(HOST_FAILURE.findall(daemon.log())) >= 6,
        timeout=WAIT_S,
        what=lambda: "more failed probes; daemon log tail:\n" + daemon.log()[-3000:],
    )
    log = daemon.log()
    assert log.count("type=dispatch_paused") == 1, log[-4000:]
    assert "slot_blocked" not in log, log[-4000:]
    status = subprocess.run(
        [*CLI, "status", str(workflow)],
        env=daemon_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "PAUSED" in status.stdout, status.stdout + status.stderr
    assert paused["code"] in status.stdout, status.stdout
    assert read_agent_log(root / "agent.log") == []

    subprocess.run(["umount", str(read_only_state_root)], check=True)
    wait_until(
        lambda: "dispatch_resumed" in daemon.log(),
        timeout=WAIT_S,
        what=lambda: "dispatch to resume; daemon log tail:\n" + daemon.log()[-3000:],
    )
    wait_until(
        lambda: {e["slot"] for e in read_agent_log(root / "agent.log")}
        >= {"P-1#0", "P-2#0", "P-3#0"},
        timeout=WAIT_S,
        what=lambda: "every issue's agent; daemon log tail:\n" + daemon.log()[-3000:],
    )
    assert get_state(endpoint)["poll"]["dispatch_paused"] is None
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]


def launcher_of(daemon: DaemonProcess) -> int | None:
    """The pid of the daemon's warm worker launcher (``lorenz worker --launcher``), once up."""
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--launcher" in cmdline and str(daemon.pid) in cmdline:
            return int(process.info["pid"])
    return None


def test_a_stopped_launcher_times_out_launches_as_a_host_fault(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    """SIGSTOP of the launcher: the launch times out (the launch bound, 60 s) — a host fault,
    never an agent failure: with a budget of one nothing is blocked, dispatch pauses with
    ``worker_launch_timeout``, and resumes by itself once the launcher runs again."""
    workflow = write_daemon_workflow(
        root,
        issues=(),
        front_matter={
            "retry": {
                "max_attempts": 1,
                "terminal_action": "block",
                "backoff": {"initial_ms": 100, "max_ms": 300},
            },
        },
    )
    daemon = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "daemon.log"
    )
    daemons.append(daemon.start())
    endpoint = daemon.wait_ready()["endpoint"]
    launcher = wait_until(
        lambda: launcher_of(daemon), timeout=WAIT_S, what="the daemon's worker launcher"
    )
    os.kill(launcher, signal.SIGSTOP)
    try:
        write_issues(root / "issues", ["L-1"])
        paused = wait_until(
            lambda: get_state(endpoint)["poll"]["dispatch_paused"],
            timeout=WAIT_S + 60,
            what=lambda: "dispatch to pause; daemon log tail:\n" + daemon.log()[-3000:],
        )
        assert paused["code"] == "worker_launch_timeout", paused
        log = daemon.log()
        assert "run_failed worker_launch_timeout" in log, log[-4000:]
        assert "slot_blocked" not in log, log[-4000:]
        assert read_agent_log(root / "agent.log") == []
    finally:
        os.kill(launcher, signal.SIGCONT)
    wait_until(
        lambda: "dispatch_resumed" in daemon.log() and read_agent_log(root / "agent.log"),
        timeout=WAIT_S + 60,
        what=lambda: "dispatch to resume; daemon log tail:\n" + daemon.log()[-3000:],
    )
    assert "slot_blocked" not in daemon.log()
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]
