"""`lorenz WORKFLOW.md --port N` serves the API and the dashboard from the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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
        state = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/state",
                                            timeout=2) as resp:
                    state = json.load(resp)
                if state["run_history"] and len(state["run_history"]) >= 3:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert state is not None, "the API never answered"
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
