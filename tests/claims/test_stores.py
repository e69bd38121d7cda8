"""The ClaimStore contract on the durable backends (sqlite and turso, one file, many owners)."""

from __future__ import annotations

import dataclasses
import datetime
import sqlite3
from pathlib import Path

import pytest

from lorenz.claims import (
    DEFAULT_OWNER_STALE_MS,
    SCHEMA_VERSION,
    ClaimOwnerLost,
    ClaimStoreBusy,
    ClaimStoreSchemaUnsupported,
    ClaimStoreUnreadable,
)
from lorenz.model import ClaimPhase, ManualClock, RetryKind, SlotKey, TokenUsage
from tests.claims.records import BACKENDS, OpenStore, claim, keys_of

T0 = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)


def clock_at(offset_ms: float = 0) -> ManualClock:
    return ManualClock(wall=T0 + datetime.timedelta(milliseconds=offset_ms))


async def test_acquire_free_slot_then_refuse_other_owner(open_store: OpenStore) -> None:
    a = await open_store("a")
    b = await open_store("b")
    assert await a.acquire(claim("1")) is True
    assert await b.acquire(claim("1")) is False
    assert await a.acquire(claim("1", phase=ClaimPhase.RETRY_PENDING)) is True  # ours already
    state = await b.load()
    assert [(c.slot_key, c.owner, c.phase) for c in state.claims] == [
        ("1#0", "a", ClaimPhase.RETRY_PENDING)
    ]


async def test_save_never_overwrites_another_owner(open_store: OpenStore) -> None:
    a = await open_store("a")
    b = await open_store("b")
    await a.acquire(claim("1"))
    await b.save(dataclasses.replace(claim("1"), attempt=9, last_error="b was here"))
    (row,) = (await a.load()).claims
    assert (row.owner, row.attempt, row.last_error) == ("a", None, None)


async def test_save_updates_our_claim(open_store: OpenStore) -> None:
    a = await open_store("a")
    await a.acquire(claim("1"))
    await a.save(dataclasses.replace(claim("1"), attempt=2, turn_count=3))
    (row,) = (await a.load()).claims
    assert (row.attempt, row.turn_count) == (2, 3)


async def test_release_only_drops_our_own_claim(open_store: OpenStore) -> None:
    a = await open_store("a")
    b = await open_store("b")
    await a.acquire(claim("1"))
    await b.acquire(claim("2"))
    await b.release(SlotKey("1#0"))  # not b's: no-op
    await a.release(SlotKey("9#0"))  # absent: no-op
    assert keys_of((await a.load()).claims) == {"1#0", "2#0"}
    await a.release(SlotKey("1#0"))
    assert keys_of((await a.load()).claims) == {"2#0"}
    assert await b.acquire(claim("1")) is True


async def test_every_claim_field_round_trips(open_store: OpenStore) -> None:
    a = await open_store("a")
    record = dataclasses.replace(
        claim("ENG#7", 2, phase=ClaimPhase.RETRY_PENDING, attempt=3),
        retry_kind=RetryKind.FAILURE,
        due_at=T0 + datetime.timedelta(seconds=40),
        reservation_token="tok-1",
        host="worker-1:22",
        workspace_path="/w/ENG-7",
        started_at=T0,
        last_agent_at=T0 + datetime.timedelta(seconds=5),
        turn_count=4,
        usage=TokenUsage(input_tokens=10, output_tokens=20, total_tokens=30),
        last_error="turn_timeout",
        session_id="thread-1-turn-2",
        updated_at=T0 + datetime.timedelta(seconds=6),
    )
    assert await a.acquire(record)
    (loaded,) = (await a.load()).claims
    assert loaded == dataclasses.replace(record, owner="a")


