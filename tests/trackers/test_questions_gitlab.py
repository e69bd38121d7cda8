"""Questions on GitLab (:mod:`lorenz.trackers.questions`) against the REST v4 fake.

One issue note carries the question's marker and is posted once under replay; the replies are
the notes after it by any user but the token's, without GitLab's system notes, oldest first,
bounded, read across paged note listings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.gitlab import GitLabTracker
from lorenz.trackers.questions import MAX_REPLY_CHARS, QuestionChannel, question_marker
from lorenz.trackers.writes import with_marker
from tests.fakes.gitlab_server import FakeGitLabServer

KEY = "lz-0123456789abcdef"
QUESTION = "Which database should the migration target?"


async def _no_sleep(delay: float) -> None:
    """No real wait (no test here expects a rate limit)."""


@pytest.fixture
async def gitlab(gitlab_server: FakeGitLabServer) -> AsyncIterator[GitLabTracker]:
    tracker = GitLabTracker(
        settings=TrackerSettings(
            kind="gitlab",
            endpoint=gitlab_server.url,
            project_slug=gitlab_server.project,
            provider={"state_label_scope": "status", "max_response_bytes": 1024 * 1024},
            active_states=("Todo", "In Progress"),
            terminal_states=("Done", "Cancelled"),
        ),
        token=gitlab_server.token,
        sleep=_no_sleep,
    )
    yield tracker
    await tracker.close()


async def _issue(gitlab: GitLabTracker, gitlab_server: FakeGitLabServer) -> Issue:
    seeded = gitlab_server.add_issue("Migrate", labels=["status::In Progress"])
    [issue] = await gitlab.fetch_issues_by_ids([str(seeded.iid)])
    return issue


def _posts(gitlab_server: FakeGitLabServer) -> int:
    return len([r for r in gitlab_server.requests_to("/notes") if r.method == "POST"])


async def test_the_question_is_posted_once_however_often_it_is_replayed(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    assert isinstance(gitlab, QuestionChannel)

    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    [posted] = gitlab_server.issue(int(issue.id)).notes
    assert posted.startswith(question_marker(KEY))
    assert QUESTION in posted
    assert not await gitlab.post_question(issue, key=KEY, body=QUESTION)
    assert gitlab_server.issue(int(issue.id)).notes == [posted]
    assert _posts(gitlab_server) == 1


async def test_replies_are_the_notes_after_the_question_without_lorenz_own(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    iid = int(issue.id)
    gitlab_server.add_note(iid, "before the question", username="alice")
    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    assert await gitlab.replies_after_question(issue, key=KEY) == []

    gitlab_server.add_note(iid, "the token's own user")  # the username of GET /user
    gitlab_server.add_note(iid, "added ~bug label", username="alice", system=True)
    gitlab_server.add_note(iid, with_marker("escalated", key="lz-00ff"), username="alice")
    first = gitlab_server.add_note(iid, "Postgres, please.", username="alice")
    second = gitlab_server.add_note(iid, "Agreed", username="bob")

    replies = await gitlab.replies_after_question(issue, key=KEY)
    assert [(r.author, r.body, r.comment_id) for r in replies or []] == [
        ("alice", "Postgres, please.", str(first)),
        ("bob", "Agreed", str(second)),
    ]
    assert replies is not None
    assert replies[0].created_at < replies[1].created_at
    await gitlab.replies_after_question(issue, key=KEY)
    assert len([r for r in gitlab_server.requests if r.path.endswith("/user")]) == 1


async def test_the_question_is_found_across_note_pages(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    iid = int(issue.id)
    for n in range(210):
        gitlab_server.add_note(iid, f"chatter {n}", username="alice")
    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    assert not await gitlab.post_question(issue, key=KEY, body=QUESTION)
    gitlab_server.add_note(iid, "the answer", username="alice")

    replies = await gitlab.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["the answer"]
    assert _posts(gitlab_server) == 1
    reads = [r for r in gitlab_server.requests_to("/notes") if r.method == "GET"]
    assert all(r.query.get("sort") == "asc" for r in reads)
    assert any(r.query.get("page") == "3" for r in reads)


async def test_an_oversized_reply_is_truncated_with_a_note(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    gitlab_server.add_note(int(issue.id), "z" * (MAX_REPLY_CHARS + 1), username="alice")

    [reply] = await gitlab.replies_after_question(issue, key=KEY) or []
    assert reply.body.startswith("z" * MAX_REPLY_CHARS)
    assert "truncated by Lorenz" in reply.body


async def test_a_deleted_question_reads_as_none(
    gitlab_server: FakeGitLabServer, gitlab: GitLabTracker
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    iid = int(issue.id)
    assert await gitlab.replies_after_question(issue, key=KEY) is None
    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    gitlab_server.add_note(iid, "an answer", username="alice")
    [question_id, _] = gitlab_server.note_ids(iid)
    gitlab_server.delete_note(iid, question_id)

    assert await gitlab.replies_after_question(issue, key=KEY) is None


@pytest.mark.parametrize(
    ("kind", "options", "code"),
    [
        ("status", {"status": 500}, ErrorCode.GITLAB_API_STATUS),
        ("status", {"status": 404, "message": "404 Not found"}, ErrorCode.GITLAB_API_STATUS),
        ("not_json", {}, ErrorCode.GITLAB_UNKNOWN_PAYLOAD),
        ("malformed", {"body": {"not": "a list"}}, ErrorCode.GITLAB_UNKNOWN_PAYLOAD),
        ("oversized", {}, ErrorCode.GITLAB_RESPONSE_TOO_LARGE),
        ("disconnect", {}, ErrorCode.GITLAB_API_REQUEST),
    ],
)
async def test_tracker_failures_raise_the_coded_gitlab_errors(
    gitlab_server: FakeGitLabServer,
    gitlab: GitLabTracker,
    kind: str,
    options: dict[str, object],
    code: str,
) -> None:
    issue = await _issue(gitlab, gitlab_server)
    gitlab_server.fail_next(kind, paths=["/notes"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await gitlab.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == code
    assert gitlab_server.issue(int(issue.id)).notes == []

    assert await gitlab.post_question(issue, key=KEY, body=QUESTION)
    gitlab_server.fail_next(kind, paths=["/notes"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await gitlab.replies_after_question(issue, key=KEY)
    assert raised.value.code == code
