"""Every agent protocol against the fake Linear server, through the single-host composition root.

One board for all of them: ENG-1 (Todo) and ENG-2 (In Progress) are active, ENG-3 is Done, and
ENG-4 (Todo) is blocked by ENG-1. A ``--once`` run must dispatch exactly ENG-1 and ENG-2; ENG-1's
agent succeeds (over two turns where the protocol has turns), ENG-2's fails. Everything asserted
comes from outside the code under test: the requests the fake Linear server received, the
prompts and environment each scripted agent wrote down, and the runtime's snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.workflow import continuation_prompt
from tests.e2e.rig import (
    FAKES,
    LinearBoard,
    agent_environ,
    expected_prompt,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    read_jsonl,
    run_host_once,
    seed_linear_board,
    write_workflow,
)
from tests.fakes.linear_server import FakeIssue, FakeLinearServer

E2E = Path(__file__).resolve().parent
MAX_TURNS = 2
LEAK_CANARY = "LEAKED_TRACKER_KEY"
"""An ``agents.<kind>.env`` entry whose value is the tracker key: it must be stripped by value."""


def _dump_env_then(command: str) -> str:
    """Write the agent's environment to ``agent_env.json`` in the workspace, then exec."""
    dump = "import json, os; open('agent_env.json', 'w').write(json.dumps(dict(os.environ)))"
    return f"{python_command('-c', dump)} && exec {command}"


def _codex_command(tmp_path: Path) -> str:
    fake = python_command(FAKES / "codex_agent.py")
    record = 'FAKE_CODEX_RECORD="$PWD/codex_record.jsonl"'
    return _dump_env_then(f"env {record} {fake} {per_issue_scenario_arg(tmp_path)}")


def _codex_prompts(workspace: Path) -> list[str]:
    return [e["text"] for e in read_jsonl(workspace / "codex_record.jsonl") if "turn" in e]


def _acp_command(tmp_path: Path) -> str:
    return f"{python_command(FAKES / 'acp_agent.py')} {per_issue_scenario_arg(tmp_path)}"


def _acp_prompts(workspace: Path) -> list[str]:
    return [
        "".join(block["text"] for block in m["params"]["prompt"])
        for m in read_jsonl(workspace / "acp_received.jsonl")
        if m.get("method") == "session/prompt"
    ]


def _claude_command(tmp_path: Path) -> str:
    # The runner appends --max-turns and --resume; the fake checks both.
    return (
        f"{python_command(FAKES / 'claude_agent.py')} {per_issue_scenario_arg(tmp_path)} "
        "-p --output-format stream-json --verbose"
    )


def _claude_prompts(workspace: Path) -> list[str]:
    return [
        i["prompt"].removesuffix("\n") for i in read_jsonl(workspace / "claude_invocations.jsonl")
    ]


def _command_command(tmp_path: Path) -> str:
    return f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"


def _command_prompts(workspace: Path) -> list[str]:
    stdin = (workspace / "prompt.txt").read_text(encoding="utf-8")
    prompt = (workspace / "prompt_file.txt").read_text(encoding="utf-8")
    assert stdin == prompt + "\n"  # stdin carries the prompt as newline-terminated text
    return [prompt]


def _env_file(name: str) -> Callable[[Path], dict[str, str]]:
    def read(workspace: Path) -> dict[str, str]:
        env: dict[str, str] = json.loads((workspace / name).read_text(encoding="utf-8"))
        return env

    return read


@dataclasses.dataclass(frozen=True)
class AgentCase:
    """One protocol: how to launch its scripted agent and read back what the agent saw."""

    protocol: str
    command: Callable[[Path], str]
    success: str | dict[str, Any]
    failure: str | dict[str, Any]
    prompts: Callable[[Path], list[str]]
    env: Callable[[Path], dict[str, str]]
    success_turns: int
    success_usage: tuple[int, int, int]
    """Exactly what the success scenario reports as the run's usage (input, output, total)."""
    failure_usage: tuple[int, int, int]
    cost_usd: float