async def test_checkpoint_round_trip_and_survives_reopen(
    open_store: OpenStore, backend: str, store_path: Path
) -> None:
    a = await open_store("a")
    assert (await a.load()).checkpoint is None
    await a.save_checkpoint({"totals": {"input_tokens": 5}, "completed": ["1", "2"]})
    await a.save_checkpoint({"totals": {"input_tokens": 7}, "completed": ["1", "2", "3"]})
    await a.close()
    again = await BACKENDS[backend].open(store_path, owner="b")
    try:
        assert (await again.load()).checkpoint == {
            "totals": {"input_tokens": 7},
            "completed": ["1", "2", "3"],
        }
    finally:
        await again.close()


async def test_checkpoint_must_be_json(open_store: OpenStore) -> None:
    a = await open_store("a")
    with pytest.raises(TypeError):
        await a.save_checkpoint({"when": T0})


async def test_event_table_keeps_only_the_last_n(open_store: OpenStore) -> None:
    a = await open_store("a", events_kept=20)
    for i in range(30):
        await a.acquire(claim(str(i)))
    await a.release(SlotKey("29#0"))
    events = await a.recent_events(limit=1000)
    assert len(events) == 20
    assert [e.kind for e in events[:2]] == ["release", "acquire"]
    assert events[0].slot_key == "29#0"
    assert events[1].body["slot_key"] == "29#0"
    assert events[1].body["owner"] == "a"
    assert [e.id for e in events] == list(range(events[0].id, events[0].id - 20, -1))


async def test_refused_and_no_op_writes_record_no_event(open_store: OpenStore) -> None:
    a = await open_store("a")
    b = await open_store("b")
    await a.acquire(claim("1"))
    before = await a.recent_events(limit=1000)
    assert await b.acquire(claim("1")) is False
    await b.save(claim("1"))
    await b.release(SlotKey("1#0"))
    assert await a.recent_events(limit=1000) == before


async def test_default_stale_threshold(open_store: OpenStore) -> None:
    a = await open_store("a")
    assert a.owner_stale_ms == DEFAULT_OWNER_STALE_MS == 30_000
    b = await open_store("b", owner_stale_ms=1234)
    assert b.owner_stale_ms == 1234


async def test_stale_owner_is_reported_and_taken_over(open_store: OpenStore) -> None:
    dead = await open_store("dead", clock=clock_at(0))
    await dead.acquire(claim("1"))
    await dead.acquire(claim("2", phase=ClaimPhase.RETRY_PENDING, attempt=2))
    heir = await open_store("heir", clock=clock_at(29_000), owner_stale_ms=30_000)
    assert (await heir.load()).stale_owners == frozenset()  # 29 s: still live
    assert await heir.take_over(from_owners=["dead"]) == []
    late = await open_store("late", clock=clock_at(31_000), owner_stale_ms=30_000)
    state = await late.load()
    assert "dead" in state.stale_owners
    assert await late.acquire(claim("1")) is False  # stale rows are never silently stolen
    taken = await late.take_over(from_owners=state.stale_owners)
    assert keys_of(taken) == {"1#0", "2#0"}
    assert {r.owner for r in taken} == {"late"}
    assert {r.slot_key: r.attempt for r in taken} == {"1#0": None, "2#0": 2}
    assert {c.owner for c in (await late.load()).claims} == {"late"}
    # The old owner's writes are now no-ops, and its heartbeat row is gone.
    await dead.save(dataclasses.replace(claim("1"), last_error="zombie"))
    await dead.release(SlotKey("2#0"))
    rows = {c.slot_key: c for c in (await late.load()).claims}
    assert rows[SlotKey("1#0")].last_error is None
    assert set(rows) == {"1#0", "2#0"}
    assert "dead" not in (await late.stale_owners())


async def test_heartbeat_after_being_taken_over_says_so_once(open_store: OpenStore) -> None:
    sleeper = await open_store("sleeper", clock=clock_at(0))
    await sleeper.acquire(claim("1"))
    heir = await open_store("heir", clock=clock_at(60_000))
    assert keys_of(await heir.take_over(from_owners=["sleeper"])) == {"1#0"}
    with pytest.raises(ClaimOwnerLost) as caught:
        await sleeper.heartbeat()
    assert caught.value.code == "claim_owner_lost"
    assert "sleeper" in caught.value.message
    await sleeper.heartbeat()  # said once; the owner is registered again
    assert await sleeper.acquire(claim("1")) is False  # but the slot stays the heir's


