"""Ask and resume with each protocol's scripted agent: the question is captured with its session
and turn, the run ends with ``AgentAsked`` (``input_required``), and a run with the answer
continues the same session (Codex ``thread/resume``, Claude Code ``--resume``, ACP
``session/load``), or starts a new one told what was asked when the session cannot be resumed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import AgentAsked, AgentRunRequest
from lorenz.agents.acp import AcpRunner
from lorenz.agents.claude import ClaudeStreamRunner
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.config import ApprovalMode
from lorenz.model.questions import AgentQuestion, SessionResume, new_session_summary
from tests.agents.conftest import FakeCodexFactory, RunKit, assert_gone, base_env
from tests.agents.test_acp import Harness as AcpHarness
from tests.agents.test_acp import _jsonl
from tests.agents.test_claude import Harness as ClaudeHarness
from tests.agents.test_codex import agent_pids

FAST = CodexAppServerRunner(overload_initial_delay_s=0.01, overload_max_delay_s=0.05)

USER_INPUT = {
    "request": "item/tool/requestUserInput",
    "params": {
        "questions": [
            {
                "id": "q1",
                "header": "Database",
                "question": "Which database should the cache use?",
                "options": [
                    {"label": "Redis", "description": "in memory"},
                    {"label": "Postgres", "description": "durable"},
                ],
            }
        ]
    },
}


def answered(question: AgentQuestion, text: str = "Use Postgres.") -> SessionResume:
    return SessionResume(
        session_id=question.session_id,
        answer=text,
        text=f"The answer to your question: {text}",
        question=question,
    )


def with_answer(request: AgentRunRequest, resume: SessionResume) -> AgentRunRequest:
    return dataclasses.replace(request, answer=resume)


# -- Codex app-server ---------------------------------------------------------------------------


async def test_codex_question_is_captured_and_the_answer_resumes_the_thread(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex(
        thread_id="thr-ask",
        turns=[{"steps": [USER_INPUT, {"hang": True}]}],
        resumed_turns=[{"steps": [{"agent_message": "using Postgres"}]}],
    )
    with pytest.raises(AgentAsked) as caught:
        await FAST.run(kit.request(command=script.command, turn_timeout_ms=120_000))
    question = caught.value.question
    assert caught.value.code == "input_required"
    assert question.text == "Database — Which database should the cache use?"
    assert question.options == ("Redis", "Postgres")
    assert (question.session_id, question.turn) == ("thr-ask", 1)
    assert question.source == "item/tool/requestUserInput"
    assert [u.payload for u in kit.recorder.of("agent_question")] == [
        {"question": question.to_json()}
    ]
    # The request was answered (the turn does not stall) and the agent is gone.
    assert "item/tool/requestUserInput" in script.answers()
    assert_gone(agent_pids(kit))

    resumed = fake_codex(
        thread_id="thr-other",
        resumed_turns=[{"steps": [{"agent_message": "using Postgres"}]}],
    )
    result = await FAST.run(
        with_answer(kit.request(command=resumed.command), answered(question))
    )
    assert result.turns == 1
    records = resumed.records()
    assert {"resume": "thr-ask"} in records
    assert not [r for r in resumed.received() if r.get("method") == "thread/start"]
    turns = [r for r in records if "turn" in r and "text" in r]
    assert turns == [
        {"turn": 1, "text": "The answer to your question: Use Postgres."}
    ]


async def test_codex_thread_that_cannot_be_resumed_starts_a_new_one_told_the_question(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    question = AgentQuestion(text="Which port?", options=("80", "8080"), session_id="thr-gone")
    script = fake_codex(thread_resume={"error": "no rollout found for thread thr-gone"})
    resume = answered(question, "8080")
    await FAST.run(with_answer(kit.request(command=script.command), resume))
    records = script.records()
    assert {"resume": "thr-gone"} in records
    assert [r for r in script.received() if r.get("method") == "thread/start"]
    (turn,) = [r for r in records if "turn" in r and "text" in r]
    assert turn["text"] == new_session_summary(resume)
    assert "Which port?" in turn["text"]
    assert "8080" in turn["text"]
    assert "thread_resume_refused" in kit.recorder.events()


async def test_codex_approvals_ask_turns_an_approval_into_a_question(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    approval = {
        "request": "item/commandExecution/requestApproval",
        "params": {"reason": "needs network", "command": "curl example.com", "cwd": "/tmp"},
        "expect_result": {"decision": "decline"},
    }
    script = fake_codex(turns=[{"steps": [approval, {"hang": True}]}])
    with pytest.raises(AgentAsked) as caught:
        await FAST.run(
            kit.request(command=script.command, approvals=ApprovalMode.ASK, turn_timeout_ms=60_000)
        )
    assert "curl example.com" in caught.value.question.text
    assert caught.value.question.options == ("yes", "no")
    assert not script.violations()


# -- Claude Code stream-json --------------------------------------------------------------------

ASK_DENIAL: dict[str, Any] = {
    "tool_name": "AskUserQuestion",
    "tool_use_id": "toolu_1",
    "tool_input": {
        "questions": [
            {
                "question": "Should the migration drop the old table?",
                "header": "Migration",
                "options": [{"label": "Drop it"}, {"label": "Keep it"}],
                "multiSelect": False,
            }
        ]
    },
}


def claude_result(*, denials: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 1,
        "result": "I need to know something first.",
        "total_cost_usd": 0.01,
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "permission_denials": denials or [],
    }


async def test_claude_question_is_captured_and_the_answer_resumes_the_session(
    tmp_path: Path,
) -> None:
    session = "5e551011-0000-4000-8000-00000000c1a0"
    harness = ClaudeHarness(
        tmp_path,
        {
            "session_id": session,
            "invocations": [
                {"events": [{"type": "system", "subtype": "init"},
                            claude_result(denials=[ASK_DENIAL])]},
                {"events": [{"type": "system", "subtype": "init"}, claude_result()]},
            ],
        },
    )
    with pytest.raises(AgentAsked) as caught:
        await ClaudeStreamRunner().run(harness.request())
    question = caught.value.question
    assert question.text == "Migration — Should the migration drop the old table?"
    assert question.options == ("Drop it", "Keep it")
    assert (question.session_id, question.turn, question.source) == (
        session, 1, "AskUserQuestion"
    )

    result = await ClaudeStreamRunner().run(
        with_answer(harness.request(), answered(question, "Keep it."))
    )
    assert result.session_id == session
    first, second = harness.invocations()
    assert "--resume" not in first["argv"]
    assert second["argv"][second["argv"].index("--resume") + 1] == session
    assert second["prompt"].strip() == "The answer to your question: Keep it."


# -- ACP ------------------------------------------------------------------------------------------


def acp_scenario(*, load_session: bool) -> dict[str, Any]:
    permission = {
        "permission": {
            "toolCall": {"toolCallId": "edit-1", "title": "Edit schema.sql", "kind": "edit"},
            "options": [
                {"optionId": "once", "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"},
            ],
        }
    }
    return {
        "initialize": {"loadSession": load_session},
        "session": {"sessionId": "sess-ask"},
        "turns": [
            {"steps": [permission, {"hang": "stop_on_cancel"}], "stopReason": "end_turn"},
            {"steps": [{"message": "new session work"}], "stopReason": "end_turn"},  # no load
        ],
        "loaded_turns": [{"steps": [{"message": "resumed"}], "stopReason": "end_turn"}],
    }


async def test_acp_permission_under_approvals_ask_is_a_question_and_session_load_resumes(
    tmp_path: Path,
) -> None:
    harness = AcpHarness(tmp_path, acp_scenario(load_session=True))
    with pytest.raises(AgentAsked) as caught:
        await AcpRunner().run(harness.request(approvals=ApprovalMode.ASK))
    question = caught.value.question
    assert question.text == "May I: Edit schema.sql?"
    assert question.options == ("Allow", "Reject")
    assert (question.session_id, question.source) == ("sess-ask", "session/request_permission")
    assert [a["result"]["outcome"] for a in harness.answers()] == [{"outcome": "cancelled"}]

    result = await AcpRunner().run(
        with_answer(harness.request(approvals=ApprovalMode.ASK), answered(question, "Allow."))
    )
    assert result.session_id == "sess-ask"
    assert _jsonl(harness.workspace / "acp_loads.jsonl") == [{"sessionId": "sess-ask"}]
    prompts = _jsonl(harness.workspace / "acp_prompts.jsonl")
    assert prompts[-1] == {"text": "The answer to your question: Allow.", "loaded": True}
    # The replayed history is not reported as this run's output.
    assert "old" not in " ".join(harness.messages())


async def test_acp_without_load_session_starts_a_new_session_told_the_question(
    tmp_path: Path,
) -> None:
    scenario = acp_scenario(load_session=False)
    scenario["turns"] = scenario["turns"][1:]
    harness = AcpHarness(tmp_path, scenario)
    question = AgentQuestion(text="May I: Edit schema.sql?", session_id="sess-ask")
    resume = answered(question, "Allow.")
    await AcpRunner().run(with_answer(harness.request(), resume))
    assert not (harness.workspace / "acp_loads.jsonl").exists()
    assert harness.prompts() == [new_session_summary(resume)]


async def test_codex_resumes_a_thread_only_where_its_codex_home_kept_it(
    kit: RunKit, fake_codex: FakeCodexFactory, tmp_path: Path
) -> None:
    # NB: what a Pod run without a persistent session store meets: the resumed run's agent
    # has another CODEX_HOME (a new Pod's home), where the thread is not kept.
    kept = tmp_path / "kept-home"
    fresh = tmp_path / "fresh-home"
    kept.mkdir()
    fresh.mkdir()
    script = fake_codex(
        thread_id="thr-kept",
        turns=[{"steps": [USER_INPUT, {"hang": True}]}],
        resumed_turns=[{"steps": [{"agent_message": "using Postgres"}]}],
    )
    env = {**base_env(), "CODEX_HOME": str(kept)}
    with pytest.raises(AgentAsked) as caught:
        await FAST.run(kit.request(command=script.command, env=env, turn_timeout_ms=120_000))
    resume = answered(caught.value.question)
    assert (kept / "sessions" / "thr-kept.json").exists()

    elsewhere = fake_codex(thread_id="thr-new")
    await FAST.run(
        with_answer(
            kit.request(command=elsewhere.command, env={**base_env(), "CODEX_HOME": str(fresh)}),
            resume,
        )
    )
    assert {"resume": "thr-kept"} in elsewhere.records()
    assert [r for r in elsewhere.received() if r.get("method") == "thread/start"]
    assert "thread_resume_refused" in kit.recorder.events()

    again = fake_codex(resumed_turns=[{"steps": [{"agent_message": "using Postgres"}]}])
    await FAST.run(with_answer(kit.request(command=again.command, env=env), resume))
    assert {"resume": "thr-kept"} in again.records()
    assert not [r for r in again.received() if r.get("method") == "thread/start"]
