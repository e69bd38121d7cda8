"""Two workflow files in one folder naming the same tracker project and workspace root: warned.

Each file has a lease and a claim store of its own (both keyed by the file), so two ``lorenz``
processes, one per file, both lead and both run every issue. A start names every such sibling
with the coded warning ``workflow_shares_tracker_project``; files that differ in the workspace
root or the project, and Markdown that is not a workflow, are not named.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lorenz.daemon.exclusion import SHARED_PROJECT_CODE, sibling_workflows_sharing_project
from lorenz.workflow import load_workflow
from tests.daemon.harness import CLI, write_daemon_workflow


def _siblings(root: Path) -> Path:
    workflow = write_daemon_workflow(root, issues=())
    text = workflow.read_text(encoding="utf-8")
    (root / "copy.md").write_text(text, encoding="utf-8")
    (root / "other-root.md").write_text(
        text.replace(str(root / "workspaces"), str(root / "elsewhere")), encoding="utf-8"
    )
    (root / "other-issues.md").write_text(
        text.replace("path: issues", "path: other-issues"), encoding="utf-8"
    )
    (root / "README.md").write_text("# notes\n\nnot a workflow\n", encoding="utf-8")
    (root / "broken.md").write_text("---\ntracker: [\n---\n", encoding="utf-8")
    return workflow


def test_siblings_sharing_project_and_workspace_root_are_found(tmp_path: Path) -> None:
    workflow = _siblings(tmp_path / "wf")
    found = sibling_workflows_sharing_project(load_workflow(workflow))
    assert [path.name for path in found] == ["copy.md"]


def test_a_start_warns_with_a_code_naming_the_sibling(
    root: Path, daemon_env: dict[str, str]
) -> None:
    workflow = _siblings(root)
    done = subprocess.run(
        [*CLI, str(workflow), "--no-tui", "--once"],
        env=daemon_env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [
        line for line in (done.stdout + done.stderr).splitlines() if SHARED_PROJECT_CODE in line
    ]
    assert len(lines) == 1
    assert "WORKFLOW.md and copy.md" in lines[0]
    assert str(root / "workspaces") in lines[0]
