"""Questions on Jira (:mod:`lorenz.trackers.questions`) against the REST v3 fake.

One ADF comment ends in the question's marker (a code line, like an escalation) and is posted
once under replay; the replies are the comments after it by any account but the token's,
rendered from ADF to text, oldest first, bounded, read across ``startAt`` pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.jira import JiraTracker
from lorenz.trackers.questions import MAX_REPLY_CHARS, QuestionChannel, question_marker
from lorenz.trackers.writes import escalation_marker
from tests.fakes.jira_server import FakeJiraServer, adf, adf_text

KEY = "lz-0123456789abcdef"
QUESTION = "Which database should the migration target?\n\nPostgres or SQLite?"
ALICE = "712020:alice-0000-0000"
BOB = "712020:bob-0000-0000"


async def _no_sleep(delay: float) -> None:
    """No real wait (no test here expects a rate limit)."""


@pytest.fixture
async def jira(jira_server: FakeJiraServer) -> AsyncIterator[JiraTracker]:
    tracker = JiraTracker(
        settings=TrackerSettings(
            kind="jira",
            endpoint=jira_server.url,
            project_slug=jira_server.project,
            active_states=("To Do", "In Progress"),
            terminal_states=("Done",),
            provider={"max_response_bytes": 1024 * 1024},
        ),
        email=jira_server.email,
        token=jira_server.token,
        sleep=_no_sleep,
    )
    yield tracker
    await tracker.close()


async def _issue(jira: JiraTracker, jira_server: FakeJiraServer) -> Issue:
    seeded = jira_server.add_issue("Migrate", status="In Progress")
    [issue] = await jira.fetch_issues_by_ids([str(seeded.id)])
    return issue


def _posts(jira_server: FakeJiraServer) -> int:
    return len(jira_server.requests_to("/comment", method="POST"))


async def test_the_question_is_posted_once_however_often_it_is_replayed(
    jira_server: FakeJiraServer, jira: JiraTracker
) -> None:
    issue = await _issue(jira, jira_server)
    assert isinstance(jira, QuestionChannel)

    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    [posted] = jira_server.comment_texts(issue.id)
    assert posted.endswith(question_marker(KEY))
    assert "Postgres or SQLite?" in posted
    assert not await jira.post_question(issue, key=KEY, body=QUESTION)
    assert jira_server.comment_texts(issue.id) == [posted]
    assert _posts(jira_server) == 1


async def test_replies_are_the_comments_after_the_question_without_lorenz_own(
    jira_server: FakeJiraServer, jira: JiraTracker
) -> None:
    issue = await _issue(jira, jira_server)
    jira_server.user_emails[ALICE] = "alice@example.com"
    jira_server.add_comment(issue.id, "before the question", account_id=ALICE)
    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    assert await jira.replies_after_question(issue, key=KEY) == []

    jira_server.add_comment(issue.id, "the token's own account")  # GET /myself
    jira_server.add_comment(issue.id, f"escalated {escalation_marker('lz-00ff')}", account_id=BOB)
    first = jira_server.add_comment(
        issue.id,
        {
            "type": "doc",
            "version": 1,
            "content": [
                {"type": "paragraph", "content": [{"type": "text", "text": "Postgres,"}]},
                {"type": "paragraph", "content": [{"type": "text", "text": "please."}]},
            ],
        },
        account_id=ALICE,
    )
    second = jira_server.add_comment(issue.id, "Agreed", account_id=BOB)

    replies = await jira.replies_after_question(issue, key=KEY)
    assert [(r.author, r.body, r.comment_id) for r in replies or []] == [
        ("alice@example.com", "Postgres,\n\nplease.", first),
        (BOB, "Agreed", second),  # no e-mail shown: the account id
    ]
    assert replies is not None
    assert replies[0].created_at < replies[1].created_at
    await jira.replies_after_question(issue, key=KEY)
    assert len(jira_server.requests_to("/myself")) == 1


async def test_the_question_is_found_across_comment_pages(
    jira_server: FakeJiraServer, jira: JiraTracker
) -> None:
    issue = await _issue(jira, jira_server)
    jira_server.issue(issue.id).comments.extend(adf(f"chatter {n}") for n in range(150))
    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    assert not await jira.post_question(issue, key=KEY, body=QUESTION)
    jira_server.add_comment(issue.id, "the answer", account_id=ALICE)

    replies = await jira.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["the answer"]
    assert _posts(jira_server) == 1
    reads = jira_server.requests_to("/comment", method="GET")
    assert {r.query.get("startAt") for r in reads} >= {"0", "100"}


async def test_an_oversized_reply_is_truncated_with_a_note(
    jira_server: FakeJiraServer, jira: JiraTracker
) -> None:
    issue = await _issue(jira, jira_server)
    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    jira_server.add_comment(issue.id, "w" * (MAX_REPLY_CHARS * 3), account_id=ALICE)

    [reply] = await jira.replies_after_question(issue, key=KEY) or []
    assert reply.body.startswith("w" * MAX_REPLY_CHARS)
    assert "truncated by Lorenz" in reply.body
    assert len(reply.body) < MAX_REPLY_CHARS + 200


async def test_a_deleted_question_reads_as_none(
    jira_server: FakeJiraServer, jira: JiraTracker
) -> None:
    issue = await _issue(jira, jira_server)
    assert await jira.replies_after_question(issue, key=KEY) is None
    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    jira_server.add_comment(issue.id, "an answer", account_id=ALICE)
    [question_id, _] = jira_server.comment_ids(issue.id)
    jira_server.delete_comment(issue.id, question_id)

    assert await jira.replies_after_question(issue, key=KEY) is None
    assert adf_text(jira_server.issue(issue.id).comments[-1]) == "an answer"


@pytest.mark.parametrize(
    ("kind", "options", "code"),
    [
        ("status", {"status": 500}, ErrorCode.JIRA_API_STATUS),
        ("status", {"status": 404}, ErrorCode.JIRA_API_STATUS),
        ("not_json", {}, ErrorCode.JIRA_UNKNOWN_PAYLOAD),
        ("malformed", {"body": {"comments": "not a list"}}, ErrorCode.JIRA_UNKNOWN_PAYLOAD),
        ("huge", {}, ErrorCode.JIRA_RESPONSE_TOO_LARGE),
        ("disconnect", {}, ErrorCode.JIRA_API_REQUEST),
    ],
)
async def test_tracker_failures_raise_the_coded_jira_errors(
    jira_server: FakeJiraServer,
    jira: JiraTracker,
    kind: str,
    options: dict[str, object],
    code: str,
) -> None:
    issue = await _issue(jira, jira_server)
    jira_server.fail_next(kind, paths=["/comment"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await jira.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == code
    assert jira_server.comment_texts(issue.id) == []

    assert await jira.post_question(issue, key=KEY, body=QUESTION)
    jira_server.fail_next(kind, paths=["/comment"], **options)  # type: ignore[arg-type]
    with pytest.raises(TrackerError) as raised:
        await jira.replies_after_question(issue, key=KEY)
    assert raised.value.code == code
