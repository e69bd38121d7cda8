"""docs/daemon.md lists every code this package raises and every shutdown step, in order."""

from __future__ import annotations

import inspect
from pathlib import Path

import lorenz.daemon.errors as errors
from lorenz.daemon.shutdown import SHUTDOWN_ORDER

DOC = Path(__file__).resolve().parents[2] / "docs" / "daemon.md"


def test_every_error_code_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    codes = {
        cls.code
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.DaemonError) and cls is not errors.DaemonError
    }
    assert len(codes) >= 8
    for code in sorted(codes):
        assert f"| `{code}` |" in text, code


def test_shutdown_steps_are_documented_in_order() -> None:
    text = DOC.read_text(encoding="utf-8")
    positions = [text.index(f"| `{step}` |") for step in SHUTDOWN_ORDER]
    assert positions == sorted(positions)
