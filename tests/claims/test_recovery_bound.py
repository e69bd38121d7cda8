"""A start-up recovers from the exact, bounded set of claims it rebinds, never a broad scan.

Issue #32 point 6 (seed 004: "recover from the exact bounded set of ids, not a broad scan";
"a fresh registration performs no broad recovery scan"). Before, ``hydrate()`` read every
claim row of every owner (capped at 1,000): a store shared with a live host holding 1,200
claims made the start-up fail with ``claim_rebind_too_large``, and every start-up read rows
it had no business with. Now the store rebinds the stale owners' claims in one transaction
(ours from an earlier life counted), returns their exact slot keys, and reads back only
those: the live host's 1,200 claims are neither read nor counted, and above 1,000 claims to
rebind nothing moves.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import ClassVar

import pytest

from lorenz.claims import (
    ClaimRebindTooLarge,
    ClaimRecoveryTooLarge,
    MemoryClaimStore,
    SqliteClaimStore,
)
from lorenz.claims.connections import DbConnection, SqlDriver
from lorenz.claims.errors import MAX_REBIND
from lorenz.claims.memory import MemoryClaimTable
from lorenz.claims.rebinding import MAX_OWNERS
from lorenz.claims.sqlite import SqliteDriver
from lorenz.config import WorkflowSettings
from lorenz.model import ClaimStore, SlotKey, SystemClock, slot_key
from lorenz.orchestrator import Orchestrator
from tests.claims.records import OpenStore, claim

STALE_MS = 600_000
"""Ten minutes: the live owner stays live (heartbeat fresh) through the test."""

LIVE_CLAIMS = 1_200
"""More than the bound, all of a live other owner: none of them is the start-up's business."""


def _orchestrator(store: ClaimStore) -> Orchestrator:
    return Orchestrator(settings=WorkflowSettings(), store=store, clock=SystemClock())


def _keys(prefix: str, count: int) -> set[SlotKey]:
    return {slot_key(f"{prefix}{index}", 0) for index in range(count)}


async def _hold(store: ClaimStore, prefix: str, count: int) -> None:
    for index in range(count):
        assert await store.acquire(claim(f"{prefix}{index}"))


async def test_sql_start_up_beside_a_live_owner_recovers_exactly_the_stale_claims(
    open_store: OpenStore,
) -> None:
    await _hold(await open_store("live", owner_stale_ms=STALE_MS), "L", LIVE_CLAIMS)
    crashed = await open_store("crashed", owner_stale_ms=STALE_MS)
    await _hold(crashed, "C", 3)
    await crashed.close()  # heartbeat 0: stale at once
    earlier = await open_store("ours", owner_stale_ms=STALE_MS)
    await _hold(earlier, "O", 2)
    await earlier.close()

    ours = await open_store("ours", owner_stale_ms=STALE_MS)
    orchestrator = _orchestrator(ours)
    report = await orchestrator.hydrate()
    assert set(report.interrupted) == _keys("C", 3) | _keys("O", 2)
    assert report.taken_over_from == {"crashed", "ours"}
    assert orchestrator.state.foreign == {}, "the live owner's claims were not read"
    owners = {record.slot_key: record.owner for record in (await ours.load()).claims}
    assert {key for key, owner in owners.items() if owner == "live"} == _keys("L", LIVE_CLAIMS)
    assert {key for key, owner in owners.items() if owner == "ours"} == (
        _keys("C", 3) | _keys("O", 2)
    )


async def test_sql_rebind_above_the_bound_fails_closed_and_moves_nothing(
    open_store: OpenStore,
) -> None:
    await _hold(await open_store("live", owner_stale_ms=STALE_MS), "L", 5)
    crashed = await open_store("crashed", owner_stale_ms=STALE_MS)
    await _hold(crashed, "C", MAX_REBIND)
    await crashed.close()
    earlier = await open_store("ours", owner_stale_ms=STALE_MS)
    await _hold(earlier, "O", 1)  # NB: ours count too: 1,001 claims to rebind
    await earlier.close()

    ours = await open_store("ours", owner_stale_ms=STALE_MS)
    with pytest.raises(ClaimRebindTooLarge) as caught:
        await _orchestrator(ours).hydrate()
    assert caught.value.code == "claim_rebind_too_large"
    assert caught.value.count == MAX_REBIND + 1
    assert caught.value.owners == ["crashed", "ours"]
    stored = await ours.load()
    owners = {record.slot_key: record.owner for record in stored.claims}
    assert {key for key, owner in owners.items() if owner == "crashed"} == _keys("C", MAX_REBIND)
    assert {key for key, owner in owners.items() if owner == "live"} == _keys("L", 5)
    assert "crashed" in stored.stale_owners, "its owner row was not removed either"


