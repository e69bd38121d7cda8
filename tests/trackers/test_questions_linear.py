"""Questions on Linear (:mod:`lorenz.trackers.questions`) against the GraphQL fake.

The question is one comment carrying its marker, posted once however often the call is replayed;
the replies are the comments after it by anyone but Lorenz (its marked comments and the API
key's own user), oldest first, bounded in length, read across comment pages.
"""

from __future__ import annotations

from typing import Any

import pytest

from lorenz.codes import ErrorCode
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.linear import LinearTracker
from lorenz.trackers.questions import (
    MAX_REPLY_CHARS,
    QuestionChannel,
    question_marker,
)
from lorenz.trackers.writes import with_marker
from tests.fakes.linear_server import FakeLinearServer

KEY = "lz-0123456789abcdef"
QUESTION = "Which database should the migration target?\n\n1. Postgres\n2. SQLite"


@pytest.fixture
def alice(linear_server: FakeLinearServer) -> str:
    linear_server.add_user("user-alice", name="Alice", email="alice@example.com")
    return "user-alice"


async def _issue(linear: LinearTracker, linear_server: FakeLinearServer) -> Issue:
    seeded = linear_server.add_issue(title="Migrate", state="In Progress")
    [issue] = await linear.fetch_issues_by_ids([seeded.id])
    return issue


async def test_the_question_is_posted_once_however_often_it_is_replayed(
    linear_server: FakeLinearServer, linear: LinearTracker
) -> None:
    issue = await _issue(linear, linear_server)
    assert isinstance(linear, QuestionChannel)

    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    [posted] = linear_server.comments_on(issue.id)
    assert posted.startswith(question_marker(KEY))
    assert QUESTION in posted

    assert not await linear.post_question(issue, key=KEY, body=QUESTION)
    assert not await linear.post_question(issue, key=KEY, body="reworded")
    assert linear_server.comments_on(issue.id) == [posted]
    assert len(linear_server.requests_for("LorenzQuestionComment")) == 1
    assert await linear.post_question(issue, key="lz-fedcba9876543210", body="another")
    assert len(linear_server.comments_on(issue.id)) == 2
    assert linear_server.rejected == []


async def test_replies_are_the_comments_after_the_question_without_lorenz_own(
    linear_server: FakeLinearServer, linear: LinearTracker, alice: str
) -> None:
    issue = await _issue(linear, linear_server)
    linear_server.add_comment(issue.id, "Before the question: not an answer", user_id=alice)
    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    assert await linear.replies_after_question(issue, key=KEY) == []

    linear_server.add_comment(issue.id, "Lorenz's own user says something")  # the viewer
    linear_server.add_comment(
        issue.id, with_marker("escalated", key="lz-00ff"), user_id=alice
    )  # a Lorenz comment, whoever the tracker says wrote it
    first = linear_server.add_comment(issue.id, "Postgres, please.", user_id=alice)
    linear_server.add_user("user-bob", name="Bob", email="bob@example.com")
    second = linear_server.add_comment(issue.id, "Agreed", user_id="user-bob")

    replies = await linear.replies_after_question(issue, key=KEY)
    assert replies is not None
    assert [(r.author, r.body, r.comment_id) for r in replies] == [
        ("alice@example.com", "Postgres, please.", first),
        ("bob@example.com", "Agreed", second),
    ]
    assert replies[0].created_at < replies[1].created_at
    assert replies[0].created_at.tzinfo is not None
    # The viewer is asked once per tracker instance, not on every read.
    await linear.replies_after_question(issue, key=KEY)
    assert len(linear_server.requests_for("LorenzViewer")) == 1
    assert linear_server.rejected == []


async def test_the_question_is_found_across_comment_pages(
    linear_server: FakeLinearServer, linear: LinearTracker, alice: str
) -> None:
    issue = await _issue(linear, linear_server)
    for n in range(130):
        linear_server.add_comment(issue.id, f"chatter {n}", user_id=alice)
    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    assert not await linear.post_question(issue, key=KEY, body=QUESTION)
    linear_server.add_comment(issue.id, "the answer", user_id=alice)

    replies = await linear.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["the answer"]
    reads = linear_server.requests_for("LorenzQuestionComments")
    assert {r.variables["after"] is None for r in reads} == {True, False}  # paged


async def test_an_oversized_reply_is_truncated_with_a_note(
    linear_server: FakeLinearServer, linear: LinearTracker, alice: str
) -> None:
    issue = await _issue(linear, linear_server)
    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    linear_server.add_comment(issue.id, "x" * (MAX_REPLY_CHARS + 500), user_id=alice)

    [reply] = await linear.replies_after_question(issue, key=KEY) or []
    assert reply.body.startswith("x" * MAX_REPLY_CHARS)
    assert not reply.body.startswith("x" * (MAX_REPLY_CHARS + 1))
    assert f"{MAX_REPLY_CHARS + 500} characters" in reply.body


async def test_a_deleted_question_reads_as_none(
    linear_server: FakeLinearServer, linear: LinearTracker, alice: str
) -> None:
    issue = await _issue(linear, linear_server)
    assert await linear.replies_after_question(issue, key=KEY) is None  # never posted
    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    linear_server.add_comment(issue.id, "an answer to a question that goes away", user_id=alice)
    [question_id, _] = linear_server.comment_ids_on(issue.id)
    linear_server.delete_comment(question_id)

    assert await linear.replies_after_question(issue, key=KEY) is None
    # Posting again after the deletion makes a new question comment.
    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    assert await linear.replies_after_question(issue, key=KEY) == []


@pytest.mark.parametrize(
    ("kind", "options", "code"),
    [
        ("status", {"status": 500}, ErrorCode.LINEAR_API_STATUS),
        ("status", {"status": 401}, ErrorCode.LINEAR_API_STATUS),
        ("graphql_errors", {}, ErrorCode.LINEAR_GRAPHQL_ERRORS),
        ("not_json", {}, ErrorCode.LINEAR_UNKNOWN_PAYLOAD),
    ],
)
async def test_tracker_failures_raise_the_coded_linear_errors(
    linear_server: FakeLinearServer,
    linear: LinearTracker,
    kind: str,
    options: dict[str, Any],
    code: str,
) -> None:
    issue = await _issue(linear, linear_server)
    linear_server.fail_next(kind, operations=["LorenzQuestionComments"], **options)
    with pytest.raises(TrackerError) as raised:
        await linear.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == code
    assert linear_server.comments_on(issue.id) == []

    linear_server.fail_next(kind, operations=["LorenzQuestionComment"], **options)
    with pytest.raises(TrackerError) as raised:
        await linear.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == code

    assert await linear.post_question(issue, key=KEY, body=QUESTION)
    linear_server.fail_next(kind, operations=["LorenzQuestionComments"], **options)
    with pytest.raises(TrackerError) as raised:
        await linear.replies_after_question(issue, key=KEY)
    assert raised.value.code == code


async def test_a_missing_issue_is_a_coded_error(
    linear_server: FakeLinearServer, linear: LinearTracker
) -> None:
    issue = await _issue(linear, linear_server)
    linear_server.remove_issue(issue.id)
    with pytest.raises(TrackerError) as raised:
        await linear.replies_after_question(issue, key=KEY)
    assert raised.value.code == ErrorCode.LINEAR_GRAPHQL_ERRORS
