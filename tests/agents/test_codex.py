"""The codex-app-server runner against the scripted fake app-server (real subprocesses)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import build_runner
from lorenz.agents.base import AgentRunError
from lorenz.agents.codex import LEGACY_DENIAL_REASON, CodexAppServerRunner
from lorenz.config import AgentProtocol, ApprovalMode
from lorenz.model import TokenUsage
from tests.agents.conftest import (
    FakeCodexFactory,
    FakeCodexScript,
    RunKit,
    StaticTools,
    assert_gone,
    python_command,
)
from tests.waiting import wait_until_async

FAST = CodexAppServerRunner(overload_initial_delay_s=0.01, overload_max_delay_s=0.05)


def methods(script: FakeCodexScript) -> list[str]:
    return [m["method"] for m in script.received() if "method" in m]


def sent(script: FakeCodexScript, method: str) -> list[dict[str, Any]]:
    return [m for m in script.received() if m.get("method") == method]


def agent_pids(kit: RunKit) -> list[int]:
    return [u.pid for u in kit.recorder.of("agent_started") if u.pid is not None]


async def test_a_normal_turn_follows_the_handshake_and_succeeds(
    kit: RunKit, fake_codex: FakeCodexFactory, workspace: Path
) -> None:
    script = fake_codex("normal")
    result = await FAST.run(kit.request(command=script.command))

    assert result.turns == 1
    assert result.session_id == "thr-normal-turn-1"
    assert result.stop_reason == "max_turns"
    assert script.violations() == []
    assert methods(script) == ["initialize", "initialized", "thread/start", "turn/start"]
    assert all("jsonrpc" not in m for m in script.received())

    init = sent(script, "initialize")[0]
    assert init["params"]["clientInfo"]["name"] == "lorenz"
    assert init["params"]["clientInfo"]["title"] == "Lorenz"
    assert init["params"]["clientInfo"]["version"]
    assert "capabilities" not in init["params"]  # no tools offered: no experimental API

    thread = sent(script, "thread/start")[0]["params"]
    assert thread == {"cwd": str(workspace)}  # nothing configured: Codex's own defaults apply

    turn = sent(script, "turn/start")[0]["params"]
    assert turn["threadId"] == "thr-normal"
    assert turn["input"] == [{"type": "text", "text": "Fix the bug described in ABC-1."}]
    assert turn["title"] == "ABC-1: Fix the bug"
    assert turn["cwd"] == str(workspace)
    assert turn["sandboxPolicy"] == {"type": "workspaceWrite", "writableRoots": [str(workspace)]}

    events = kit.recorder.events()
    assert events[0] == "agent_started"
    assert events.index("thread_started") < events.index("session_started")
    assert events[-1] == "turn_completed"
    started = kit.recorder.of("session_started")
    assert [u.session_id for u in started] == ["thr-normal-turn-1"]
    assert started[0].pid == agent_pids(kit)[0]
    messages = [u.message or "" for u in kit.recorder.of("notification")]
    assert any("commandExecution started: ls -la" in m for m in messages)
    assert any("Looking at the issue." in m for m in messages)
    assert kit.recorder.of("token_usage")[-1].usage == TokenUsage(120, 30, 150)
    assert_gone(agent_pids(kit))


async def test_configured_policies_are_passed_through(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    policy = {"type": "readOnly", "networkAccess": False}
    script = fake_codex(
        "normal",
        expect={
            "approval_policy": "never",
            "sandbox": "workspace-write",
            "sandbox_policy": policy,
        },
    )
    await FAST.run(
        kit.request(
            command=script.command,
            approval_policy="never",
            thread_sandbox="workspace-write",
            turn_sandbox_policy=policy,
        )
    )
    assert script.violations() == []
    assert sent(script, "turn/start")[0]["params"]["approvalPolicy"] == "never"


async def test_continuation_turns_reuse_the_thread_while_the_issue_is_active(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("multi_turn")
    result = await FAST.run(kit.request(command=script.command, max_turns=3))

    assert result.turns == 3
    assert result.stop_reason == "max_turns"
    assert kit.active_calls == 2  # asked before turns 2 and 3, not after the last
    assert kit.continuation_calls == [(2, 3), (3, 3)]
    assert len(sent(script, "thread/start")) == 1
    texts = [m["params"]["input"][0]["text"] for m in sent(script, "turn/start")]
    assert texts == [
        "Fix the bug described in ABC-1.",
        "Continue: turn 2 of 3.",
        "Continue: turn 3 of 3.",
    ]
    assert [u.session_id for u in kit.recorder.of("session_started")] == [
        "thr-multi-turn-1",
        "thr-multi-turn-2",
        "thr-multi-turn-3",
    ]
    # Thread totals are reported as they are: cumulative, never summed, "last" ignored.
    totals = [u.usage.total_tokens for u in kit.recorder.of("token_usage") if u.usage]
    assert totals == [110, 280, 450]


async def test_the_run_stops_cleanly_when_the_issue_is_no_longer_active(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    kit.active_answers.append(False)
    script = fake_codex("multi_turn")
    result = await FAST.run(kit.request(command=script.command, max_turns=5))
    assert result.turns == 1
    assert result.stop_reason == "issue_inactive"
    assert len(sent(script, "turn/start")) == 1
    assert kit.continuation_calls == []


async def test_a_failed_turn_fails_the_run_with_its_message(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("failed")
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command, max_turns=3))
    assert caught.value.code == "turn_failed"
    assert "model stream disconnected before completion" in caught.value.message
    assert any("stream disconnected" in (u.message or "") for u in kit.recorder.of("notification"))
    assert_gone(agent_pids(kit))


async def test_an_interrupted_turn_fails_the_run(kit: RunKit, fake_codex: FakeCodexFactory) -> None:
    script = fake_codex("interrupted")
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "turn_interrupted"


async def test_legacy_turn_failed_notifications_are_understood(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex(turns=[{"steps": [], "completion": "turn/failed", "error": "old style"}])
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "turn_failed"
    assert "old style" in caught.value.message


async def test_approvals_are_declined_by_default(kit: RunKit, fake_codex: FakeCodexFactory) -> None:
    script = fake_codex("approvals")
    result = await FAST.run(kit.request(command=script.command))
    assert result.turns == 1
    assert script.violations() == []
    answers = script.answers()
    commands = [a["result"] for a in answers["item/commandExecution/requestApproval"]]
    assert commands == [{"decision": "decline"}, {"decision": "cancel"}]  # "cancel" was offered
    assert answers["item/fileChange/requestApproval"][0]["result"] == {"decision": "decline"}
    assert answers["item/permissions/requestApproval"][0]["result"] == {
        "permissions": {},
        "scope": "turn",
    }
    assert answers["execCommandApproval"][0]["result"] == {
        "decision": {"denied": {"rejection": LEGACY_DENIAL_REASON}}
    }
    unknown = answers["account/chatgptAuthTokens/refresh"][0]
    assert unknown["error"]["code"] == -32601
    assert len(kit.recorder.of("approval_auto_denied")) == 5
    assert kit.recorder.of("approval_auto_approved") == []


async def test_approvals_are_accepted_for_the_session_when_allowed(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("approvals")
    await FAST.run(kit.request(command=script.command, approvals=ApprovalMode.ALLOW))
    answers = script.answers()
    commands = [a["result"] for a in answers["item/commandExecution/requestApproval"]]
    assert commands == [{"decision": "acceptForSession"}, {"decision": "accept"}]
    assert answers["item/fileChange/requestApproval"][0]["result"] == {
        "decision": "acceptForSession"
    }
    assert answers["item/permissions/requestApproval"][0]["result"] == {
        "permissions": {"network": {"enabled": True}},
        "scope": "session",
    }
    assert answers["execCommandApproval"][0]["result"] == {"decision": "approved_for_session"}
    assert answers["account/chatgptAuthTokens/refresh"][0]["error"]["code"] == -32601
    assert len(kit.recorder.of("approval_auto_approved")) == 5


async def test_dynamic_tools_are_advertised_and_executed_host_side(
    kit: RunKit, fake_codex: FakeCodexFactory, tools: StaticTools
) -> None:
    script = fake_codex("tool_call", expect={"experimental_api": True, "tools": ["linear_graphql"]})
    result = await FAST.run(kit.request(command=script.command, tools=tools))
    assert result.turns == 1
    assert script.violations() == []
    assert tools.calls == [("linear_graphql", {"query": "query { viewer { id } }"})]
    known, unknown = script.answers()["item/tool/call"]
    assert known["result"]["success"] is True
    assert known["result"]["contentItems"] == [
        {"type": "inputText", "text": json.dumps({"data": {"viewer": {"id": "user-1"}}})}
    ]
    assert unknown["result"]["success"] is False
    explanation = json.loads(unknown["result"]["contentItems"][0]["text"])
    assert explanation["error"]["message"] == "Unsupported dynamic tool: delete_everything"
    assert explanation["error"]["supportedTools"] == ["linear_graphql"]
    events = kit.recorder.events()
    assert "tool_call_completed" in events
    assert "unsupported_tool_call" in events
    spec = sent(script, "thread/start")[0]["params"]["dynamicTools"][0]
    assert spec["type"] == "function"
    assert spec["inputSchema"]["required"] == ["query"]


async def test_tool_calls_without_a_tool_handler_are_refused_but_the_turn_goes_on(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("tool_call", expect={"experimental_api": False})
    result = await FAST.run(kit.request(command=script.command))
    assert result.turns == 1
    assert [a["result"]["success"] for a in script.answers()["item/tool/call"]] == [False, False]


async def test_a_request_for_user_input_fails_the_run_at_once(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("user_input")
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command, turn_timeout_ms=120_000))
    assert caught.value.code == "input_required"
    assert "item/tool/requestUserInput" in caught.value.message
    assert "turn_input_required" in kit.recorder.events()
    assert_gone(agent_pids(kit))


async def test_an_mcp_elicitation_also_means_input_required(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    request = {
        "request": "mcpServer/elicitation/request",
        "params": {"serverName": "docs", "mode": "form", "message": "Your name?"},
    }
    script = fake_codex(turns=[{"steps": [request, {"hang": True}]}])
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "input_required"


async def test_a_silent_turn_times_out_and_the_agent_is_killed(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("hang")
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command, turn_timeout_ms=300))
    assert caught.value.code == "turn_timeout"
    assert_gone(agent_pids(kit))


async def test_a_turn_that_keeps_streaming_outlives_the_turn_timeout(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    # 12 x 0.15 s of work is well past the 1 s limit, but no silence ever lasts that long.
    steps: list[dict[str, Any]] = []
    for n in range(12):
        steps += [{"sleep": 0.15}, {"agent_message": f"step {n}"}]
    script = fake_codex(turns=[{"steps": steps}])
    result = await FAST.run(kit.request(command=script.command, turn_timeout_ms=1000))
    assert result.turns == 1


async def test_no_response_to_initialize_is_a_read_timeout(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal", initialize={"no_response": True})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command, read_timeout_ms=300))
    assert caught.value.code == "read_timeout"
    assert "initialize" in caught.value.message
    assert_gone(agent_pids(kit))


async def test_a_rejected_thread_start_is_a_handshake_failure(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal", thread_start={"error": "invalid sandbox mode"})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "handshake_failed"
    assert "invalid sandbox mode" in caught.value.message


async def test_a_rejected_turn_start_fails_the_turn(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal", turn_start={"error": "thread not found"})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "turn_failed"
    assert "thread not found" in caught.value.message


async def test_a_thread_start_result_without_an_id_is_a_protocol_error(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal", thread_start={"result": {"thread": {"preview": ""}}})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "agent_protocol_error"


async def test_a_huge_line_is_read_and_reported_without_its_payload(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("huge_line")
    result = await FAST.run(kit.request(command=script.command))
    assert result.turns == 1
    huge = [u for u in kit.recorder.of("notification") if u.payload and u.payload.get("truncated")]
    assert len(huge) == 1
    assert huge[0].payload is not None
    assert huge[0].payload["bytes"] > 12_000_000
    assert huge[0].message is not None
    assert len(huge[0].message) <= 500
    assert any("after the huge line" in (u.message or "") for u in kit.recorder.updates)


async def test_garbage_lines_are_counted_and_skipped(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("garbage")
    result = await FAST.run(kit.request(command=script.command))
    assert result.turns == 1
    malformed = kit.recorder.of("malformed")
    assert len(malformed) == 3
    assert "#3" in (malformed[-1].message or "")
    messages = [u.message or "" for u in kit.recorder.of("notification")]
    assert any("split across two writes" in m for m in messages)
    assert any("still fine" in m for m in messages)
    # stderr is diagnostics, never protocol: its JSON-looking noise produced no event.
    assert not any("something on stderr" in (u.message or "") for u in kit.recorder.updates)


async def test_an_agent_that_dies_mid_turn_reports_its_status_and_stderr(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("early_exit")
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "agent_exited"
    assert "status 3" in caught.value.message
    assert "panic: the fake agent crashed on purpose" in caught.value.message


async def test_an_agent_that_dies_during_the_handshake_reports_agent_exited(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("normal", initialize={"exit": 2, "stderr": "auth.json is corrupt"})
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command=script.command))
    assert caught.value.code == "agent_exited"
    assert "auth.json is corrupt" in caught.value.message


async def test_a_missing_agent_command_reports_agent_exited_with_a_hint(kit: RunKit) -> None:
    with pytest.raises(AgentRunError) as caught:
        await FAST.run(kit.request(command="lorenz-no-such-codex-binary app-server"))
    assert caught.value.code == "agent_exited"
    assert "127" in caught.value.message
    assert "agents.<kind>.command" in caught.value.message


async def test_overloaded_requests_are_retried(kit: RunKit, fake_codex: FakeCodexFactory) -> None:
    script = fake_codex("overload")
    result = await FAST.run(kit.request(command=script.command))
    assert result.turns == 1
    overloaded = [r["overloaded"] for r in script.records() if "overloaded" in r]
    assert overloaded == ["initialize", "thread_start", "turn_start", "turn_start"]
    ids = [m["id"] for m in script.received() if "id" in m and "method" in m]
    assert len(ids) == len(set(ids))  # every retry is a new request


async def test_overload_retries_are_bounded(kit: RunKit, fake_codex: FakeCodexFactory) -> None:
    runner = CodexAppServerRunner(
        overload_attempts=3, overload_initial_delay_s=0.01, overload_max_delay_s=0.02
    )
    script = fake_codex("normal", thread_start={"overload_times": 10})
    with pytest.raises(AgentRunError) as caught:
        await runner.run(kit.request(command=script.command))
    assert caught.value.code == "agent_overloaded"
    assert [r for r in script.records() if "overloaded" in r] == [
        {"overloaded": "thread_start"}
    ] * 3


async def test_token_usage_and_rate_limits_are_extracted(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("token_usage")
    await FAST.run(kit.request(command=script.command))
    usages = [u.usage for u in kit.recorder.of("token_usage")]
    assert usages == [TokenUsage(10, 5, 15), TokenUsage(40, 20, 60), TokenUsage(90, 30, 120)]
    limits = kit.recorder.of("rate_limits")
    assert len(limits) == 1
    assert limits[0].rate_limits is not None
    assert limits[0].rate_limits["limitId"] == "codex"
    assert limits[0].rate_limits["primary"]["usedPercent"] == 12


async def test_cancelling_a_run_kills_the_agent_and_its_children(
    kit: RunKit, fake_codex: FakeCodexFactory
) -> None:
    script = fake_codex("grandchild")
    task = asyncio.create_task(FAST.run(kit.request(command=script.command)))

    def child_recorded() -> bool:
        return any("child_pid" in r for r in script.records())

    await wait_until_async(child_recorded, timeout=10.0, what="child_recorded")
    await wait_until_async(
        lambda: "child started" in " ".join(u.message or "" for u in kit.recorder.updates),
        timeout=10.0,
        what='"child started" in " ".join(u.message or "" for u in kit.recorder.updates)',
    )
    child = next(r["child_pid"] for r in script.records() if "child_pid" in r)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_gone([*agent_pids(kit), child])


async def test_the_factory_builds_a_codex_runner() -> None:
    runner = build_runner(AgentProtocol.CODEX_APP_SERVER)
    assert isinstance(runner, CodexAppServerRunner)
    assert isinstance(build_runner("codex-app-server"), CodexAppServerRunner)


async def test_the_factory_knows_every_configured_protocol() -> None:
    for protocol in AgentProtocol:
        runner = build_runner(protocol)
        assert callable(getattr(runner, "run", None)), protocol


async def test_the_factory_refuses_an_unknown_protocol() -> None:
    with pytest.raises(AgentRunError) as caught:
        build_runner("carrier-pigeon")
    assert caught.value.code == "agent_protocol_unavailable"


async def test_python_command_quotes_paths_with_spaces(tmp_path: Path) -> None:
    # The fixture helper itself: a scenario path with a space must survive bash -lc.
    assert "'" in python_command(tmp_path / "with space.py")
