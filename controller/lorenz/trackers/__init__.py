"""Issue trackers: one protocol (:class:`TrackerClient`), one module per tracker.

``memory`` (tests, benchmarks), ``files`` (Markdown files in a folder), ``linear`` (GraphQL),
``github`` (Issues REST, labels as states), ``gitlab`` (REST v4, scoped labels as states) and
``jira`` (Jira Cloud REST v3); :func:`build_tracker` picks one from the settings.
"""

# NB: first, before any module of this package imports httpx (see its docstring).
from lorenz.trackers import httpstack as _httpstack  # noqa: F401

# isort: split

from lorenz.trackers.base import GraphQLTool, TrackerClient, TrackerError, tracker_settings_of
from lorenz.trackers.factory import DEFAULT_SECRET_ENV, build_tracker
from lorenz.trackers.files import FilesTracker, set_issue_state
from lorenz.trackers.github import GitHubTracker
from lorenz.trackers.gitlab import GitLabTracker
from lorenz.trackers.jira import JiraTracker
from lorenz.trackers.linear import LinearTracker
from lorenz.trackers.memory import MemoryTracker

__all__ = [
    "DEFAULT_SECRET_ENV",
    "FilesTracker",
    "GitHubTracker",
    "GitLabTracker",
    "GraphQLTool",
    "JiraTracker",
    "LinearTracker",
    "MemoryTracker",
    "TrackerClient",
    "TrackerError",
    "build_tracker",
    "set_issue_state",
    "tracker_settings_of",
]
