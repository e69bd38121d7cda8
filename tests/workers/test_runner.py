"""WorkerRunner: the agents port, served by a worker — same updates, results and codes as the
in-process runner; a predecessor's live or finished worker is adopted, never run twice."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import AgentRunError, AgentRunRequest
from lorenz.agents.base import TurnStop
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.config import AgentKindSettings, AgentProtocol
from lorenz.model import AgentUpdate, Issue
from lorenz.workers.handles import LocalTransport
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.spec import HookSpec, RunSpec
from lorenz.workers.states import COLLECTED_NAME, list_handles
from tests.waiting import wait_until_async
from tests.workers.conftest import GATED_CODEX, base_env, process_gone


class Kit:
    def __init__(self, tmp_path: Path, steps: list[dict[str, Any]], max_turns: int = 1) -> None:
        self.dir = tmp_path
        self.marks = tmp_path / "marks"
        self.pid_file = tmp_path / "agent.pid"
        scenario = tmp_path / "scenario.json"
        scenario.write_text(
            json.dumps(
                {
                    "turns": [{"steps": steps}],
                    "marks": str(self.marks),
                    "pid_file": str(self.pid_file),
                }
            )
        )
        self.command = " ".join(
            shlex.quote(p) for p in (sys.executable, str(GATED_CODEX), str(scenario))
        )
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir(exist_ok=True)
        self.updates: list[AgentUpdate] = []
        self.max_turns = max_turns

    def request(self, **changes: Any) -> AgentRunRequest:
        async def active() -> bool:
            return False

        fields: dict[str, Any] = {
            "issue": Issue(id="issue-1", identifier="ABC-1", title="Fix", state="Todo"),
            "attempt": None,
            "slot_index": 0,
            "prompt": "Fix it.",
            "workspace": self.workspace,
            "settings": AgentKindSettings(command=self.command, read_timeout_ms=30000).launch(),
            "max_turns": self.max_turns,
            "env": base_env(),
            "on_update": self.updates.append,
            "issue_is_active": active,
            "continuation_prompt": lambda turn, most: f"continue {turn}/{most}",
        }
        fields.update(changes)
        return AgentRunRequest(**fields)

    def starts(self) -> int:
        return self.marks.read_text().split().count("start") if self.marks.exists() else 0


FAKE_CODEX = Path(__file__).resolve().parent.parent / "fakes" / "codex_agent.py"
"""The scripted Codex app-server of the agent tests (its ``spend`` step keeps spending)."""


def runner(state_root: Path, tmp_path: Path) -> WorkerRunner:
    return WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
    )


def comparable(updates: list[AgentUpdate]) -> list[str]:
    # NB: sorted: session_started races the turn's first notifications in either path.
    return sorted(
        repr((u.event, u.message, u.usage, u.session_id))
        for u in updates
        if u.event != "agent_started"  # names the pid
    )


async def test_the_same_updates_and_result_as_the_in_process_runner(
    state_root: Path, tmp_path: Path
) -> None:
    steps: list[dict[str, Any]] = [{"message": "one"}, {"usage": 42}, {"message": "two"}]
    kit = Kit(tmp_path, steps, max_turns=2)
    result = await runner(state_root, tmp_path).run(kit.request())
    (tmp_path / "inproc").mkdir()
    in_process = Kit(tmp_path / "inproc", steps, max_turns=2)
    expected = await CodexAppServerRunner().run(in_process.request())
    assert (result.turns, result.stop_reason) == (expected.turns, expected.stop_reason)
    assert comparable(kit.updates) == comparable(in_process.updates)
    assert [u.event for u in kit.updates][:2] == ["agent_started", "thread_started"]
    assert kit.updates[-1].event == "turn_completed"


async def test_a_failed_run_raises_the_agents_code(state_root: Path, tmp_path: Path) -> None:
    kit = Kit(tmp_path, [{"fail": "no"}])
    with pytest.raises(AgentRunError) as caught:
        await runner(state_root, tmp_path).run(kit.request())
    assert caught.value.code == "turn_failed"


class HookedRunner(WorkerRunner):
    """A runner whose worker runs hooks itself, as the remote placements' runners do."""

    def __init__(self, *, hooks: HookSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hooks = hooks

    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        return dataclasses.replace(super().spec_for(request, run=run), hooks=self.hooks)


async def test_hooks_the_worker_ran_are_in_the_controllers_log_and_a_failed_after_run_warns(
    state_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kit = Kit(tmp_path, [{"message": "done"}])
    hooked = HookedRunner(
        hooks=HookSpec(before_run="true", after_run="echo disk full >&2; exit 4", env=base_env()),
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
    )
    with caplog.at_level(logging.INFO, logger="lorenz.workers.runner"):
        result = await hooked.run(kit.request())
    assert result.turns == 1, "a failed after_run does not fail the run"
    lines = [r for r in caplog.records if r.name == "lorenz.workers.runner"]
    finished = [r for r in lines if "workspace hook finished hook=before_run" in r.getMessage()]
    failed = [r for r in lines if "workspace hook failed hook=after_run" in r.getMessage()]
    assert len(finished) == 1
    assert finished[0].levelno == logging.INFO
    assert len(failed) == 1
    assert failed[0].levelno == logging.WARNING
    assert "code=workspace_hook_failed" in failed[0].getMessage()
    assert "disk full" in failed[0].getMessage()


async def test_cancelling_the_runner_cancels_the_worker_and_waits_for_its_end(
    state_root: Path, tmp_path: Path
) -> None:
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(tmp_path / "never")}])
    worker_runner = runner(state_root, tmp_path)
    task = asyncio.create_task(worker_runner.run(kit.request()))
    await wait_until_async(
        lambda: any(u.event == "session_started" for u in kit.updates),
        timeout=60.0,
        what='any(u.event == "session_started" for u in kit.updates)',
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_gone(int(kit.pid_file.read_text()))
    (name,) = list_handles(state_root)
    final = json.loads((state_root / name / "journal.jsonl").read_text().splitlines()[-1])
    assert final["data"]["outcome"] == "canceled"
    assert (state_root / name / COLLECTED_NAME).exists()


async def test_a_restarted_controller_adopts_the_live_worker_instead_of_running_again(
    state_root: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(gate)}, {"usage": 9}])
    predecessor = runner(state_root, tmp_path)
    # What the dead controller did: start the worker; it then died without collecting anything.
    await predecessor.transport.launch(predecessor.spec_for(kit.request()))
    await wait_until_async(
        lambda: kit.starts() == 1,
        timeout=60.0,
        what="kit.starts() == 1",
    )
    successor = runner(state_root, tmp_path)
    task = asyncio.create_task(successor.run(kit.request()))
    await wait_until_async(
        lambda: any(u.event == "session_started" for u in kit.updates),
        timeout=60.0,
        what='any(u.event == "session_started" for u in kit.updates)',
    )
    gate.write_text("open")
    result = await asyncio.wait_for(task, timeout=60)
    assert result.turns == 1
    assert kit.starts() == 1, "one agent run, adopted"
    assert kit.updates[0].event == "agent_started", "replayed from the first record"
    assert len(list_handles(state_root)) == 1