async def test_live_owner_is_never_taken_however_old_its_rows(open_store: OpenStore) -> None:
    clock = clock_at(0)
    live = await open_store("live", clock=clock)
    await live.acquire(dataclasses.replace(claim("1"), updated_at=T0 - datetime.timedelta(days=9)))
    clock.advance(3_600_000)
    await live.heartbeat()
    other = await open_store("other", clock=clock_at(3_600_000 + 10_000))
    assert "live" not in (await other.load()).stale_owners
    assert await other.take_over(from_owners=["live"]) == []
    assert await other.acquire(claim("1")) is False
    assert [c.owner for c in (await other.load()).claims] == ["live"]


async def test_take_over_rechecks_staleness_in_its_transaction(open_store: OpenStore) -> None:
    clock = clock_at(0)
    sleeper = await open_store("sleeper", clock=clock)
    await sleeper.acquire(claim("1"))
    heir = await open_store("heir", clock=clock_at(60_000))
    assert "sleeper" in (await heir.load()).stale_owners
    clock.advance(60_000)
    await sleeper.heartbeat()  # woke up between the heir's load and its take_over
    assert await heir.take_over(from_owners=["sleeper"]) == []
    assert [c.owner for c in (await heir.load()).claims] == ["sleeper"]


async def test_take_over_by_two_heirs_moves_each_claim_once(open_store: OpenStore) -> None:
    dead = await open_store("dead", clock=clock_at(0))
    for i in range(5):
        await dead.acquire(claim(str(i)))
    first = await open_store("first", clock=clock_at(60_000))
    second = await open_store("second", clock=clock_at(60_000))
    taken_first = await first.take_over(from_owners=["dead"])
    taken_second = await second.take_over(from_owners=["dead"])
    assert len(taken_first) == 5
    assert taken_second == []


async def test_owner_without_heartbeat_row_is_stale(
    open_store: OpenStore, backend: str, store_path: Path
) -> None:
    a = await open_store("a")
    await a.acquire(claim("1"))
    if backend == "sqlite":
        with sqlite3.connect(store_path) as raw:
            raw.execute("UPDATE claims SET owner = 'ghost'")
    else:
        await a._run(lambda: a._connection().execute("UPDATE claims SET owner = 'ghost'"))
    assert "ghost" in (await a.load()).stale_owners
    assert keys_of(await a.take_over(from_owners=["ghost"])) == {"1#0"}


async def test_close_marks_owner_stale_at_once(open_store: OpenStore) -> None:
    a = await open_store("a", clock=clock_at(0))
    await a.acquire(claim("1"))
    await a.close()
    b = await open_store("b", clock=clock_at(1))  # 1 ms later: no waiting for the threshold
    state = await b.load()
    assert state.stale_owners == frozenset({"a"})
    assert keys_of(state.claims) == {"1#0"}  # close keeps the rows for recovery
    assert keys_of(await b.take_over(from_owners=state.stale_owners)) == {"1#0"}


async def test_take_over_never_takes_from_ourselves(open_store: OpenStore) -> None:
    a = await open_store("a")
    await a.acquire(claim("1"))
    assert await a.take_over(from_owners=["a"]) == []
    assert "a" not in (await a.load()).stale_owners


async def test_stale_owner_rows_without_claims_are_pruned_on_open(open_store: OpenStore) -> None:
    gone = await open_store("gone", clock=clock_at(0))
    await gone.close()
    holder = await open_store("holder", clock=clock_at(0))
    await holder.acquire(claim("1"))
    await holder.close()
    fresh = await open_store("fresh", clock=clock_at(60_000))
    assert await fresh.stale_owners() == frozenset({"holder"})


