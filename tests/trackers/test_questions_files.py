"""Questions in the files tracker (:mod:`lorenz.trackers.questions`) on a real issue folder.

The question is a ``### Lorenz · <time>`` comment under the file's ``## Comments`` section,
written once; a person answers by adding a ``### <name>`` comment below it in an editor, and the
replies come back in file order.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings
from lorenz.model import Issue
from lorenz.trackers.base import TrackerError
from lorenz.trackers.files import FilesTracker, post_question_to_file
from lorenz.trackers.questions import MAX_REPLY_CHARS, QuestionChannel, question_marker
from lorenz.trackers.writes import escalation_marker

KEY = "lz-0123456789abcdef"
QUESTION = "Which database should the migration target?"
HEADER = (
    "---\nid: demo-1\ntitle: Migrate\nstate: In Progress\nupdated_at: 2026-01-01T00:00:00Z\n---\n"
)
NOW = datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.UTC)


@pytest.fixture
def tracker(folder: Path) -> FilesTracker:
    return FilesTracker(settings=TrackerSettings(kind="files"), folder=folder)


def _seed(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", newline="")


async def _issue(tracker: FilesTracker, path: Path, text: str) -> Issue:
    _seed(path, text)
    [issue] = await tracker.fetch_issues_by_ids(["demo-1"])
    return issue


def _append(path: Path, text: str) -> None:
    """A person's edit: text added at the end of the file."""
    with path.open("a", encoding="utf-8", newline="") as handle:
        handle.write(text)


async def test_the_question_is_written_once_under_a_comments_section(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "The description.\n")
    assert isinstance(tracker, QuestionChannel)

    assert await tracker.post_question(issue, key=KEY, body=QUESTION)
    written = path.read_text(encoding="utf-8")
    assert written.count(question_marker(KEY)) == 1
    section = written.split("The description.\n", 1)[1]
    assert section.startswith("\n## Comments\n\n### Lorenz · ")
    assert f"{question_marker(KEY)}\n{QUESTION}\n" in section
    assert "updated_at: 2026-01-01T00:00:00Z" not in written  # bumped

    assert not await tracker.post_question(issue, key=KEY, body=QUESTION)
    assert path.read_text(encoding="utf-8") == written
    # The issue still reads, its description now carrying the conversation.
    [again] = await tracker.fetch_issues_by_ids(["demo-1"])
    assert again.description is not None
    assert again.description.startswith("The description.")
    assert await tracker.replies_after_question(issue, key=KEY) == []


async def test_replies_are_the_comments_below_the_question_in_file_order(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(
        tracker,
        path,
        HEADER + "Body.\n\n## Comments\n\n### carol · 2026-01-01T00:00:00Z\n\nAn early remark.\n",
    )
    assert await tracker.post_question(issue, key=KEY, body=QUESTION)
    _append(
        path,
        "\n### Lorenz\n\nLorenz's own name: not an answer.\n"
        f"\n### dave\n\n{escalation_marker('lz-00ff')}\nA Lorenz note under another name.\n"
        "\n### alice · 2026-03-04T05:00:00Z\n\nPostgres, please.\n\n"
        "```sql\n### not a heading inside a fence\nselect 1;\n```\n"
        "\n### bob\n\nAgreed\n",
    )
    mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)

    replies = await tracker.replies_after_question(issue, key=KEY)
    assert replies is not None
    assert [(r.author, r.body) for r in replies] == [
        (
            "alice",
            "Postgres, please.\n\n```sql\n### not a heading inside a fence\nselect 1;\n```",
        ),
        ("bob", "Agreed"),
    ]
    assert replies[0].created_at == datetime.datetime(2026, 3, 4, 5, 0, tzinfo=datetime.UTC)
    assert replies[1].created_at == mtime  # no time in the heading: the file's
    assert len({r.comment_id for r in replies}) == 2


