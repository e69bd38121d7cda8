"""Helpers for workflow tests: real files in a temporary folder, an explicit environment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

WriteWorkflow = Callable[..., Path]


@pytest.fixture
def write_workflow(tmp_path: Path) -> WriteWorkflow:
    """Write a WORKFLOW.md (front matter text + body) and return its path."""

    def write(
        front_matter: str | None = "",
        body: str = "Work on {{ issue.identifier }}.",
        *,
        name: str = "WORKFLOW.md",
        folder: Path | None = None,
    ) -> Path:
        target = (folder or tmp_path) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fenced = f"---\n{(front_matter or '').strip(chr(10))}\n---\n{body}"
        text = body if front_matter is None else fenced
        target.write_text(text, encoding="utf-8")
        return target

    return write
