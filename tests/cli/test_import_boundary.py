"""Which third-party stacks each ``lorenz`` command loads, seen from outside the process.

Why: start-up time is mostly imports. ``lorenz validate`` has a 300 ms budget and must not pay
for the HTTP client, the server stack, psutil or the Kubernetes stack; run mode must not load
the Kubernetes stack (``kubernetes``, ``kopf``) at all — only ``lorenz operator``
does. One careless top-level import in any module on the path (a package ``__init__``, a CLI
module, a settings module) silently breaks that, and no functional test notices.

Each test runs the real console script (``.venv/bin/lorenz``, the file ``pip`` generated for
``lorenz.cli:main``) in a fresh interpreter under ``python -X importtime``, which reports every
module the process imports, whenever and from whichever thread it imports it — at start-up,
lazily inside a command, or at exit. The commands run to completion against a real files
tracker folder and a real agent process (``--once`` dispatches one run), so lazy imports on the
dispatch path count too. Timing figures are in ``bench/startup_bench.py``; nothing here is
timed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

LORENZ = Path(sys.executable).with_name("lorenz")
HANG_GUARD_S = 120.0

KUBERNETES_STACK = frozenset({"kubernetes", "kopf"})
"""Loaded by ``lorenz operator`` only."""

NOT_FOR_VALIDATE = KUBERNETES_STACK | {"aiohttp", "prometheus_client", "psutil", "httpx"}
"""Nothing ``lorenz validate`` / ``lorenz config`` needs: no network, no server, no processes."""

_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *(?P<module>[\w.]+)\s*$")

WORKFLOW = """---
tracker:
  kind: files
  path: issues
polling:
  interval_ms: 100
workspace:
  root: workspaces
agent:
  kind: marker
agents:
  marker:
    protocol: command
    command: touch {marker}
---
Work on {{{{ issue.identifier }}}}.
"""

ISSUE = """---
id: RUN-1
identifier: RUN-1
title: Import boundary
state: Todo
---
Check the imports.
"""


def imported_packages(
    command: Sequence[str], *, cwd: Path
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``command`` under ``-X importtime``; the top-level names of every module it loaded."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    packages = {
        match.group("module").split(".")[0]
        for line in result.stderr.splitlines()
        if (match := _IMPORT_LINE.match(line))
    }
    return result, packages


def _stderr_without_import_lines(result: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(
        line for line in result.stderr.splitlines() if not line.startswith("import time:")
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A workflow on a files tracker with one Todo issue whose agent touches a marker."""
    (tmp_path / "issues").mkdir()
    (tmp_path / "issues" / "RUN-1.md").write_text(ISSUE, encoding="utf-8")
    (tmp_path / "WORKFLOW.md").write_text(
        WORKFLOW.format(marker=tmp_path / "agent-ran"), encoding="utf-8"
    )
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [["validate", "WORKFLOW.md"], ["config", "WORKFLOW.md"], ["config", "WORKFLOW.md", "--json"]],
    ids=["validate", "config", "config-json"],
)
def test_validate_and_config_load_no_network_server_process_or_kubernetes_stack(
    project: Path, args: list[str]
) -> None:
    result, packages = imported_packages([str(LORENZ), *args], cwd=project)
    assert result.returncode == 0, result.stdout + _stderr_without_import_lines(result)
    assert "pydantic" in packages  # the probe sees third-party imports at all
    assert packages & NOT_FOR_VALIDATE == set()


@pytest.mark.parametrize(
    "args",
    [
        ["WORKFLOW.md", "--once", "--no-tui"],
        ["WORKFLOW.md", "--once", "--no-tui", "--feature", "daemon", "--feature", "durable_claims"],
        ["WORKFLOW.md", "--once", "--no-tui", "--port", "0"],
        ["WORKFLOW.md", "--dry-run", "--no-tui"],
    ],
    ids=["once", "once-daemon-durable", "once-served", "dry-run"],
)
def test_single_host_run_mode_never_loads_the_kubernetes_stack(
    project: Path, args: list[str]
) -> None:
    result, packages = imported_packages([str(LORENZ), *args], cwd=project)
    assert result.returncode == 0, result.stdout + _stderr_without_import_lines(result)
    if "--dry-run" not in args:
        # NB: the run really dispatched, so imports on the spawn and cleanup paths were made.
        assert (project / "agent-ran").exists()
    assert packages & KUBERNETES_STACK == set()


def test_the_probe_sees_every_stack_it_guards_against(tmp_path: Path) -> None:
    # NB: the boundary tests above can only fail if these stacks are installed and their
    # imports show up in the probe's output (the operator imports kopf and kubernetes inside
    # its functions, so they are named here directly).
    modules = "kopf, kubernetes.client, lorenz.server.app, lorenz.trackers.linear, psutil"
    result, packages = imported_packages(["-c", f"import {modules}"], cwd=tmp_path)
    assert result.returncode == 0, _stderr_without_import_lines(result)
    assert packages >= NOT_FOR_VALIDATE, sorted(NOT_FOR_VALIDATE - packages)