async def test_the_question_goes_into_the_section_before_the_next_one(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(
        tracker,
        path,
        HEADER + "Body.\n\n## Comments\n\n### carol\n\nEarly.\n\n## Notes\n\nKept as it is.\n",
    )
    assert post_question_to_file(path, key=KEY, body=QUESTION, now=NOW)
    written = path.read_text(encoding="utf-8")
    assert written.endswith(
        "### carol\n\nEarly.\n\n### Lorenz · 2026-03-04T05:06:07Z\n\n"
        f"{question_marker(KEY)}\n{QUESTION}\n\n## Notes\n\nKept as it is.\n"
    )
    assert "updated_at: 2026-03-04T05:06:07Z" in written
    # A reply written after the Notes section is outside the comments: not an answer.
    _append(path, "\n### alice\n\nOutside.\n")
    assert await tracker.replies_after_question(issue, key=KEY) == []


async def test_headings_and_an_open_fence_in_the_question_do_not_break_the_section(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "Body.\n")
    question = "## Options\n### A\nPostgres\n```\nan open fence"
    assert await tracker.post_question(issue, key=KEY, body=question)
    written = path.read_text(encoding="utf-8")
    assert "\\## Options\n\\### A\nPostgres\n```\nan open fence\n```\n" in written
    _append(path, "\n### alice\n\nA.\n")

    replies = await tracker.replies_after_question(issue, key=KEY)
    assert [(r.author, r.body) for r in replies or []] == [("alice", "A.")]


async def test_a_crlf_file_keeps_its_line_endings(folder: Path, tracker: FilesTracker) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER.replace("\n", "\r\n") + "Body.\r\n")
    assert await tracker.post_question(issue, key=KEY, body="Line one\nLine two")
    raw = path.read_bytes()
    assert b"\n" not in raw.replace(b"\r\n", b"")
    _append(path, "\r\n### alice\r\n\r\nYes.\r\n")
    replies = await tracker.replies_after_question(issue, key=KEY)
    assert [r.body for r in replies or []] == ["Yes."]


async def test_an_oversized_reply_is_truncated_with_a_note(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "Body.\n")
    assert await tracker.post_question(issue, key=KEY, body=QUESTION)
    _append(path, "\n### alice\n\n" + "v" * (MAX_REPLY_CHARS + 10) + "\n")

    [reply] = await tracker.replies_after_question(issue, key=KEY) or []
    assert reply.body.startswith("v" * MAX_REPLY_CHARS)
    assert "truncated by Lorenz" in reply.body


async def test_a_removed_question_reads_as_none(folder: Path, tracker: FilesTracker) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "Body.\n")
    assert await tracker.replies_after_question(issue, key=KEY) is None
    assert await tracker.post_question(issue, key=KEY, body=QUESTION)
    _append(path, "\n### alice\n\nAn answer.\n")
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(question_marker(KEY), ""), encoding="utf-8")

    assert await tracker.replies_after_question(issue, key=KEY) is None


async def test_a_missing_or_broken_file_is_a_coded_error(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "Body.\n")
    path.write_text("no front matter any more\n", encoding="utf-8")
    with pytest.raises(TrackerError) as raised:
        await tracker.post_question(issue, key=KEY, body=QUESTION)
    assert raised.value.code == ErrorCode.FILES_MALFORMED_ISSUE

    os.unlink(path)
    for call in (
        tracker.post_question(issue, key=KEY, body=QUESTION),
        tracker.replies_after_question(issue, key=KEY),
    ):
        with pytest.raises(TrackerError) as raised:
            await call
        assert raised.value.code == ErrorCode.FILES_ISSUE_NOT_FOUND


async def test_comment_headings_take_either_separator_and_keep_odd_names_whole(
    folder: Path, tracker: FilesTracker
) -> None:
    path = folder / "demo-1.md"
    issue = await _issue(tracker, path, HEADER + "Body.\n")
    assert await tracker.post_question(issue, key=KEY, body=QUESTION)
    _append(
        path,
        "\n### erin - 2026-03-04T07:00:00+01:00\n\nOne.\n"
        "\n### Anne - the reviewer\n\nTwo.\n",
    )
    replies = await tracker.replies_after_question(issue, key=KEY) or []
    assert [(r.author, r.body) for r in replies] == [
        ("erin", "One."),
        ("Anne - the reviewer", "Two."),
    ]
    assert replies[0].created_at == datetime.datetime(2026, 3, 4, 6, 0, tzinfo=datetime.UTC)
