"""The fake GitHub server's write endpoints, which end-to-end agents use to move their issues.

Checked over real HTTP (httpx) for GitHub's shapes and status codes, and through the real
GitHub tracker, so a label or state written here reads back as the workflow state Lorenz sees.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from lorenz.config import TrackerSettings
from lorenz.trackers.github import GitHubTracker
from tests.fakes.github_server import FakeGitHubServer

OTHER_TOKEN = "ghp_someoneElse0000000000000000000000"


@pytest.fixture
async def github() -> AsyncIterator[FakeGitHubServer]:
    async with FakeGitHubServer(tokens=[OTHER_TOKEN]) as server:
        yield server


@pytest.fixture
async def client(github: FakeGitHubServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=f"{github.url}/repos/{github.repository}",
        headers={"Authorization": f"Bearer {OTHER_TOKEN}"},
    ) as http:
        yield http


def _names(labels: list[dict[str, object]]) -> list[object]:
    return [label["name"] for label in labels]


async def test_labels_are_added_replaced_and_removed_like_github_does(
    github: FakeGitHubServer, client: httpx.AsyncClient
) -> None:
    issue = github.add_issue("Work", labels=["todo"])
    labels = f"/issues/{issue.number}/labels"

    added = await client.post(labels, json={"labels": ["Backend", "TODO"]})
    assert added.status_code == 200
    assert _names(added.json()) == ["todo", "Backend"]  # no second copy of "todo"
    bare = await client.post(labels, json=["urgent"])
    assert _names(bare.json()) == ["todo", "Backend", "urgent"]

    removed = await client.delete(f"{labels}/BACKEND")
    assert (removed.status_code, _names(removed.json())) == (200, ["todo", "urgent"])
    missing = await client.delete(f"{labels}/wontfix")
    assert (missing.status_code, missing.json()["message"]) == (404, "Label does not exist")

    replaced = await client.put(labels, json={"labels": ["in progress"]})
    assert _names(replaced.json()) == ["in progress"]
    assert (await client.delete(labels)).status_code == 204
    assert github.issue(issue.number).labels == []

    invalid = await client.post(labels, json={"labels": "done"})
    assert invalid.status_code == 422
    writes = [r for r in github.requests if r.method in ("POST", "PUT")]
    assert writes[0].body == {"labels": ["Backend", "TODO"]}


async def test_issues_are_closed_and_reopened_by_patch(
    github: FakeGitHubServer, client: httpx.AsyncClient
) -> None:
    issue = github.add_issue("Work", labels=["todo"])
    path = f"/issues/{issue.number}"

    closed = await client.patch(path, json={"state": "closed"})
    assert closed.status_code == 200
    assert (closed.json()["state"], closed.json()["state_reason"]) == ("closed", "completed")
    assert closed.json()["closed_at"] is not None
    reopened = await client.patch(path, json={"state": "open"})
    assert (reopened.json()["state"], reopened.json()["state_reason"]) == ("open", "reopened")
    skipped = await client.patch(path, json={"state": "closed", "state_reason": "not_planned"})
    assert skipped.json()["state_reason"] == "not_planned"
    relabelled = await client.patch(path, json={"labels": ["done"], "title": "Work, done"})
    assert _names(relabelled.json()["labels"]) == ["done"]
    assert relabelled.json()["title"] == "Work, done"

    assert (await client.patch(path, json={"state": "merged"})).status_code == 422
    assert (await client.patch(path, content=b"not json")).status_code == 422
    assert (await client.patch("/issues/999", json={"state": "closed"})).status_code == 404
    github.delete_issue(issue.number)
    assert (await client.patch(path, json={"state": "open"})).status_code == 410


async def test_writes_need_a_known_token(github: FakeGitHubServer) -> None:
    issue = github.add_issue("Work")
    url = f"{github.url}/repos/{github.repository}/issues/{issue.number}/labels"
    async with httpx.AsyncClient() as http:
        stranger = await http.post(url, json=["x"], headers={"Authorization": "Bearer nope"})
        owner = await http.post(url, json=["y"], headers={"Authorization": f"token {github.token}"})
    assert stranger.status_code == 401
    assert owner.status_code == 200
    assert github.issue(issue.number).labels == ["y"]


async def test_the_tracker_reads_written_labels_and_states_as_workflow_states(
    github: FakeGitHubServer, client: httpx.AsyncClient
) -> None:
    issue = github.add_issue("Work", labels=["todo"])
    tracker = GitHubTracker(
        settings=TrackerSettings(
            kind="github",
            repository=github.repository,
            active_states=("todo", "in progress"),
            terminal_states=("done", "wontfix"),
        ),
        token=github.token,
        endpoint=github.url,
    )
    try:
        await client.delete(f"/issues/{issue.number}/labels/todo")
        await client.post(f"/issues/{issue.number}/labels", json={"labels": ["in progress"]})
        [moved] = await tracker.fetch_issues_by_ids([str(issue.number)])
        assert moved.state == "in progress"
        await client.patch(f"/issues/{issue.number}", json={"state": "closed"})
        [closed] = await tracker.fetch_issues_by_ids([str(issue.number)])
        assert closed.state == "done"  # closing is terminal: the first terminal state
        await client.patch(f"/issues/{issue.number}", json={"state": "open"})
        assert [i.id for i in await tracker.fetch_candidate_issues()] == [str(issue.number)]
    finally:
        await tracker.close()
