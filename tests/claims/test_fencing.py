"""Generation fencing and spawn intents on every claim store (memory, sqlite, turso).

Two stores stand for two controllers sharing one store: the first leads generation 1, the
second takes over as generation 2. From then on every write of the first is refused with
``claim_generation_stale`` *before* it changes anything — checked in the store's contents,
not by timing. Also: the migration of a schema-1 file (it must open, with its claims intact).
"""

from __future__ import annotations

import dataclasses
import datetime
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.claims import (
    SCHEMA_VERSION,
    ClaimGenerationStale,
    MemoryClaimStore,
    SqlClaimStore,
)
from lorenz.claims.memory import MemoryClaimTable
from lorenz.model import (
    ClaimPhase,
    GenerationFence,
    LorenzError,
    SlotKey,
    SpawnIntent,
    SpawnIntents,
    SpawnPhase,
)
from tests.claims.records import BACKENDS, claim

Store = MemoryClaimStore | SqlClaimStore
OpenAny = Callable[[str], Awaitable[Store]]


@pytest.fixture(params=["memory", *sorted(BACKENDS)])
async def open_any(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenAny]:
    """Stores of any owner on one shared table / file."""
    kind = str(request.param)
    table = MemoryClaimTable()
    opened: list[Store] = []

    async def _open(owner: str) -> Store:
        store: Store
        if kind == "memory":
            store = MemoryClaimStore(owner=owner, table=table)
        else:
            store = await BACKENDS[kind].open(tmp_path / "claims.db", owner=owner)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.close()


async def contents(store: Store) -> Any:
    """Everything a store holds that a write could change, as plain data."""
    if isinstance(store, MemoryClaimStore):
        return (
            sorted((k, r.to_dict()) for k, r in store.claims.items()),
            store._table.checkpoint,
            store._table.fence,
        )
    conn = store._connection()

    def dump() -> Any:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("claims", "owners", "checkpoint", "events", "fence")
        }

    return await store._run(dump)


def intent(handle: str = "lzw-h", phase: SpawnPhase = SpawnPhase.RUNNING, **kw: Any) -> SpawnIntent:
    return SpawnIntent(handle=handle, phase=phase, **kw)


async def test_a_deposed_generation_writes_nothing(open_any: OpenAny) -> None:
    old = await open_any("old")
    assert isinstance(old, GenerationFence)
    assert isinstance(old, SpawnIntents)
    refusals: list[LorenzError] = []
    await old.fence(1, on_fenced=refusals.append)
    assert old.generation == 1
    assert await old.acquire(claim("1")) is True
    assert await old.acquire(claim("2")) is True
    await old.record_intent(SlotKey("1#0"), intent(generation=1))
    await old.save_checkpoint({"n": 1})

    new = await open_any("new")
    await new.fence(2)
    assert await new.acquire(claim("3")) is True
    before = await contents(new)

    attempts: list[Callable[[], Awaitable[object]]] = [
        lambda: old.acquire(claim("4")),
        lambda: old.save(dataclasses.replace(claim("1"), attempt=7)),
        lambda: old.record_intent(SlotKey("1#0"), intent(last_seq=99)),
        lambda: old.release(SlotKey("2#0")),
        lambda: old.take_over(from_owners=["new"]),
        lambda: old.save_checkpoint({"n": 2}),
        lambda: old.heartbeat(),
    ]
    for attempt in attempts:
        with pytest.raises(ClaimGenerationStale) as caught:
            await attempt()
        assert caught.value.code == "claim_generation_stale"
        assert (caught.value.generation, caught.value.current) == (1, 2)
    await old.close()  # a deposed store closes without writing either
    assert await contents(new) == before
    assert [e.code for e in refusals] == ["claim_generation_stale"]  # said once

    # The old generation cannot fence itself back in; the new one keeps writing.
    with pytest.raises(ClaimGenerationStale):
        await (await open_any("old-again")).fence(1)
    await new.save(dataclasses.replace(claim("3"), attempt=2))
    rows = {r.slot_key: r for r in (await new.load()).claims}
    assert rows[SlotKey("3#0")].attempt == 2
    assert rows[SlotKey("3#0")].generation == 2
    assert rows[SlotKey("1#0")].attempt is None  # the old generation's save never landed
    assert rows[SlotKey("1#0")].generation == 1


async def test_one_generation_belongs_to_one_holder(open_any: OpenAny) -> None:
    first = await open_any("a")
    await first.fence(5)
    await first.fence(5)  # the same holder again: fine
    with pytest.raises(ClaimGenerationStale):
        await (await open_any("b")).fence(5)
    assert await first.acquire(claim("1")) is True


async def test_unfenced_writers_are_not_refused(open_any: OpenAny) -> None:
    """A plain run (no leadership) shares the store beside a leader: owner exclusion only."""
    leader = await open_any("leader")
    await leader.fence(3)
    plain = await open_any("plain")
    assert plain.generation is None
    assert await plain.acquire(claim("9")) is True
    (row,) = [r for r in (await leader.load()).claims if r.slot_key == "9#0"]
    assert (row.owner, row.generation) == ("plain", None)


