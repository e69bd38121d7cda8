"""Questions on the in-process tracker (:mod:`lorenz.trackers.questions`).

The memory tracker is what the runtime's own tests drive, so it must behave like the remote
ones: one marked comment per key, replies after it without Lorenz's own, injected failures,
a removed issue as a coded error.
"""

from __future__ import annotations

import pytest

from lorenz.codes import ErrorCode
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.memory import (
    MEMORY_OWN_AUTHOR,
    POST_QUESTION,
    READ_REPLIES,
    MemoryTracker,
)
from lorenz.trackers.questions import (
    MAX_REPLIES,
    MAX_REPLY_CHARS,
    QuestionChannel,
    question_marker,
)
from lorenz.trackers.writes import with_marker

KEY = "lz-0123456789abcdef"
ISSUE = Issue(id="i-1", identifier="MEM-1", title="Migrate", state="In Progress")


@pytest.fixture
def tracker() -> MemoryTracker:
    return MemoryTracker([ISSUE])


async def test_the_question_is_posted_once_and_replies_come_after_it(
    tracker: MemoryTracker,
) -> None:
    assert isinstance(tracker, QuestionChannel)
    tracker.add_comment(ISSUE.id, author="carol", body="before")
    assert await tracker.post_question(ISSUE, key=KEY, body="Which one?")
    assert not await tracker.post_question(ISSUE, key=KEY, body="Which one?")
    [_, question] = tracker.comments_on(ISSUE.id)
    assert question.author == MEMORY_OWN_AUTHOR
    assert question.body == f"{question_marker(KEY)}\nWhich one?"
    assert await tracker.replies_after_question(ISSUE, key=KEY) == []

    tracker.add_comment(ISSUE.id, author=MEMORY_OWN_AUTHOR, body="Lorenz again")
    tracker.add_comment(ISSUE.id, author="dave", body=with_marker("x", key="lz-00ff"))
    first = tracker.add_comment(ISSUE.id, author="alice", body="The first.")
    tracker.add_comment(ISSUE.id, author="bob", body="x" * (MAX_REPLY_CHARS + 1))

    replies = await tracker.replies_after_question(ISSUE, key=KEY)
    assert replies is not None
    assert [(r.author, r.comment_id) for r in replies][:1] == [("alice", first)]
    assert replies[0].created_at < replies[1].created_at
    assert "truncated by Lorenz" in replies[1].body
    assert tracker.calls[POST_QUESTION] == 2


async def test_replies_are_bounded_in_number(tracker: MemoryTracker) -> None:
    assert await tracker.post_question(ISSUE, key=KEY, body="?")
    for n in range(MAX_REPLIES + 5):
        tracker.add_comment(ISSUE.id, author="alice", body=f"reply {n}")
    replies = await tracker.replies_after_question(ISSUE, key=KEY) or []
    assert len(replies) == MAX_REPLIES
    assert replies[0].body == "reply 0"


async def test_a_deleted_question_reads_as_none(tracker: MemoryTracker) -> None:
    assert await tracker.replies_after_question(ISSUE, key=KEY) is None
    assert await tracker.post_question(ISSUE, key=KEY, body="?")
    tracker.add_comment(ISSUE.id, author="alice", body="an answer")
    [question, _] = tracker.comments_on(ISSUE.id)
    tracker.delete_comment(ISSUE.id, question.comment_id)
    assert await tracker.replies_after_question(ISSUE, key=KEY) is None


async def test_injected_failures_and_a_removed_issue_are_coded_errors(
    tracker: MemoryTracker,
) -> None:
    tracker.fail_next(methods=[POST_QUESTION])
    with pytest.raises(TrackerError) as raised:
        await tracker.post_question(ISSUE, key=KEY, body="?")
    assert raised.value.code == ErrorCode.TRACKER_REQUEST
    assert raised.value.retryable
    assert tracker.comments_on(ISSUE.id) == []
    assert await tracker.post_question(ISSUE, key=KEY, body="?")

    tracker.fail_next(methods=[READ_REPLIES])
    with pytest.raises(TrackerError):
        await tracker.replies_after_question(ISSUE, key=KEY)
    assert await tracker.replies_after_question(ISSUE, key=KEY) == []

    tracker.remove(ISSUE.id)
    with pytest.raises(TrackerError) as raised:
        await tracker.replies_after_question(ISSUE, key=KEY)
    assert raised.value.code == ErrorCode.TRACKER_REQUEST
    assert not raised.value.retryable
