"""Adoption from a claim's spawn intent: the next controller re-attaches, it never re-runs.

A lost controller's worker is started for real (``transport.launch``, as the dead controller
did); the successor's runner gets the request with ``resume`` — the intent hydration brought
back — under a newer generation. From the journal and the agent's own start marks: the worker
is followed after the intent's ``last_seq`` (nothing relayed twice, nothing skipped), no second
agent starts, a worker that ended while nobody watched is settled from its final record, one
that is gone without one fails the run with ``worker_gone``, and one that cannot be probed is
quarantined (the run stays bound) until it answers again.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import AgentRunError
from lorenz.claims import SqliteClaimStore
from lorenz.model import LorenzError, SpawnIntent, SpawnPhase
from lorenz.workers.handles import LocalTransport
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.states import list_handles, worker_pid
from tests.claims.records import claim
from tests.waiting import wait_until_async
from tests.workers.conftest import base_env, process_gone
from tests.workers.test_runner import Kit


def successor(state_root: Path, tmp_path: Path, **options: object) -> WorkerRunner:
    return WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=2,
        **options,  # type: ignore[arg-type]
    )


async def started_by_lost_controller(state_root: Path, tmp_path: Path, kit: Kit) -> str:
    """What the dead controller did: start the worker under generation 1."""
    lost = WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=1,
    )
    spec = lost.spec_for(kit.request())
    await lost.transport.launch(spec)
    return spec.handle


def journal(state_root: Path, handle: str) -> list[dict[str, Any]]:
    path = state_root / handle / "journal.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def agent_updates_after(state_root: Path, handle: str, seq: int) -> list[str]:
    return [
        str((r["data"] or {}).get("event"))
        for r in journal(state_root, handle)
        if r["kind"] == "agent_update" and int(r["seq"]) > seq
    ]


def intent(handle: str, last_seq: int) -> SpawnIntent:
    return SpawnIntent(handle=handle, phase=SpawnPhase.RUNNING, generation=1, last_seq=last_seq)


async def test_a_resumed_run_re_attaches_after_the_collected_seq_and_starts_nothing(
    state_root: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(gate)}, {"message": "done"}])
    handle = await started_by_lost_controller(state_root, tmp_path, kit)
    await wait_until_async(
        lambda: "session_started" in agent_updates_after(state_root, handle, 0),
        timeout=60,
        what='"session_started" in agent_updates_after(state_root, handle, 0)',
    )
    # The lost controller had collected everything up to the thread's start.
    collected = next(
        int(r["seq"])
        for r in journal(state_root, handle)
        if r["kind"] == "agent_update"
        and (r["data"] or {}).get("event") == "thread_started"
    )
    task = asyncio.create_task(
        successor(state_root, tmp_path).run(kit.request(resume=intent(handle, collected)))
    )
    await wait_until_async(
        lambda: any(u.event == "session_started" for u in kit.updates),
        timeout=60,
        what='any(u.event == "session_started" for u in kit.updates)',
    )
    gate.write_text("open")
    result = await asyncio.wait_for(task, timeout=60)
    assert result.turns == 1
    assert kit.starts() == 1, "the agent ran once: adopted, not started again"
    assert list_handles(state_root) == [handle], "no worker under the new generation"
    relayed = [u.event for u in kit.updates]
    # NB: the journal's order after the thread's start is the agent's own (its message and the
    # turn's start race under load); what matters is that exactly the records after the
    # collected seq are relayed, in the journal's order, and none at or before it.
    assert relayed == agent_updates_after(state_root, handle, collected)
    assert "notification" in relayed
    assert "session_started" in relayed
    assert "agent_started" not in relayed
    assert "thread_started" not in relayed


async def test_a_resumed_run_whose_worker_finished_unwatched_settles_from_its_final_record(
    state_root: Path, tmp_path: Path
) -> None:
    kit = Kit(tmp_path, [{"fail": "broke while nobody watched"}])
    handle = await started_by_lost_controller(state_root, tmp_path, kit)
    await wait_until_async(
        lambda: any(r["kind"] == "final" for r in journal(state_root, handle)),
        timeout=60,
        what='any(r["kind"] == "final" for r in journal(state_root, handle))',
    )
    with pytest.raises(AgentRunError) as caught:
        await successor(state_root, tmp_path).run(kit.request(resume=intent(handle, 1)))
    assert "broke while nobody watched" in caught.value.message
    assert kit.starts() == 1
    assert list_handles(state_root) == [handle]


async def test_a_resumed_run_whose_worker_is_gone_fails_with_worker_gone_and_starts_nothing(
    state_root: Path, tmp_path: Path
) -> None:
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(tmp_path / "never")}])
    handle = await started_by_lost_controller(state_root, tmp_path, kit)
    # NB: the agent writes its pid file when it starts, its start mark only at ``turn/start``:
    # wait for the mark, or the kill can land before the turn began (it did in a full run).
    await wait_until_async(
        lambda: kit.starts() == 1 and worker_pid(state_root / handle) is not None,
        timeout=60,
        what="kit.starts() == 1 and worker_pid(state_root / handle) is not None",
    )
    pid = worker_pid(state_root / handle)
    assert pid is not None
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    await wait_until_async(lambda: process_gone(pid), timeout=60, what="process_gone(pid)")
    with pytest.raises(LorenzError) as caught:
        await successor(state_root, tmp_path).run(kit.request(resume=intent(handle, 0)))
    assert caught.value.code == "worker_gone"
    assert kit.starts() == 1, "a gone worker is a failure retry, not a silent second start"
    assert list_handles(state_root) == [handle]


async def test_an_intent_naming_another_slots_worker_is_not_attached_to(
    state_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    other = Kit(tmp_path / "other", [{"message": "not yours"}])
    foreign = await started_by_lost_controller(state_root, tmp_path, other)  # slot 0
    await wait_until_async(
        lambda: any(r["kind"] == "final" for r in journal(state_root, foreign)),
        timeout=60,
        what='any(r["kind"] == "final" for r in journal(state_root, foreign))',
    )
    kit = Kit(tmp_path, [{"message": "mine"}])
    await successor(state_root, tmp_path).run(
        kit.request(slot_index=1, resume=intent(foreign, 0))
    )
    messages = " ".join(u.message or "" for u in kit.updates)
    assert "mine" in messages
    assert "not yours" not in messages
    assert len(list_handles(state_root)) == 2


async def test_an_unreachable_worker_is_quarantined_in_the_claim_and_followed_when_it_thaws(
    state_root: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(gate)}, {"message": "done"}])
    handle = await started_by_lost_controller(state_root, tmp_path, kit)
    await wait_until_async(
        lambda: worker_pid(state_root / handle) is not None,
        timeout=60.0,
        what="worker_pid(state_root / handle) is not None",
    )
    store = await SqliteClaimStore.open(tmp_path / "claims.db", owner="ctl-2")
    try:
        await store.fence(2)
        await store.acquire(claim("issue-1"))
        runner = successor(
            state_root,
            tmp_path,
            intents=store,
            heartbeat_s=0.5,
            unknown_patience_s=1.0,
            quarantine_probe_s=0.2,
        )
        task = asyncio.create_task(runner.run(kit.request(resume=intent(handle, 0))))
        await wait_until_async(
            lambda: any(u.event == "session_started" for u in kit.updates),
            timeout=60,
            what='any(u.event == "session_started" for u in kit.updates)',
        )
        pid = worker_pid(state_root / handle)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            await wait_until_async(
                lambda: any(u.event == "worker_quarantined" for u in kit.updates),
                timeout=120,
                what='any(u.event == "worker_quarantined" for u in kit.updates)',
            )
            [row] = (await store.load()).claims
            assert row.intent is not None
            assert (row.intent.phase, row.intent.handle) == (SpawnPhase.QUARANTINED, handle)
            assert not task.done(), "a quarantined run stays bound: no retry beside the worker"
        finally:
            os.kill(pid, signal.SIGCONT)
        gate.write_text("open")
        result = await asyncio.wait_for(task, timeout=120)
        assert result.turns == 1
        assert kit.starts() == 1
        events = [u.event for u in kit.updates]
        assert events.count("session_started") == 1, "nothing relayed twice"
        assert events.count("agent_started") == 1
        [row] = (await store.load()).claims
        assert row.intent is not None
        assert row.intent.phase is SpawnPhase.RUNNING
    finally:
        await store.close()
