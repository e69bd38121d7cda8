"""An in-process tracker (``tracker.kind: memory``) for tests and benchmarks.

The scheduling core must be exercised against something that behaves like a tracker — states
that move, issues that vanish, requests that fail for a while — without a network or files.
This one keeps issues in a dict the test owns, counts every call so a test can assert that an
empty refresh made no request, and can be told to fail its next requests.

It also carries questions (:mod:`lorenz.trackers.questions`): each issue has a list of
comments; Lorenz's are written by :data:`MEMORY_OWN_AUTHOR`, a test adds a person's reply with
:meth:`MemoryTracker.add_comment`.

Several :class:`MemoryTracker` objects may share one board: :meth:`MemoryTracker.with_settings`
gives a reconfigured tracker (new active states after a reload) over the same issues, counters
and injected failures, which is what a hot reload of a memory-backed workflow needs.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers.base import TrackerError, tracker_settings_of
from lorenz.trackers.questions import (
    ReadComment,
    TrackerReply,
    has_question_marker,
    question_comment,
    replies_after,
)

FETCH_CANDIDATES = "fetch_candidate_issues"
FETCH_BY_IDS = "fetch_issues_by_ids"
FETCH_BY_STATES = "fetch_issues_by_states"
POST_QUESTION = "post_question"
READ_REPLIES = "replies_after_question"
METHODS = (FETCH_CANDIDATES, FETCH_BY_IDS, FETCH_BY_STATES, POST_QUESTION, READ_REPLIES)
MEMORY_OWN_AUTHOR = "lorenz"
"""The author of the comments this tracker posts (its "token's own user")."""


def injected_failure() -> TrackerError:
    """The default error :meth:`MemoryTracker.fail_next` raises: a retryable request failure."""
    return TrackerError(
        "injected failure from the memory tracker; it clears by itself",
        code=ErrorCode.TRACKER_REQUEST,
        retryable=True,
    )


@dataclasses.dataclass(slots=True)
class _PendingFailure:
    error: BaseException
    methods: frozenset[str] | None


class _Board:
    """What every view of one memory tracker shares."""

    def __init__(self, issues: Iterable[Issue]) -> None:
        self.issues: dict[str, Issue] = {}
        for issue in issues:
            if issue.id in self.issues:
                raise ValueError(f"duplicate issue id {issue.id!r}")
            self.issues[issue.id] = issue
        self.calls: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.failures: collections.deque[_PendingFailure] = collections.deque()
        self.close_count = 0
        self.comments: dict[str, list[ReadComment]] = {}
        """Comments per issue id, oldest first."""
        self.comment_ids = itertools.count(1)
        self.last_comment_at = datetime.datetime.min.replace(tzinfo=datetime.UTC)

    def comment(self, issue_id: str, *, author: str, body: str) -> ReadComment:
        """Append a comment (times strictly increase, so order never ties)."""
        now = datetime.datetime.now(datetime.UTC)
        if now <= self.last_comment_at:
            now = self.last_comment_at + datetime.timedelta(microseconds=1)
        self.last_comment_at = now
        comment = ReadComment(
            comment_id=f"comment-{next(self.comment_ids)}",
            body=body,
            author=author,
            author_id=author,
            created_at=now,
        )
        self.comments.setdefault(issue_id, []).append(comment)
        return comment


class MemoryTracker:
    """Issues in a dict; every read filters it like a real tracker would."""

    def __init__(
        self,
        issues: Iterable[Issue] = (),
        *,
        settings: WorkflowSettings | TrackerSettings | None = None,
        _board: _Board | None = None,
    ) -> None:
        self._board = _board if _board is not None else _Board(issues)
        self._settings = (
            tracker_settings_of(settings) if settings is not None else TrackerSettings()
        )

    # -- configuration ------------------------------------------------------------------------

    @property
    def settings(self) -> TrackerSettings:
        return self._settings

    def with_settings(self, settings: WorkflowSettings | TrackerSettings) -> MemoryTracker:
        """A tracker over the same board (issues, counters, failures) with new settings."""
        return MemoryTracker(settings=settings, _board=self._board)

    # -- what tests do to the board -----------------------------------------------------------

    @property
    def issues(self) -> list[Issue]:
        """Every issue on the board, in insertion order."""
        return list(self._board.issues.values())

    def get(self, issue_id: str) -> Issue | None:
        return self._board.issues.get(issue_id)

    def add(self, *issues: Issue) -> None:
        """Add new issues; an id already on the board is an error (use :meth:`put`)."""
        for issue in issues:
            if issue.id in self._board.issues:
                raise ValueError(f"issue {issue.id!r} is already on the board; use put()")
            self._board.issues[issue.id] = issue

    def put(self, issue: Issue) -> None:
        """Add or replace an issue (a replaced one keeps its position)."""
        self._board.issues[issue.id] = issue

    def update(self, issue_id: str, **changes: Any) -> Issue:
        """Replace some fields of an issue (``state=``, ``labels=``, ``blocked_by=``, ...)."""
        issue = self._require(issue_id)
        updated = dataclasses.replace(issue, **changes)
        self._board.issues[issue_id] = updated
        return updated

    def set_state(self, issue_id: str, state: str) -> Issue:
        """Move an issue to another state (as a human or an agent would)."""
        return self.update(issue_id, state=state)

    def remove(self, issue_id: str) -> None:
        """Make an issue invisible (deleted, moved out of the project)."""
        self._require(issue_id)
        del self._board.issues[issue_id]

    def add_comment(self, issue_id: str, *, author: str, body: str) -> str:
        """A comment by ``author`` (a person's reply); returns its id."""
        self._require(issue_id)
        return self._board.comment(issue_id, author=author, body=body).comment_id

    def comments_on(self, issue_id: str) -> list[TrackerReply]:
        """Every comment on an issue, oldest first, Lorenz's included."""
        return [
            TrackerReply(
                author=c.author, body=c.body, created_at=c.created_at, comment_id=c.comment_id
            )
            for c in self._board.comments.get(issue_id, [])
        ]

    def delete_comment(self, issue_id: str, comment_id: str) -> None:
        """Remove one comment (a person deleting the question, say)."""
        comments = self._board.comments.get(issue_id, [])
        self._board.comments[issue_id] = [c for c in comments if c.comment_id != comment_id]

    def fail_next(
        self,
        n: int = 1,
        error: BaseException | None = None,
        *,
        methods: Iterable[str] | None = None,
    ) -> None:
        """Make the next ``n`` requests fail with ``error`` (default: a retryable
        ``tracker_request``). With ``methods``, only requests of those methods fail; the others
        go through and do not use up the failures."""
        if n < 0:
            raise ValueError("n must not be negative")
        only = frozenset(methods) if methods is not None else None
        if only is not None and not only <= set(METHODS):
            raise ValueError(f"unknown methods {sorted(only - set(METHODS))}; known: {METHODS}")
        for _ in range(n):
            self._board.failures.append(
                _PendingFailure(
                    error=error if error is not None else injected_failure(), methods=only
                )
            )

    @property
    def calls(self) -> collections.Counter[str]:
        """Every invocation per method name, including ``[]`` short-circuits."""
        return self._board.calls

    @property
    def requests(self) -> collections.Counter[str]:
        """Invocations that would have reached a remote API (``[]`` inputs do not)."""
        return self._board.requests

    @property
    def close_count(self) -> int:
        return self._board.close_count

    def reset_counters(self) -> None:
        self._board.calls.clear()
        self._board.requests.clear()

    # -- the TrackerClient protocol -----------------------------------------------------------

    async def fetch_candidate_issues(self) -> list[Issue]:
        self._board.calls[FETCH_CANDIDATES] += 1
        return self._select_by_states(FETCH_CANDIDATES, self._settings.active_states)

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        self._board.calls[FETCH_BY_STATES] += 1
        if not states:
            return []
        return self._select_by_states(FETCH_BY_STATES, states)

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        self._board.calls[FETCH_BY_IDS] += 1
        if not ids:
            return []
        self._request(FETCH_BY_IDS)
        wanted = dict.fromkeys(ids)
        board = self._board.issues
        live = _LiveBlockers(board)
        return [live.refresh(board[i]) for i in wanted if i in board]

    async def close(self) -> None:
        # NB: closing does not disable the board: a reload closes the old view while the new
        # view (same board) keeps serving.
        self._board.close_count += 1

    # -- questions (lorenz.trackers.questions) -------------------------------------------------

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """A comment by :data:`MEMORY_OWN_AUTHOR` carrying ``key``'s marker, once."""
        self._board.calls[POST_QUESTION] += 1
        self._request(POST_QUESTION)
        self._known(issue)
        comments = self._board.comments.get(issue.id, [])
        if any(has_question_marker(c.body, key=key) for c in comments):
            return False
        self._board.comment(
            issue.id, author=MEMORY_OWN_AUTHOR, body=question_comment(body, key=key)
        )
        return True

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """Comments after the question, without Lorenz's (see
        :func:`~lorenz.trackers.questions.replies_after`)."""
        self._board.calls[READ_REPLIES] += 1
        self._request(READ_REPLIES)
        self._known(issue)
        return replies_after(
            self._board.comments.get(issue.id, []), key=key, own_ids=[MEMORY_OWN_AUTHOR]
        )

    # -- internals ----------------------------------------------------------------------------

    def _known(self, issue: Issue) -> None:
        if issue.id not in self._board.issues:
            raise TrackerError(
                f"issue {issue.identifier} is not on the memory tracker board; it was removed",
                code=ErrorCode.TRACKER_REQUEST,
            )

    def _require(self, issue_id: str) -> Issue:
        try:
            return self._board.issues[issue_id]
        except KeyError:
            raise KeyError(f"no issue {issue_id!r} on the memory tracker board") from None

    def _request(self, method: str) -> None:
        self._board.requests[method] += 1
        failures = self._board.failures
        for index, pending in enumerate(failures):
            if pending.methods is None or method in pending.methods:
                del failures[index]
                raise pending.error

    def _select_by_states(self, method: str, states: Iterable[str]) -> list[Issue]:
        self._request(method)
        keys = {normalize_state(s) for s in states}
        live = _LiveBlockers(self._board.issues)
        return [
            live.refresh(issue) for issue in self._board.issues.values() if issue.state_key in keys
        ]


class _LiveBlockers:
    """Blockers that are on the board report the board's current state (one read's worth)."""

    def __init__(self, board: dict[str, Issue]) -> None:
        self._board = board
        self._by_identifier: dict[str, Issue] | None = None

    def refresh(self, issue: Issue) -> Issue:
        if not issue.blocked_by:
            return issue
        refreshed: list[BlockerRef] = []
        for blocker in issue.blocked_by:
            found = self._board.get(blocker.id) if blocker.id else None
            if found is None and blocker.identifier:
                if self._by_identifier is None:
                    self._by_identifier = {i.identifier: i for i in self._board.values()}
                found = self._by_identifier.get(blocker.identifier)
            if found is None:
                refreshed.append(blocker)
            else:
                refreshed.append(
                    BlockerRef(id=found.id, identifier=found.identifier, state=found.state)
                )
        return dataclasses.replace(issue, blocked_by=tuple(refreshed))
