"""Waiting slots at run time: their questions on the tracker, and the answers that resume them.

The orchestrator keeps a slot whose agent asked in its ``waiting`` lane (a blocked entry with
``waiting`` set: no concurrency, no retry, no failure counted); this part of the runtime does
what waiting asks of the outside world, once per poll tick and right after the question:

* post the question on the issue through the tracker's
  :class:`~lorenz.trackers.questions.QuestionChannel`, once (its idempotency key is the
  block's ``action_key``, so a replay after a crash posts nothing twice), then move the issue to
  ``input.waiting_state`` and add ``input.waiting_label`` when set;
* read the replies after the question: the first one from an allowed author
  (``input.answer_authors``, else anyone but Lorenz) is the answer;
* a question past ``input.timeout_ms`` stops waiting: the slot takes the terminal action.

An answer from any channel (the tracker, ``lorenz answer``, the API, the dashboard) goes the
same way: rendered through ``input.answer_template``, handed to the orchestrator as a
:class:`~lorenz.model.questions.SessionResume`; the slot's next run, due at once, resumes the
session with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from lorenz.codes import ErrorCode
from lorenz.model import EventType, Issue, LorenzError
from lorenz.model.questions import ANSWER_TEXT_LIMIT, SessionResume
from lorenz.orchestrator.state import BlockedEntry
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reporting import describe_error
from lorenz.trackers.questions import QuestionChannel, TrackerReply
from lorenz.trackers.writes import IssueWriter
from lorenz.workflow.answers import render_answer

logger = logging.getLogger("lorenz.runtime")


class AnswerRefused(LorenzError):
    """An answer that cannot be taken: no slot of the issue waits, or the text is unusable."""

    code = ErrorCode.ISSUE_NOT_WAITING


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AnswerReceipt:
    """What an answer did: the slots it resumes."""

    identifier: str
    slot_keys: tuple[str, ...]
    session_ids: tuple[str | None, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "identifier": self.identifier,
            "slot_keys": list(self.slot_keys),
            "session_ids": list(self.session_ids),
            "resumed": True,
        }


def valid_answer(text: object) -> str:
    """``text`` as an answer, or :class:`AnswerRefused` ``answer_invalid``."""
    if not isinstance(text, str) or not text.strip():
        raise AnswerRefused("the answer is empty; give it as text", code=ErrorCode.ANSWER_INVALID)
    if len(text) > ANSWER_TEXT_LIMIT:
        raise AnswerRefused(
            f"the answer has {len(text)} characters, more than {ANSWER_TEXT_LIMIT}; shorten it",
            code=ErrorCode.ANSWER_INVALID,
        )
    return text.strip()


def first_allowed_reply(
    replies: list[TrackerReply], *, authors: tuple[str, ...] | None
) -> TrackerReply | None:
    """The first reply with a body from an allowed author (``None``: anyone may answer)."""
    allowed = None if authors is None else {a.strip().lower() for a in authors}
    for reply in replies:
        if not reply.body.strip():
            continue
        if allowed is None or reply.author.strip().lower() in allowed:
            return reply
    return None


class Questions:
    """Posts waiting slots' questions, reads their answers and resumes them."""

    def __init__(self, *, parts: RuntimeParts) -> None:
        self._parts = parts
        self._lock = asyncio.Lock()
        """NB: one pass at a time: a question's own pass and a tick's must not both post."""
        self._unposted: set[str] = set()
        """Waits already told that their tracker carries no questions (said once each)."""

    def on_waiting(self, blocked: BlockedEntry) -> None:
        """A run's end put its slot in the waiting lane: say so (the caller starts a
        :meth:`sync` pass, which posts the question)."""
        question = blocked.question
        self._parts.reporting.event(
            EventType.INPUT_REQUESTED,
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot=blocked.slot_index,
            message=f"the agent asked: {question.text if question else blocked.error}"[:500],
            reason=question.source if question is not None else "input_required",
            attempt=blocked.attempt,
        )

    async def sync(self) -> list[BlockedEntry]:
        """Post what is not posted, read the replies of what is, and end the waits past
        ``input.timeout_ms``. Returns the slots that stopped waiting (the caller reports them as
        blocked and applies their terminal action)."""
        expired: list[BlockedEntry] = []
        async with self._lock:
            for blocked in self._parts.orchestrator.waiting_slots():
                if self._parts.status.stopped:
                    break
                if self._timed_out(blocked):
                    stopped = await self._parts.orchestrator.stop_waiting(
                        blocked.key, action_key=blocked.action_key
                    )
                    if stopped is not None:
                        expired.append(stopped)
                    continue
                try:
                    await self._sync_one(blocked)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - shown, and tried again next poll
                    error = self._parts.reporting.scrub(describe_error(exc))
                    logger.warning(
                        "question sync failed issue=%s code=%s: %s",
                        blocked.identifier,
                        getattr(exc, "code", ErrorCode.QUESTION_POST_FAILED),
                        error,
                    )
            self._parts.reporting.emit_snapshot()
        return expired

    def _timed_out(self, blocked: BlockedEntry) -> bool:
        timeout_ms = self._parts.settings.input.timeout_ms
        if timeout_ms is None:
            return False
        waited = self._parts.clock.now() - blocked.blocked_at
        return waited.total_seconds() * 1000 >= timeout_ms

    async def _issue(self, blocked: BlockedEntry) -> Issue | None:
        issue = self._parts.candidates.get(blocked.issue_id)
        if issue is not None:
            return issue
        found = await self._parts.tracker.current.fetch_issues_by_ids([blocked.issue_id])
        return found[0] if found else None

    async def _sync_one(self, blocked: BlockedEntry) -> None:
        tracker = self._parts.tracker.current
        if not isinstance(tracker, QuestionChannel):
            # NB: nothing to post on; the CLI, the API and the dashboard still answer.
            if blocked.action_key not in self._unposted:
                self._unposted.add(blocked.action_key)
                logger.warning(
                    "%s: tracker.kind %s cannot carry questions; %s's question is only shown "
                    "(answer it with lorenz answer, the API or the dashboard)",
                    ErrorCode.QUESTION_CHANNEL_UNSUPPORTED,
                    self._parts.settings.tracker.kind,
                    blocked.identifier,
                )
            return
        issue = await self._issue(blocked)
        if issue is None:
            return  # gone from the tracker: the next poll releases the slot
        if not blocked.question_posted:
            await tracker.post_question(
                issue, key=blocked.action_key, body=question_body(blocked)
            )
            await self._mark_waiting(issue)
            await self._parts.orchestrator.record_question_posted(
                blocked.key, action_key=blocked.action_key
            )
            return
        replies = await tracker.replies_after_question(issue, key=blocked.action_key)
        if replies is None:
            # NB: the question comment is gone (deleted by someone): post it again, so that
            # there is something to reply to (idempotent by its key, like the first time).
            await tracker.post_question(
                issue, key=blocked.action_key, body=question_body(blocked)
            )
            return
        if not replies:
            return
        reply = first_allowed_reply(replies, authors=self._parts.settings.input.answer_authors)
        if reply is None:
            return
        await self.resume(blocked, issue=issue, text=reply.body, source="tracker")

    async def _mark_waiting(self, issue: Issue) -> None:
        settings = self._parts.settings.input
        if settings.waiting_state is None and settings.waiting_label is None:
            return
        tracker = self._parts.tracker.current
        if not isinstance(tracker, IssueWriter):
            logger.warning(
                "tracker.kind %s cannot set input.waiting_state or input.waiting_label",
                self._parts.settings.tracker.kind,
            )
            return
        if settings.waiting_label is not None:
            await tracker.escalate_issue(
                issue, key="lorenz-waiting", comment=None, label=settings.waiting_label
            )
        if settings.waiting_state is not None and issue.state_key != (
            settings.waiting_state.strip().lower()
        ):
            await tracker.move_issue_to_state(issue, state=settings.waiting_state)

    async def answer(self, identifier: str, *, text: object, source: str) -> AnswerReceipt:
        """Answer every waiting slot of the issue ``identifier`` (or issue id) with ``text``.

        Raises :class:`AnswerRefused` (``issue_not_waiting``, ``answer_invalid``) or the
        template's ``template_render_error``; nothing changes then.
        """
        answer = valid_answer(text)
        chosen = [
            blocked
            for blocked in self._parts.orchestrator.waiting_slots()
            if identifier in (blocked.identifier, blocked.issue_id)
        ]
        if not chosen:
            raise AnswerRefused(
                f"no slot of {identifier[:100]!r} waits for an answer; see the waiting lane "
                "(lorenz status)",
            )
        async with self._lock:
            resumed: list[SessionResume] = []
            keys: list[str] = []
            for blocked in chosen:
                issue = self._parts.candidates.get(blocked.issue_id) or _stand_in(blocked)
                done = await self.resume(blocked, issue=issue, text=answer, source=source)
                if done is not None:
                    resumed.append(done)
                    keys.append(blocked.key)
        if not resumed:
            raise AnswerRefused(f"{identifier[:100]!r} was answered meanwhile")
        return AnswerReceipt(
            identifier=chosen[0].identifier,
            slot_keys=tuple(keys),
            session_ids=tuple(r.session_id for r in resumed),
        )

    async def resume(
        self, blocked: BlockedEntry, *, issue: Issue, text: str, source: str
    ) -> SessionResume | None:
        """Hand the orchestrator the rendered answer; ``None`` when that wait was over."""
        question = blocked.question
        assert question is not None
        rendered = render_answer(
            self._parts.settings.input.answer_template,
            answer=text,
            question=question.text,
            issue=issue,
        )
        resume = SessionResume(
            session_id=question.session_id, answer=text, text=rendered, question=question
        )
        retry = await self._parts.orchestrator.answer(
            blocked.key, action_key=blocked.action_key, resume=resume
        )
        if retry is None:
            return None
        waited = self._parts.clock.now() - blocked.blocked_at
        self._parts.reporting.event(
            EventType.INPUT_ANSWERED,
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot=blocked.slot_index,
            message=f"answered ({source}); resuming session {question.session_id or '(new)'}",
            reason=source,
            duration_ms=max(waited.total_seconds() * 1000, 0.0),
        )
        if not self._parts.status.stopped:
            self._parts.timers.sync(self._parts.orchestrator.retry_deadlines())
        return resume


def question_body(blocked: BlockedEntry) -> str:
    """The comment a question is posted as (the tracker adds the idempotency marker)."""
    question = blocked.question
    text = question.text if question is not None else (blocked.error or "")
    lines = [
        f"**The agent working on {blocked.identifier} has a question** and waits for your "
        "answer:",
        "",
        *(f"> {line}" for line in text.splitlines() or [text]),
    ]
    if question is not None and question.options:
        lines += ["", "Options: " + " · ".join(f"`{option}`" for option in question.options)]
    lines += [
        "",
        "Reply to this comment: the first reply resumes the agent where it stopped (or use "
        f"`lorenz answer WORKFLOW.md {blocked.identifier} --text ...`).",
    ]
    return "\n".join(lines)


def _stand_in(blocked: BlockedEntry) -> Issue:
    """The issue as far as the waiting slot knows it (the answer template's ``issue``)."""
    return Issue(id=blocked.issue_id, identifier=blocked.identifier, title="", state="")
