"""build_tracker: the one place a tracker kind becomes an adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import Issue
from lorenz.trackers import (
    FilesTracker,
    GitHubTracker,
    GitLabTracker,
    LinearTracker,
    MemoryTracker,
    TrackerError,
    build_tracker,
)
from tests.fakes.github_server import FakeGitHubServer
from tests.fakes.gitlab_server import FakeGitLabServer
from tests.fakes.linear_server import FakeLinearServer


def workflow(**tracker: Any) -> WorkflowSettings:
    return WorkflowSettings(tracker=TrackerSettings(**tracker))


def test_no_kind_is_a_coded_error() -> None:
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow())
    assert (err.value.code, err.value.key_path) == ("missing_tracker_kind", "tracker.kind")


async def test_memory_needs_an_instance_and_gets_a_view_of_it() -> None:
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow(kind="memory"))
    assert err.value.code == "memory_tracker_needs_instance"
    board = MemoryTracker([Issue(id="1", identifier="M-1", title="t", state="Done")])
    built = build_tracker(workflow(kind="memory", active_states=["Done"]), memory=board)
    assert isinstance(built, MemoryTracker)
    assert [i.id for i in await built.fetch_candidate_issues()] == ["1"]
    assert board.requests["fetch_candidate_issues"] == 1


async def test_files_resolves_a_relative_path_against_the_base_dir(tmp_path: Path) -> None:
    (tmp_path / "issues").mkdir()
    (tmp_path / "issues" / "a.md").write_text("---\ntitle: A\nstate: Todo\n---\n")
    built = build_tracker(workflow(kind="files", path="issues"), base_dir=tmp_path)
    assert isinstance(built, FilesTracker)
    assert built.folder == tmp_path / "issues"
    assert [i.id for i in await built.fetch_candidate_issues()] == ["a"]
    absolute = build_tracker(workflow(kind="files", path=str(tmp_path / "issues")))
    assert isinstance(absolute, FilesTracker)
    assert absolute.folder == tmp_path / "issues"


def test_files_needs_a_path() -> None:
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow(kind="files"))
    assert (err.value.code, err.value.key_path) == ("missing_tracker_path", "tracker.path")


async def test_linear_takes_its_key_from_the_settings_or_the_environment(
    linear_server: FakeLinearServer,
) -> None:
    linear_server.add_issue(title="Seen")
    settings = dict(
        kind="linear", endpoint=linear_server.url, project_slug=linear_server.project_slug
    )
    from_env = build_tracker(workflow(**settings), env={"LINEAR_API_KEY": linear_server.api_key})
    assert isinstance(from_env, LinearTracker)
    assert [i.title for i in await from_env.fetch_candidate_issues()] == ["Seen"]
    await from_env.close()
    explicit = build_tracker(
        workflow(**settings, api_key=linear_server.api_key), env={"LINEAR_API_KEY": "stale"}
    )
    assert len(await explicit.fetch_candidate_issues()) == 1
    await explicit.close()
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow(**settings), env={})
    assert err.value.code == "missing_tracker_api_key"


async def test_github_takes_its_token_from_the_settings_or_the_environment(
    github_server: FakeGitHubServer,
) -> None:
    github_server.add_issue("Seen", labels=["todo"])
    settings = dict(kind="github", endpoint=github_server.url, repository=github_server.repository)
    built = build_tracker(workflow(**settings), env={"GITHUB_TOKEN": github_server.token})
    assert isinstance(built, GitHubTracker)
    assert [i.title for i in await built.fetch_candidate_issues()] == ["Seen"]
    await built.close()
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow(**settings), env={})
    assert err.value.code == "missing_tracker_api_key"


async def test_a_reload_builds_a_fresh_tracker_from_new_settings(
    linear_server: FakeLinearServer,
) -> None:
    linear_server.add_issue(title="Todo")
    linear_server.add_issue(title="Review", state="Human Review")
    base = dict(
        kind="linear",
        endpoint=linear_server.url,
        project_slug=linear_server.project_slug,
        api_key=linear_server.api_key,
    )
    old = build_tracker(workflow(**base))
    assert [i.title for i in await old.fetch_candidate_issues()] == ["Todo"]
    new = build_tracker(workflow(**base, active_states=["Human Review"]))
    await old.close()
    assert [i.title for i in await new.fetch_candidate_issues()] == ["Review"]
    await new.close()


def test_the_fakes_also_run_from_synchronous_code() -> None:
    import httpx

    linear = FakeLinearServer()
    linear.add_issue(title="From a thread")
    with linear.running_in_thread() as running:
        response = httpx.post(
            running.url,
            json={"query": "{ issues { nodes { title } } }"},
            headers={"Authorization": running.api_key},
        )
        assert response.json() == {"data": {"issues": {"nodes": [{"title": "From a thread"}]}}}
    github = FakeGitHubServer()
    github.add_issue("Threaded")
    with github.running_in_thread() as running:
        response = httpx.get(
            f"{running.url}/repos/{running.repository}/issues",
            headers={"Authorization": f"Bearer {running.token}"},
        )
        assert [i["title"] for i in response.json()] == ["Threaded"]


async def test_gitlab_takes_its_token_from_the_settings_or_the_environment(
    gitlab_server: FakeGitLabServer,
) -> None:
    gitlab_server.add_issue("Seen")
    settings = dict(
        kind="gitlab",
        endpoint=gitlab_server.url,
        project_slug=gitlab_server.project,
        active_states=["opened"],
        provider={"links": False},
    )
    built = build_tracker(workflow(**settings), env={"GITLAB_TOKEN": gitlab_server.token})
    assert isinstance(built, GitLabTracker)
    assert [i.title for i in await built.fetch_candidate_issues()] == ["Seen"]
    await built.close()
    explicit = build_tracker(
        workflow(**settings, api_key=gitlab_server.token), env={"GITLAB_TOKEN": "stale"}
    )
    assert len(await explicit.fetch_candidate_issues()) == 1
    await explicit.close()
    with pytest.raises(TrackerError) as err:
        build_tracker(workflow(**settings), env={})
    assert err.value.code == "missing_tracker_api_key"


def test_the_gitlab_fake_also_runs_from_synchronous_code() -> None:
    import httpx

    gitlab = FakeGitLabServer()
    gitlab.add_issue("Threaded")
    with gitlab.running_in_thread() as running:
        response = httpx.get(
            f"{running.url}/api/v4/projects/{running.encoded_project}/issues",
            headers={"PRIVATE-TOKEN": running.token},
        )
        assert [i["title"] for i in response.json()] == ["Threaded"]
        assert response.headers["X-Total"] == "1"
