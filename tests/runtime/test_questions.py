"""Ask, wait, answer on the tracker, resume — through the real runtime with the scripted Codex
app-server: the question reaches the tracker once, the slot is free for another issue while it
waits (one slot in all), a reply on the issue resumes the same thread with the answer as the
turn's input, and ``input.timeout_ms`` ends the wait with the terminal action."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from lorenz.model import slot_key
from lorenz.trackers.memory import MemoryTracker
from lorenz.trackers.questions import question_marker
from tests.runtime.questions_rig import (
    WAIT_S,
    asking_scenario,
    build,
    codex_workflow,
    issue,
    plain_scenario,
    records,
    turn_texts,
    until,
    waiting_rows,
)

KEY = slot_key("id-1", 0)


async def test_a_question_waits_on_the_tracker_frees_the_slot_and_a_reply_resumes_the_thread(
    tmp_path: Path,
) -> None:
    workflow = codex_workflow(
        tmp_path,
        scenarios={"T-1": asking_scenario(tmp_path, "T-1"), "T-2": plain_scenario(tmp_path, "T-2")},
        front_matter={"input": {"answer_template": "Answer: {{ answer }} (to: {{ question }})"}},
    )
    # NB: T-1 first (higher priority), and one slot in all: T-2 runs only if T-1's wait frees it.
    rig = build(tmp_path, workflow, [issue(1, priority=1), issue(2, priority=3)])
    tracker: MemoryTracker = rig.tracker
    state = rig.orchestrator.state
    task = asyncio.create_task(rig.runtime.start())
    try:
        await until(
            lambda: bool(waiting_rows(rig)) and waiting_rows(rig)[0]["posted"],
            what="T-1 waiting with its question posted",
        )
        (row,) = waiting_rows(rig)
        assert row["identifier"] == "T-1"
        assert row["question"] == "Database — Which database should the cache use?"
        assert row["options"] == ["Redis", "Postgres"]
        assert row["session_id"] == "thr-T-1"
        assert KEY not in state.claimed
        assert KEY not in state.retry_attempts
        assert rig.runtime.snapshot().to_dict()["blocked"] == []
        (asked,) = rig.of_type("input_requested")
        assert asked["identifier"] == "T-1"

        # The slot is free: T-2 runs to its end while T-1 waits.
        await until(
            lambda: any(e["identifier"] == "T-2" for e in rig.of_type("run_finished")),
            what="T-2's run",
        )
        assert {e["identifier"] for e in rig.of_type("run_started")} == {"T-1", "T-2"}
        assert turn_texts(tmp_path, "T-2") == ["Work on T-2"]

        # The question is on the issue once, however many ticks went by.
        await until(lambda: rig.runtime.poll_count >= 5, what="a few more ticks")
        comments = tracker.comments_on("id-1")
        (posted,) = [c for c in comments if question_marker(state_key_of(rig)) in c.body]
        assert "Which database should the cache use?" in posted.body
        assert "`Postgres`" in posted.body
        assert len(comments) == 1

        # A person replies on the issue; the next tick resumes the same thread with it.
        tracker.add_comment("id-1", author="alice", body="Postgres, please.")
        await until(lambda: bool(rig.of_type("input_answered")), what="the answer")
        (answered,) = rig.of_type("input_answered")
        assert answered["reason"] == "tracker"
        assert answered["duration_ms"] > 0
        await until(
            lambda: len(turn_texts(tmp_path, "T-1")) == 2, what="the resumed turn of T-1"
        )
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
    assert {"resume": "thr-T-1"} in records(tmp_path, "T-1")
    assert turn_texts(tmp_path, "T-1") == [
        "Work on T-1",
        "Answer: Postgres, please. (to: Database — Which database should the cache use?)",
    ]
    assert waiting_rows(rig) == []
    # Waiting counted no failure: the question's run and the resumed one are the slot's runs.
    assert [e["identifier"] for e in rig.of_type("run_failed")] == ["T-1"]
    assert KEY not in state.failure_streaks


def state_key_of(rig: object) -> str:
    """The idempotency key the waiting slot's question was posted under."""
    from tests.runtime.harness import RuntimeRig

    assert isinstance(rig, RuntimeRig)
    blocked = rig.orchestrator.state.blocked.get(KEY)
    assert blocked is not None
    return blocked.action_key


