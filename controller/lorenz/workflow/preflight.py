"""Dispatch preflight: the checks a schema cannot make, run before the loop and before every tick.

The schema accepts a workflow without ``tracker.kind`` (so that ``lorenz config`` can show
defaults, and a half-written file still loads); but nothing may be dispatched until the tracker
is fully described and the agent can be launched. These checks depend on each other (which keys a
tracker needs depends on its kind, a token may come from a fallback variable), so they run on the
typed, ``$VAR``-resolved settings, not on raw YAML.

:func:`dispatch_problems` lists every failure (for ``lorenz validate``); :func:`validate_dispatch`
raises the first (for the runtime, which skips dispatch on it).
"""

from __future__ import annotations

import shutil

from lorenz.config import TrackerKind, WorkflowSettings, WorkspaceKind
from lorenz.workflow.errors import (
    MissingAgentCommand,
    MissingTrackerApiKey,
    MissingTrackerEmail,
    MissingTrackerEndpoint,
    MissingTrackerKind,
    MissingTrackerPath,
    MissingTrackerProjectSlug,
    MissingTrackerRepository,
    SshClientMissing,
    SshWorktreeUnsupported,
    UnsupportedTrackerKind,
    WorkflowError,
)
from lorenz.workflow.resolving import TRACKER_ENV_FALLBACKS

SUPPORTED_TRACKER_KINDS: frozenset[str] = frozenset(kind.value for kind in TrackerKind)


def dispatch_problems(settings: WorkflowSettings) -> list[WorkflowError]:
    """Every reason the settings cannot dispatch yet (empty when they can)."""
    problems: list[WorkflowError] = []
    tracker = settings.tracker
    kind = tracker.kind
    if kind is None:
        problems.append(
            MissingTrackerKind(
                "tracker.kind is not set; add tracker: {kind: linear|github|files|memory}",
                key_path="tracker.kind",
            )
        )
    elif str(kind) not in SUPPORTED_TRACKER_KINDS:
        problems.append(
            UnsupportedTrackerKind(
                f"tracker.kind {str(kind)!r} is not supported; use one of "
                f"{', '.join(sorted(SUPPORTED_TRACKER_KINDS))}",
                key_path="tracker.kind",
            )
        )
    remote = (TrackerKind.LINEAR, TrackerKind.GITHUB, TrackerKind.GITLAB, TrackerKind.JIRA)
    if kind in remote and not (tracker.api_key or "").strip():
        env_name = TRACKER_ENV_FALLBACKS[kind]["api_key"]
        problems.append(
            MissingTrackerApiKey(
                f"no API token for the {kind.value} tracker; set tracker.api_key (e.g. "
                f"${env_name}) or export {env_name}",
                key_path="tracker.api_key",
            )
        )
    if kind is TrackerKind.LINEAR and not (tracker.project_slug or "").strip():
        problems.append(
            MissingTrackerProjectSlug(
                "tracker.project_slug is required for linear; use the last segment of the "
                "project URL",
                key_path="tracker.project_slug",
            )
        )
    if kind is TrackerKind.GITLAB and not (tracker.project_slug or "").strip():
        problems.append(
            MissingTrackerProjectSlug(
                "tracker.project_slug is required for gitlab; write the project's path "
                "(group/app) or numeric id",
                key_path="tracker.project_slug",
            )
        )
    if kind is TrackerKind.JIRA:
        problems.extend(_jira_problems(settings))
    if kind is TrackerKind.GITHUB and not (tracker.repository or "").strip():
        problems.append(
            MissingTrackerRepository(
                "tracker.repository is required for github; write it as owner/name",
                key_path="tracker.repository",
            )
        )
    if kind is TrackerKind.FILES and not (tracker.path or "").strip():
        problems.append(
            MissingTrackerPath(
                "tracker.path is required for the files tracker; name the folder of issue files",
                key_path="tracker.path",
            )
        )
    agent_kind = settings.agent.kind
    command = settings.agent_kind().command
    if not command.strip():
        where = (
            "codex.command"
            if agent_kind == "codex" and "codex" not in settings.agents
            else (f"agents.{agent_kind}.command")
        )
        problems.append(
            MissingAgentCommand(
                f"agent kind {agent_kind!r} has an empty command; set {where} to the shell "
                "command that starts the agent",
                key_path=where,
            )
        )
    if settings.worker.ssh_hosts:
        problems.extend(_ssh_problems(settings))
    return problems


def _jira_problems(settings: WorkflowSettings) -> list[WorkflowError]:
    """What the jira tracker needs besides its token: the site, the project key, the email."""
    tracker = settings.tracker
    problems: list[WorkflowError] = []
    if not (tracker.endpoint or "").strip():
        problems.append(
            MissingTrackerEndpoint(
                "tracker.endpoint is required for jira; set it to the site URL, like "
                "https://example.atlassian.net",
                key_path="tracker.endpoint",
            )
        )
    if not (tracker.project_slug or "").strip():
        problems.append(
            MissingTrackerProjectSlug(
                "tracker.project_slug is required for jira; use the project key (ENG for ENG-12)",
                key_path="tracker.project_slug",
            )
        )
    if not (tracker.email or "").strip():
        problems.append(
            MissingTrackerEmail(
                "no account email for the jira tracker; set tracker.email (e.g. $JIRA_EMAIL) "
                "or export JIRA_EMAIL",
                key_path="tracker.email",
            )
        )
    return problems


def _ssh_problems(settings: WorkflowSettings) -> list[WorkflowError]:
    """What SSH placement needs on this machine (the hosts themselves are checked at launch:
    a host that is down fails its run with ``worker_host_unreachable``, not the tick)."""
    problems: list[WorkflowError] = []
    if shutil.which("ssh") is None:
        problems.append(
            SshClientMissing(
                "worker.ssh_hosts is set but there is no ssh program on PATH; install the "
                "OpenSSH client or remove worker.ssh_hosts",
                key_path="worker.ssh_hosts",
            )
        )
    if settings.workspace.kind is WorkspaceKind.WORKTREE:
        problems.append(
            SshWorktreeUnsupported(
                "workspace.kind worktree cannot be used with worker.ssh_hosts (the repository "
                "is on this machine); use kind directory and clone in hooks.after_create",
                key_path="workspace.kind",
            )
        )
    return problems


def validate_dispatch(settings: WorkflowSettings) -> None:
    """Raise the first dispatch problem, if any (see :func:`dispatch_problems`)."""
    problems = dispatch_problems(settings)
    if problems:
        raise problems[0]
