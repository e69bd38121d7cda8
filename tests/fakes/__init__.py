"""Faithful local fakes of remote services (Linear, GitHub, GitLab, Jira) and scripted agents.

The tracker fakes are real HTTP servers on 127.0.0.1. Use them as pytest fixtures — in a test
module or conftest, ``from tests.fakes import linear_server, github_server  # noqa: F401`` —
or directly as context managers (``async with FakeLinearServer() as linear:``, or
``with FakeLinearServer().running_in_thread() as linear:`` from synchronous code).

NB: the server modules are imported inside the fixtures, so importing this package (which every
``tests.fakes.<script>`` import does) stays cheap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fakes.github_server import FakeGitHubServer
    from tests.fakes.gitlab_server import FakeGitLabServer
    from tests.fakes.jira_server import FakeJiraServer
    from tests.fakes.linear_server import FakeLinearServer


@pytest.fixture
async def linear_server() -> AsyncIterator[FakeLinearServer]:
    """A running fake Linear GraphQL endpoint (``.url``, ``.api_key``, ``.project_slug``)."""
    from tests.fakes.linear_server import FakeLinearServer

    async with FakeLinearServer() as server:
        yield server


@pytest.fixture
async def github_server() -> AsyncIterator[FakeGitHubServer]:
    """A running fake GitHub REST API (``.url``, ``.token``, ``.repository``)."""
    from tests.fakes.github_server import FakeGitHubServer

    async with FakeGitHubServer() as server:
        yield server


@pytest.fixture
async def gitlab_server() -> AsyncIterator[FakeGitLabServer]:
    """A running fake GitLab REST v4 API (``.url``, ``.token``, ``.project``)."""
    from tests.fakes.gitlab_server import FakeGitLabServer

    async with FakeGitLabServer() as server:
        yield server


@pytest.fixture
async def jira_server() -> AsyncIterator[FakeJiraServer]:
    """A running fake Jira Cloud REST v3 site (``.url``, ``.email``, ``.token``, ``.project``)."""
    from tests.fakes.jira_server import FakeJiraServer

    async with FakeJiraServer() as server:
        yield server
