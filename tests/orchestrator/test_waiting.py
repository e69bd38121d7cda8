"""The waiting lane in the orchestrator: a run that ends with a question waits (no failure, no
retry, no claim), its checkpoint form reads back (and a checkpoint from before questions reads
as before), an answer turns it into a due retry whose next run resumes the session, and the
timeout turns it into a blocked slot with the terminal action."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

from lorenz.codes import ErrorCode
from lorenz.config import TerminalAction
from lorenz.model import BlockReason, ClaimPhase, RetryKind, SlotKey
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.orchestrator import Checkpoint
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import EPOCH, issue, make, settings
from tests.orchestrator.test_checkpoints import STORED

QUESTION = AgentQuestion(
    text="Which database?", options=("Redis", "Postgres"), session_id="thr-1", turn=2,
    source="item/tool/requestUserInput",
)

WAITING: dict[str, Any] = copy.deepcopy(STORED)
WAITING["blocked"][0].update(
    {"question": QUESTION.to_json(), "waiting": True, "question_posted": True}
)
WAITING["resumes"] = [
    {
        "slot_key": "i4#0",
        **SessionResume(
            session_id="thr-4", answer="Redis", text="The answer: Redis", question=QUESTION
        ).to_json(),
    }
]


def test_a_waiting_slot_and_a_resume_read_back_identical() -> None:
    checkpoint, problems = Checkpoint.from_json(WAITING)
    assert problems == ()
    (blocked,) = checkpoint.blocked
    assert blocked.waiting
    assert blocked.question_posted
    assert blocked.question == QUESTION
    assert checkpoint.resumes[SlotKey("i4#0")].session_id == "thr-4"
    assert checkpoint.to_json() == WAITING


def test_a_checkpoint_from_before_questions_reads_as_before() -> None:
    checkpoint, problems = Checkpoint.from_json(STORED)
    assert problems == ()
    (blocked,) = checkpoint.blocked
    assert (blocked.waiting, blocked.question) == (False, None)
    assert checkpoint.resumes == {}
    assert checkpoint.to_json() == STORED


def test_unreadable_questions_and_resumes_are_left_out_and_reported() -> None:
    document = copy.deepcopy(WAITING)
    document["blocked"][0]["question"] = {"text": 3}
    document["resumes"] = [{"slot_key": "i4#0", "answer": "x"}, "junk"]
    checkpoint, problems = Checkpoint.from_json(document)
    assert checkpoint.blocked == ()
    assert checkpoint.resumes == {}
    assert len(problems) == 2


async def test_a_question_waits_and_an_answer_resumes_without_counting_a_failure() -> None:
    orchestrator, store, _ = make(config=settings())
    subject = issue(1)
    key = SlotKey("i1#0")
    await run(orchestrator, subject)
    finished = await orchestrator.finish(
        key, normal=False, error="asked", failure_code=ErrorCode.INPUT_REQUIRED,
        question=QUESTION,
    )
    assert finished is not None
    blocked = finished.blocked
    assert blocked is not None
    assert blocked.waiting
    assert blocked.action is TerminalAction.BLOCK
    assert orchestrator.waiting_slots() == (blocked,)
    state = orchestrator.state
    assert key not in state.claimed
    assert key not in state.retry_attempts
    assert key not in state.failure_streaks
    assert store.claims[key].phase is ClaimPhase.RETRY_PENDING
    # A refresh does not end the wait; a change of the issue neither.
    assert await orchestrator.unblock() == ()
    changed = dataclasses.replace(subject, updated_at=EPOCH + datetime.timedelta(hours=1))
    await orchestrator.eligible_issues([changed])
    assert orchestrator.waiting_slots() == (blocked,)

    resume = SessionResume(session_id="thr-1", answer="Redis", text="A: Redis", question=QUESTION)
    assert await orchestrator.answer(key, action_key="other", resume=resume) is None
    retry = await orchestrator.answer(key, action_key=blocked.action_key, resume=resume)
    assert retry is not None
    assert retry.kind is RetryKind.CONTINUATION
    assert orchestrator.waiting_slots() == ()
    assert orchestrator.session_resume(key) == resume
    saved = (await store.load()).checkpoint
    assert saved is not None
    assert saved["resumes"][0]["session_id"] == "thr-1"
    # The resumed run ends: the resume is spent.
    await run(orchestrator, subject)
    await orchestrator.finish(key, normal=True)
    assert orchestrator.session_resume(key) is None


async def test_the_timeout_turns_a_waiting_slot_into_a_blocked_one() -> None:
    orchestrator, _, clock = make(
        config=settings(retry={"terminal_action": "cancel", "cancel_state": "X"})
    )
    key = SlotKey("i1#0")
    await run(orchestrator, issue(1))
    finished = await orchestrator.finish(
        key, normal=False, error="asked", failure_code=ErrorCode.INPUT_REQUIRED,
        question=QUESTION,
    )
    assert finished is not None
    assert finished.blocked is not None
    asked_key = finished.blocked.action_key
    clock.advance(60.0)
    stopped = await orchestrator.stop_waiting(key, action_key=asked_key)
    assert stopped is not None
    assert not stopped.waiting
    assert stopped.reason is BlockReason.INPUT_REQUIRED
    assert stopped.action is TerminalAction.BLOCK  # cancel counts as block for a question
    assert stopped.action_key != asked_key
    assert orchestrator.waiting_slots() == ()
    assert orchestrator.snapshot().blocked[0].identifier == stopped.identifier