async def test_only_the_allowed_authors_answer_on_the_tracker(tmp_path: Path) -> None:
    workflow = codex_workflow(
        tmp_path,
        scenarios={"T-1": asking_scenario(tmp_path, "T-1")},
        front_matter={"input": {"answer_authors": ["Carol"]}},
    )
    rig = build(tmp_path, workflow, [issue(1)])
    tracker: MemoryTracker = rig.tracker
    task = asyncio.create_task(rig.runtime.start())
    try:
        await until(
            lambda: bool(waiting_rows(rig)) and waiting_rows(rig)[0]["posted"],
            what="T-1 waiting with its question posted",
        )
        tracker.add_comment("id-1", author="mallory", body="Redis!")
        ticks = rig.runtime.poll_count
        await until(lambda: rig.runtime.poll_count >= ticks + 3, what="three more ticks")
        assert rig.of_type("input_answered") == []
        assert waiting_rows(rig)
        tracker.add_comment("id-1", author="carol", body="Postgres.")
        await until(
            lambda: len(turn_texts(tmp_path, "T-1")) == 2, what="the resumed turn of T-1"
        )
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
    assert turn_texts(tmp_path, "T-1")[1] == "The answer to your question: Postgres."


async def test_a_question_left_unanswered_past_the_timeout_takes_the_terminal_action(
    tmp_path: Path,
) -> None:
    workflow = codex_workflow(
        tmp_path,
        scenarios={"T-1": asking_scenario(tmp_path, "T-1")},
        front_matter={"input": {"timeout_ms": 1500}},
    )
    rig = build(tmp_path, workflow, [issue(1)])
    task = asyncio.create_task(rig.runtime.start())
    try:
        await until(lambda: bool(rig.of_type("input_requested")), what="the question")
        await until(lambda: bool(rig.of_type("slot_blocked")), what="the end of the wait")
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
    document = rig.runtime.snapshot().to_dict()
    assert document["waiting"] == []
    (blocked,) = document["blocked"]
    assert (blocked["identifier"], blocked["reason"]) == ("T-1", "input_required")
    assert blocked["terminal_action"] == "block"
    # No answer, no resume: the slot is not retried.
    assert len(turn_texts(tmp_path, "T-1")) == 1


# -- Claude Code and ACP through the runtime ------------------------------------------------------

FAKES = Path(__file__).resolve().parent.parent / "fakes"


def _workflow_for(tmp_path: Path, *, protocol: str, command: str, **kind: object) -> Path:
    config = {
        "tracker": {"kind": "memory"},
        "polling": {"interval_ms": 100},
        "workspace": {"root": str(tmp_path / "workspaces")},
        "agent": {"kind": "asker", "max_concurrent_agents": 1, "max_turns": 1},
        "agents": {
            "asker": {
                "protocol": protocol,
                "command": command,
                "stall_timeout_ms": 60000,
                "turn_timeout_ms": 60000,
                **kind,
            }
        },
    }
    path = tmp_path / "WORKFLOW.md"
    path.write_text(
        f"---\n{yaml.safe_dump(config)}---\nWork on {{{{ issue.identifier }}}}\n",
        encoding="utf-8",
    )
    return path


def _claude(tmp_path: Path) -> tuple[Path, Callable[[Path], tuple[str | None, str]]]:
    session = "5e551011-0000-4000-8000-00000000c1a0"
    result: dict[str, object] = {
        "type": "result", "subtype": "success", "is_error": False, "num_turns": 1,
        "result": "ok", "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    ask = {
        "tool_name": "AskUserQuestion",
        "tool_input": {"questions": [{"question": "Keep the old table?", "header": "Schema",
                                      "options": [{"label": "Keep"}, {"label": "Drop"}]}]},
    }
    scenario = tmp_path / "claude.json"
    scenario.write_text(json.dumps({
        "session_id": session,
        "invocations": [
            {"events": [{"type": "system", "subtype": "init"},
                        {**result, "permission_denials": [ask]}]},
            {"events": [{"type": "system", "subtype": "init"}, result]},
        ],
    }), encoding="utf-8")
    command = " ".join(
        shlex.quote(str(p)) for p in (sys.executable, FAKES / "claude_agent.py", scenario)
    ) + " -p --output-format stream-json --verbose"

    def resumed(workspace: Path) -> tuple[str | None, str]:
        lines = (workspace / "claude_invocations.jsonl").read_text().splitlines()
        if len(lines) < 2:
            return None, ""
        second = json.loads(lines[1])
        argv = second["argv"]
        return argv[argv.index("--resume") + 1], second["prompt"].strip()

    return _workflow_for(tmp_path, protocol="claude-stream-json", command=command), resumed