async def test_a_predecessors_finished_run_is_settled_from_its_final_record(
    state_root: Path, tmp_path: Path
) -> None:
    kit = Kit(tmp_path, [{"fail": "broke while nobody watched"}])
    predecessor = runner(state_root, tmp_path)
    spec = predecessor.spec_for(kit.request())
    await predecessor.transport.launch(spec)
    probe_root = state_root / spec.handle
    await wait_until_async(
        lambda: b'"kind":"final"' in (probe_root / "journal.jsonl").read_bytes(),
        timeout=60.0,
        what='b\'"kind":"final"\' in (probe_root / "journal.jsonl").read_bytes()',
    )
    with pytest.raises(AgentRunError) as caught:
        await runner(state_root, tmp_path).run(kit.request())
    assert "broke while nobody watched" in caught.value.message
    assert kit.starts() == 1


async def test_a_collected_run_is_not_adopted_again_and_a_continuation_gets_a_new_handle(
    state_root: Path, tmp_path: Path
) -> None:
    kit = Kit(tmp_path, [{"message": "hi"}])
    worker_runner = runner(state_root, tmp_path)
    await worker_runner.run(kit.request(attempt=1))
    await worker_runner.run(kit.request(attempt=1))  # a continuation repeats the attempt
    assert kit.starts() == 2
    names = list_handles(state_root)
    assert len(names) == 2
    assert any("-r1-" in name for name in names)


