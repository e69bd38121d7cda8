"""Spend control in the run loop, against scripted agents that keep spending until stopped.

A run that crosses a cap is stopped mid-turn within one usage update (Codex: ``turn/interrupt``;
ACP: ``session/cancel``; Claude Code and a ``command`` agent: its process group), fails with
``budget_exhausted``, is not retried, and ``budget.on_exhausted`` runs once; an issue at its
cap, or any issue while the day's budget is spent, waits in the ``budget`` lane until a reload
raises the cap. The ledger (sqlite here) is the truth across a restart.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path
from typing import Any

import psutil

from lorenz.claims.sqlite import SqliteClaimStore
from lorenz.model import BlockReason, Issue, slot_key
from lorenz.policies.budget import day_key
from tests.agents.conftest import FAKE_CODEX, FAKES, assert_gone, python_command
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

WAIT_S = 60.0
"""Generous: agents spend every 0.2-0.5 s, on a loaded machine."""

KEY = slot_key("id-1", 0)


def issue(number: int = 1) -> Issue:
    return Issue(
        id=f"id-{number}", identifier=f"T-{number}", title="t", state="Todo", priority=2,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


def spending_agent(tmp_path: Path, *, tokens: int = 1000, usd: float = 0.1) -> Path:
    """A ``command`` agent that reports ever-growing running totals (``LORENZ_USAGE_FILE``)
    every 0.2 s, and notes each line it wrote, until it is killed."""
    return write_agent(
        tmp_path,
        "spender",
        f"""
        usage = pathlib.Path(env['LORENZ_USAGE_FILE'])
        n = 0
        while True:
            n += 1
            with usage.open('a') as out:
                out.write(json.dumps({{'input_tokens': n * {tokens}, 'output_tokens': 0,
                                       'cost_usd': n * {usd}, 'model': 'gpt-5'}}) + '\\n')
            note('lines', str(n))
            note('pid', str(os.getpid()))
            time.sleep(0.2)
        """,
    )


def codex_workflow(tmp_path: Path, *, budget: dict[str, Any]) -> tuple[Path, Path]:
    """A workflow whose agent is the scripted Codex app-server, spending 1000 tokens (300
    of them cached) per update every 0.3 s until interrupted."""
    record = tmp_path / "codex-record.jsonl"
    scenario = tmp_path / "codex-scenario.json"
    scenario.write_text(json.dumps({
        "model": "gpt-5.1-codex",
        "record": str(record),
        "turns": [{"steps": [{"spend": {
            "input": 900, "cached": 300, "output": 100, "interval_s": 0.3,
        }}]}],
    }))
    agent = write_agent(tmp_path, "unused", "pass\n")
    path = write_workflow(tmp_path, agent_script=agent, front_matter={
        "agents": {"test": {
            "protocol": "codex-app-server",
            "command": python_command(FAKE_CODEX, str(scenario)),
            "stall_timeout_ms": 60000,
            "turn_timeout_ms": 60000,
        }},
        "budget": budget,
    })
    return path, record


def scripted_workflow(
    tmp_path: Path, *, protocol: str, command: str, budget: dict[str, Any]
) -> Path:
    agent = write_agent(tmp_path, "unused", "pass\n")
    return write_workflow(tmp_path, agent_script=agent, front_matter={
        "agents": {"test": {
            "protocol": protocol,
            "command": command,
            "stall_timeout_ms": 60000,
            "turn_timeout_ms": 60000,
        }},
        "budget": budget,
    })


def processes_running(marker: str) -> list[int]:
    """Pids of live processes whose command line names ``marker`` (a scenario's path)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


async def wait_for(condition: Any, *, what: str) -> None:
    await wait_until_async(condition, timeout=WAIT_S, what=what)


async def stop(rig: RuntimeRig, task: asyncio.Task[None]) -> None:
    rig.runtime.stop()
    await asyncio.wait_for(task, WAIT_S)


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


async def test_codex_run_is_interrupted_at_its_token_cap_and_blocked(tmp_path: Path) -> None:
    workflow, record = codex_workflow(tmp_path, budget={"max_tokens_per_run": 3000, "warn_at": 0.6})
    rig = build_rig(workflow, issues=[issue()])
    state = rig.orchestrator.state
    task = asyncio.create_task(rig.runtime.start())
    try:
        await wait_for(lambda: KEY in state.blocked and rig.of_type("slot_blocked"),
                       what="the slot to be blocked")
        await rig.runtime.spending.flush()
    finally:
        await stop(rig, task)
    assert state.blocked[KEY].reason is BlockReason.BUDGET_EXHAUSTED
    assert state.blocked[KEY].error_code == "budget_exhausted"
    assert KEY not in state.retry_attempts  # not retried
    (exhausted,) = rig.of_type("budget_exhausted")
    assert exhausted["reason"] == "tokens_per_run"
    (failed,) = rig.of_type("run_failed")
    assert failed["message"].startswith("budget_exhausted"), failed
    assert len(rig.of_type("run_started")) == 1
    warnings = rig.of_type("budget_warning")
    assert [w["reason"] for w in warnings] == ["tokens_per_run"]  # at 60 % (2000 tokens): once
    # Mid-turn, the Codex way: one turn/interrupt, after the crossing update or one more.
    received = [r["received"] for r in records(record) if "received" in r]
    assert [m["method"] for m in received].count("turn/interrupt") == 1
    (stopped_after,) = [r["interrupted_after"] for r in records(record) if "interrupted_after" in r]
    assert 3 <= stopped_after <= 4
    spent = await rig.runtime.spending.ledger.issue_spend("id-1")
    assert spent.tokens in (3000, 4000)  # the crossing update, at most one more
    # Priced with the model the agent reported: 600 input, 300 cached, 100 output per update.
    per_update = (600 * 1.25 + 300 * 0.125 + 100 * 10.0) / 1e6
    assert abs(spent.usd - per_update * spent.tokens / 1000) < 1e-9
    day = await rig.runtime.spending.ledger.day_spend(day_key(datetime.datetime.now(datetime.UTC)))
    assert day.tokens == spent.tokens
    pids = [r["pid"] for r in records(record) if "pid" in r]
    assert_gone(pids)


async def test_command_agent_stopped_at_the_issue_cap_then_held_until_the_cap_is_raised(
    tmp_path: Path,
) -> None:
    agent = spending_agent(tmp_path)
    workflow = write_workflow(tmp_path, agent_script=agent, front_matter={
        "budget": {"max_usd_per_issue": 0.5, "on_exhausted": "block"},
    })
    rig = build_rig(workflow, issues=[issue()])
    state = rig.orchestrator.state
    workspace = tmp_path / "workspaces" / "T-1"
    task = asyncio.create_task(rig.runtime.start())
    try:
        await wait_for(lambda: KEY in state.blocked, what="the slot to be blocked")
        await rig.runtime.spending.flush()
        spent = await rig.runtime.spending.ledger.issue_spend("id-1")
        # The agent's own cost wins; the fifth line crossed 0.5 USD, a sixth may have been read.
        assert 0.5 - 1e-9 <= spent.usd <= 0.6 + 1e-9
        lines = int((workspace / "lines").read_text())
        assert 5 <= lines <= 7
        assert_gone([int((workspace / "pid").read_text())])
        assert [e["reason"] for e in rig.of_type("budget_exhausted")] == ["usd_per_issue"]
        # A refresh unblocks the slot, but the issue is at its cap: the budget lane holds it.
        rig.runtime.request_refresh()
        await wait_for(lambda: rig.of_type("budget_held"), what="the issue to be held")
        lane = rig.runtime.snapshot().to_dict()["budget"]
        (held,) = lane["held"]
        assert (held["issue_identifier"], held["cap"]) == ("T-1", "usd_per_issue")
        assert held["limit"] == 0.5
        assert held["spent"] == round(spent.usd, 6)
        assert len(rig.of_type("run_started")) == 1
        (row,) = lane["issues"]
        assert row["issue_identifier"] == "T-1"
        # Raising the cap (a reload) releases it: it runs again, and is stopped at the new cap.
        text = workflow.read_text().replace("max_usd_per_issue: 0.5", "max_usd_per_issue: 0.9")
        workflow.write_text(text)
        await wait_for(lambda: len(rig.of_type("run_started")) == 2, what="the second run")
        await wait_for(lambda: len(rig.of_type("budget_exhausted")) == 2, what="the new cap")
        await rig.runtime.spending.flush()
        again = await rig.runtime.spending.ledger.issue_spend("id-1")
        assert 0.9 - 1e-9 <= again.usd <= 1.0 + 1e-9
    finally:
        await stop(rig, task)


async def test_the_days_budget_holds_every_issue_and_survives_a_restart(tmp_path: Path) -> None:
    agent = spending_agent(tmp_path, usd=0.2)
    workflow = write_workflow(tmp_path, agent_script=agent, front_matter={
        "budget": {"max_usd_per_day": 0.6},
        "agent": {"max_concurrent_agents": 1},
    })
    db = tmp_path / "claims.db"
    store = await SqliteClaimStore.open(db, owner="host:1:first")
    rig = build_rig(workflow, issues=[issue(1), issue(2)], store=store)
    task = asyncio.create_task(rig.runtime.start())
    try:
        await wait_for(lambda: rig.of_type("budget_exhausted"), what="the day's cap")
        await wait_for(lambda: len(rig.of_type("budget_held")) >= 1, what="the other issue held")
    finally:
        await stop(rig, task)  # graceful: every charge is written before it returns
    await store.close()
    today = day_key(datetime.datetime.now(datetime.UTC))
    assert len(rig.of_type("run_started")) == 1
    (held,) = rig.of_type("budget_held")
    assert held["reason"] == "usd_per_day"

    # A new process on the same store continues the day's count: nothing is dispatched.
    again = await SqliteClaimStore.open(db, owner="host:2:second")
    day = await again.day_spend(today)
    assert 0.6 - 1e-9 <= day.usd <= 0.8 + 1e-9
    second = build_rig(workflow, issues=[issue(1), issue(2)], store=again)
    task = asyncio.create_task(second.runtime.start())
    try:
        await wait_for(lambda: len(second.of_type("budget_held")) == 2, what="both issues held")
        lane = second.runtime.snapshot().to_dict()["budget"]
        assert {row["cap"] for row in lane["held"]} == {"usd_per_day"}
        assert lane["remaining_usd"] == 0.0
        assert second.of_type("run_started") == []
    finally:
        await stop(second, task)
        await again.close()


async def test_no_caps_no_budget_block_in_the_snapshot_and_runs_as_before(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", "print('done', flush=True)\n")
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(workflow, issues=[issue()])
    await rig.runtime.start(once=True)
    assert "budget" not in rig.runtime.snapshot().to_dict()
    assert len(rig.of_type("run_finished")) == 1
    assert rig.of_type("budget_warning") == []
    assert rig.of_type("budget_held") == []



async def test_claude_run_is_stopped_at_its_token_cap_mid_turn(tmp_path: Path) -> None:
    """Claude Code (stream-json): an assistant message with usage every 0.3 s, forever; the
    update that crosses the cap stops the run by its process group, mid-turn."""
    scenario = tmp_path / "claude-scenario.json"
    scenario.write_text(json.dumps({"invocations": [{"events": [
        {"type": "system", "subtype": "init", "model": "claude-sonnet-4-5", "tools": []},
        {"_spend": {"input": 1000, "output": 100, "interval_s": 0.3}},
    ]}]}))
    command = python_command(FAKES / "claude_agent.py", str(scenario))
    workflow = scripted_workflow(
        tmp_path, protocol="claude-stream-json",
        command=f"{command} -p --output-format stream-json --verbose",
        budget={"max_tokens_per_run": 3300},
    )
    rig = build_rig(workflow, issues=[issue()])
    state = rig.orchestrator.state
    task = asyncio.create_task(rig.runtime.start())
    try:
        await wait_for(lambda: KEY in state.blocked, what="the slot to be blocked")
        await rig.runtime.spending.flush()
    finally:
        await stop(rig, task)
    assert state.blocked[KEY].reason is BlockReason.BUDGET_EXHAUSTED
    assert KEY not in state.retry_attempts
    assert [e["reason"] for e in rig.of_type("budget_exhausted")] == ["tokens_per_run"]
    (failed,) = rig.of_type("run_failed")
    assert failed["message"].startswith("budget_exhausted"), failed
    assert len(rig.of_type("run_started")) == 1
    spent = await rig.runtime.spending.ledger.issue_spend("id-1")
    assert spent.tokens in (3300, 4400)  # the crossing update, at most one more
    # The process group is gone, and it wrote at most one update after the crossing one (the
    # one it may have written while its stop was on the way).
    assert processes_running(str(scenario)) == []
    written = records(tmp_path / "workspaces" / "T-1" / "claude_spend.jsonl")
    assert 3 <= len(written) <= 5


async def test_acp_run_is_cancelled_at_the_issue_cap_mid_turn(tmp_path: Path) -> None:
    """ACP: a ``usage_update`` whose cumulative cost grows 0.1 USD every 0.3 s until the
    client cancels; the update that crosses the cap sends ``session/cancel``, once."""
    scenario = tmp_path / "acp-scenario.json"
    scenario.write_text(json.dumps({
        "session": {"sessionId": "sess-1"},
        "turns": [{"steps": [{"spend": {"cost": 0.1, "interval_s": 0.3}}],
                   "stopReason": "cancelled"}],
    }))
    workflow = scripted_workflow(
        tmp_path, protocol="acp",
        command=python_command(FAKES / "acp_agent.py", str(scenario)),
        budget={"max_usd_per_issue": 0.5},
    )
    rig = build_rig(workflow, issues=[issue()])
    state = rig.orchestrator.state
    task = asyncio.create_task(rig.runtime.start())
    try:
        await wait_for(lambda: KEY in state.blocked, what="the slot to be blocked")
        await rig.runtime.spending.flush()
    finally:
        await stop(rig, task)
    assert state.blocked[KEY].reason is BlockReason.BUDGET_EXHAUSTED
    assert KEY not in state.retry_attempts
    assert [e["reason"] for e in rig.of_type("budget_exhausted")] == ["usd_per_issue"]
    (failed,) = rig.of_type("run_failed")
    assert failed["message"].startswith("budget_exhausted"), failed
    assert len(rig.of_type("run_started")) == 1
    spent = await rig.runtime.spending.ledger.issue_spend("id-1")
    assert 0.5 - 1e-9 <= spent.usd <= 0.6 + 1e-9  # the crossing update, at most one more
    written = records(tmp_path / "workspaces" / "T-1" / "acp_spend.jsonl")
    (cancelled_after,) = [r["cancelled_after"] for r in written if "cancelled_after" in r]
    assert 5 <= cancelled_after <= 6
    assert processes_running(str(scenario)) == []
