"""The Claude stream-json runner against a scripted ``claude -p``, as real subprocesses.

Each turn launches ``tests/fakes/claude_agent.py`` through the runner (``bash -lc`` in the
workspace, its own process group). The fake checks the flags it gets (``-p``, stream-json,
``--verbose``, ``--max-turns``, ``--resume`` on later turns) and records every invocation, so
the tests see exactly what a real CLI would have been asked to do.
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

from lorenz.agents.base import AgentRunError, AgentRunRequest
from lorenz.agents.claude import ClaudeStreamRunner, claude_command, usage_from_claude
from lorenz.agents.environment import agent_environment
from lorenz.config import AgentKindSettings, AgentProtocol
from lorenz.model import AgentUpdate, Issue, TokenUsage
from tests.waiting import wait_until_async

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_CLAUDE = FAKES / "claude_agent.py"
SCENARIOS = FAKES / "scenarios"

ISSUE = Issue(id="issue-2", identifier="LOR-2", title="Fix the other bug", state="In Progress")
PROMPT = "You are working on LOR-2.\nFix the other bug."
FLAGS = "-p --output-format stream-json --verbose"


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
        self.session_id = json.loads(self.scenario.read_text()).get("session_id")
        self.updates: list[AgentUpdate] = []
        self.activity_answers: list[bool] = []
        self.activity_asked = 0

    def command(self, flags: str = FLAGS) -> str:
        fake = " ".join(shlex.quote(str(p)) for p in (sys.executable, FAKE_CLAUDE, self.scenario))
        return f"{fake} {flags}"

    def request(
        self,
        *,
        max_turns: int = 1,
        turn_timeout_ms: int = 60000,
        env: Mapping[str, str] | None = None,
        command: str | None = None,
    ) -> AgentRunRequest:
        settings = AgentKindSettings(
            command=command or self.command(),
            protocol=AgentProtocol.CLAUDE_STREAM_JSON,
            turn_timeout_ms=turn_timeout_ms,
        )

        async def issue_is_active() -> bool:
            self.activity_asked += 1
            return self.activity_answers.pop(0) if self.activity_answers else True

        return AgentRunRequest(
            issue=ISSUE,
            attempt=1,
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

    def invocations(self) -> list[dict[str, Any]]:
        path = self.workspace / "claude_invocations.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def events(self, name: str) -> list[AgentUpdate]:
        return [u for u in self.updates if u.event == name]

    def messages(self) -> list[str]:
        return [u.message for u in self.updates if u.message]

    def pids(self) -> list[int]:
        return sorted({u.pid for u in self.updates if u.pid is not None})


def _minimal_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def assert_gone(pid: int) -> None:
    """The process is dead (a zombie left to a non-reaping init counts as dead)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(timeout=10)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        assert proc.status() == psutil.STATUS_ZOMBIE, f"pid {pid} is still running"


# -- the command line -----------------------------------------------------------------------


def test_claude_command_appends_max_turns_and_resume() -> None:
    assert claude_command("claude -p", max_turns=5) == "claude -p --max-turns 5"
    assert claude_command("claude -p --max-turns 50", max_turns=5) == "claude -p --max-turns 50"
    assert claude_command("claude -p --max-turns=50", max_turns=5) == "claude -p --max-turns=50"
    assert (
        claude_command("claude -p", max_turns=2, resume="a b")
        == "claude -p --max-turns 2 --resume 'a b'"
    )
    # A flag mentioned inside a quoted argument is not the flag itself.
    assert claude_command("claude -p --append-system-prompt 'no --max-turns 9'", max_turns=3) == (
        "claude -p --append-system-prompt 'no --max-turns 9' --max-turns 3"
    )


def test_usage_counts_cache_tokens_as_input() -> None:
    usage = {
        "input_tokens": 15,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2200,
        "output_tokens": 100,
        "server_tool_use": {"web_search_requests": 0},
    }
    assert usage_from_claude(usage) == TokenUsage(2315, 100, 2415)
    assert usage_from_claude({"input_tokens": True, "output_tokens": -3}) == TokenUsage()
    assert usage_from_claude(None) == TokenUsage()


# -- normal turns ---------------------------------------------------------------------------


