"""The ACP runner against a scripted ACP agent, as real subprocesses in a real workspace.

Every test launches ``tests/fakes/acp_agent.py`` through the runner (``bash -lc`` in its own
process group), so the framing, the handshake, the turn loop, permission answers, usage totals
and process cleanup are all exercised over real pipes. The fake validates every message it gets
and exits with status 70 on a protocol violation, which would surface here as ``agent_exited``.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest
from acp import schema

from lorenz.agents.acp import AcpRunner, choose_permission_option
from lorenz.agents.base import AgentRunError, AgentRunRequest
from lorenz.agents.environment import agent_environment
from lorenz.config import AgentKindSettings, AgentProtocol, ApprovalMode
from lorenz.model import AgentUpdate, Issue, TokenUsage
from tests.waiting import wait_until_async

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_AGENT = FAKES / "acp_agent.py"
SCENARIOS = FAKES / "scenarios"

ISSUE = Issue(id="issue-1", identifier="LOR-1", title="Fix the bug", state="Todo")
PROMPT = "You are working on LOR-1: fix the bug."


def continuation(turn: int, max_turns: int) -> str:
    return f"Continue: turn {turn} of {max_turns}."


class Harness:
    """A workspace, a scenario and the sinks a run reports into."""

    def __init__(self, tmp_path: Path, scenario: str | dict[str, Any]) -> None:
        self.workspace = tmp_path / "workspace"
        self.workspace.mkdir()
        if isinstance(scenario, str):
            self.scenario = SCENARIOS / scenario
        else:
            self.scenario = tmp_path / "scenario.json"
            self.scenario.write_text(json.dumps(scenario), encoding="utf-8")
        self.updates: list[AgentUpdate] = []
        self.activity_answers: list[bool] = []
        self.activity_asked = 0

    @property
    def command(self) -> str:
        return f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE_AGENT))} " + shlex.quote(
            str(self.scenario)
        )

    def request(
        self,
        *,
        max_turns: int = 1,
        approvals: ApprovalMode = ApprovalMode.DENY,
        turn_timeout_ms: int = 60000,
        read_timeout_ms: int = 10000,
        env: Mapping[str, str] | None = None,
        command: str | None = None,
    ) -> AgentRunRequest:
        settings = AgentKindSettings(
            command=command or self.command,
            protocol=AgentProtocol.ACP,
            approvals=approvals,
            turn_timeout_ms=turn_timeout_ms,
            read_timeout_ms=read_timeout_ms,
        )

        async def issue_is_active() -> bool:
            self.activity_asked += 1
            return self.activity_answers.pop(0) if self.activity_answers else True

        return AgentRunRequest(
            issue=ISSUE,
            attempt=None,
            slot_index=0,
            prompt=PROMPT,
            workspace=self.workspace,
            settings=settings.launch(),
            max_turns=max_turns,
            env=dict(env) if env is not None else agent_environment(base=_minimal_env()),
            on_update=self.updates.append,
            issue_is_active=issue_is_active,
            continuation_prompt=continuation,
        )

    def received(self) -> list[dict[str, Any]]:
        return _jsonl(self.workspace / "acp_received.jsonl")

    def answers(self) -> list[dict[str, Any]]:
        return _jsonl(self.workspace / "acp_answers.jsonl")

    def prompts(self) -> list[str]:
        return [
            m["params"]["prompt"][0]["text"]
            for m in self.received()
            if m.get("method") == "session/prompt"
        ]

    def events(self, name: str) -> list[AgentUpdate]:
        return [u for u in self.updates if u.event == name]

    def messages(self) -> list[str]:
        return [u.message for u in self.updates if u.message]

    def agent_pid(self) -> int:
        pids = {u.pid for u in self.updates if u.pid is not None}
        assert len(pids) == 1, pids
        return pids.pop()


def _minimal_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def assert_gone(pid: int) -> None:
    """The process is dead (a zombie left to a non-reaping init counts as dead)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(timeout=10)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        assert proc.status() == psutil.STATUS_ZOMBIE, f"pid {pid} is still running"


# -- normal turns ---------------------------------------------------------------------------


