"""Workers outlive their controller; controllers survive their workers; nothing is lost or
repeated. Real processes, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lorenz.workers.client import CallHandlers
from lorenz.workers.handles import LocalTransport, WorkerGone, WorkerHandle, launch
from lorenz.workers.spec import encode_spec
from lorenz.workers.states import ProbeState, probe_local, worker_pid
from tests.waiting import wait_until_async
from tests.workers.conftest import (
    SECRET,
    Collected,
    SpecFactory,
    base_env,
    environ_of,
    process_gone,
)

CONTROLLER = Path(__file__).resolve().parent / "controller_script.py"


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # NB: the controller was killed -9: its last line may be torn; it never counted.
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def start_controller(
    spec_path: Path, state_root: Path, out: Path, after_seq: int = 0
) -> subprocess.Popen[bytes]:
    env = {**base_env(), "LINEAR_API_KEY": SECRET, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(
        [sys.executable, str(CONTROLLER), str(spec_path), str(state_root), str(out),
         str(after_seq)],
        env=env,
        start_new_session=True,  # its own process group, so the test can kill all of it
    )


async def test_kill_9_of_the_controllers_process_group_mid_turn_then_reattach_without_gap(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    spec, scenario = make_spec(
        turns=[{"steps": [{"burst": 50}, {"gate": str(tmp_path / "gate")}, {"burst": 50},
                          {"usage": 7}]}]
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_bytes(encode_spec(spec))
    out1 = tmp_path / "controller1.jsonl"
    controller = start_controller(spec_path, state_root, out1)
    try:
        # Mid-turn: the agent sent its first burst and waits at the gate.
        await wait_until_async(
            lambda: sum(1 for r in read_lines(out1) if r.get("kind") == "agent_update") >= 50,
            timeout=60.0,
            what='sum(1 for r in read_lines(out1) if r.get("kind") == "agent_update") >= 50',
        )
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
    state_dir = state_root / spec.handle
    pid = worker_pid(state_dir)
    assert pid is not None, "the worker survived kill -9 of the controller's process group"
    assert os.getpgid(pid) != controller.pid
    assert not process_gone(scenario.agent_pid()), "and so did its agent, mid-turn"
    collected_before = [r["seq"] for r in read_lines(out1) if "seq" in r]
    last = collected_before[-1]
    # A successor controller re-attaches after the last seq its predecessor collected.
    scenario_gate = tmp_path / "gate"
    out2 = tmp_path / "controller2.jsonl"
    successor = start_controller(spec_path, state_root, out2, after_seq=last)
    try:
        # Attached and live before the agent moves on: what follows arrives live.
        await wait_until_async(
            lambda: any("live" in r for r in read_lines(out2)),
            timeout=60.0,
            what='any("live" in r for r in read_lines(out2))',
        )
        scenario_gate.write_text("open")
        await wait_until_async(
            lambda: any("done" in r for r in read_lines(out2)),
            timeout=60.0,
            what='any("done" in r for r in read_lines(out2))',
        )
    finally:
        if successor.poll() is None:
            successor.wait(timeout=60)
    collected_after = [r["seq"] for r in read_lines(out2) if "seq" in r]
    assert collected_after[0] == last + 1, "no gap"
    assert collected_before + collected_after == list(range(1, collected_after[-1] + 1)), (
        "every record exactly once, in order"
    )
    assert read_lines(out2)[-1]["done"] == "success"
    marks = scenario.marks.read_text().split("\n")
    assert marks.count("start 1") == 1, "the turn was never re-run"


async def test_kill_9_of_the_worker_is_gone_without_a_final_record(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="go")
    handle, result = await launch(
        spec, transport=LocalTransport(state_root=state_root, env=base_env())
    )
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("message") for r in rs
                                            if r.data.get("event") == "notification"))
    assert result.pid is not None
    os.kill(result.pid, signal.SIGKILL)
    with pytest.raises(WorkerGone) as caught:
        await asyncio.wait_for(follow, timeout=60)
    assert caught.value.code == "worker_gone"
    probe = await probe_local(state_root / spec.handle)
    assert probe.state is ProbeState.GONE
    assert collected.records[-1].kind != "final"
    # The orphaned agent finds its stdout closed once it moves on.
    scenario.open_gate("go")
    await wait_until_async(
        lambda: process_gone(scenario.agent_pid()),
        timeout=60.0,
        what="process_gone(scenario.agent_pid())",
    )
    # The same handle is never run a second time: a retry is a new attempt, a new handle.
    from lorenz.workers.launch import WorkerLaunchError

    with pytest.raises(WorkerLaunchError) as refused:
        await LocalTransport(state_root=state_root, env=base_env()).launch(spec)
    assert refused.value.code == "worker_handle_used"


async def test_cancel_with_a_reason_stops_the_agent_runs_after_run_and_records_it(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    from lorenz.workers.spec import HookSpec

    hooks = HookSpec(after_run=f"echo cleaned > {tmp_path}/after", env=base_env())
    spec, scenario = make_spec(gate="never", hooks=hooks)
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    assert await handle.cancel("issue moved to Done")
    final = await asyncio.wait_for(follow, timeout=60)
    assert final.data["outcome"] == "canceled"
    assert final.data["reason"] == "issue moved to Done"
    assert final.data["exit_status"] == 3
    assert [r.data["reason"] for r in collected.records if r.kind == "cancel"] == [
        "issue moved to Done"
    ]
    assert (tmp_path / "after").read_text() == "cleaned\n"
    await wait_until_async(
        lambda: process_gone(scenario.agent_pid()),
        timeout=60.0,
        what="process_gone(scenario.agent_pid())",
    )


async def test_sigterm_to_the_worker_cancels_the_run_cleanly(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="never")
    handle, result = await launch(
        spec, transport=LocalTransport(state_root=state_root, env=base_env())
    )
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    assert result.pid is not None
    os.kill(result.pid, signal.SIGTERM)
    final = await asyncio.wait_for(follow, timeout=60)
    assert final.data["outcome"] == "canceled"
    assert final.data["reason"] == "signal SIGTERM"
    await wait_until_async(
        lambda: process_gone(scenario.agent_pid()),
        timeout=60.0,
        what="process_gone(scenario.agent_pid())",
    )


class TokenTools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def tool_specs(self) -> list[dict[str, Any]]:
        return [{"name": "linear_graphql", "inputSchema": {"type": "object"}}]

    async def call_tool(self, name: str, arguments: Any) -> dict[str, Any]:
        self.calls.append((name, dict(arguments)))
        return {"success": True, "output": json.dumps({"token_tail": SECRET[-4:]})}


async def test_tool_calls_run_in_the_controller_and_the_token_never_reaches_the_worker(
    state_root: Path, make_spec: SpecFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LINEAR_API_KEY", SECRET)
    monkeypatch.setenv("SOME_OTHER_NAME", SECRET)  # stripped by value, whatever its name
    tools = TokenTools()
    spec, scenario = make_spec(
        turns=[{"steps": [
            {"tool": "linear_graphql", "arguments": {"query": "{ viewer { id } }"}},
            {"gate": "/nonexistent-until-cancel"},
        ]}],
        tools=tools.tool_specs(),
    )
    transport = LocalTransport(state_root=state_root, secret_values=[SECRET])
    handle, result = await launch(spec, transport=transport, handlers=CallHandlers(tools=tools))
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.kind == "tool_call" for r in rs))
    assert tools.calls == [("linear_graphql", {"query": "{ viewer { id } }"})]
    await wait_until_async(
        lambda: bool(scenario.answers()),
        timeout=60.0,
        what="bool(scenario.answers())",
    )
    answer = scenario.answers()[0]["answer"]
    assert answer["success"] is True
    assert json.loads(answer["contentItems"][0]["text"]) == {"token_tail": SECRET[-4:]}
    assert result.pid is not None
    assert SECRET.encode() not in environ_of(result.pid)
    agent_environ = environ_of(scenario.agent_pid())
    assert SECRET.encode() not in agent_environ
    assert f"LORENZ_WORKER_HANDLE={spec.handle}".encode() in agent_environ.split(b"\0")
    assert SECRET not in (state_root / spec.handle / "spec.json").read_text()
    await handle.cancel("done")
    await asyncio.wait_for(follow, timeout=60)


async def test_a_tool_call_without_a_controller_fails_after_the_wait_instead_of_hanging(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(
        turns=[{"steps": [{"tool": "linear_graphql", "arguments": {}}]}],
        tools=TokenTools().tool_specs(),
        controller_wait_ms=300,
    )
    await LocalTransport(state_root=state_root, env=base_env()).launch(spec)
    await wait_until_async(
        lambda: bool(scenario.answers()),
        timeout=60.0,
        what="bool(scenario.answers())",
    )
    answer = scenario.answers()[0]["answer"]
    assert answer["success"] is False
    assert "no controller" in answer["contentItems"][0]["text"]


async def test_between_turns_the_worker_asks_the_controller_whether_the_issue_is_active(
    state_root: Path, make_spec: SpecFactory
) -> None:
    asked: list[bool] = []

    async def inactive() -> bool:
        asked.append(True)
        return False

    spec, _scenario = make_spec(max_turns=3)
    handle, _ = await launch(
        spec,
        transport=LocalTransport(state_root=state_root, env=base_env()),
        handlers=CallHandlers(issue_active=inactive),
    )
    final = await handle.follow(Collected())
    assert asked == [True]
    assert final.data["stop_reason"] == "issue_inactive"
    assert final.data["turns"] == 1


async def test_without_a_controller_between_turns_the_run_ends_after_the_wait(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _scenario = make_spec(max_turns=3, controller_wait_ms=300, linger_ms=60000)
    transport = LocalTransport(state_root=state_root, env=base_env())
    await transport.launch(spec)
    state_dir = state_root / spec.handle

    async def finished() -> bool:
        return (await probe_local(state_dir)).state is ProbeState.FINAL

    async with asyncio.timeout(60):
        while not await finished():
            await asyncio.sleep(0.05)
    handle = WorkerHandle(transport=transport, handle=spec.handle)
    collected = Collected()
    final = await handle.follow(collected)
    assert final.data["stop_reason"] == "issue_inactive"
    assert "controller_absent" in collected.kinds()


async def kill_controllers_at_random_points(
    *, kills: int, state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    import random

    rng = random.Random(kills)
    steps: list[dict[str, Any]] = []
    for _ in range(kills * 2):
        steps += [{"burst": 40}, {"sleep": 0.5}]  # outlasts the kills: they land mid-turn
    spec, scenario = make_spec(turns=[{"steps": steps}])
    spec_path = tmp_path / "spec.json"
    spec_path.write_bytes(encode_spec(spec))
    collected: list[int] = []
    for n in range(kills + 1):
        out = tmp_path / f"controller{n}.jsonl"
        after = collected[-1] if collected else 0
        controller = start_controller(spec_path, state_root, out, after_seq=after)
        try:
            if n < kills:
                # Let it collect a random number of new records (or finish), then kill -9.
                goal = rng.randint(1, 60)

                def collected_enough(out: Path = out, goal: int = goal) -> bool:
                    lines = read_lines(out)
                    return sum(1 for r in lines if "seq" in r) >= goal or any(
                        "done" in r for r in lines
                    )

                await wait_until_async(collected_enough, timeout=60.0, what="collected_enough")
                os.killpg(controller.pid, signal.SIGKILL)
            controller.wait(timeout=120)
        finally:
            if controller.poll() is None:
                os.killpg(controller.pid, signal.SIGKILL)
                controller.wait()
        lines = read_lines(out)
        collected += [r["seq"] for r in lines if "seq" in r]
        done = [r for r in lines if "done" in r]
        if done:
            break
    else:
        # The last controller was never killed: it must have seen the end.
        pytest.fail("the run did not finish")
    assert done[0]["done"] == "success", done[0]
    assert collected == list(range(1, collected[-1] + 1)), "no gap, no duplicate, in order"
    assert scenario.marks.read_text().split().count("start") == 1, "never re-run"


async def test_kill_9_of_controllers_at_random_points_loses_and_repeats_nothing(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    await kill_controllers_at_random_points(
        kills=8, state_root=state_root, make_spec=make_spec, tmp_path=tmp_path
    )


@pytest.mark.soak
async def test_soak_kill_9_of_controllers_at_50_random_points(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    await kill_controllers_at_random_points(
        kills=50, state_root=state_root, make_spec=make_spec, tmp_path=tmp_path
    )


async def test_a_frozen_worker_is_unknown_not_gone_and_is_followed_again_once_it_thaws(
    state_root: Path, make_spec: SpecFactory
) -> None:
    from lorenz.workers.handles import WorkerUnknown

    spec, scenario = make_spec(gate="go")
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, result = await launch(spec, transport=transport)
    handle.heartbeat_s = 0.5
    handle.unknown_patience_s = 2.0
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    assert result.pid is not None
    os.kill(result.pid, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerUnknown) as caught:
            await asyncio.wait_for(follow, timeout=120)
        assert caught.value.code == "worker_unknown"
        assert (await probe_local(state_root / spec.handle, timeout_s=1.0)).state is (
            ProbeState.UNKNOWN
        )
    finally:
        os.kill(result.pid, signal.SIGCONT)
    again = WorkerHandle(transport=transport, handle=spec.handle, last_seq=handle.last_seq)
    rest = Collected()
    scenario.open_gate("go")
    final = await asyncio.wait_for(again.follow(rest), timeout=60)
    assert final.data["outcome"] == "success"
    assert collected.seqs() + rest.seqs() == list(range(1, final.seq + 1))
