"""A waiting slot in the operator's claim store, against the real API server: its Claim shows
``WaitingForInput`` with the question (bounded), the slot holds no concurrency, the wait (the
question, the session, the workspace) survives a change of leader, an answer turns the Claim
back into a due ``RetryPending``, and the checkpoint's merge patch drops ``resumes`` and
``blocked`` once they are spent (a JSON merge patch keeps what it does not name)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from lorenz.codes import ErrorCode
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import QUESTION_STATUS_LIMIT
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.errors import KubeApiError
from lorenz.model import ManualClock, SlotKey
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.orchestrator import DispatchCandidate, Orchestrator, Started
from tests.kube.test_claims import NOW, Leadership, claim_object, store_for, workflow
from tests.orchestrator.factories import issue, settings

pytestmark = pytest.mark.cluster

__all__ = ["workflow"]  # NB: the fixture, shared with test_claims


@pytest.fixture(autouse=True)
async def _claims_served(kube_api: KubeApi, workflow: WorkflowRef) -> None:
    """Wait until the API server serves Claims: right after the CRD is Established, its
    storage may still be initializing (429 "storage is (re)initializing") on a loaded host."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            await kube_api.list_items(claims_path(workflow.namespace))
        except KubeApiError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
        else:
            return

QUESTION = AgentQuestion(
    text="Which database should the cache use?", options=("Redis", "Postgres"),
    session_id="thr-1", turn=2, source="item/tool/requestUserInput",
)
KEY = SlotKey("i1#0")


async def start(orchestrator: Orchestrator, n: int) -> Started:
    subject = issue(n)
    key = SlotKey(f"i{n}#0")
    retry = orchestrator.state.retry_attempts.get(key)
    result = await orchestrator.claim(DispatchCandidate(subject, 0, key, retry))
    assert isinstance(result, Started), result
    return result


async def stored_checkpoint(api: KubeApi, workflow: WorkflowRef) -> dict[str, object]:
    obj = await api.get(workflows_path(workflow.namespace, workflow.name))
    checkpoint = (obj.get("status") or {}).get("checkpoint")
    assert isinstance(checkpoint, dict)
    return checkpoint


async def test_a_waiting_claim_shows_its_question_survives_failover_and_resumes_on_answer(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    config = settings(agent={"max_concurrent_agents": 1})
    clock = ManualClock(wall=NOW)
    old = Orchestrator(
        settings=config, store=store_for(kube_api, workflow, "old", Leadership("old")),
        clock=clock,
    )
    await old.hydrate()
    started = await start(old, 1)
    assert KEY in old.state.claimed
    started.entry.workspace_path = "/work/wf/i1"
    finished = await old.finish(
        KEY, normal=False, error="asked", failure_code=ErrorCode.INPUT_REQUIRED,
        question=QUESTION,
    )
    assert finished is not None
    assert finished.blocked is not None
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert status["phase"] == "WaitingForInput"
    assert status["question"] == {
        "text": QUESTION.text, "options": ["Redis", "Postgres"], "sessionId": "thr-1",
        "askedAt": status["question"]["askedAt"], "posted": False,
    }
    assert status.get("retryIn") is None
    # It holds no concurrency: the one slot runs another issue meanwhile.
    await start(old, 2)
    await old.finish(SlotKey("i2#0"), normal=True)
    await old.release_retry(SlotKey("i2#0"))

    # A new leader finds the same wait: question, session, workspace.
    new_store = store_for(kube_api, workflow, "new", Leadership("new"))
    new = Orchestrator(settings=config, store=new_store, clock=clock)
    await new.hydrate()
    (waiting,) = new.waiting_slots()
    assert waiting.question == QUESTION
    assert waiting.workspace_path == "/work/wf/i1"
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert (status["owner"], status["phase"]) == ("new", "WaitingForInput")
    assert status["question"]["sessionId"] == "thr-1"

    resume = SessionResume(session_id="thr-1", answer="Redis", text="A: Redis", question=QUESTION)
    assert await new.answer(KEY, action_key=waiting.action_key, resume=resume) is not None
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert (status["phase"], status.get("question")) == ("RetryPending", None)
    checkpoint = await stored_checkpoint(kube_api, workflow)
    assert checkpoint["resumes"][0]["sessionId"] == "thr-1"  # type: ignore[index]
    assert "blocked" not in checkpoint

    # The resumed run ends: its resume is spent, and gone from the Workflow's status too.
    await start(new, 1)
    assert new.session_resume(KEY) == resume
    await new.finish(KEY, normal=True)
    checkpoint = await stored_checkpoint(kube_api, workflow)
    assert "resumes" not in checkpoint
    third = Orchestrator(
        settings=config, store=store_for(kube_api, workflow, "third", Leadership("third")),
        clock=clock,
    )
    await third.hydrate()
    assert third.session_resume(KEY) is None
    assert third.waiting_slots() == ()


async def test_a_long_question_is_cut_in_the_claim(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    clock = ManualClock(wall=NOW)
    orchestrator = Orchestrator(
        settings=settings(), store=store_for(kube_api, workflow, "a", Leadership("a")),
        clock=clock,
    )
    await orchestrator.hydrate()
    await start(orchestrator, 1)
    long = dataclasses.replace(
        QUESTION, text="why " * 3000, options=tuple("x" * 500 for _ in range(30))
    )
    await orchestrator.finish(
        KEY, normal=False, error="asked", failure_code=ErrorCode.INPUT_REQUIRED, question=long
    )
    question = (await claim_object(kube_api, workflow, KEY))["status"]["question"]
    assert len(question["text"]) == QUESTION_STATUS_LIMIT
    assert question["text"].endswith("…")
    assert len(question["options"]) == 20
    assert {len(option) for option in question["options"]} == {200}
