"""README command 1 works: ./scripts/demo drives the real CLI to completion on the demo."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from tests.cli.processes import processes_marked, run_bounded

ROOT = Path(__file__).resolve().parents[2]
_MICROSECOND = datetime.timedelta(microseconds=1)


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
    # DEMO-3 is blocked by DEMO-2: it may only start once the tracker shows DEMO-2 Done. NB: not
    # once DEMO-2's run_finished is logged: the pass that reads DEMO-2 Done may start DEMO-3
    # before it settles DEMO-2's clean exit (or before DEMO-2's agent has even exited).
    events = [json.loads(line) for line in (work / "lorenz-events.jsonl").read_text().splitlines()]
    [started_3] = [e for e in events if e["type"] == "run_started" and e["identifier"] == "DEMO-3"]
    # The demo agent's atomic rewrite to Done is the last write to DEMO-2.md, so the file's
    # mtime says when it was made (a file stamp is never later than the clock reading of the
    # same moment); the dispatch that read it took its event time after that read.
    done_2_us = (work / "issues" / "DEMO-2.md").stat().st_mtime_ns // 1000
    at_3 = datetime.datetime.fromisoformat(started_3["at"])
    started_3_us = (at_3 - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // _MICROSECOND
    assert done_2_us <= started_3_us, (started_3, done_2_us)
    # Every run went through a detached worker (the default), and none is left running.
    state_root = Path(os.environ["LORENZ_WORKER_STATE"])
    workers = [
        spec["issue"]["identifier"]
        for spec in (json.loads(p.read_text()) for p in state_root.glob("lzw-*/spec.json"))
        if spec["workflow"] == str(work / "WORKFLOW.md")
    ]
    assert sorted(workers) == ["DEMO-1", "DEMO-2", "DEMO-3"]
    assert processes_marked("LORENZ_DEMO_DIR", str(work)) == []
    # the original demo files in the repository are untouched
    assert "state: Todo" in (ROOT / "examples/demo/issues/DEMO-1.md").read_text()