class _TracingDriver(SqliteDriver):
    """SQLite with every statement the store's real connection runs recorded (expanded)."""

    def __init__(self, statements: list[str]) -> None:
        super().__init__()
        self._statements = statements

    def connect(self, path: Path, *, busy_timeout_ms: int) -> DbConnection:
        conn = super().connect(path, busy_timeout_ms=busy_timeout_ms)
        conn.set_trace_callback(self._statements.append)  # type: ignore[attr-defined]
        return conn


class _TracedSqliteClaimStore(SqliteClaimStore):
    statements: ClassVar[list[str]] = []

    @classmethod
    def _make_driver(cls) -> SqlDriver:
        return _TracingDriver(cls.statements)


async def test_a_sqlite_start_up_reads_no_row_of_a_live_owner(tmp_path: Path) -> None:
    path = tmp_path / "claims.db"
    live = await SqliteClaimStore.open(path, owner="live", owner_stale_ms=STALE_MS)
    crashed = await SqliteClaimStore.open(path, owner="crashed", owner_stale_ms=STALE_MS)
    try:
        await _hold(live, "L", LIVE_CLAIMS)
        await _hold(crashed, "C", 3)
    finally:
        await crashed.close()
    statements = _TracedSqliteClaimStore.statements
    ours = await _TracedSqliteClaimStore.open(path, owner="ours", owner_stale_ms=STALE_MS)
    try:
        statements.clear()
        report = await _orchestrator(ours).hydrate()
    finally:
        await ours.close()
        await live.close()
    assert set(report.interrupted) == _keys("C", 3)
    on_claims = [s for s in statements if "FROM claims" in s and "MIN(owner)" not in s]
    assert on_claims, "the start-up read its claims through this connection"
    # NB: each read of the claims table names an owner to rebind or exact slot keys.
    assert all(" WHERE " in s for s in on_claims), on_claims
    assert not [s for s in statements if "'live'" in s], "no statement asks for the live owner"
    assert not [s for s in statements if "'L" in s], "no key of the live owner is read"
    fetched = [s for s in on_claims if "slot_key IN (" in s]
    assert all(f"'{key}'" in "".join(fetched) for key in _keys("C", 3))


async def test_memory_start_up_beside_a_live_owner_recovers_exactly_ours() -> None:
    table = MemoryClaimTable()
    await _hold(MemoryClaimStore(owner="live", table=table), "L", LIVE_CLAIMS)
    await _hold(MemoryClaimStore(owner="ours", table=table), "O", 2)
    orchestrator = _orchestrator(MemoryClaimStore(owner="ours", table=table))
    report = await orchestrator.hydrate()
    assert set(report.interrupted) == _keys("O", 2)
    assert orchestrator.state.foreign == {}
    assert sum(1 for r in table.claims.values() if r.owner == "live") == LIVE_CLAIMS


async def test_memory_start_up_above_the_bound_fails_closed() -> None:
    table = MemoryClaimTable()
    await _hold(MemoryClaimStore(owner="ours", table=table), "O", MAX_REBIND + 1)
    with pytest.raises(ClaimRebindTooLarge) as caught:
        await _orchestrator(MemoryClaimStore(owner="ours", table=table)).hydrate()
    assert caught.value.count == MAX_REBIND + 1
    assert {record.phase.value for record in table.claims.values()} == {"Running"}


async def test_a_store_naming_more_owners_than_the_bound_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "claims.db"
    ours = await SqliteClaimStore.open(path, owner="ours", owner_stale_ms=STALE_MS)
    try:
        await _hold(ours, "O", 1)
        # NB: a damaged store (a copied file, an owner id per restart never pruned): heartbeat
        # rows are written beside the store, as another process would.
        with sqlite3.connect(path) as conn:
            now_ms = time.time() * 1000.0
            conn.executemany(
                "INSERT INTO owners (owner, heartbeat_at) VALUES (?, ?)",
                [(f"host:{pid}:1.0", now_ms) for pid in range(MAX_OWNERS + 1)],
            )
        with pytest.raises(ClaimRecoveryTooLarge) as caught:
            await _orchestrator(ours).hydrate()
        assert caught.value.code == "claim_rebind_too_large"
        assert f"more than {MAX_OWNERS} owners" in caught.value.message
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT slot_key, owner FROM claims").fetchall() == [
                ("O0#0", "ours")
            ]
    finally:
        await ours.close()