async def test_normal_turn_reports_events_usage_and_cost(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_normal.json")
    harness.activity_answers = [False]
    result = await ClaudeStreamRunner().run(harness.request(max_turns=4))

    assert (result.turns, result.session_id, result.stop_reason) == (
        1,
        harness.session_id,
        "success",
    )
    (started,) = harness.events("session_started")
    assert started.session_id == f"{harness.session_id}-1"
    assert started.message == "turn 1 of at most 4: claude-sonnet-4-5, 3 tools"
    messages = harness.messages()
    assert "system: hook_started" in messages
    assert "thinking: Let me look at main.py." in messages
    assert "agent: I will read the file." in messages
    assert 'tool call: Read {"file_path": "main.py"}' in messages
    assert "tool result: print('hi')" in messages
    assert "agent: Fixed the bug in main.py." in messages
    (limits,) = harness.events("rate_limits")
    assert limits.rate_limits == {
        "status": "allowed",
        "resetsAt": 1790000000,
        "rateLimitType": "five_hour",
    }
    # msg_1 repeats its usage on three lines: counted once, at its last figures.
    running = [u.usage for u in harness.events("notification") if u.usage is not None]
    assert running == [
        TokenUsage(1110, 5, 1115),
        TokenUsage(1110, 20, 1130),
        TokenUsage(1110, 40, 1150),
        TokenUsage(2315, 100, 2415),
    ]
    (completed,) = harness.events("turn_completed")
    assert completed.usage == TokenUsage(2315, 100, 2415)
    assert completed.cost_usd == pytest.approx(0.0425)
    (invocation,) = harness.invocations()
    assert invocation["prompt"] == PROMPT + "\n"
    assert invocation["argv"] == [*FLAGS.split(), "--max-turns", "4"]
    assert invocation["cwd"] == str(harness.workspace)
    assert_gone(harness.pids()[0])


async def test_continuation_turns_resume_the_session_in_the_same_workspace(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path, "claude_multi_turn.json")
    result = await ClaudeStreamRunner().run(harness.request(max_turns=3))

    assert (result.turns, result.session_id) == (3, harness.session_id)
    invocations = harness.invocations()
    assert [i["prompt"] for i in invocations] == [
        PROMPT + "\n",
        continuation(2, 3) + "\n",
        continuation(3, 3) + "\n",
    ]
    assert [i["argv"][-2:] for i in invocations[1:]] == [["--resume", harness.session_id]] * 2
    assert "--resume" not in invocations[0]["argv"]
    assert {i["cwd"] for i in invocations} == {str(harness.workspace)}
    assert harness.activity_asked == 2
    # Each continuation is a new process.
    assert len(harness.pids()) == 3
    assert [u.session_id for u in harness.events("session_started")] == [
        f"{harness.session_id}-{turn}" for turn in (1, 2, 3)
    ]
    completed = harness.events("turn_completed")
    assert [u.usage for u in completed] == [
        TokenUsage(1000, 100, 1100),
        TokenUsage(3000, 300, 3300),
        TokenUsage(7000, 700, 7700),
    ]
    assert [u.cost_usd for u in completed] == [0.5, 0.75, 0.875]
    for pid in harness.pids():
        assert_gone(pid)


async def test_an_inactive_issue_stops_before_the_next_invocation(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_multi_turn.json")
    harness.activity_answers = [False]
    result = await ClaudeStreamRunner().run(harness.request(max_turns=3))

    assert result.turns == 1
    assert len(harness.invocations()) == 1


async def test_max_turns_already_in_the_command_is_kept(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_multi_turn.json")
    command = harness.command(f"{FLAGS} --max-turns 40")
    await ClaudeStreamRunner().run(harness.request(max_turns=2, command=command))

    invocations = harness.invocations()
    assert len(invocations) == 2
    assert all(i["argv"].count("--max-turns") == 1 for i in invocations)
    assert all(i["argv"][i["argv"].index("--max-turns") + 1] == "40" for i in invocations)


# -- failures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "code", "text", "usage", "cost"),
    [
        (
            "claude_failure.json",
            "turn_failed",
            "error_during_execution",
            TokenUsage(50, 5, 55),
            0.01,
        ),
        ("claude_max_turns.json", "max_turns_reached", "--max-turns", TokenUsage(70, 7, 77), 0.02),
        ("claude_error_text.json", "turn_failed", "Invalid API key", TokenUsage(), 0.0),
    ],
)
async def test_failed_results_raise_coded_errors_after_reporting_usage(
    tmp_path: Path, scenario: str, code: str, text: str, usage: TokenUsage, cost: float
) -> None:
    harness = Harness(tmp_path, scenario)
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner().run(harness.request(max_turns=3))
    assert caught.value.code == code
    assert text in caught.value.message
    (failed,) = harness.events("turn_failed")
    assert failed.usage == usage
    assert failed.cost_usd == cost
    assert len(harness.invocations()) == 1


async def test_exit_without_a_result_is_agent_exited(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_early_exit.json")
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner().run(harness.request())
    assert caught.value.code == "agent_exited"
    assert "status 3" in caught.value.message
    assert "fatal: claude crashed" in caught.value.message


async def test_missing_verbose_is_explained(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_normal.json")
    command = harness.command("-p --output-format stream-json")
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner().run(harness.request(command=command))
    assert caught.value.code == "agent_exited"
    assert "add --verbose to the command" in caught.value.message


async def test_a_missing_binary_is_agent_exited(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_normal.json")
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner().run(harness.request(command="no-such-claude-binary -p"))
    assert caught.value.code == "agent_exited"
    assert "status 127" in caught.value.message
    assert "not found" in caught.value.message


async def test_permission_denials_are_reported(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_permission_denials.json")
    await ClaudeStreamRunner().run(harness.request())

    assert "2 tool use(s) denied by the permission settings: Bash, Write" in harness.messages()


# -- hostile output -------------------------------------------------------------------------


async def test_a_12_mb_line_is_read_whole(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_huge_line.json")
    result = await ClaudeStreamRunner().run(harness.request())

    assert result.stop_reason == "success"
    huge = [
        u for u in harness.events("notification") if u.payload and u.payload.get("id") == "msg_huge"
    ]
    assert len(huge) == 1
    assert huge[0].message is not None
    assert huge[0].message.startswith("agent: yyyy")
    assert len(huge[0].message) < 300
    assert "agent: after the huge line" in harness.messages()


async def test_garbage_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_garbage.json")
    result = await ClaudeStreamRunner().run(harness.request())

    assert result.stop_reason == "success"
    malformed = [u.message or "" for u in harness.events("malformed")]
    assert len(malformed) == 2
    assert "not JSON" in malformed[0]
    assert "not an event" in malformed[1]
    assert "claude event mystery_event" in harness.messages()
    assert "agent: survived the garbage" in harness.messages()


async def test_a_line_over_the_limit_is_skipped_and_the_turn_goes_on(tmp_path: Path) -> None:
    scenario = json.loads((SCENARIOS / "claude_huge_line.json").read_text())
    scenario["invocations"][0]["events"][1] = {"_huge_text_bytes": 17 * 1024 * 1024}
    harness = Harness(tmp_path, scenario)
    result = await ClaudeStreamRunner().run(harness.request())

    assert result.stop_reason == "success"
    (malformed,) = harness.events("malformed")
    assert malformed.message is not None
    assert "over 16777216 bytes" in malformed.message
    assert "agent: after the huge line" in harness.messages()


async def test_no_session_id_means_no_continuation(tmp_path: Path) -> None:
    scenario = json.loads((SCENARIOS / "claude_multi_turn.json").read_text())
    for event in scenario["invocations"][0]["events"]:
        event["session_id"] = ""
    harness = Harness(tmp_path, scenario)
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner().run(harness.request(max_turns=2))
    assert caught.value.code == "agent_protocol_error"
    assert "cannot --resume" in caught.value.message
    assert len(harness.invocations()) == 1


# -- timeouts, cancellation, process cleanup ------------------------------------------------


async def test_cancel_kills_a_hung_invocation_and_its_children(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_hang.json")
    child_file = harness.workspace / "claude_child.pid"
    task = asyncio.create_task(ClaudeStreamRunner(terminate_grace_s=0.3).run(harness.request()))
    await wait_until_async(
        lambda: child_file.exists() and "agent: thinking hard" in harness.messages(),
        timeout=30.0,
        what="the fake started its helper and reported progress",
    )
    child_pid = int(child_file.read_text())
    assert psutil.pid_exists(child_pid)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_gone(harness.pids()[0])
    assert_gone(child_pid)


async def test_turn_timeout_stops_a_hung_invocation(tmp_path: Path) -> None:
    harness = Harness(tmp_path, "claude_hang.json")
    with pytest.raises(AgentRunError) as caught:
        await ClaudeStreamRunner(terminate_grace_s=0.2).run(harness.request(turn_timeout_ms=1500))
    assert caught.value.code == "turn_timeout"
    assert "turn_timeout_ms=1500" in caught.value.message
    assert harness.events("turn_failed")
    assert_gone(harness.pids()[0])
    assert_gone(int((harness.workspace / "claude_child.pid").read_text()))


# -- environment ----------------------------------------------------------------------------


def _login_shell_variables() -> set[str]:
    """Variables ``bash -lc`` adds or rewrites on its own, whatever it was given."""
    out = subprocess.run(
        ["bash", "-lc", "env -0"], env={}, capture_output=True, check=True
    ).stdout.decode()
    return {entry.split("=", 1)[0] for entry in out.split("\0") if entry} | {"_", "OLDPWD"}


async def test_every_invocation_gets_exactly_the_request_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORENZ_CONTROLLER_ONLY", "must-not-leak")
    harness = Harness(tmp_path, "claude_multi_turn.json")
    env = agent_environment(
        base={**_minimal_env(), "ANTHROPIC_API_KEY": "agent-key", "GITHUB_TOKEN": "ghp_secret"},
        extra={"LORENZ_ISSUE_IDENTIFIER": "LOR-2", "GH_TOKEN": "ghp_secret", "KEY": "tok-1"},
        secret_values=["tok-1"],
    )
    await ClaudeStreamRunner().run(harness.request(max_turns=2, env=env))

    shell_owned = _login_shell_variables()
    expected = {k: v for k, v in env.items() if k not in shell_owned}
    for index in (0, 1):
        seen = json.loads((harness.workspace / f"claude_env_{index}.json").read_text())
        assert {k: v for k, v in seen.items() if k not in shell_owned} == expected
        assert seen["ANTHROPIC_API_KEY"] == "agent-key"
        for stripped in ("GITHUB_TOKEN", "GH_TOKEN", "KEY", "LORENZ_CONTROLLER_ONLY"):
            assert stripped not in seen


def test_the_factory_builds_this_runner() -> None:
    from lorenz.agents import build_runner

    assert isinstance(build_runner(AgentProtocol.CLAUDE_STREAM_JSON), ClaudeStreamRunner)
