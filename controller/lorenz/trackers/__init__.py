"""Issue trackers: one protocol (:class:`TrackerClient`), one module per tracker.

``memory`` (tests, benchmarks), ``files`` (Markdown files in a folder), ``linear`` (GraphQL),
``github`` (Issues REST, labels as states), ``gitlab`` (REST v4, scoped labels as states) and
``jira`` (Jira Cloud REST v3); :func:`build_tracker` picks one from the settings.

NB: the adapters are loaded on first use (PEP 562), and :func:`build_tracker` imports only the
one its settings name: a controller polling Linear does not hold the GitHub, GitLab and Jira
adapters and their payload modules (issue #35). Type checkers read the imports under
``TYPE_CHECKING``; ``_LAZY`` says where each lazy name lives at run time
(tests/test_lean_imports.py checks that the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorenz.lazy_names import lazy_attributes

# NB: first, before any module of this package imports httpx (see its docstring).
from lorenz.trackers import httpstack as _httpstack  # noqa: F401

# isort: split

from lorenz.trackers.base import GraphQLTool, TrackerClient, TrackerError, tracker_settings_of
from lorenz.trackers.factory import DEFAULT_SECRET_ENV, build_tracker

if TYPE_CHECKING:
    from lorenz.trackers.files import FilesTracker as FilesTracker
    from lorenz.trackers.files import set_issue_state as set_issue_state
    from lorenz.trackers.github import GitHubTracker as GitHubTracker
    from lorenz.trackers.gitlab import GitLabTracker as GitLabTracker
    from lorenz.trackers.jira import JiraTracker as JiraTracker
    from lorenz.trackers.linear import LinearTracker as LinearTracker
    from lorenz.trackers.memory import MemoryTracker as MemoryTracker

_LAZY: dict[str, str] = {
    "FilesTracker": "files",
    "set_issue_state": "files",
    "GitHubTracker": "github",
    "GitLabTracker": "gitlab",
    "JiraTracker": "jira",
    "LinearTracker": "linear",
    "MemoryTracker": "memory",
}

if not TYPE_CHECKING:
    # NB: hidden from type checkers (lorenz.lazy_names): they read the imports above.
    __getattr__, __dir__ = lazy_attributes(
        package=__name__, homes=_LAZY, namespace=globals()
    )


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
