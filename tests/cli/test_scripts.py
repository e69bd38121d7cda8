"""The repository's scripts: ``scripts/demo`` stops everything it started, however it ends,
its detached workers included."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli.processes import processes_marked, processes_mentioning, run_bounded

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo"
HANG_GUARD_S = 240.0
"""Hang protection only; never asserted as a figure."""


def demo_environ(work: Path, *, timeout_s: int) -> dict[str, str]:
    return {
        **os.environ,
        "LORENZ_DEMO_DIR": str(work),
        "LORENZ_DEMO_TIMEOUT": str(timeout_s),
        # The demo agent pauses this long between progress lines: it never finishes here.
        "LORENZ_DEMO_STEP_DELAY": "600",
    }


def test_a_demo_that_times_out_stops_lorenz_and_its_agents_before_it_exits(
    tmp_path: Path,
) -> None:
    work = tmp_path / "demo"
    result = run_bounded([str(DEMO)], timeout=HANG_GUARD_S, env=demo_environ(work, timeout_s=15))
    assert not result.timed_out
    assert result.returncode == 1, result.stdout + result.stderr
    assert "demo timed out" in result.stderr
    assert processes_mentioning(str(work)) == [], (work / "lorenz.log").read_text()
    # Workers run detached, outside the script's process tree: none is left either.
    assert processes_marked("LORENZ_DEMO_DIR", str(work)) == [], (work / "lorenz.log").read_text()


def test_a_test_timeout_leaves_no_demo_process_behind(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    log = work / "lorenz.log"
    result = run_bounded([str(DEMO)], timeout=20, env=demo_environ(work, timeout_s=3600))
    assert result.timed_out
    assert log.exists(), "the demo had started Lorenz"
    assert processes_mentioning(str(work)) == [], log.read_text()
    assert processes_marked("LORENZ_DEMO_DIR", str(work)) == [], log.read_text()
