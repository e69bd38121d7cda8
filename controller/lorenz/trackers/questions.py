"""The tracker side of ask, answer, resume: an agent's question posted once, replies read back.

When an agent asks for input, the runtime posts the question to the issue as a comment and
later reads the comments that came after it; the first reply from someone other than Lorenz is
the answer. Both calls may be replayed (a crash between posting and recording the receipt), so
the question comment carries an invisible marker with an idempotency key, exactly like an
escalation (:mod:`lorenz.trackers.writes`): the adapter looks for the marker before posting, and
finds the question again by it when reading replies.

Lorenz's own comments never count as an answer: a comment that carries any Lorenz marker (a
question, an escalation) is skipped, and so is any comment by the user the tracker's token
belongs to, where the tracker can tell (Linear ``viewer``, GitHub and GitLab ``GET /user``, Jira
``GET /myself``). NB: with a personal token, that user is the person too; their replies on the
tracker are skipped, so they answer with ``lorenz answer`` (or Lorenz gets a token of its own).

Everything read is bounded: comment pages (:data:`~lorenz.trackers.writes.MAX_COMMENT_PAGES`),
replies per call (:data:`MAX_REPLIES`) and the length of each reply (:data:`MAX_REPLY_CHARS`,
truncated with a note). A question further back than the pages read counts as not found.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from lorenz.model import Issue
from lorenz.trackers.payloads import nonblank

QUESTION_MARKER = "<!-- lorenz-question: {key} -->"
"""The invisible marker a question comment carries (``{key}``: the idempotency key)."""

LORENZ_MARKER_RE = re.compile(r"<!-- lorenz-[a-z][a-z-]{0,30}: [^<>\s]{1,128} -->")
"""Any marker Lorenz puts in what it writes (questions, escalations)."""

MAX_REPLIES = 50
"""Replies returned per call at most (the oldest ones: the first answer is what counts)."""

MAX_REPLY_CHARS = 16_000
"""A reply's body is cut to this many characters, with :func:`truncation_note` appended."""

MAX_QUESTION_CHARS = 60_000
"""A question's body is cut to this many characters before posting (trackers cap comments:
GitHub at 65,536 characters, Jira at 32,767 in ADF text)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrackerReply:
    """One comment posted after a question, as the tracker gave it."""

    author: str
    """Who wrote it: Linear e-mail (else display name), GitHub login, GitLab username, Jira
    e-mail address (else account id), the files tracker's heading name, memory's author."""
    body: str
    """The comment's text (Markdown; Jira's ADF rendered to text), at most
    :data:`MAX_REPLY_CHARS` plus a truncation note."""
    created_at: datetime.datetime
    """When the tracker says it was posted (timezone-aware)."""
    comment_id: str
    """The tracker's id of the comment (the files tracker: its position in the file)."""


@runtime_checkable
class QuestionChannel(Protocol):
    """A tracker that can carry an agent's question and bring back the replies."""

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """Post ``body`` as a comment marked with ``key``, unless a comment with that marker is
        already there. ``True`` when it posted."""
        ...

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The comments after the one marked with ``key``, oldest first, without Lorenz's own;
        ``None`` when no comment carries the marker (deleted, or never posted)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReadComment:
    """A comment as an adapter read it, before the question is looked for."""

    comment_id: str
    body: str
    author: str
    """What :attr:`TrackerReply.author` will say."""
    author_id: str | None
    """What identifies the author against the token's own user (``None``: unknown)."""
    created_at: datetime.datetime


def question_marker(key: str) -> str:
    """The invisible marker of the question with idempotency key ``key``."""
    return QUESTION_MARKER.format(key=key)


def question_comment(body: str, *, key: str) -> str:
    """``body`` as posted: the marker first, then the (bounded) text."""
    return f"{question_marker(key)}\n{bounded_question(body)}"


def bounded_question(body: str) -> str:
    """``body`` cut to :data:`MAX_QUESTION_CHARS` (with a note) so every tracker accepts it."""
    if len(body) <= MAX_QUESTION_CHARS:
        return body
    return body[:MAX_QUESTION_CHARS] + "\n\n[the question was cut by Lorenz: too long]"


