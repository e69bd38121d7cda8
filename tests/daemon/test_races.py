"""Daemons of one workflow started at the same instant: exactly one leads, every time."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorenz.daemon.discovery import lease_file_for, read_lease
from tests.daemon.harness import DaemonProcess, write_daemon_workflow

ROOT = Path(__file__).resolve().parents[2]
SOAK_ROUNDS = 40
ROUND_BUDGET_S = 20.0
"""Hang protection per round of the soak: a parent that imports the daemon, five forked
racers, the winner's start until it serves and its graceful stop. Here the 40 rounds took
216 s (5.4 s a round) at a load of 12 on 2 cores, beside the crash soak; CI runs three test
groups at once at a load of 25-35, where they outlasted the default 300 s."""


def race_rounds(workflow: Path, env: dict[str, str], out: Path, *, rounds: int, racers: int) -> int:
    """Run ``rounds`` races of ``racers`` daemons; returns how many refusals were checked."""
    refusals = 0
    for round_no in range(rounds):
        results = out / f"round-{round_no}"
        parent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.daemon.racers",
                str(workflow),
                str(racers),
                str(results),
                "--feature",
                "daemon",
                "--no-tui",
            ],
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert parent.stdout is not None
            pids = json.loads(parent.stdout.readline())
            deadline = time.monotonic() + 60
            while len(list(results.glob("*.rc"))) < racers - 1:
                assert time.monotonic() < deadline, "losers did not exit"
                assert parent.poll() is None, "every racer exited: nobody holds the lease"
                time.sleep(0.01)
            finished: dict[int, int] = {}
            for path in results.glob("*.rc"):
                pid, status = map(int, path.read_text().split())
                finished[pid] = status
            (winner,) = set(pids) - set(finished)
            for index in range(racers):
                text = (results / f"{index}.out").read_text()
                if pids[index] == winner:
                    continue
                assert finished[pids[index]] == 1, text
                assert "daemon_already_running" in text, text
                assert f"pid {winner}" in text, text
                assert "claims hydrated" not in text  # refused before opening anything
                refusals += 1
            lease = read_lease(lease_file_for(workflow))
            assert lease is not None
            assert lease["pid"] == winner
            while (read_lease(lease_file_for(workflow)) or {}).get("endpoint") is None:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            os.kill(winner, signal.SIGTERM)
            codes = json.loads(parent.stdout.readline())
            assert parent.wait(timeout=60) == 0
            assert codes[str(winner)] == 0
            assert read_lease(lease_file_for(workflow)) is None
        finally:
            if parent.poll() is None:
                for pid in pids:
                    with_suppressed_kill(pid)
                parent.kill()
                parent.wait()
    return refusals


def with_suppressed_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


ROUNDS = 20


# NB: the default 300 s is 15 s a round; a full CI-like run at load 28 took longer (the winner's
# graceful stop alone can take seconds there). Hang protection, not a speed check.
@pytest.mark.timeout(int(ROUNDS * ROUND_BUDGET_S))
def test_the_second_daemon_refuses_every_time(
    root: Path, daemon_env: dict[str, str], tmp_path: Path
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    refusals = race_rounds(workflow, daemon_env, tmp_path / "races", rounds=ROUNDS, racers=3)
    assert refusals >= ROUNDS * 2


@pytest.mark.soak
@pytest.mark.timeout(int(SOAK_ROUNDS * ROUND_BUDGET_S))
def test_the_second_daemon_refuses_every_time_soak(
    root: Path, daemon_env: dict[str, str], tmp_path: Path
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    refusals = race_rounds(workflow, daemon_env, tmp_path / "races", rounds=SOAK_ROUNDS, racers=5)
    assert refusals >= SOAK_ROUNDS * 4


def test_a_late_second_daemon_names_the_owner_pid_and_endpoint(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    first = DaemonProcess(workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "1")
    daemons.append(first.start())
    lease = first.wait_ready()
    second = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon"], output=root / "2"
    )
    daemons.append(second.start())
    assert second.wait() == 1
    text = second.log()
    assert "daemon_already_running" in text
    assert f"pid {first.pid}" in text
    assert lease["endpoint"] in text
    # --once never takes the lease, and beside a live daemon it runs nothing: daemon_running
    # (exit 2; issue 32 — before, it ran every issue a second time beside the daemon)
    once = DaemonProcess(
        workflow, env=daemon_env, args=["--feature", "daemon", "--once"], output=root / "3"
    )
    daemons.append(once.start())
    assert once.wait() == 2, once.log()
    assert "daemon_running" in once.log()
    assert f"pid {first.pid}" in once.log()
    assert (read_lease(lease_file_for(workflow)) or {}).get("pid") == first.pid
