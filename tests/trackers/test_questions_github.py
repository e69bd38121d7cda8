"""Questions on GitHub (:mod:`lorenz.trackers.questions`) against the REST fake.

One issue comment carries the question's marker and is posted once under replay; the replies
are the comments after it by any login but the token's, oldest first, bounded, read across
``Link``-paged comment listings.
"""

from __future__ import annotations

import pytest

from lorenz.codes import ErrorCode
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.github import GitHubTracker
from lorenz.trackers.questions import MAX_REPLY_CHARS, QuestionChannel, question_marker
from lorenz.trackers.writes import with_marker
from tests.fakes.github_server import FakeGitHubServer

KEY = "lz-0123456789abcdef"
QUESTION = "Which database should the migration target?"


async def _issue(github: GitHubTracker, github_server: FakeGitHubServer) -> Issue:
    seeded = github_server.add_issue("Migrate", labels=["In Progress"])
    [issue] = await github.fetch_issues_by_ids([str(seeded.number)])
    return issue


def _posts(github_server: FakeGitHubServer) -> int:
    return len([r for r in github_server.requests_to("/comments") if r.method == "POST"])


async def test_the_question_is_posted_once_however_often_it_is_replayed(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    assert isinstance(github, QuestionChannel)

    assert await github.post_question(issue, key=KEY, body=QUESTION)
    [posted] = github_server.issue(int(issue.id)).comments
    assert posted.startswith(question_marker(KEY))
    assert QUESTION in posted
    assert not await github.post_question(issue, key=KEY, body=QUESTION)
    assert github_server.issue(int(issue.id)).comments == [posted]
    assert _posts(github_server) == 1


async def test_replies_are_the_comments_after_the_question_without_lorenz_own(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    number = int(issue.id)
    github_server.add_comment(number, "before the question", login="octocat")
    assert await github.post_question(issue, key=KEY, body=QUESTION)
    assert await github.replies_after_question(issue, key=KEY) == []

    github_server.add_comment(number, "the token's own user")  # the login of GET /user
    github_server.add_comment(number, with_marker("escalated", key="lz-00ff"), login="octocat")
    first = github_server.add_comment(number, "Postgres, please.", login="octocat")
    second = github_server.add_comment(number, "Agreed", login="hubot")

    replies = await github.replies_after_question(issue, key=KEY)
    assert [(r.author, r.body, r.comment_id) for r in replies or []] == [
        ("octocat", "Postgres, please.", str(first)),
        ("hubot", "Agreed", str(second)),
    ]
    assert replies is not None
    assert replies[0].created_at < replies[1].created_at
    await github.replies_after_question(issue, key=KEY)
    assert len(github_server.requests_to("/user")) == 1  # asked once


async def test_an_app_token_without_a_user_still_skips_lorenz_marked_comments(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    assert await github.post_question(issue, key=KEY, body=QUESTION)
    github_server.add_comment(int(issue.id), "an answer", login="octocat")
    github_server.fail_next(
        "status", status=403, message="Resource not accessible by integration", paths=["/user"]
    )

    replies = await github.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["an answer"]


async def test_the_question_is_found_across_comment_pages(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    number = int(issue.id)
    for n in range(230):
        github_server.add_comment(number, f"chatter {n}", login="octocat")
    assert await github.post_question(issue, key=KEY, body=QUESTION)
    assert not await github.post_question(issue, key=KEY, body=QUESTION)
    github_server.add_comment(number, "the answer", login="octocat")

    replies = await github.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["the answer"]
    assert _posts(github_server) == 1
    assert any(r.query.get("page") == "3" for r in github_server.requests_to("/comments"))


async def test_an_oversized_reply_is_truncated_with_a_note(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    assert await github.post_question(issue, key=KEY, body=QUESTION)
    github_server.add_comment(int(issue.id), "y" * (MAX_REPLY_CHARS * 2), login="octocat")

    [reply] = await github.replies_after_question(issue, key=KEY) or []
    assert reply.body.startswith("y" * MAX_REPLY_CHARS)
    assert "truncated by Lorenz" in reply.body
    assert len(reply.body) < MAX_REPLY_CHARS + 200


async def test_a_deleted_question_reads_as_none(
    github_server: FakeGitHubServer, github: GitHubTracker
) -> None:
    issue = await _issue(github, github_server)
    number = int(issue.id)
    assert await github.replies_after_question(issue, key=KEY) is None
    assert await github.post_question(issue, key=KEY, body=QUESTION)
    github_server.add_comment(number, "an answer", login="octocat")
    [question_id, _] = github_server.comment_ids(number)
    github_server.delete_comment(number, question_id)

    assert await github.replies_after_question(issue, key=KEY) is None


@pytest.mark.parametrize(
    ("kind", "options", "code"),
    [
        ("status", {"status": 500}, ErrorCode.GITHUB_API_STATUS),
        ("status", {"status": 404, "message": "Not Found"}, ErrorCode.GITHUB_API_STATUS),
        ("not_json", {}, ErrorCode.GITHUB_UNKNOWN_PAYLOAD),
        ("malformed", {"body": {"not": "a list"}}, ErrorCode.GITHUB_UNKNOWN_PAYLOAD),
        ("disconnect", {}, ErrorCode.GITHUB_API_REQUEST),
    ],
)
async def test_tracker_failures_raise_the_coded_github_errors(
    github_server: FakeGitHubServer,
    github: GitHubTracker,
    kind: str,
    options: dict[str, object],
    code: str,
) -> None:
    issue = await _issue(github, github_server)
    github_server.fail_next(kind, paths=["/comments"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await github.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == code
    assert github_server.issue(int(issue.id)).comments == []

    assert await github.post_question(issue, key=KEY, body=QUESTION)
    github_server.fail_next(kind, paths=["/comments"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await github.replies_after_question(issue, key=KEY)
    assert raised.value.code == code