async def test_closed_store_refuses_use(open_store: OpenStore) -> None:
    a = await open_store("a")
    await a.close()
    await a.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await a.acquire(claim("1"))


async def test_reopen_keeps_claims_and_owner(
    open_store: OpenStore, backend: str, store_path: Path
) -> None:
    a = await open_store("a")
    await a.acquire(claim("1"))
    await a.close()
    again = await BACKENDS[backend].open(store_path, owner="a")
    try:
        assert await again.acquire(claim("1")) is True  # the same owner id: still ours
        assert await again.integrity_check() == "ok"
    finally:
        await again.close()


# -- opening refusals -----------------------------------------------------------------------


def _bump_schema(backend: str, path: Path, version: str) -> None:
    # NB: the file is edited with the engine that wrote it (turso's WAL is not sqlite's).
    if backend == "sqlite":
        raw = sqlite3.connect(path, isolation_level=None)
        raw.execute(
            "UPDATE claim_store_meta SET value = ? WHERE key = 'schema_version'", (version,)
        )
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        raw.close()
        return
    import turso

    conn = turso.connect(str(path), experimental_features="multiprocess_wal", isolation_level=None)
    conn.execute("UPDATE claim_store_meta SET value = ? WHERE key = 'schema_version'", (version,))
    conn.close()


def _write_garbage(path: Path) -> None:
    path.write_bytes(b"definitely not a database\n" * 200)


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.iterdir()) if p.is_file()}


async def test_unknown_schema_version_is_refused_untouched(backend: str, store_path: Path) -> None:
    store = await BACKENDS[backend].open(store_path, owner="a")
    await store.acquire(claim("1"))
    await store.close()
    unknown = str(int(SCHEMA_VERSION) + 1)  # the next schema, which this code does not know
    _bump_schema(backend, store_path, unknown)
    before = _snapshot(store_path)
    with pytest.raises(ClaimStoreSchemaUnsupported) as caught:
        await BACKENDS[backend].open(store_path, owner="b")
    assert caught.value.code == "claim_store_schema_unsupported"
    assert str(store_path) in str(caught.value)
    assert f"'{unknown}'" in str(caught.value)
    assert caught.value.version == unknown
    # Nothing was written: the main file is byte-identical (no owner row for "b", no event).
    assert _snapshot(store_path)[store_path.name] == before[store_path.name]


async def test_foreign_database_is_refused(backend: str, store_path: Path) -> None:
    with sqlite3.connect(store_path) as raw:
        raw.execute("CREATE TABLE something_else (x)")
    before = _snapshot(store_path)
    with pytest.raises(ClaimStoreSchemaUnsupported, match="not a Lorenz claim store") as caught:
        await BACKENDS[backend].open(store_path, owner="a")
    assert caught.value.version is None
    assert _snapshot(store_path) == before  # not even converted to WAL


async def test_garbage_file_is_unreadable(backend: str, store_path: Path) -> None:
    _write_garbage(store_path)
    with pytest.raises(ClaimStoreUnreadable) as caught:
        await BACKENDS[backend].open(store_path, owner="a")
    assert caught.value.code == "claim_store_unreadable"
    assert str(store_path) in caught.value.message


async def test_locked_store_gives_up_with_a_coded_error(backend: str, store_path: Path) -> None:
    store = await BACKENDS[backend].open(store_path, owner="a", busy_deadline_s=0.3)
    holder = await BACKENDS[backend].open(store_path, owner="h")
    try:
        # Another connection sits inside a write transaction and never commits.
        conn = holder._connection()
        await holder._run(lambda: conn.execute("BEGIN IMMEDIATE"))
        with pytest.raises(ClaimStoreBusy) as caught:
            await store.acquire(claim("1"))
        assert caught.value.code == "claim_store_busy"
        await holder._run(lambda: conn.execute("ROLLBACK"))
        assert await store.acquire(claim("1")) is True
    finally:
        await holder.close()
        await store.close()