async def test_finished_state_directories_are_pruned_after_the_retention_but_evidence_stays(
    state_root: Path, tmp_path: Path
) -> None:
    import os
    import time

    from lorenz.workers.journal import JournalWriter
    from lorenz.workers.states import prune_state_dirs

    def state(name: str, *, final: bool, age_s: float) -> None:
        directory = state_root / f"lzw-{name}-s0-a0-g0-000000000000"
        directory.mkdir()
        writer = JournalWriter(directory / "journal.jsonl")
        writer.append("run_started", {})
        if final:
            writer.append("final", {"outcome": "success", "exit_status": 0})
        writer.close()
        old = time.time() - age_s
        os.utime(directory / "journal.jsonl", (old, old))

    state("OLD", final=True, age_s=8 * 24 * 3600)
    state("RECENT", final=True, age_s=60)
    state("DIED", final=False, age_s=8 * 24 * 3600)
    removed = prune_state_dirs(state_root)
    assert removed == ["lzw-OLD-s0-a0-g0-000000000000"]
    assert sorted(list_handles(state_root)) == [
        "lzw-DIED-s0-a0-g0-000000000000",
        "lzw-RECENT-s0-a0-g0-000000000000",
    ]
    # A runner prunes once, on its first run.
    kit = Kit(tmp_path, [{"message": "hi"}])
    worker_runner = WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        retention_s=30,
    )
    await worker_runner.run(kit.request())
    assert "lzw-RECENT-s0-a0-g0-000000000000" not in list_handles(state_root)


async def test_the_launch_is_reported_before_and_after_it_answers(
    state_root: Path, tmp_path: Path
) -> None:
    # Issue #32 point 2: the runtime's stall clock does not run while a worker is launched;
    # the runner says when the launch begins and when it answered — before any agent record.
    kit = Kit(tmp_path, [{"message": "one"}])
    seen: list[tuple[bool, int]] = []
    request = kit.request(on_launch=lambda up: seen.append((up, len(kit.updates))))
    await runner(state_root, tmp_path).run(request)
    assert seen == [(True, 0), (False, 0)]
    assert kit.updates
async def test_a_spend_cap_stops_the_workers_agent_mid_turn(
    state_root: Path, tmp_path: Path
) -> None:
    """A run in a detached worker (the default) is stopped at a spend cap as one in process:
    the stop request cancels the worker's run with its reason, the agent is gone, and the run
    fails with ``budget_exhausted`` after the crossing update (or one more)."""
    record = tmp_path / "codex-record.jsonl"
    scenario = tmp_path / "spend.json"
    scenario.write_text(json.dumps({
        "record": str(record),
        "turns": [{"steps": [{"spend": {"input": 900, "output": 100, "interval_s": 0.3}}]}],
    }))
    command = " ".join(shlex.quote(p) for p in (sys.executable, str(FAKE_CODEX), str(scenario)))
    kit = Kit(tmp_path, [])
    stop = TurnStop()
    usage: list[int] = []

    def on_update(update: AgentUpdate) -> None:
        kit.updates.append(update)
        if update.usage is not None:
            usage.append(update.usage.total_tokens)
            if update.usage.total_tokens >= 3000:
                stop.request(reason="spend cap reached: budget.max_tokens_per_run 3000 tokens")

    request = kit.request(
        settings=AgentKindSettings(command=command, read_timeout_ms=30000).launch(),
        on_update=on_update,
        stop=stop,
    )
    with pytest.raises(AgentRunError) as caught:
        await runner(state_root, tmp_path).run(request)
    assert caught.value.code == "budget_exhausted"
    assert usage[:3] == [1000, 2000, 3000]
    assert len(usage) <= 4  # the crossing update, at most one more
    pids = [u.pid for u in kit.updates if u.pid is not None]
    assert pids
    assert all(process_gone(pid) for pid in pids)
    (name,) = list_handles(state_root)
    final = json.loads((state_root / name / "journal.jsonl").read_text().splitlines()[-1])
    assert final["data"]["outcome"] == "canceled"
    assert "budget.max_tokens_per_run" in json.dumps(final["data"])