def has_question_marker(text: str | None, *, key: str) -> bool:
    """Whether ``text`` carries the marker of the question ``key``."""
    return bool(text) and question_marker(key) in (text or "")


def is_lorenz_comment(text: str | None) -> bool:
    """Whether ``text`` carries any Lorenz marker (so Lorenz wrote it)."""
    return bool(text) and LORENZ_MARKER_RE.search(text or "") is not None


def truncation_note(total: int) -> str:
    """What replaces the rest of a reply longer than :data:`MAX_REPLY_CHARS`."""
    return (
        f"\n\n[truncated by Lorenz: the reply has {total} characters, the first "
        f"{MAX_REPLY_CHARS} are shown; read the rest on the tracker]"
    )


def bounded_reply(body: str) -> str:
    """``body`` cut to :data:`MAX_REPLY_CHARS` with a :func:`truncation_note`."""
    if len(body) <= MAX_REPLY_CHARS:
        return body
    return body[:MAX_REPLY_CHARS] + truncation_note(len(body))


def read_rest_comment(item: Any, *, author_key: str, name_key: str) -> ReadComment | None:
    """A comment of a REST listing (GitHub's issue comment, GitLab's note) as a
    :class:`ReadComment`; ``None`` when it has no id, no readable ``created_at`` or no string
    ``body``.

    Both trackers write a comment as ``{id, body, created_at, <author_key>: {<name_key>: …}}``
    and name its author by that login or username, so they read it here alike.
    """
    if not isinstance(item, Mapping):
        return None
    comment_id = item.get("id")
    created_at = parse_comment_time(item.get("created_at"))
    body = item.get("body")
    if comment_id is None or created_at is None or not isinstance(body, str):
        return None
    author = item.get(author_key)
    name = nonblank(author.get(name_key)) if isinstance(author, Mapping) else None
    return ReadComment(
        comment_id=str(comment_id),
        body=body,
        author=name or "",
        author_id=name,
        created_at=created_at,
    )


def replies_after(
    comments: Iterable[ReadComment],
    *,
    key: str,
    own_ids: Iterable[str] = (),
    by_time: bool = True,
) -> list[TrackerReply] | None:
    """The replies after the question ``key`` among ``comments`` (as listed, oldest first).

    The comments are put in time order (stable, so a tie keeps the listed order); the first
    comment carrying the marker is the question (a second one, left by a replay, is Lorenz's
    own and skipped like any other); what follows it, minus Lorenz's own comments (any Lorenz
    marker, or an author in ``own_ids``, compared case-insensitively), are the replies, at most
    :data:`MAX_REPLIES`. ``by_time=False`` keeps the listed order as it is (the files tracker,
    where the order in the file is what a person meant and times may be missing).
    """
    if by_time:
        ordered = sorted(comments, key=lambda comment: comment.created_at)
    else:
        ordered = list(comments)
    found = next(
        (i for i, comment in enumerate(ordered) if has_question_marker(comment.body, key=key)),
        None,
    )
    if found is None:
        return None
    own = {value.casefold() for value in own_ids if value}
    replies: list[TrackerReply] = []
    for comment in ordered[found + 1 :]:
        if is_lorenz_comment(comment.body):
            continue
        if comment.author_id is not None and comment.author_id.casefold() in own:
            continue
        replies.append(
            TrackerReply(
                author=comment.author,
                body=bounded_reply(comment.body),
                created_at=comment.created_at,
                comment_id=comment.comment_id,
            )
        )
        if len(replies) >= MAX_REPLIES:
            break
    return replies


def parse_comment_time(value: object) -> datetime.datetime | None:
    """An ISO 8601 time as trackers write it (``Z``, offsets, Jira's ``+0000``); naive → UTC."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    elif re.search(r"[+-]\d{4}$", text):
        text = f"{text[:-2]}:{text[-2:]}"
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment
