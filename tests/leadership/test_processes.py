"""The file lease between real processes: racers started together, and SIGKILL mid-write."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.leadership import FileLeaseProvider, LeaseRecord, lease_path, read_lease_file

REPO = Path(__file__).resolve().parents[2]
RACERS = 20
PARENT_EXIT_S = 120.0
"""Hang protection only: the racers' parent exits once it reaped its killed winner."""


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.leadership.workers", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def expect_line(child: subprocess.Popen[str]) -> Any:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        _, err = child.communicate()
        raise AssertionError(f"child exited early (rc={child.returncode}):\n{err}")
    return json.loads(line)


def tell(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdin is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()


def race_once(workflow: Path) -> tuple[subprocess.Popen[str], int, list[Any]]:
    """Fork RACERS processes, release them together.

    Returns the racers' parent, the winner's pid (it holds the lease until killed) and every
    racer's report.
    """
    parent = spawn("race", str(workflow), "--count", str(RACERS))
    try:
        pids = expect_line(parent)
        assert len(pids) == RACERS
        tell(parent, "go")
        reports = [expect_line(parent) for _ in range(RACERS)]
        assert sorted(r["pid"] for r in reports) == sorted(pids)
        winners = [r["pid"] for r in reports if r["won"]]
        assert len(winners) == 1, reports
        tell(parent, "exit")  # the losers go; the winner holds the lease
    except BaseException:
        for pid in pids_of(parent):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
        raise
    return parent, winners[0], reports


def pids_of(parent: subprocess.Popen[str]) -> list[int]:
    """The racers the parent forked (still running or not yet reaped)."""
    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process(parent.pid).children()]
    return []


def run_rounds(workflow: Path, rounds: int) -> None:
    """Race, then SIGKILL the winner (its lock stays behind), and race again over its corpse."""
    for round_ in range(rounds):
        parent, winner, reports = race_once(workflow)
        try:
            (won,) = [r for r in reports if r["won"]]
            assert won["transitions"] == round_  # round 0 found no lock; later ones replaced
            lost = [r for r in reports if not r["won"]]
            assert {r["code"] for r in lost} == {"daemon_already_running"}
            assert {r["owner_pid"] for r in lost} == {winner}
            record = read_lease_file(lease_path(workflow))
            assert record is not None
            assert record.pid == winner
        finally:
            os.kill(winner, signal.SIGKILL)
        # NB: the racers' parent reaps them all, the winner last, then exits.
        assert parent.wait(timeout=PARENT_EXIT_S) == 0, parent.communicate()

@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    path = tmp_path / "WORKFLOW.md"
    path.write_text("---\n---\nprompt\n")
    return path


def test_racers_started_together_elect_exactly_one(workflow: Path) -> None:
    run_rounds(workflow, rounds=3)


@pytest.mark.soak
def test_racers_soak(workflow: Path) -> None:
    run_rounds(workflow, rounds=10)


def test_kill_between_temp_write_and_rename_keeps_the_old_lock(workflow: Path) -> None:
    child = spawn("torn", str(workflow), "--endpoint", "http://127.0.0.1:7001")
    try:
        acquired = LeaseRecord.from_dict(expect_line(child)["acquired"])
        paused = Path(expect_line(child)["paused"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    path = lease_path(workflow)
    # The lock is the old record, whole and parseable; the half-done renewal never landed.
    assert read_lease_file(path) == acquired
    # The renewal sat complete in its temp file, fsynced, one rename short.
    assert paused.parent == path.parent
    pending = LeaseRecord.from_dict(json.loads(paused.read_text()))
    assert pending.heartbeat_at > acquired.heartbeat_at
    # The writer is dead (same host, pid gone): the next daemon takes over at once and sweeps
    # the leftover temp file.
    record = asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert record.transitions == 1
    assert not paused.exists()
