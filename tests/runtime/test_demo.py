"""README command 1 works: ./scripts/demo drives the real CLI to completion on the demo."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli.processes import run_bounded

ROOT = Path(__file__).resolve().parents[2]


def test_demo_script_finishes_every_active_issue(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    env = {**os.environ, "LORENZ_DEMO_DIR": str(work), "LORENZ_DEMO_TIMEOUT": "90"}
    # NB: on timeout the whole tree (script, lorenz, agents) is stopped, not just the script.
    result = run_bounded([str(ROOT / "scripts" / "demo")], env=env, timeout=180)
    assert not result.timed_out, result.stdout + result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All active issues done." in result.stdout
    assert "lorenz stopped (exit 0)" in result.stdout
    states = {p.stem: p.read_text() for p in (work / "issues").glob("*.md")}
    assert all("state: Done" in states[k] for k in ("DEMO-1", "DEMO-2", "DEMO-3"))
    assert "state: Backlog" in states["DEMO-4"]
    # DEMO-3 is blocked by DEMO-2: it may only start after DEMO-2 finished.
    lines = [line for line in result.stdout.splitlines() if "run_" in line]
    started_3 = next(i for i, ln in enumerate(lines) if "run_started" in ln and "DEMO-3" in ln)
    finished_2 = next(i for i, ln in enumerate(lines) if "run_finished" in ln and "DEMO-2" in ln)
    assert finished_2 < started_3
    # the original demo files in the repository are untouched
    assert "state: Todo" in (ROOT / "examples/demo/issues/DEMO-1.md").read_text()
