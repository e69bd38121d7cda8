"""The tracker-independent part of questions (:mod:`lorenz.trackers.questions`): finding the
question among read comments, telling Lorenz's comments apart, bounding what comes back, and
reading the times trackers write."""

from __future__ import annotations

import datetime

from lorenz.trackers.questions import (
    MAX_QUESTION_CHARS,
    ReadComment,
    bounded_question,
    is_lorenz_comment,
    parse_comment_time,
    question_comment,
    question_marker,
    replies_after,
)
from lorenz.trackers.writes import with_marker

KEY = "lz-0123456789abcdef"
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _comment(n: int, body: str, *, author: str = "alice", second: int | None = None) -> ReadComment:
    return ReadComment(
        comment_id=f"c{n}",
        body=body,
        author=author,
        author_id=author,
        created_at=T0 + datetime.timedelta(seconds=n if second is None else second),
    )


def test_replies_follow_the_question_in_time_order_whatever_the_listing_order() -> None:
    listed = [
        _comment(3, "second reply"),
        _comment(1, question_comment("?", key=KEY), author="Bot"),
        _comment(0, "before"),
        _comment(2, "first reply", author="BOB"),
    ]
    replies = replies_after(listed, key=KEY, own_ids=["bot"])
    assert [r.body for r in replies or []] == ["first reply", "second reply"]


def test_ties_in_time_keep_the_listed_order_and_own_ids_compare_without_case() -> None:
    listed = [
        _comment(0, question_comment("?", key=KEY), second=0),
        _comment(1, "by the token's user", author="Lorenz-Bot", second=0),
        _comment(2, "a", second=0),
        _comment(3, "b", second=0),
    ]
    replies = replies_after(listed, key=KEY, own_ids=["lorenz-bot", ""])
    assert [r.body for r in replies or []] == ["a", "b"]


def test_file_order_wins_over_times_when_asked() -> None:
    listed = [
        _comment(5, question_comment("?", key=KEY)),
        _comment(1, "written later, with an earlier time"),
    ]
    assert replies_after(listed, key=KEY, by_time=True) is not None
    assert replies_after(listed, key=KEY, by_time=True) == []
    assert [r.body for r in replies_after(listed, key=KEY, by_time=False) or []] == [
        "written later, with an earlier time"
    ]


def test_a_replayed_second_question_is_not_an_answer() -> None:
    listed = [
        _comment(0, question_comment("?", key=KEY)),
        _comment(1, "reply"),
        _comment(2, question_comment("?", key=KEY)),
    ]
    assert [r.body for r in replies_after(listed, key=KEY) or []] == ["reply"]
    assert replies_after(listed, key="lz-other") is None


def test_lorenz_markers_of_any_kind_are_recognized() -> None:
    assert is_lorenz_comment(with_marker("gave up", key="lz-00ff"))
    assert is_lorenz_comment(f"text\n{question_marker('lz-abc')}")
    assert not is_lorenz_comment("<!-- a person's own html comment -->")
    assert not is_lorenz_comment("<!-- lorenz-question: -->")
    assert not is_lorenz_comment(None)


def test_a_long_question_is_cut_with_a_note() -> None:
    assert bounded_question("short") == "short"
    cut = bounded_question("q" * (MAX_QUESTION_CHARS + 1))
    assert cut.startswith("q" * MAX_QUESTION_CHARS)
    assert cut.endswith("[the question was cut by Lorenz: too long]")


def test_tracker_times_parse_to_aware_datetimes() -> None:
    want = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert parse_comment_time("2026-01-02T03:04:05Z") == want  # GitHub
    assert parse_comment_time("2026-01-02T03:04:05.000Z") == want  # Linear, GitLab
    assert parse_comment_time("2026-01-02T03:04:05.000+0000") == want  # Jira
    assert parse_comment_time("2026-01-02T04:04:05+01:00") == want
    assert parse_comment_time("2026-01-02T03:04:05") == want  # no zone: UTC
    for bad in ("", "yesterday", None, 17, "2026-13-01T00:00:00Z"):
        assert parse_comment_time(bad) is None
