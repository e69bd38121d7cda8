"""A pending retry is due by the store's clock, not by the clock of the process that wrote it.

Issue #32 point 6 (seed 004: "the checkout's storage-minted updated_at anchors that delay ...
the daemon's wall clock never releases that capacity"). The writer's clock is a day behind:
its retry, 60 s after a failure, carries a wall-clock ``due_at`` a day in the past for a
restarted controller whose clock is right. Before, that restart ran the retry at once; now the
SQL store stamps each claim write with its own ``strftime('now')`` (``stored_at``, schema 4),
and the restart waits the writer's 60 s counted from that stamp on the store's clock.
"""

from __future__ import annotations

import dataclasses
import datetime
import sqlite3
from pathlib import Path

from lorenz.claims import SqliteClaimStore
from lorenz.claims.sql import SCHEMA_VERSION
from lorenz.config import WorkflowSettings
from lorenz.model import ClaimPhase, ManualClock, SlotKey
from lorenz.orchestrator import Orchestrator
from tests.claims.records import OpenStore, claim
from tests.orchestrator.claims_helpers import run
from tests.orchestrator.factories import issue

K1 = SlotKey("i1#0")
DELAY_MS = 60_000
BEHIND = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
"""The writer's clock: a day behind the store's (and the restarted controller's)."""


def _settings() -> WorkflowSettings:
    return WorkflowSettings.model_validate(
        {"retry": {"max_attempts": 5, "backoff": {"initial_ms": DELAY_MS}}}
    )


async def test_a_restart_waits_the_delay_on_the_stores_clock(open_store: OpenStore) -> None:
    writer_clock = ManualClock(wall=BEHIND)
    writer = Orchestrator(
        settings=_settings(), store=await open_store("me"), clock=writer_clock
    )
    await writer.hydrate()
    await run(writer, issue(1))
    finished = await writer.finish(K1, normal=False, error="boom")
    assert finished is not None
    assert finished.retry is not None
    assert finished.retry.due_at == BEHIND + datetime.timedelta(milliseconds=DELAY_MS)

    restart_clock = ManualClock(wall=datetime.datetime.now(datetime.UTC))
    restarted = Orchestrator(
        settings=_settings(), store=await open_store("me"), clock=restart_clock
    )
    report = await restarted.hydrate()
    assert report.restored_retries == (K1,)
    retry = restarted.state.retry_attempts[K1]
    left_ms = retry.due_at_ms - restart_clock.monotonic_ms()
    # NB: the delay less what passed since the write (generous: a loaded machine).
    assert 0 < left_ms <= DELAY_MS
    assert retry.due_at > restart_clock.now()


async def test_a_schema_3_store_migrates_and_its_old_rows_keep_their_due_at(
    store_path: Path,
) -> None:
    # NB: sqlite only: the file is rewritten by stdlib sqlite3 while no process has it open.
    store = await SqliteClaimStore.open(store_path, owner="me")
    due = datetime.datetime(2026, 1, 1, 0, 1, tzinfo=datetime.UTC)
    pending = dataclasses.replace(
        claim("1", phase=ClaimPhase.RETRY_PENDING, attempt=1),
        due_at=due,
        updated_at=due - datetime.timedelta(minutes=1),
    )
    assert await store.acquire(pending)
    await store.close()
    raw = sqlite3.connect(store_path, isolation_level=None)
    raw.execute("ALTER TABLE claims DROP COLUMN stored_at")
    raw.execute("UPDATE claim_store_meta SET value = '3' WHERE key = 'schema_version'")
    raw.close()

    migrated = await SqliteClaimStore.open(store_path, owner="me")
    try:
        state = await migrated.load()
        assert [row.due_at for row in state.claims] == [due]
        assert state.retry_ready_in_ms == {}
        assert [e.body for e in await migrated.recent_events() if e.kind == "migrate"] == [
            {"from": "3", "to": SCHEMA_VERSION}
        ]
        await migrated.save(pending)
        assert set((await migrated.load()).retry_ready_in_ms) == {SlotKey("1#0")}
    finally:
        await migrated.close()