CASES = [
    AgentCase(
        protocol="codex-app-server",
        command=_codex_command,
        success="e2e_codex_success.json",
        failure="e2e_codex_failure.json",
        prompts=_codex_prompts,
        env=_env_file("agent_env.json"),
        success_turns=2,
        # Thread totals after turn 2 (120 after turn 1 must not be added on top).
        success_usage=(260, 50, 310),
        failure_usage=(40, 5, 45),
        cost_usd=0.0,
    ),
    AgentCase(
        protocol="acp",
        command=_acp_command,
        success="e2e_acp_success.json",
        failure="e2e_acp_failure.json",
        prompts=_acp_prompts,
        env=_env_file("acp_env.json"),
        success_turns=2,
        # ACP reports usage per prompt turn: 110 + 220.
        success_usage=(300, 30, 330),
        failure_usage=(0, 0, 0),
        cost_usd=0.0,
    ),
    AgentCase(
        protocol="claude-stream-json",
        command=_claude_command,
        success="e2e_claude_success.json",
        failure="e2e_claude_failure.json",
        prompts=_claude_prompts,
        env=_env_file("claude_env_0.json"),
        success_turns=2,
        # One invocation per turn, each with its own result usage: 1100 + 2200; the assistant
        # message usage inside an invocation is not added on top of its result.
        success_usage=(3000, 300, 3300),
        failure_usage=(50, 5, 55),
        cost_usd=0.76,
    ),
    AgentCase(
        protocol="command",
        command=_command_command,
        success={"stdout": ["working"], "exit": 0},
        failure={"stdout": ["trying"], "stderr": "could not build", "exit": 3},
        prompts=_command_prompts,
        env=_env_file("agent_env.json"),
        success_turns=1,  # a command run is one turn whatever agent.max_turns says
        success_usage=(0, 0, 0),
        failure_usage=(0, 0, 0),
        cost_usd=0.0,
    ),
]


def _prompt_for(issue: FakeIssue, linear: FakeLinearServer, *, labels: list[str]) -> str:
    return expected_prompt(
        identifier=issue.identifier,
        title=issue.title,
        state=linear.state_of(issue.identifier),
        priority=issue.priority or None,
        labels=labels,
        description=issue.description,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.protocol for c in CASES])
async def test_once_dispatches_the_eligible_issues_to_each_agent_protocol(
    tmp_path: Path, linear_server: FakeLinearServer, case: AgentCase
) -> None:
    linear = linear_server
    board = seed_linear_board(linear)
    install_scenarios(tmp_path, {"ENG-1": case.success, "ENG-2": case.failure})
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={
            "protocol": case.protocol,
            "command": case.command(tmp_path),
            "env": {"E2E_MARKER": "passed-through", LEAK_CANARY: linear.api_key},
        },
        max_turns=MAX_TURNS,
    )

    run = await run_host_once(
        workflow, environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key)
    )

    assert run.exit_code == 0
    snapshot = run.snapshot
    assert snapshot["app_status"] == "stopped"
    _assert_tracker_reads(linear, board, continuation_checks=case.success_turns - 1)
    _assert_dispatch(run.of_type("run_started"), tmp_path, board)

    # The prompts each agent received, rendered from the issue's fields.
    workspaces = tmp_path / "workspaces"
    first = _prompt_for(board.todo, linear, labels=["backend", "good first issue"])
    continuations = [continuation_prompt(t, MAX_TURNS) for t in range(2, case.success_turns + 1)]
    assert case.prompts(workspaces / "ENG-1") == [first, *continuations]
    assert case.prompts(workspaces / "ENG-2") == [_prompt_for(board.in_progress, linear, labels=[])]

    # Outcomes and retries: a continuation after the success, a failure retry 10 s out.
    [success] = run.history("ENG-1")
    [failure] = run.history("ENG-2")
    assert (success["outcome"], success["attempt"], success["turn_count"]) == (
        "success",
        None,
        case.success_turns,
    )
    assert (failure["outcome"], failure["attempt"]) == ("failed", None)
    continuation = run.retry("ENG-1")
    assert (continuation["kind"], continuation["attempt"]) == ("continuation", 1)
    retry = run.retry("ENG-2")
    assert (retry["kind"], retry["attempt"]) == ("failure", 1)
    assert retry["error"] == failure["error"]
    delays = {e["identifier"]: e["delay_ms"] for e in run.of_type("retry_scheduled")}
    assert set(delays) == {"ENG-1", "ENG-2"}
    assert 900 <= delays["ENG-1"] <= 1000
    assert 9900 <= delays["ENG-2"] <= 10000
    assert not snapshot["running"]

    # Token totals: exactly what the scenarios reported, nothing counted twice.
    assert _usage(success["usage"]) == case.success_usage
    assert _usage(failure["usage"]) == case.failure_usage
    totals = snapshot["usage_totals"]
    assert _usage(totals) == tuple(
        s + f for s, f in zip(case.success_usage, case.failure_usage, strict=True)
    )
    assert totals["cost_usd"] == pytest.approx(case.cost_usd)

    # The tracker secret never reaches an agent, by name or by value.
    for identifier in ("ENG-1", "ENG-2"):
        env = case.env(workspaces / identifier)
        assert env["E2E_MARKER"] == "passed-through"
        assert env["LORENZ_ISSUE_IDENTIFIER"] == identifier
        assert "LINEAR_API_KEY" not in env
        assert LEAK_CANARY not in env
        assert linear.api_key not in env.values()


