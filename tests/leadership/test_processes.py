"""The file lease between real processes: racers started together, and SIGKILL mid-write."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lorenz.leadership import FileLeaseProvider, LeaseRecord, lease_path, read_lease_file

REPO = Path(__file__).resolve().parents[2]
RACERS = 20


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


def race_once(workflow: Path) -> tuple[subprocess.Popen[str], list[Any]]:
    """Start RACERS processes, release them together; return the winner and all reports."""
    children = [spawn("race", str(workflow)) for _ in range(RACERS)]
    try:
        for child in children:
            assert expect_line(child) == "ready"
        for child in children:
            tell(child, "go")
        reports = [expect_line(child) for child in children]
    except BaseException:
        for child in children:
            child.kill()
            child.wait()
        raise
    winners = [c for c, r in zip(children, reports, strict=True) if r["won"]]
    losers = [c for c, r in zip(children, reports, strict=True) if not r["won"]]
    for child in losers:
        tell(child, "exit")
        child.wait()
    assert len(winners) == 1, reports
    return winners[0], reports


def run_rounds(workflow: Path, rounds: int) -> None:
    """Race, then SIGKILL the winner (its lock stays behind), and race again over its corpse."""
    for round_ in range(rounds):
        winner, reports = race_once(workflow)
        (won,) = [r for r in reports if r["won"]]
        assert won["transitions"] == round_  # round 0 found no lock; later ones replaced one
        lost = [r for r in reports if not r["won"]]
        assert {r["code"] for r in lost} == {"daemon_already_running"}
        assert {r["owner_pid"] for r in lost} == {winner.pid}
        record = read_lease_file(lease_path(workflow))
        assert record is not None
        assert record.pid == winner.pid
        winner.send_signal(signal.SIGKILL)
        winner.wait()


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
