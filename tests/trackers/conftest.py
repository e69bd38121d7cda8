"""The tracker tests run against the local fakes of Linear, GitHub, GitLab and Jira.

The fake servers' fixtures come from the `tests.fakes` plugin (see tests/conftest.py); the
clients of them that several test modules drive the same way are here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lorenz.config import TrackerSettings
from lorenz.trackers.github import GitHubTracker
from lorenz.trackers.linear import LinearTracker

if TYPE_CHECKING:
    # NB: not at run time: importing a server module here, before the `tests.fakes` plugin is
    # read, binds `tests.fakes.linear_server` to the module instead of the fixture.
    from tests.fakes.github_server import FakeGitHubServer
    from tests.fakes.linear_server import FakeLinearServer


async def _no_sleep(delay: float) -> None:
    """No real wait (no test here expects a rate limit)."""


@pytest.fixture
async def linear(linear_server: FakeLinearServer) -> AsyncIterator[LinearTracker]:
    tracker = LinearTracker(
        settings=TrackerSettings(
            kind="linear", endpoint=linear_server.url, project_slug=linear_server.project_slug
        ),
        api_key=linear_server.api_key,
        sleep=_no_sleep,
    )
    yield tracker
    await tracker.close()


@pytest.fixture
async def github(github_server: FakeGitHubServer) -> AsyncIterator[GitHubTracker]:
    tracker = GitHubTracker(
        settings=TrackerSettings(
            kind="github",
            endpoint=github_server.url,
            repository=github_server.repository,
            active_states=("Todo", "In Progress"),
            terminal_states=("Done", "Cancelled"),
        ),
        token=github_server.token,
        sleep=_no_sleep,
    )
    yield tracker
    await tracker.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "issues"
    path.mkdir()
    return path
