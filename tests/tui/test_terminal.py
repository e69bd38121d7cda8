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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

LAUNCHER = """
import os, pathlib, sys
pathlib.Path(os.environ["LORENZ_TEST_PID_FILE"]).write_text(str(os.getpid()))
from lorenz.daemon.host import ATTACHMENTS
from lorenz.tui import attachment_factory
# Run mode as shipped, with the terminal view registered (a no-op once run mode registers it).
if attachment_factory not in ATTACHMENTS:
    ATTACHMENTS.append(attachment_factory)
from lorenz.cli import main
sys.exit(main(sys.argv[1:]))
"""


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
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"terminal never got there; screen:\n{self.screen()}")
            time.sleep(0.05)


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


def test_run_mode_shows_the_view_and_sigterm_restores_the_terminal(
    tmp_path: Path, tmux: Tmux
) -> None:
    workflow = _workflow(tmp_path)
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TERM": "xterm-256color",
        "PYTHONPATH": str(REPO_ROOT / "controller"),
        "LORENZ_TEST_PID_FILE": str(tmp_path / "lorenz.pid"),
    }
    command = " ".join(
        [
            "env",
            "-i",
            *(f"{key}={value}" for key, value in env.items()),
            sys.executable,
            str(launcher),
            str(workflow),
        ]
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

    # The view comes up with its lanes, the issue running, and the countdown.
    tmux.wait_for(lambda: "working on TERM-1" in tmux.screen() and "Running 1" in tmux.screen())
    screen = tmux.screen()
    for expected in ("Lorenz", "● running", "next poll", "Retrying", "Recent events"):
        assert expected in screen, screen
    assert "Shown in the terminal" in screen
    assert tmux.pane("#{cursor_flag}") == "0"  # hidden while the view is live

    pid = int((tmp_path / "lorenz.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    tmux.wait_for(lambda: exit_file.exists() and exit_file.read_text().strip() != "")
    assert exit_file.read_text().strip() == "0"
    # The terminal is back as it was: cursor shown, main screen, the last picture kept.
    assert tmux.pane("#{cursor_flag}") == "1"
    assert tmux.pane("#{alternate_on}") == "0"
    final = tmux.screen()
    assert "TERM-1" in final
    assert "Traceback" not in final