async def test_spawn_intents_round_trip_and_follow_the_claim(open_any: OpenAny) -> None:
    a = await open_any("a")
    b = await open_any("b")
    await a.fence(1)
    await a.acquire(claim("1"))
    await b.acquire(claim("2"))
    written = intent("lzw-x", SpawnPhase.SPAWN_REQUESTED, generation=1, placement="h:22")
    assert await a.record_intent(SlotKey("1#0"), written) is True
    assert await a.record_intent(SlotKey("2#0"), written) is False  # b's claim
    assert await a.record_intent(SlotKey("7#0"), written) is False  # nobody's

    def stored() -> dict[SlotKey, Any]:
        return {r.slot_key: r.intent for r in rows}

    rows = (await b.load()).claims
    got = stored()[SlotKey("1#0")]
    assert got is not None
    assert (got.handle, got.phase, got.generation, got.placement) == (
        "lzw-x",
        SpawnPhase.SPAWN_REQUESTED,
        1,
        "h:22",
    )
    assert got.updated_at is not None  # stamped by the store
    # save() of the running claim keeps the intent; last_seq moves through record_intent.
    await a.save(dataclasses.replace(claim("1"), turn_count=2))
    await a.record_intent(SlotKey("1#0"), dataclasses.replace(written, last_seq=17))
    rows = (await b.load()).claims
    kept = stored()[SlotKey("1#0")]
    assert kept is not None
    assert kept.last_seq == 17
    # Back to a pending retry: the run is settled, nothing to probe.
    await a.save(claim("1", phase=ClaimPhase.RETRY_PENDING, attempt=1))
    rows = (await b.load()).claims
    assert stored()[SlotKey("1#0")] is None
    assert stored()[SlotKey("2#0")] is None


async def test_the_record_dict_carries_generation_and_intent() -> None:
    record = dataclasses.replace(
        claim("1"),
        generation=4,
        intent=intent(
            generation=4, last_seq=3, updated_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        ),
    )
    assert type(record).from_dict(record.to_dict()) == record


# -- schema 1 files open and are migrated ---------------------------------------------------

SCHEMA_1 = (
    "CREATE TABLE claim_store_meta ( key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE claims ("
    " slot_key TEXT PRIMARY KEY, owner TEXT NOT NULL,"
    " issue_id TEXT NOT NULL, identifier TEXT NOT NULL, slot_index INTEGER NOT NULL,"
    " phase TEXT NOT NULL, attempt INTEGER, retry_kind TEXT, due_at TEXT,"
    " reservation_token TEXT, host TEXT, workspace_path TEXT, started_at TEXT,"
    " last_agent_at TEXT, turn_count INTEGER NOT NULL DEFAULT 0,"
    " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,"
    " total_tokens INTEGER NOT NULL DEFAULT 0, last_error TEXT, session_id TEXT,"
    " updated_at TEXT)",
    "CREATE INDEX claims_by_owner ON claims (owner)",
    "CREATE TABLE owners ("
    " owner TEXT PRIMARY KEY, heartbeat_at REAL NOT NULL, pid INTEGER, host TEXT,"
    " started_at REAL)",
    "CREATE TABLE checkpoint ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL, updated_at REAL NOT NULL)",
    "CREATE TABLE events ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, owner TEXT NOT NULL,"
    " kind TEXT NOT NULL, slot_key TEXT, body TEXT)",
    "INSERT INTO claim_store_meta VALUES ('schema_version', '1')",
    "INSERT INTO claims (slot_key, owner, issue_id, identifier, slot_index, phase, attempt,"
    " turn_count, input_tokens, updated_at) VALUES"
    " ('I1#0', 'gone:1:1', 'I1', 'ENG-1', 0, 'RetryPending', 2, 3, 40,"
    " '2026-01-01T00:00:00+00:00')",
    'INSERT INTO checkpoint VALUES (1, \'{"completed": ["I0"]}\', 1)',
)


def write_schema_1(backend: str, path: Path) -> None:
    """A store as Lorenz with schema 1 left it, written by the backend's own engine."""
    if backend == "sqlite":
        raw: Any = sqlite3.connect(path, isolation_level=None)
        raw.execute("PRAGMA journal_mode = WAL")
    else:
        import turso

        raw = turso.connect(
            str(path), experimental_features="multiprocess_wal", isolation_level=None
        )
    for statement in SCHEMA_1:
        raw.execute(statement)
    raw.close()


async def test_a_schema_1_store_opens_migrated(backend: str, store_path: Path) -> None:
    write_schema_1(backend, store_path)
    store = await BACKENDS[backend].open(store_path, owner="me")
    try:
        state = await store.load()
        (row,) = state.claims
        assert (row.slot_key, row.owner, row.phase, row.attempt, row.turn_count) == (
            "I1#0",
            "gone:1:1",
            ClaimPhase.RETRY_PENDING,
            2,
            3,
        )
        assert (row.usage.input_tokens, row.generation, row.intent) == (40, None, None)
        assert state.checkpoint == {"completed": ["I0"]}
        assert [e.body for e in await store.recent_events() if e.kind == "migrate"] == [
            {"from": "1", "to": SCHEMA_VERSION}
        ]
        await store.fence(1)
        assert await store.acquire(claim("2")) is True
        await store.record_intent(SlotKey("2#0"), intent(generation=1))
    finally:
        await store.close()
    again = await BACKENDS[backend].open(store_path, owner="me-2")
    try:
        rows = {r.slot_key: r for r in (await again.load()).claims}
        assert rows[SlotKey("2#0")].intent is not None
        assert await again.integrity_check() == "ok"
    finally:
        await again.close()