def _usage(row: dict[str, Any]) -> tuple[int, int, int]:
    return (row["input_tokens"], row["output_tokens"], row["total_tokens"])


def _assert_tracker_reads(
    linear: FakeLinearServer, board: LinearBoard, *, continuation_checks: int
) -> None:
    """One candidate query, the by-id checks between ENG-1's turns, and its exit's read.

    ENG-1 ends cleanly, so one more by-id read decides its slot (still active: continuation);
    ENG-2 fails, which needs no read (a failure always retries with backoff).
    """
    assert not linear.rejected, [r.validation_errors for r in linear.rejected]
    # The raw personal key, never "Bearer <key>".
    assert {r.authorization for r in linear.requests} == {linear.api_key}
    assert {r.status for r in linear.requests} == {200}
    names = [r.operation_name for r in linear.requests]
    # NB: nothing is tracked when the only tick starts, so it reconciles without a request.
    assert names == ["LorenzIssuesByStates"] + ["LorenzIssuesByIds"] * (continuation_checks + 1)
    candidates = linear.requests[0].variables
    assert candidates["projectSlug"] == linear.project_slug
    assert candidates["stateNames"] == ["Todo", "In Progress"]
    for request in linear.requests[1:]:
        assert request.variables["ids"] == [board.todo.id]
        assert request.variables["projectSlug"] == linear.project_slug


def _assert_dispatch(started: list[dict[str, Any]], tmp_path: Path, board: LinearBoard) -> None:
    """ENG-1 and ENG-2 ran once each; the Done and the blocked issue never did."""
    assert sorted(e["identifier"] for e in started) == ["ENG-1", "ENG-2"]
    workspaces = tmp_path / "workspaces"
    for issue in (board.done, board.blocked):
        assert not (workspaces / issue.identifier).exists()
    assert (workspaces / "ENG-1").is_dir()


def test_the_agent_cases_quote_their_commands() -> None:
    """The per-issue scenario argument survives the agent's shell for odd temp paths."""
    odd = Path("/tmp/with space/and'quote")
    for case in CASES:
        words = shlex.split(case.command(odd).replace('"$LORENZ_ISSUE_IDENTIFIER"', "ENG-1"))
        assert "/tmp/with space/and'quote/scenarios/ENG-1.json" in words


async def test_a_typo_in_the_strict_prompt_fails_the_attempt_before_any_agent_starts(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    linear.add_issue("ENG-1", title="Add a greeting", state="Todo")
    install_scenarios(tmp_path, {"ENG-1": {"exit": 0}})
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={"protocol": "command", "command": _command_command(tmp_path)},
        prompt="Work on {{ issue.identifier }}: {{ issue.titel }}",
    )

    run = await run_host_once(
        workflow, environ=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key)
    )

    [failure] = run.history("ENG-1")
    assert failure["outcome"] == "failed"
    assert failure["error"].startswith("template_render_error: prompt for ENG-1 failed to render")
    assert not (tmp_path / "workspaces" / "ENG-1" / "prompt.txt").exists()
    retry = run.retry("ENG-1")
    assert (retry["kind"], retry["attempt"]) == ("failure", 1)
