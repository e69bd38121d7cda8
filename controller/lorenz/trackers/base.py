"""The tracker port the runtime reads issues through.

Every adapter returns normalized :class:`~lorenz.model.Issue` objects and raises
:class:`TrackerError` with a stable code on failure, so the runtime can tell a transient error
(keep runs alive, try next tick) from anything else without knowing which tracker it talks to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import Issue, LorenzError


class TrackerError(LorenzError):
    """A tracker request failed; ``code`` says how (``linear_api_status``, ...)."""

    code = ErrorCode.TRACKER_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        key_path: str | None = None,
        retryable: bool = False,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message, code=code, key_path=key_path)
        self.retryable = retryable
        """Whether the same request may succeed later (transport, 5xx, rate limits)."""
        self.retry_after_ms = retry_after_ms
        """When the tracker said how long to wait (rate limits), that wait in milliseconds."""


def tracker_settings_of(settings: WorkflowSettings | TrackerSettings) -> TrackerSettings:
    """Adapters take either the whole workflow settings or just their section."""
    if isinstance(settings, WorkflowSettings):
        return settings.tracker
    return settings


class TrackerClient(Protocol):
    """Read access to one tracker scope (a Linear project, a GitHub repo, a folder)."""

    async def fetch_candidate_issues(self) -> list[Issue]:
        """Issues in the configured active states (malformed records dropped and logged)."""
        ...

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        """Full snapshots of these ids; an id no longer visible is absent. ``[]`` → ``[]``
        without a request. A malformed record fails the whole call."""
        ...

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        """Issues in these states (used for terminal clean-up). ``[]`` → ``[]``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class GraphQLTool(Protocol):
    """A tracker that can run one raw GraphQL operation for an agent (``linear_graphql``)."""

    async def execute_graphql(
        self, *, query: str, variables: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run exactly one operation with the tracker's credentials; return the response body."""
        ...


def unchanged(issue: Issue) -> Issue:
    """The routing of a tracker that keeps every issue as read (no ``tracker.assignee``)."""
    return issue
