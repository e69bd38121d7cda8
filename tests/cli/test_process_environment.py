"""``lorenz WORKFLOW.md``'s own environment stays out of reach of processes of its uid (agents).

Agents on the single host run as the user who runs ``lorenz``; a tracker key exported for the
workflow's ``$VAR`` is in that process's environment. Real processes under one unprivileged uid
(``setpriv``; the suite runs as root): ``lorenz`` with a token in its environment, and another
process of the same uid that reads ``/proc/<pid>/environ`` and ``/proc/<pid>/mem`` as an agent
could. They run the system's Python of the suite's version on the project's sources and
packages (the suite's own interpreter lives where that uid cannot reach).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_run_mode import files_workflow
from tests.kube.test_process_environment import as_nobody, interpreter
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TOKEN = "lin_s3cr3t_0123456789"

READER = """
import sys
pid = sys.argv[1]
for name in ("environ", "mem"):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as file:
            data = file.read(1 << 16) if name == "environ" else b""
    except PermissionError:
        print(name, "refused")
    else:
        print(name, "read" if b"LINEAR_API_KEY=" in data else "opened")
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged uid can use (pytest's own tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="lorenz-uid-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_process_of_the_same_uid_cannot_read_lorenzs_environment(shared_dir: Path) -> None:
    files_workflow(shared_dir)  # one issue, an agent that touches agent-ran
    for path in (shared_dir / "issues", *(shared_dir / "issues").iterdir()):
        path.chmod(0o777)
    marker = shared_dir / "agent-ran"
    packages = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(shared_dir), "TMPDIR": str(shared_dir),
           "LANG": "C.UTF-8", "LINEAR_API_KEY": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(REPO / "controller"), *packages])}
    lorenz = subprocess.Popen(
        [*as_nobody(), interpreter(), "-c",
         "import sys; from lorenz.cli import main; sys.exit(main())", "WORKFLOW.md",
         "--no-tui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=shared_dir,
    )
    try:
        assert lorenz.stderr is not None
        stderr = lorenz.stderr
        lines: list[str] = []

        def started() -> str | None:
            line = stderr.readline()
            lines.append(line)
            if not line:
                return "ended"
            return "polls" if "claims hydrated" in line else None

        assert wait_until(started, timeout=120, what="lorenz polls") == "polls", "".join(lines)
        # A run still works: the launcher and the agent, exec'd, are dumpable again.
        wait_until(marker.exists, timeout=120, what="the agent ran")
        reader = subprocess.run(
            [*as_nobody(), interpreter(), "-c", READER, str(lorenz.pid)], capture_output=True,
            text=True, env={"PATH": env["PATH"]}, cwd="/", timeout=60, check=True,
        )
    finally:
        lorenz.kill()
        lorenz.wait(timeout=30)
    # Without it the same uid reads the key ("environ read"), and opens the memory.
    assert reader.stdout.split("\n")[:2] == ["environ refused", "mem refused"], reader.stdout
