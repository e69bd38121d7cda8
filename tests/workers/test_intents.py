"""WorkerRunner records the spawn intent in a real claim store before the worker starts.

A real worker, a real SQLite store: the claim says ``provisioning`` and ``spawn_requested``
with the deterministic handle before ``lorenz worker`` runs, then ``running`` with the journal
seq it collected — recorded before each record reaches the runtime, so a successor re-attaches
after it. A store that refuses the intent (a deposed generation) starts no worker at all; a
deposed runner that is cancelled leaves its live worker running.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lorenz.agents import AgentRunError
from lorenz.claims import SqliteClaimStore
from lorenz.claims.memory import MemoryClaimStore, MemoryClaimTable
from lorenz.model import AgentUpdate, SlotKey, SpawnPhase
from lorenz.workers.handles import LocalTransport
from lorenz.workers.runner import Departure, WorkerRunner
from lorenz.workers.states import list_handles
from tests.claims.records import claim
from tests.waiting import wait_until_async
from tests.workers.conftest import base_env, process_gone
from tests.workers.test_runner import Kit

KEY = SlotKey("issue-1#0")


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[SqliteClaimStore, SqliteClaimStore]]:
    """The controller's store (fenced, generation 1, holding the slot) and an observer."""
    ours = await SqliteClaimStore.open(tmp_path / "claims.db", owner="ctl-1")
    await ours.fence(1)
    await ours.acquire(claim("issue-1"))
    observer = await SqliteClaimStore.open(tmp_path / "claims.db", owner="observer")
    yield ours, observer
    await observer.close()
    await ours.close()


def make_runner(state_root: Path, tmp_path: Path, store: SqliteClaimStore) -> WorkerRunner:
    return WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=1,
        intents=store,
    )


async def phases_of(store: SqliteClaimStore) -> list[tuple[str, str | None, int]]:
    """The intent events of the slot, oldest first: (phase, handle, last_seq)."""
    events = [e for e in await store.recent_events(limit=500) if e.kind == "intent"]
    return [
        (e.body["phase"], e.body["handle"], e.body["last_seq"]) for e in reversed(events) if e.body
    ]


async def test_the_intent_is_recorded_before_the_spawn_and_follows_the_journal(
    state_root: Path, tmp_path: Path, stores: tuple[SqliteClaimStore, SqliteClaimStore]
) -> None:
    ours, observer = stores
    kit = Kit(tmp_path, [{"message": "one"}, {"message": "two"}])
    runner = make_runner(state_root, tmp_path, ours)
    await runner.run(kit.request())
    (name,) = list_handles(state_root)
    seen = await phases_of(observer)
    assert seen[0] == ("provisioning", name, 0)
    assert seen[1] == ("spawn_requested", name, 0)
    assert "-g1-" in name  # the generation is part of the handle
    running = [seq for phase, handle, seq in seen if phase == "running" and handle == name]
    assert running == sorted(running)
    journal = (state_root / name / "journal.jsonl").read_text().splitlines()
    last = json.loads(journal[-1])
    assert last["kind"] == "final"
    # The newest collected seq is what the claim holds at the end.
    (row,) = (await observer.load()).claims
    assert row.intent is not None
    assert (row.intent.phase, row.intent.handle, row.intent.last_seq, row.intent.generation) == (
        SpawnPhase.RUNNING,
        name,
        last["seq"],
        1,
    )


async def test_no_worker_starts_when_the_intent_is_refused(
    state_root: Path, tmp_path: Path, stores: tuple[SqliteClaimStore, SqliteClaimStore]
) -> None:
    ours, observer = stores
    await observer.fence(2)  # a newer leader
    kit = Kit(tmp_path, [{"message": "one"}])
    with pytest.raises(AgentRunError) as caught:
        await make_runner(state_root, tmp_path, ours).run(kit.request())
    assert caught.value.code == "claim_generation_stale"
    assert list_handles(state_root) == []
    assert kit.starts() == 0


async def test_a_deposed_runner_leaves_its_worker_running(
    state_root: Path,
    tmp_path: Path,
    stores: tuple[SqliteClaimStore, SqliteClaimStore],
) -> None:
    ours, observer = stores
    gate = tmp_path / "gate"
    kit = Kit(tmp_path, [{"message": "waiting"}, {"gate": str(gate)}])
    departure = Departure()
    runner = make_runner(state_root, tmp_path, ours)
    runner.leaving = departure
    task = asyncio.create_task(runner.run(kit.request()))
    await wait_until_async(
        lambda: any(u.event == "session_started" for u in kit.updates),
        timeout=60.0,
        what='any(u.event == "session_started" for u in kit.updates)',
    )
    await observer.fence(2)  # deposed: the next intent write is refused
    departure.leave(reason="claim_generation_stale")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(kit.pid_file.read_text())
    assert not process_gone(pid), "the deposed runner killed its live worker's agent"
    gate.write_text("go")
    await wait_until_async(lambda: process_gone(pid), timeout=60, what="process_gone(pid)")


async def test_a_memory_store_holds_each_records_seq_before_the_record_is_relayed(
    state_root: Path, tmp_path: Path
) -> None:
    # NB: the memory store never suspends, so the runner writes its intent at once, without
    # a writer task: the claim names a record's seq before the runtime sees that record.
    store = MemoryClaimStore(owner="ctl-1")
    await store.fence(1)
    await store.acquire(claim("issue-1"))
    kit = Kit(tmp_path, [{"message": "one"}, {"message": "two"}])
    held: list[tuple[str, int]] = []

    def on_update(update: AgentUpdate) -> None:
        intent = store.claims[KEY].intent
        assert intent is not None
        held.append((intent.phase.value, intent.last_seq))
        kit.updates.append(update)

    runner = WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=1,
        intents=store,
    )
    await runner.run(kit.request(on_update=on_update))
    (name,) = list_handles(state_root)
    records = [
        json.loads(line) for line in (state_root / name / "journal.jsonl").read_text().splitlines()
    ]
    relayed = [r["seq"] for r in records if r["kind"] == "agent_update"]
    assert held == [("running", seq) for seq in relayed]
    intent = store.claims[KEY].intent
    assert intent is not None
    assert (intent.phase, intent.handle, intent.last_seq) == (
        SpawnPhase.RUNNING,
        name,
        records[-1]["seq"],
    )


async def test_a_memory_store_that_refuses_an_update_leaves_the_worker_running_to_its_end(
    state_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = MemoryClaimTable()
    ours = MemoryClaimStore(owner="ctl-1", table=table)
    await ours.fence(1)
    await ours.acquire(claim("issue-1"))
    gate = tmp_path / "gate"
    kit = Kit(tmp_path, [{"message": "one"}, {"gate": str(gate)}, {"message": "two"}])
    fenced: list[int] = []

    async def depose() -> None:
        try:
            await wait_until_async(
                lambda: any(u.event == "session_started" for u in kit.updates),
                timeout=60.0,
                what='any(u.event == "session_started" for u in kit.updates)',
            )
            await MemoryClaimStore(owner="ctl-2", table=table).fence(2)  # a newer leader
            fenced.append(len(kit.updates))
        finally:
            gate.write_text("go")

    runner = WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=1,
        intents=ours,
    )
    deposing = asyncio.create_task(depose())
    result = await runner.run(kit.request())
    await deposing
    assert fenced
    assert result.turns == 1
    assert len(kit.updates) > fenced[0]  # relayed although no longer recorded
    assert "spawn intent not recorded" in caplog.text
