"""Dispatch preflight: one coded error per missing piece."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from lorenz.config import (
    AgentKindSettings,
    AgentSettings,
    TrackerKind,
    TrackerSettings,
    WorkflowSettings,
)
from lorenz.workflow import (
    InvalidWorkflowConfig,
    MissingAgentCommand,
    MissingTrackerApiKey,
    MissingTrackerKind,
    MissingTrackerPath,
    MissingTrackerProjectSlug,
    MissingTrackerRepository,
    dispatch_problems,
    settings_from_mapping,
    validate_dispatch,
)


def _settings(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> WorkflowSettings:
    return settings_from_mapping(data, base_dir=Path("/w"), environ=env or {}).settings


@pytest.mark.parametrize(
    "tracker",
    [
        {"kind": "linear", "api_key": "k", "project_slug": "p"},
        {"kind": "github", "api_key": "k", "repository": "o/r"},
        {"kind": "gitlab", "api_key": "k", "project_slug": "group/app"},
        {"kind": "files", "path": "issues"},
        {"kind": "memory"},
    ],
)
def test_complete_trackers_pass(tracker: dict[str, str]) -> None:
    settings = _settings({"tracker": tracker})
    assert dispatch_problems(settings) == []
    validate_dispatch(settings)


def test_missing_tracker_kind() -> None:
    with pytest.raises(MissingTrackerKind) as caught:
        validate_dispatch(_settings({}))
    assert caught.value.code == "missing_tracker_kind"
    assert caught.value.key_path == "tracker.kind"


@pytest.mark.parametrize(
    ("tracker", "env_name"),
    [
        ({"kind": "linear", "project_slug": "p"}, "LINEAR_API_KEY"),
        ({"kind": "github", "repository": "o/r"}, "GITHUB_TOKEN"),
        ({"kind": "gitlab", "project_slug": "group/app"}, "GITLAB_TOKEN"),
        ({"kind": "linear", "project_slug": "p", "api_key": "$EMPTY"}, "LINEAR_API_KEY"),
    ],
)
def test_missing_tracker_api_key_after_resolution(tracker: dict[str, str], env_name: str) -> None:
    settings = _settings(
        {"tracker": tracker},
        {"EMPTY": "", "LINEAR_API_KEY": "set-but-ignored"} if tracker.get("api_key") else {},
    )
    with pytest.raises(MissingTrackerApiKey) as caught:
        validate_dispatch(settings)
    assert caught.value.code == "missing_tracker_api_key"
    assert env_name in caught.value.message


def test_the_fallback_variable_satisfies_the_api_key_check() -> None:
    settings = _settings(
        {"tracker": {"kind": "linear", "project_slug": "p"}}, {"LINEAR_API_KEY": "x"}
    )
    assert dispatch_problems(settings) == []


def test_missing_tracker_project_slug() -> None:
    with pytest.raises(MissingTrackerProjectSlug) as caught:
        validate_dispatch(_settings({"tracker": {"kind": "linear", "api_key": "k"}}))
    assert caught.value.code == "missing_tracker_project_slug"


def test_gitlab_needs_a_project_and_reads_its_token_from_gitlab_token() -> None:
    with pytest.raises(MissingTrackerProjectSlug) as caught:
        validate_dispatch(_settings({"tracker": {"kind": "gitlab", "api_key": "k"}}))
    assert "gitlab" in caught.value.message
    settings = _settings(
        {"tracker": {"kind": "gitlab", "project_slug": "4711"}}, {"GITLAB_TOKEN": "x"}
    )
    assert dispatch_problems(settings) == []
    assert settings.tracker.api_key == "x"


def test_missing_tracker_repository() -> None:
    with pytest.raises(MissingTrackerRepository) as caught:
        validate_dispatch(_settings({"tracker": {"kind": "github", "api_key": "k"}}))
    assert caught.value.code == "missing_tracker_repository"


def test_missing_tracker_path() -> None:
    with pytest.raises(MissingTrackerPath) as caught:
        validate_dispatch(_settings({"tracker": {"kind": "files", "path": "$UNSET"}}))
    assert caught.value.code == "missing_tracker_path"


def test_a_blank_codex_command_is_caught_by_the_schema_at_its_key_path() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        _settings({"tracker": {"kind": "memory"}, "codex": {"command": "   "}})
    (problem,) = caught.value.problems()
    assert (problem.key_path, problem.reason) == ("codex.command", "must not be blank")


def test_blank_agent_command() -> None:
    # The schema already refuses blank commands; the preflight still guards settings built
    # without validation (model_construct), e.g. by other composition roots.
    settings = WorkflowSettings.model_construct(
        agent=AgentSettings.model_construct(kind="mine"),
        agents={"mine": AgentKindSettings.model_construct(command="  ")},
        tracker=TrackerSettings(kind=TrackerKind.MEMORY),
    )
    with pytest.raises(MissingAgentCommand) as caught:
        validate_dispatch(settings)
    assert caught.value.code == "missing_agent_command"
    assert caught.value.key_path == "agents.mine.command"


def test_every_problem_is_listed_and_the_first_is_raised() -> None:
    settings = _settings({"tracker": {"kind": "linear"}})
    codes = [p.code for p in dispatch_problems(settings)]
    assert codes == ["missing_tracker_api_key", "missing_tracker_project_slug"]
    with pytest.raises(MissingTrackerApiKey):
        validate_dispatch(settings)


def test_ssh_hosts_dispatch_when_ssh_is_there() -> None:
    from lorenz.config import WorkflowSettings
    from lorenz.workflow import dispatch_problems

    settings = WorkflowSettings.model_validate(
        {"tracker": {"kind": "memory"}, "worker": {"ssh_hosts": ["build-1", "build-2:2222"]}}
    )
    assert dispatch_problems(settings) == []


def test_ssh_hosts_without_an_ssh_client_are_a_coded_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from lorenz.config import WorkflowSettings
    from lorenz.workflow import dispatch_problems

    monkeypatch.setenv("PATH", str(tmp_path))
    settings = WorkflowSettings.model_validate(
        {"tracker": {"kind": "memory"}, "worker": {"ssh_hosts": ["build-1"]}}
    )
    problems = dispatch_problems(settings)
    assert [p.code for p in problems] == ["ssh_client_missing"]
    assert problems[0].key_path == "worker.ssh_hosts"


def test_ssh_hosts_refuse_worktree_workspaces(tmp_path: Path) -> None:
    from lorenz.config import WorkflowSettings
    from lorenz.workflow import dispatch_problems

    settings = WorkflowSettings.model_validate(
        {
            "tracker": {"kind": "memory"},
            "worker": {"ssh_hosts": ["build-1"]},
            "workspace": {"kind": "worktree", "repo": str(tmp_path)},
        }
    )
    problems = dispatch_problems(settings)
    assert [p.code for p in problems] == ["ssh_worktree_unsupported"]
    assert problems[0].key_path == "workspace.kind"
