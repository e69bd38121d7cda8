"""CLI tests run against real files and a clean ``LORENZ_*``/tracker environment."""

from __future__ import annotations

import os

import pytest

_TRACKER_VARS = ("LINEAR_API_KEY", "LINEAR_ASSIGNEE", "GITHUB_TOKEN")
_KEPT = ("LORENZ_WORKER_STATE",)
"""NB: the suite's private worker state root (tests/conftest.py), not a setting under test:
without it the runs of these tests would keep their worker state in the real home."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if (name.startswith("LORENZ_") and name not in _KEPT) or name in _TRACKER_VARS:
            monkeypatch.delenv(name)
