"""CLI tests run against real files and a clean ``LORENZ_*``/tracker environment."""

from __future__ import annotations

import os

import pytest

_TRACKER_VARS = ("LINEAR_API_KEY", "LINEAR_ASSIGNEE", "GITHUB_TOKEN")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("LORENZ_") or name in _TRACKER_VARS:
            monkeypatch.delenv(name)
