"""Choosing and building the tracker adapter from the settings (``tracker.kind``).

The runtime builds a tracker at start-up and again on every reload whose settings changed, then
closes the old one; every adapter's constructor is cheap and opens nothing, so this is safe to
call on each reload. Configuration problems surface here as coded errors naming the key.

NB: each adapter's module is imported in its own branch, when that kind is built: a process
holds only the tracker it polls (issue #35; a remote adapter and its payload modules are
~0.15 MiB each).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lorenz.codes import ErrorCode
from lorenz.config import TrackerKind, WorkflowSettings
from lorenz.trackers.base import TrackerClient, TrackerError

if TYPE_CHECKING:
    import httpx

    from lorenz.trackers.memory import MemoryTracker

DEFAULT_SECRET_ENV = {
    TrackerKind.LINEAR: "LINEAR_API_KEY",
    TrackerKind.GITHUB: "GITHUB_TOKEN",
    TrackerKind.GITLAB: "GITLAB_TOKEN",
    TrackerKind.JIRA: "JIRA_API_TOKEN",
}
"""The variable each remote tracker reads its token from when ``tracker.api_key`` is unset.

NB: spelled out rather than taken from the adapters (``LINEAR_API_KEY_ENV`` and the like), so
that naming it imports none of them; tests/test_lean_imports.py checks they agree."""


def build_tracker(
    settings: WorkflowSettings,
    *,
    base_dir: Path | None = None,
    memory: MemoryTracker | None = None,
    env: Mapping[str, str] | None = None,
    http_client: httpx.AsyncClient | None = None,
) -> TrackerClient:
    """The tracker ``settings.tracker.kind`` names.

    ``base_dir`` resolves a relative ``tracker.path`` (the loader normally made it absolute
    already). ``memory`` is required for ``kind: memory`` — its issues can only come from the
    caller — and the result is a view of it with these settings (same board and counters).
    ``env`` (default ``os.environ``) supplies ``LINEAR_API_KEY`` / ``GITHUB_TOKEN`` /
    ``JIRA_API_TOKEN`` when ``tracker.api_key`` is unset (and ``JIRA_EMAIL`` when
    ``tracker.email`` is). ``http_client`` is shared by remote trackers if given (and
    then not closed by them).
    """
    tracker = settings.tracker
    environment = os.environ if env is None else env
    kind = tracker.kind
    if kind is None:
        raise TrackerError(
            "tracker.kind is not set; set it to linear, github, gitlab, jira, files or memory",
            code=ErrorCode.MISSING_TRACKER_KIND,
            key_path="tracker.kind",
        )
    if kind is TrackerKind.MEMORY:
        if memory is None:
            raise TrackerError(
                "tracker.kind memory has no issues of its own; pass a MemoryTracker to "
                "build_tracker (tests and benchmarks) or choose another tracker.kind",
                code=ErrorCode.MEMORY_TRACKER_NEEDS_INSTANCE,
                key_path="tracker.kind",
            )
        return memory.with_settings(settings)
    if kind is TrackerKind.FILES:
        if not tracker.path or not tracker.path.strip():
            raise TrackerError(
                "tracker.path is not set; point it at the folder of issue files",
                code=ErrorCode.MISSING_TRACKER_PATH,
                key_path="tracker.path",
            )
        folder = Path(tracker.path).expanduser()
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        from lorenz.trackers.files import FilesTracker

        return FilesTracker(settings=settings, folder=folder)
    if kind is TrackerKind.LINEAR:
        from lorenz.trackers.linear import LINEAR_API_KEY_ENV, LinearTracker

        return LinearTracker(
            settings=settings,
            api_key=tracker.api_key or environment.get(LINEAR_API_KEY_ENV, ""),
            http_client=http_client,
        )
    if kind is TrackerKind.GITHUB:
        from lorenz.trackers.github import GITHUB_TOKEN_ENV, GitHubTracker

        return GitHubTracker(
            settings=settings,
            token=tracker.api_key or environment.get(GITHUB_TOKEN_ENV, ""),
            http_client=http_client,
        )
    if kind is TrackerKind.GITLAB:
        from lorenz.trackers.gitlab import GITLAB_TOKEN_ENV, GitLabTracker

        return GitLabTracker(
            settings=settings,
            token=tracker.api_key or environment.get(GITLAB_TOKEN_ENV, ""),
            http_client=http_client,
        )
    if kind is TrackerKind.JIRA:
        from lorenz.trackers.jira import JIRA_API_TOKEN_ENV, JIRA_EMAIL_ENV, JiraTracker

        return JiraTracker(
            settings=settings,
            email=tracker.email or environment.get(JIRA_EMAIL_ENV, ""),
            token=tracker.api_key or environment.get(JIRA_API_TOKEN_ENV, ""),
            http_client=http_client,
        )
    raise TrackerError(  # pragma: no cover - the settings model admits no other kind
        f"tracker.kind {kind!r} is not supported; "
        "use linear, github, gitlab, jira, files or memory",
        code=ErrorCode.UNSUPPORTED_TRACKER_KIND,
        key_path="tracker.kind",
    )
