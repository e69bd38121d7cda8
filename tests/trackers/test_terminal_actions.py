"""The retry budget's terminal actions (``retry.terminal_action``) through each real tracker.

``escalate`` posts one marked comment and/or adds one label; ``cancel`` moves the issue to
``retry.cancel_state``. The runtime may replay either after a crash between the write and its
receipt (with an :class:`~lorenz.model.Issue` read before the first write), so a replay with the
same idempotency key must post nothing new. Driven against the Linear and GitHub HTTP fakes and
a real issue folder (and the GitLab fake), and checked in the fake's or the file's own state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lorenz.config import TrackerSettings
from lorenz.model import Issue
from lorenz.trackers.files import FilesTracker
from lorenz.trackers.github import GitHubTracker
from lorenz.trackers.gitlab import GitLabTracker
from lorenz.trackers.linear import LinearTracker
from lorenz.trackers.writes import escalation_marker
from tests.fakes.github_server import FakeGitHubServer
from tests.fakes.gitlab_server import FakeGitLabServer
from tests.fakes.linear_server import FakeLinearServer

KEY = "lz-0123456789abcdef"
OTHER_KEY = "lz-fedcba9876543210"
COMMENT = "Lorenz gave up after 3 attempts; see the last run's log."


async def _no_sleep(delay: float) -> None:
    """No real wait (no test here expects a rate limit)."""


async def _one(
    tracker: LinearTracker | GitHubTracker | GitLabTracker | FilesTracker, issue_id: str
) -> Issue:
    [issue] = await tracker.fetch_issues_by_ids([issue_id])
    return issue


def _marked(comments: list[str], key: str) -> list[str]:
    return [c for c in comments if escalation_marker(key) in c]


# -- Linear ---------------------------------------------------------------------------------------


async def test_linear_escalation_posts_once_and_a_replay_posts_nothing(
    linear_server: FakeLinearServer, linear: LinearTracker
) -> None:
    seeded = linear_server.add_issue(title="Flaky work", labels=["backend"])
    issue = await _one(linear, seeded.id)

    assert await linear.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert sorted(linear_server.labels_on(seeded.id)) == ["backend", "needs-human"]
    [posted] = linear_server.comments_on(seeded.id)
    assert posted.startswith(escalation_marker(KEY))
    assert COMMENT in posted

    # A replay after a restart: the same key, the issue as read before the first write.
    assert not await linear.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert linear_server.comments_on(seeded.id) == [posted]
    assert sorted(linear_server.labels_on(seeded.id)) == ["backend", "needs-human"]
    assert len(linear_server.requests_for("LorenzEscalationComment")) == 1
    assert len(linear_server.requests_for("LorenzAddLabel")) == 1
    assert len(linear_server.requests_for("LorenzCreateLabel")) == 1

    # A later escalation (another key) is a new comment; the label is not added twice.
    assert await linear.escalate_issue(issue, key=OTHER_KEY, comment="again", label="needs-human")
    assert len(linear_server.comments_on(seeded.id)) == 2
    assert len(_marked(linear_server.comments_on(seeded.id), OTHER_KEY)) == 1
    assert sorted(linear_server.labels_on(seeded.id)) == ["backend", "needs-human"]


async def test_linear_escalation_with_only_a_label_or_only_a_comment(
    linear_server: FakeLinearServer, linear: LinearTracker
) -> None:
    labelled = linear_server.add_issue(title="Label only")
    commented = linear_server.add_issue(title="Comment only")

    assert await linear.escalate_issue(
        await _one(linear, labelled.id), key=KEY, comment=None, label="needs-human"
    )
    assert await linear.escalate_issue(
        await _one(linear, commented.id), key=KEY, comment=COMMENT, label=None
    )

    assert (linear_server.labels_on(labelled.id), linear_server.comments_on(labelled.id)) == (
        ["needs-human"],
        [],
    )
    assert linear_server.labels_on(commented.id) == []
    assert len(_marked(linear_server.comments_on(commented.id), KEY)) == 1
    # The label made for the first issue is found by name for the next, not created again.
    assert await linear.escalate_issue(
        await _one(linear, commented.id), key=KEY, comment=COMMENT, label="needs-human"
    )
    assert linear_server.labels_on(commented.id) == ["needs-human"]
    assert len(linear_server.requests_for("LorenzCreateLabel")) == 1


async def test_linear_cancel_moves_the_issue_and_a_replay_writes_nothing(
    linear_server: FakeLinearServer, linear: LinearTracker
) -> None:
    seeded = linear_server.add_issue(title="Hopeless", state="In Progress")
    issue = await _one(linear, seeded.id)

    await linear.move_issue_to_state(issue, state="Canceled")
    assert linear_server.state_of(seeded.id) == "Canceled"
    await linear.move_issue_to_state(issue, state="canceled")  # the replay, a stale issue
    assert linear_server.state_of(seeded.id) == "Canceled"
    assert len(linear_server.requests_for("LorenzMoveIssue")) == 1
    assert (await _one(linear, seeded.id)).state == "Canceled"


# -- GitHub ---------------------------------------------------------------------------------------


async def test_github_escalation_posts_once_and_a_replay_posts_nothing(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    seeded = github_server.add_issue("Flaky work", labels=["todo"])
    issue = await _one(github, str(seeded.number))

    assert await github.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert github_server.issue(seeded.number).labels == ["todo", "needs-human"]
    [posted] = github_server.issue(seeded.number).comments
    assert posted.startswith(escalation_marker(KEY))
    assert COMMENT in posted

    # A replay with the issue as read before the first write: the label POST is a no-op on
    # GitHub, and the comment is found by its marker, so nothing new shows on the issue.
    await github.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert github_server.issue(seeded.number).labels == ["todo", "needs-human"]
    assert github_server.issue(seeded.number).comments == [posted]
    # A replay with a fresh read writes nothing at all.
    fresh = await _one(github, str(seeded.number))
    assert not await github.escalate_issue(fresh, key=KEY, comment=COMMENT, label="Needs-Human")
    comment_posts = [r for r in github_server.requests_to("/comments") if r.method == "POST"]
    assert len(comment_posts) == 1

    assert await github.escalate_issue(fresh, key=OTHER_KEY, comment="again", label=None)
    assert len(github_server.issue(seeded.number).comments) == 2


async def test_github_cancel_swaps_state_labels_and_closes_as_not_planned(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    seeded = github_server.add_issue("Hopeless", labels=["bug", "In Progress"])
    issue = await _one(github, str(seeded.number))

    await github.move_issue_to_state(issue, state="Cancelled")
    after = github_server.issue(seeded.number)
    assert (after.labels, after.state, after.state_reason) == (
        ["bug", "Cancelled"],
        "closed",
        "not_planned",
    )
    await github.move_issue_to_state(issue, state="Cancelled")  # the replay
    after = github_server.issue(seeded.number)
    assert (after.labels, after.state, after.state_reason) == (
        ["bug", "Cancelled"],
        "closed",
        "not_planned",
    )
    assert (await _one(github, str(seeded.number))).state == "Cancelled"


async def test_github_cancel_to_an_active_state_keeps_the_issue_open(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    seeded = github_server.add_issue("Park it", labels=["In Progress"])

    await github.move_issue_to_state(await _one(github, str(seeded.number)), state="Todo")
    after = github_server.issue(seeded.number)
    assert (after.labels, after.state) == (["Todo"], "open")


# -- files ----------------------------------------------------------------------------------------


def _files_tracker(folder: Path) -> FilesTracker:
    return FilesTracker(settings=TrackerSettings(kind="files"), folder=folder)


async def test_files_escalation_writes_once_and_a_replay_writes_nothing(folder: Path) -> None:
    path = folder / "demo-1.md"
    path.write_text(
        "---\nid: demo-1\ntitle: Flaky work\nstate: In Progress\nlabels: [backend]\n"
        "updated_at: 2026-01-01T00:00:00Z\n---\nThe description.\n",
        encoding="utf-8",
    )
    tracker = _files_tracker(folder)
    issue = await _one(tracker, "demo-1")

    assert await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    written = path.read_text(encoding="utf-8")
    assert written.count(escalation_marker(KEY)) == 1
    assert COMMENT in written
    assert written.rstrip().endswith(COMMENT)
    parsed = await _one(tracker, "demo-1")
    assert parsed.labels == ("backend", "needs-human")
    assert parsed.description is not None
    assert parsed.description.startswith("The description.")
    assert "updated_at: 2026-01-01T00:00:00Z" not in written

    assert not await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert path.read_text(encoding="utf-8") == written

    assert await tracker.escalate_issue(issue, key=OTHER_KEY, comment="again", label=None)
    again = path.read_text(encoding="utf-8")
    assert again.count(escalation_marker(KEY)) == 1
    assert again.count(escalation_marker(OTHER_KEY)) == 1


async def test_files_cancel_sets_the_state_and_the_issue_reads_back_in_it(folder: Path) -> None:
    path = folder / "demo-1.md"
    path.write_text("---\nid: demo-1\ntitle: Hopeless\nstate: Todo\n---\nBody.\n", "utf-8")
    tracker = _files_tracker(folder)
    issue = await _one(tracker, "demo-1")

    await tracker.move_issue_to_state(issue, state="Cancelled")
    assert (await _one(tracker, "demo-1")).state == "Cancelled"
    first = path.read_text(encoding="utf-8")
    await tracker.move_issue_to_state(issue, state="Cancelled")  # the replay
    assert path.read_text(encoding="utf-8") == first
    assert "Body." in first


# -- GitLab ---------------------------------------------------------------------------------------


@pytest.fixture
async def gitlab(gitlab_server: FakeGitLabServer) -> AsyncIterator[GitLabTracker]:
    tracker = GitLabTracker(
        settings=TrackerSettings(
            kind="gitlab",
            endpoint=gitlab_server.url,
            project_slug=gitlab_server.project,
            active_states=("Todo", "In Progress"),
            terminal_states=("Done", "Cancelled"),
            provider={"state_label_scope": "status"},
        ),
        token=gitlab_server.token,
        sleep=_no_sleep,
    )
    yield tracker
    await tracker.close()


async def test_gitlab_escalation_posts_one_note_and_a_replay_posts_nothing(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    seeded = gitlab_server.add_issue("Flaky work", labels=["status::todo"])
    issue = await _one(gitlab, str(seeded.iid))

    assert await gitlab.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert gitlab_server.issue(seeded.iid).labels == ["status::todo", "needs-human"]
    [posted] = gitlab_server.issue(seeded.iid).notes
    assert posted.startswith(escalation_marker(KEY))
    assert COMMENT in posted

    # A replay with the issue as read before the first write: adding a present label changes
    # nothing on GitLab, and the note is found by its marker.
    await gitlab.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert gitlab_server.issue(seeded.iid).labels == ["status::todo", "needs-human"]
    assert gitlab_server.issue(seeded.iid).notes == [posted]
    fresh = await _one(gitlab, str(seeded.iid))
    assert not await gitlab.escalate_issue(fresh, key=KEY, comment=COMMENT, label="Needs-Human")
    note_posts = [r for r in gitlab_server.requests_to("/notes") if r.method == "POST"]
    assert len(note_posts) == 1

    assert await gitlab.escalate_issue(fresh, key=OTHER_KEY, comment="again", label=None)
    assert len(gitlab_server.issue(seeded.iid).notes) == 2


async def test_gitlab_escalation_finds_its_note_on_a_later_page(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    seeded = gitlab_server.add_issue("Chatty", labels=["status::todo"])
    issue = await _one(gitlab, str(seeded.iid))
    gitlab_server.issue(seeded.iid).notes.extend(f"note {n}" for n in range(150))
    assert await gitlab.escalate_issue(issue, key=KEY, comment=COMMENT, label=None)
    assert not await gitlab.escalate_issue(issue, key=KEY, comment=COMMENT, label=None)
    assert len(_marked(gitlab_server.issue(seeded.iid).notes, KEY)) == 1


async def test_gitlab_cancel_swaps_scoped_labels_and_closes(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    seeded = gitlab_server.add_issue("Hopeless", labels=["bug", "status::In Progress"])
    issue = await _one(gitlab, str(seeded.iid))

    await gitlab.move_issue_to_state(issue, state="Cancelled")
    after = gitlab_server.issue(seeded.iid)
    assert (after.labels, after.state) == (["bug", "status::Cancelled"], "closed")
    await gitlab.move_issue_to_state(issue, state="Cancelled")  # the replay
    assert (after.labels, after.state) == (["bug", "status::Cancelled"], "closed")
    assert len([r for r in gitlab_server.requests if r.method == "PUT"]) == 1
    assert (await _one(gitlab, str(seeded.iid))).state == "Cancelled"


async def test_gitlab_cancel_to_an_active_state_keeps_the_issue_open(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    seeded = gitlab_server.add_issue("Park it", labels=["status::In Progress"])

    await gitlab.move_issue_to_state(await _one(gitlab, str(seeded.iid)), state="Todo")
    after = gitlab_server.issue(seeded.iid)
    assert (after.labels, after.state) == (["status::Todo"], "opened")
