"""The tracker tests run against the local fakes of Linear and GitHub."""

from tests.fakes import github_server, linear_server

__all__ = ["github_server", "linear_server"]