@pytest.mark.parametrize("protocol", [AgentProtocol.CLAUDE_STREAM_JSON, AgentProtocol.ACP])
async def test_a_spend_cap_stops_the_workers_claude_or_acp_agent_mid_turn(
    state_root: Path, tmp_path: Path, protocol: AgentProtocol
) -> None:
    """As for Codex above: Claude Code (its process group) and ACP (``session/cancel``, then
    the process group) in a detached worker stop at the update that crosses the cap (or one
    more), and the run fails with ``budget_exhausted``."""
    scenario = tmp_path / "spend.json"
    fakes = FAKE_CODEX.parent
    if protocol is AgentProtocol.CLAUDE_STREAM_JSON:
        scenario.write_text(json.dumps({"invocations": [{"events": [
            {"_spend": {"input": 1000, "output": 100, "interval_s": 0.3}},
        ]}]}))
        fake = fakes / "claude_agent.py"
        flags = " -p --output-format stream-json --verbose"
    else:
        scenario.write_text(json.dumps({
            "session": {"sessionId": "sess-1"},
            "turns": [{"steps": [{"spend": {"cost": 0.1, "interval_s": 0.3}}],
                       "stopReason": "cancelled"}],
        }))
        fake, flags = fakes / "acp_agent.py", ""
    command = " ".join(shlex.quote(p) for p in (sys.executable, str(fake), str(scenario)))
    kit = Kit(tmp_path, [])
    stop = TurnStop()
    spent: list[float] = []

    def on_update(update: AgentUpdate) -> None:
        kit.updates.append(update)
        if protocol is AgentProtocol.CLAUDE_STREAM_JSON and update.usage is not None:
            spent.append(update.usage.total_tokens)
        elif protocol is AgentProtocol.ACP and update.cost_usd is not None:
            spent.append(round(update.cost_usd, 6))
        else:
            return
        if spent[-1] >= (3300 if protocol is AgentProtocol.CLAUDE_STREAM_JSON else 0.3):
            stop.request(reason="spend cap reached: the third update")

    request = kit.request(
        settings=AgentKindSettings(command=command + flags, protocol=protocol,
                                   read_timeout_ms=30000).launch(),
        on_update=on_update,
        stop=stop,
    )
    with pytest.raises(AgentRunError) as caught:
        await runner(state_root, tmp_path).run(request)
    assert caught.value.code == "budget_exhausted"
    first = [1100, 2200, 3300] if protocol is AgentProtocol.CLAUDE_STREAM_JSON else [0.1, 0.2, 0.3]
    assert spent[:3] == first
    assert len(spent) <= 4  # the crossing update, at most one more
    pids = [u.pid for u in kit.updates if u.pid is not None]
    assert pids
    assert all(process_gone(pid) for pid in pids)
    (name,) = list_handles(state_root)
    final = json.loads((state_root / name / "journal.jsonl").read_text().splitlines()[-1])
    assert final["data"]["outcome"] == "canceled"