def _acp(tmp_path: Path) -> tuple[Path, Callable[[Path], tuple[str | None, str]]]:
    permission = {"permission": {
        "toolCall": {"toolCallId": "e1", "title": "Drop the old table", "kind": "edit"},
        "options": [{"optionId": "y", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "n", "name": "Reject", "kind": "reject_once"}],
    }}
    scenario = tmp_path / "acp.json"
    scenario.write_text(json.dumps({
        "initialize": {"loadSession": True},
        "session": {"sessionId": "sess-rt"},
        "turns": [{"steps": [permission, {"hang": "stop_on_cancel"}], "stopReason": "end_turn"}],
        "loaded_turns": [{"steps": [{"message": "resumed"}], "stopReason": "end_turn"}],
    }), encoding="utf-8")
    command = " ".join(
        shlex.quote(str(p)) for p in (sys.executable, FAKES / "acp_agent.py", scenario)
    )

    def resumed(workspace: Path) -> tuple[str | None, str]:
        loads = workspace / "acp_loads.jsonl"
        prompts = workspace / "acp_prompts.jsonl"
        if not loads.exists() or not prompts.exists():
            return None, ""
        (load,) = [json.loads(line) for line in loads.read_text().splitlines()]
        last = json.loads(prompts.read_text().splitlines()[-1])
        return (load["sessionId"], last["text"]) if last["loaded"] else (None, "")

    return (
        _workflow_for(tmp_path, protocol="acp", command=command, approvals="ask"),
        resumed,
    )


@pytest.mark.parametrize(
    ("make", "session", "question"),
    [
        (_claude, "5e551011-0000-4000-8000-00000000c1a0", "Schema — Keep the old table?"),
        (_acp, "sess-rt", "May I: Drop the old table?"),
    ],
    ids=["claude", "acp"],
)
async def test_claude_and_acp_questions_reach_the_tracker_and_a_reply_resumes_the_session(
    tmp_path: Path,
    make: Callable[[Path], tuple[Path, Callable[[Path], tuple[str | None, str]]]],
    session: str,
    question: str,
) -> None:
    workflow, resumed = make(tmp_path)
    rig = build(tmp_path, workflow, [issue(1)])
    tracker: MemoryTracker = rig.tracker
    task = asyncio.create_task(rig.runtime.start())
    try:
        await until(
            lambda: bool(waiting_rows(rig)) and waiting_rows(rig)[0]["posted"],
            what="T-1 waiting with its question posted",
        )
        (row,) = waiting_rows(rig)
        assert (row["question"], row["session_id"]) == (question, session)
        (posted,) = tracker.comments_on("id-1")
        assert question.split("—")[-1].strip() in posted.body
        tracker.add_comment("id-1", author="alice", body="Keep it.")
        workspace = Path(row["workspace_path"])
        await until(lambda: resumed(workspace)[0] is not None, what="the resumed session")
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
    assert resumed(workspace) == (session, "The answer to your question: Keep it.")


async def test_a_deleted_question_is_posted_again(tmp_path: Path) -> None:
    workflow = codex_workflow(tmp_path, scenarios={"T-1": asking_scenario(tmp_path, "T-1")})
    rig = build(tmp_path, workflow, [issue(1)])
    tracker: MemoryTracker = rig.tracker
    task = asyncio.create_task(rig.runtime.start())
    try:
        await until(
            lambda: bool(waiting_rows(rig)) and waiting_rows(rig)[0]["posted"],
            what="T-1 waiting with its question posted",
        )
        (first,) = tracker.comments_on("id-1")
        tracker.delete_comment("id-1", first.comment_id)
        await until(lambda: bool(tracker.comments_on("id-1")), what="the question posted again")
        (again,) = tracker.comments_on("id-1")
        assert again.comment_id != first.comment_id
        assert again.body == first.body
        assert waiting_rows(rig)
    finally:
        rig.runtime.stop()
        await asyncio.wait_for(task, WAIT_S)
