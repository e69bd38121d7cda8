"""Shared builders for workspace tests: real settings, real issues, real directories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.config import WorkflowSettings
from lorenz.model import Issue


def make_settings(
    root: Path,
    *,
    hooks: dict[str, Any] | None = None,
    ensemble_size: int = 1,
    workspace: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> WorkflowSettings:
    return WorkflowSettings.model_validate(
        {
            "tracker": {"kind": "memory", "api_key": api_key},
            "workspace": {"root": str(root), **(workspace or {})},
            "hooks": {"timeout_ms": 10000, **(hooks or {})},
            "agent": {"ensemble_size": ensemble_size},
        }
    )


def make_issue(identifier: str = "ABC-1", *, issue_id: str | None = None, **extra: Any) -> Issue:
    fields: dict[str, Any] = {"title": f"Title of {identifier}", "state": "In Progress"}
    fields.update(extra)
    return Issue(id=issue_id or f"id-{identifier}", identifier=identifier, **fields)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The workspace root, not created yet (the manager makes it)."""
    return tmp_path / "workspaces"


@pytest.fixture
def existing_root(root: Path) -> Path:
    """The workspace root, already created."""
    root.mkdir()
    return root


def lexists(path: Path) -> bool:
    return os.path.lexists(path)


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
        GIT_CONFIG_NOSYSTEM="1", HOME=str(cwd),
    )
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one commit on ``main``."""
    path = tmp_path / "repo"
    path.mkdir()
    git("init", "-q", "-b", "main", cwd=path)
    (path / "README.md").write_text("hello\n")
    git("add", "README.md", cwd=path)
    git("commit", "-q", "-m", "initial", cwd=path)
    return path
