"""Fixtures of the end-to-end tests: the fake trackers, served in the test's own event loop."""

from __future__ import annotations

from tests.fakes import github_server, linear_server

__all__ = ["github_server", "linear_server"]