async def test_normal_turn_reports_updates_usage_and_cost(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_normal.json")
    result = await AcpRunner().run(harness.request())

    assert (result.turns, result.session_id, result.stop_reason) == (1, "sess-normal", "end_turn")
    started = harness.events("session_started")
    assert [u.session_id for u in started] == ["sess-normal-1"]
    messages = harness.messages()
    assert "thinking: Reading the issue first." in messages
    assert "plan: 1/3 done; now: Fix the bug" in messages
    assert "tool call: Read main.py (read, pending)" in messages
    assert "tool call Read main.py: in_progress" in messages
    assert "tool call Read main.py: completed" in messages
    assert "mode: code" in messages
    assert "agent: I fixed the bug." in messages
    usage_updates = harness.events("usage_updated")
    assert [u.cost_usd for u in usage_updates] == [0.25]
    assert usage_updates[0].message == "context 5000/200000 tokens, session cost 0.2500 USD"
    (completed,) = harness.events("turn_completed")
    assert completed.usage == TokenUsage(input_tokens=1200, output_tokens=300, total_tokens=1500)
    assert completed.cost_usd == 0.25
    assert all(u.pid == harness.agent_pid() for u in harness.updates)
    assert_gone(harness.agent_pid())


async def test_handshake_and_prompt_are_what_acp_v1_expects(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_normal.json")
    await AcpRunner().run(harness.request())

    received = harness.received()
    assert [m.get("method") for m in received] == ["initialize", "session/new", "session/prompt"]
    assert all(m["jsonrpc"] == "2.0" for m in received)
    initialize, new_session, prompt = received
    assert initialize["params"]["protocolVersion"] == 1
    assert initialize["params"]["clientCapabilities"] == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
    }
    assert initialize["params"]["clientInfo"]["name"] == "lorenz"
    assert new_session["params"] == {"cwd": str(harness.workspace.resolve()), "mcpServers": []}
    assert prompt["params"] == {
        "sessionId": "sess-normal",
        "prompt": [{"type": "text", "text": PROMPT}],
    }
    assert len({m["id"] for m in received}) == 3


async def test_continuation_turns_run_while_the_issue_stays_active(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_multi_turn.json")
    result = await AcpRunner().run(harness.request(max_turns=3))

    assert harness.prompts() == [PROMPT, continuation(2, 3), continuation(3, 3)]
    assert harness.activity_asked == 2
    assert (result.turns, result.stop_reason) == (3, "max_turn_requests")
    assert [u.session_id for u in harness.events("session_started")] == [
        "sess-multi-1",
        "sess-multi-2",
        "sess-multi-3",
    ]
    # Per-turn usage is summed into run totals; cost is the session's cumulative figure.
    totals = [u.usage for u in harness.events("turn_completed")]
    assert totals == [
        TokenUsage(100, 10, 110),
        TokenUsage(300, 30, 330),
        TokenUsage(600, 60, 660),
    ]
    assert [u.cost_usd for u in harness.events("turn_completed")] == [0.10, 0.25, 0.45]
    received = harness.received()
    assert sum(1 for m in received if m.get("method") == "session/new") == 1


async def test_an_inactive_issue_stops_the_run_cleanly(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_multi_turn.json")
    harness.activity_answers = [True, False]
    result = await AcpRunner().run(harness.request(max_turns=3))

    assert result.turns == 2
    assert harness.prompts() == [PROMPT, continuation(2, 3)]
    assert_gone(harness.agent_pid())


async def test_max_turns_caps_the_run(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_multi_turn.json")
    result = await AcpRunner().run(harness.request(max_turns=2))

    assert (result.turns, result.stop_reason) == (2, "max_tokens")
    assert len(harness.prompts()) == 2
    assert harness.activity_asked == 1


# -- failures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "code", "text"),
    [
        ("acp_failure.json", "turn_failed", "model backend unavailable"),
        ("acp_refusal.json", "turn_refused", "refusal"),
        ("acp_unasked_cancel.json", "turn_interrupted", "cancelled"),
    ],
)
async def test_failed_turns_raise_coded_errors(
    tmp_path: Path, scenario: str, code: str, text: str
) -> None:
    harness = Harness(tmp_path, scenario)
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner().run(harness.request(max_turns=3))
    assert caught.value.code == code
    assert text in caught.value.message
    assert harness.events("turn_failed")
    assert len(harness.prompts()) == 1
    assert_gone(harness.agent_pid())


async def test_early_exit_is_agent_exited_with_the_stderr_tail(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_early_exit.json")
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner().run(harness.request())
    assert caught.value.code == "agent_exited"
    assert "status 3" in caught.value.message
    assert "fatal: model process crashed" in caught.value.message
    assert_gone(harness.agent_pid())


async def test_a_command_that_is_not_an_acp_agent_is_agent_exited(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_normal.json")
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner().run(harness.request(command="echo 'usage: agent [--acp]' >&2; exit 2"))
    assert caught.value.code == "agent_exited"
    assert "usage: agent [--acp]" in caught.value.message


@pytest.mark.parametrize(
    ("scenario", "code", "text"),
    [
        (
            {"initialize": {"error": {"code": -32603, "message": "boom"}}},
            "handshake_failed",
            "refused initialize",
        ),
        ({"initialize": {"protocolVersion": 2}}, "handshake_failed", "protocol version 2"),
        (
            {
                "initialize": {"authMethods": [{"id": "oauth", "name": "Log in"}]},
                "session": {"error": {"code": -32000, "message": "Authentication required"}},
            },
            "handshake_failed",
            "auth methods: oauth",
        ),
        ({"initialize": {"hang": True}}, "read_timeout", "read_timeout_ms=300"),
    ],
)
async def test_handshake_failures(
    tmp_path: Path, scenario: dict[str, Any], code: str, text: str
) -> None:
    harness = Harness(tmp_path, scenario)
    # NB: a short read timeout only where the agent hangs; the fake needs a moment to start.
    read_timeout_ms = 300 if code == "read_timeout" else 10000
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner(terminate_grace_s=0.2).run(harness.request(read_timeout_ms=read_timeout_ms))
    assert caught.value.code == code
    assert text in caught.value.message
    assert harness.prompts() == []


async def test_an_invalid_prompt_response_is_a_protocol_error(tmp_path: Path) -> None:
    harness = Harness(tmp_path, {"turns": [{"stopReason": "finished_somehow"}]})
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner().run(harness.request())
    assert caught.value.code == "agent_protocol_error"
    assert "stopReason" in caught.value.message


# -- permissions and agent requests ---------------------------------------------------------


async def test_permissions_denied_by_default(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_permission.json")
    await AcpRunner().run(harness.request())

    outcomes = [a["result"]["outcome"] for a in harness.answers()]
    assert outcomes == [
        {"outcome": "selected", "optionId": "no"},
        {"outcome": "selected", "optionId": "never"},
        {"outcome": "cancelled"},
        {"outcome": "cancelled"},
    ]
    denied = harness.events("approval_auto_denied")
    assert [u.message for u in denied] == [
        "denied Edit main.py (reject_once)",
        "denied Run rm -rf build (reject_always)",
    ]
    assert len(harness.events("approval_cancelled")) == 2


async def test_permissions_allowed_when_configured(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_permission.json")
    await AcpRunner().run(harness.request(approvals=ApprovalMode.ALLOW))

    outcomes = [a["result"]["outcome"] for a in harness.answers()]
    assert outcomes == [
        {"outcome": "selected", "optionId": "once"},
        {"outcome": "selected", "optionId": "always"},
        {"outcome": "selected", "optionId": "yes"},
        {"outcome": "cancelled"},
    ]
    assert len(harness.events("approval_auto_approved")) == 3


def test_choose_permission_option_prefers_once_then_always() -> None:
    options = [
        schema.PermissionOption(option_id="a", name="A", kind="allow_always"),
        schema.PermissionOption(option_id="r", name="R", kind="reject_always"),
        schema.PermissionOption(option_id="o", name="O", kind="allow_once"),
    ]
    allow = choose_permission_option(options, approvals=ApprovalMode.ALLOW)
    deny = choose_permission_option(options, approvals=ApprovalMode.DENY)
    assert allow is not None
    assert allow.option_id == "o"
    assert deny is not None
    assert deny.option_id == "r"
    assert choose_permission_option(options[:1], approvals=ApprovalMode.DENY) is None
    assert choose_permission_option([], approvals=ApprovalMode.ALLOW) is None


async def test_unsupported_agent_requests_get_method_not_found(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_unsupported_requests.json")
    result = await AcpRunner().run(harness.request())

    answers = harness.answers()
    assert [a["method"] for a in answers] == [
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "weird/method",
        "_vendor/extension",
    ]
    assert all(a["error"]["code"] == -32601 for a in answers)
    assert all("result" not in a for a in answers)
    assert len(harness.events("unsupported_request")) == 5
    assert "session update compaction_update (not a v1 update Lorenz knows)" in harness.messages()
    assert "agent: still fine" in harness.messages()
    assert result.stop_reason == "end_turn"


# -- hostile output -------------------------------------------------------------------------


async def test_a_12_mb_line_is_read_whole(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_huge_line.json")
    result = await AcpRunner().run(harness.request())

    assert result.stop_reason == "end_turn"
    chunks = [u for u in harness.events("notification") if (u.message or "").startswith("agent:")]
    assert len(chunks) == 2
    assert chunks[0].payload is not None
    assert len(chunks[0].payload["text"]) <= 1000
    second = chunks[1].message
    assert second is not None
    assert second.endswith("xxx and after the huge chunk")
    assert len(second) < 300


async def test_garbage_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_garbage.json")
    result = await AcpRunner().run(harness.request())

    assert result.stop_reason == "end_turn"
    malformed = [u.message for u in harness.events("malformed") if u.message is not None]
    assert len(malformed) == 2
    assert malformed[0].startswith("ignored a stdout line (not JSON)")
    assert "not a JSON object" in malformed[1]
    assert "agent: survived the garbage" in harness.messages()


async def test_a_line_over_the_limit_is_skipped_and_the_turn_goes_on(tmp_path: Path) -> None:
    harness = Harness(
        tmp_path,
        {
            "turns": [
                {
                    "steps": [{"huge_message_bytes": 17 * 1024 * 1024}, {"message": "still here"}],
                    "stopReason": "end_turn",
                }
            ]
        },
    )
    result = await AcpRunner().run(harness.request())

    assert result.stop_reason == "end_turn"
    (malformed,) = harness.events("malformed")
    assert malformed.message is not None
    assert "over 16777216 bytes" in malformed.message
    assert "agent: still here" in harness.messages()


# -- timeouts, cancellation, process cleanup ------------------------------------------------


async def test_cancel_kills_a_hung_agent_and_its_children(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_hang.json")
    child_file = harness.workspace / "acp_child.pid"
    task = asyncio.create_task(AcpRunner(terminate_grace_s=0.3).run(harness.request()))
    await wait_until_async(
        lambda: child_file.exists() and "agent: thinking hard" in harness.messages(),
        timeout=30.0,
        what="the fake agent started its helper and reported progress",
    )
    child_pid = int(child_file.read_text())
    assert psutil.pid_exists(child_pid)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert harness.received()[-1]["method"] == "session/cancel"
    assert_gone(harness.agent_pid())
    assert_gone(child_pid)


async def test_turn_timeout_cancels_the_turn_then_fails(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_hang_cancellable.json")
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner(terminate_grace_s=5).run(harness.request(turn_timeout_ms=300))
    assert caught.value.code == "turn_timeout"
    assert "turn_timeout_ms=300" in caught.value.message
    cancels = [m for m in harness.received() if m.get("method") == "session/cancel"]
    assert cancels == [
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "sess-hang-ok"}}
    ]
    assert_gone(harness.agent_pid())


async def test_turn_timeout_kills_an_agent_that_ignores_the_cancel(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "acp_hang.json")
    with pytest.raises(AgentRunError) as caught:
        await AcpRunner(terminate_grace_s=0.2).run(harness.request(turn_timeout_ms=300))
    assert caught.value.code == "turn_timeout"
    assert_gone(harness.agent_pid())
    assert_gone(int((harness.workspace / "acp_child.pid").read_text()))


async def test_cancel_during_the_handshake_kills_the_agent(tmp_path: Path) -> None:
    harness = Harness(tmp_path, {"initialize": {"hang": True}})
    task = asyncio.create_task(AcpRunner(terminate_grace_s=0.2).run(harness.request()))
    await wait_until_async(
        lambda: bool(harness.received()),
        timeout=30.0,
        what="initialize reached the agent",
    )
    pids = {p.pid for p in psutil.Process().children(recursive=True)}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid in pids:
        assert_gone(pid)


# -- environment ----------------------------------------------------------------------------


def _login_shell_variables() -> set[str]:
    """Variables ``bash -lc`` adds or rewrites on its own, whatever it was given."""
    out = subprocess.run(
        ["bash", "-lc", "env -0"], env={}, capture_output=True, check=True
    ).stdout.decode()
    return {entry.split("=", 1)[0] for entry in out.split("\0") if entry} | {"_", "OLDPWD"}


async def test_the_agent_gets_exactly_the_request_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORENZ_CONTROLLER_ONLY", "must-not-leak")
    harness = Harness(tmp_path, "acp_normal.json")
    env = agent_environment(
        base={**_minimal_env(), "OPENAI_API_KEY": "agent-key", "LINEAR_API_KEY": "lin_secret"},
        extra={"LORENZ_ISSUE_IDENTIFIER": "LOR-1", "COPIED_TRACKER_KEY": "tracker-token"},
        secret_values=["tracker-token"],
    )
    await AcpRunner().run(harness.request(env=env))

    seen = json.loads((harness.workspace / "acp_env.json").read_text())
    shell_owned = _login_shell_variables()
    assert {k: v for k, v in seen.items() if k not in shell_owned} == {
        k: v for k, v in env.items() if k not in shell_owned
    }
    assert seen["OPENAI_API_KEY"] == "agent-key"
    assert seen["LORENZ_ISSUE_IDENTIFIER"] == "LOR-1"
    for stripped in ("LINEAR_API_KEY", "COPIED_TRACKER_KEY", "LORENZ_CONTROLLER_ONLY"):
        assert stripped not in seen
    assert "tracker-token" not in seen.values()
    assert "lin_secret" not in seen.values()


def test_the_factory_builds_this_runner() -> None:
    from lorenz.agents import build_runner

    assert isinstance(build_runner(AgentProtocol.ACP), AcpRunner)
