"""``lorenz WORKFLOW.md`` in a real terminal (tmux): the view appears, SIGTERM leaves it clean.

tmux is the terminal here: it gives the process a real pseudo-terminal, keeps the screen to
read back, and tracks the cursor-visibility and alternate-screen modes — exactly what "the
terminal is restored" means. Each test runs its own tmux server on a private socket.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
LORENZ = Path(sys.executable).parent / "lorenz"
"""The console script, as installed into the environment running the tests."""


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return result.stdout

    def pane(self, fmt: str) -> str:
        return self("display-message", "-p", "-t", "lorenz", fmt).strip()

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "lorenz")

    def wait_for(self, predicate: object, *, timeout: float = 30.0) -> None:
        assert callable(predicate)
        wait_until(
            predicate,
            timeout=timeout,
            what=lambda: f"the terminal to get there; screen:\n{self.screen()}",
            interval=0.05,
        )


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; run scripts/install-chromium", pytrace=False)
    session = Tmux(f"lorenz-test-{uuid.uuid4().hex[:8]}")
    try:
        yield session
    finally:
        subprocess.run(["tmux", "-L", session.socket, "kill-server"], capture_output=True)


def _workflow(tmp_path: Path) -> Path:
    issues = tmp_path / "issues"
    issues.mkdir()
    (issues / "TERM-1.md").write_text(
        "---\nidentifier: TERM-1\ntitle: Shown in the terminal\nstate: Todo\n---\nBody.\n"
    )
    agent = tmp_path / "agent.py"
    agent.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            sys.stdin.read()
            print("working on", os.environ["LORENZ_ISSUE_IDENTIFIER"], flush=True)
            while True:
                time.sleep(0.1)
            """
        )
    )
    workflow = tmp_path / "WORKFLOW.md"
    workflow.write_text(
        textwrap.dedent(
            f"""\
            ---
            tracker:
              kind: files
              path: issues
            polling:
              interval_ms: 60000
            workspace:
              root: {tmp_path / "workspaces"}
            agent:
              kind: test
              max_turns: 1
            agents:
              test:
                protocol: command
                command: {sys.executable} {agent}
            ---
            Work on {{{{ issue.identifier }}}}.
            """
        )
    )
    return workflow


def _start_lorenz(tmux: Tmux, tmp_path: Path, *args: str) -> Path:
    """``lorenz WORKFLOW.md [args]`` in the pane; the file its exit status will be written to."""
    workflow = _workflow(tmp_path)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TERM": "xterm-256color",
        "PYTHONPATH": str(REPO_ROOT / "controller"),
        # NB: the suite's short private worker state root (tests/conftest.py): under HOME (a
        # long pytest path) the workers' socket paths pass 107 bytes (worker_socket_path_too_long).
        "LORENZ_WORKER_STATE": os.environ["LORENZ_WORKER_STATE"],
    }
    assignments = [f"{key}={value}" for key, value in env.items()]
    # NB: SIGTERM here means "stop now" with the run still in flight: no drain window.
    command = " ".join(
        ["env", "-i", *assignments, str(LORENZ), str(workflow), "--grace-seconds", "0", *args]
    )
    exit_file = tmp_path / "exit-status"
    # The shell records lorenz's real exit status; lorenz runs in the foreground of the pane's
    # terminal, as it does when a person starts it.
    tmux(
        "new-session",
        "-d",
        "-s",
        "lorenz",
        "-x",
        "160",
        "-y",
        "45",
        "-c",
        str(tmp_path),
        # NB: the shell lingers after lorenz exits so the pane (and the terminal modes lorenz
        # left behind) can still be read: a dead pane's modes are tmux's, not lorenz's.
        f"sleep 0.3; {command}; echo $? > {exit_file}; sleep 60",
    )
    return exit_file


def _terminate(tmux: Tmux, exit_file: Path) -> str:
    shell = psutil.Process(int(tmux.pane("#{pane_pid}")))
    (lorenz,) = [p for p in shell.children() if "lorenz" in " ".join(p.cmdline())]
    lorenz.send_signal(signal.SIGTERM)
    tmux.wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != "")
    return exit_file.read_text().strip()


def test_run_mode_shows_the_view_and_sigterm_restores_the_terminal(
    tmp_path: Path, tmux: Tmux
) -> None:
    exit_file = _start_lorenz(tmux, tmp_path)
    # The view comes up with its lanes, the issue running, and the countdown.
    tmux.wait_for(lambda: "working on TERM-1" in tmux.screen() and "Running 1" in tmux.screen())
    screen = tmux.screen()
    for expected in ("Lorenz", "● running", "next poll", "Retrying", "Recent events"):
        assert expected in screen, screen
    assert "Shown in the terminal" in screen
    assert tmux.pane("#{cursor_flag}") == "0"  # hidden while the view is live

    assert _terminate(tmux, exit_file) == "0"
    # The terminal is back as it was: cursor shown, main screen, the last picture kept.
    assert tmux.pane("#{cursor_flag}") == "1"
    assert tmux.pane("#{alternate_on}") == "0"
    final = tmux.screen()
    assert "TERM-1" in final
    assert "Traceback" not in final


def test_no_tui_flag_keeps_the_terminal_to_log_lines(tmp_path: Path, tmux: Tmux) -> None:
    exit_file = _start_lorenz(tmux, tmp_path, "--no-tui")
    tmux.wait_for(lambda: "run_started" in tmux.screen())
    screen = tmux.screen()
    assert "Recent events" not in screen
    assert "● running" not in screen
    assert "identifier=TERM-1" in screen  # structured, run-scoped log lines instead
    assert tmux.pane("#{cursor_flag}") == "1"
    assert _terminate(tmux, exit_file) == "0"
