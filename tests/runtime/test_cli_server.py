"""`lorenz WORKFLOW.md --port N` serves the API and the dashboard from the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_run_mode_serves_state_and_dashboard_then_stops_on_sigterm(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", work)
    port = free_port()
    env = {**os.environ, "LORENZ_DEMO_AGENT": str(ROOT / "examples/demo/agent.py")}
    lorenz = Path(sys.executable).with_name("lorenz")
    proc = subprocess.Popen(
        [str(lorenz), str(work / "WORKFLOW.md"), "--port", str(port), "--no-tui"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/v1/state"

        def three_runs_finished() -> dict[str, Any] | None:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    state: dict[str, Any] = json.load(resp)
            except OSError:
                return None  # not serving yet
            return state if len(state["run_history"]) >= 3 else None

        # NB: a hang guard, not a speed check: the three demo runs take seconds on an idle
        # machine and well over 30 s at load 25.
        state = wait_until(
            three_runs_finished, timeout=240.0, interval=0.2,
            what="the demo's three runs in the API's run history",
        )
        assert state["workflow_path"] == str(work / "WORKFLOW.md")
        assert {h["identifier"] for h in state["run_history"]} >= {"DEMO-1", "DEMO-2", "DEMO-3"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            assert resp.status == 200
            assert "<html" in resp.read().decode().lower()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
