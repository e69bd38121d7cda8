"""The spend ledger in every claim store: atomic add/read, bounded, durable, migrated in place.

Also run as a child process (``python -m tests.claims.test_spend <backend> <path>``): it charges
one token and 0.5 USD per transaction and prints each committed count, until it is killed.
"""

from __future__ import annotations

import asyncio
import select
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.claims import MemoryClaimStore, SqlClaimStore
from lorenz.claims.memory import MemoryClaimTable
from lorenz.claims.spend import SpendLedger, SpendTotal
from lorenz.claims.sql import SCHEMA_VERSION
from lorenz.model import SlotKey
from tests.claims.records import BACKENDS, claim

REPO = Path(__file__).resolve().parents[2]
DAY = "2026-12-07"

OpenLedger = Callable[..., Awaitable[Any]]


@pytest.fixture(params=["memory", *sorted(BACKENDS)])
def ledger_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_ledger(ledger_backend: str, tmp_path: Path) -> AsyncIterator[OpenLedger]:
    """Open ledgers of one backend on one file (memory: one shared table)."""
    opened: list[Any] = []
    table = MemoryClaimTable()

    async def _open(owner: str = "me", **kwargs: Any) -> Any:
        store: Any
        if ledger_backend == "memory":
            store = MemoryClaimStore(owner=owner, table=table, **kwargs)
        else:
            store = await BACKENDS[ledger_backend].open(
                tmp_path / "claims.db", owner=owner, **kwargs
            )
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.close()


async def test_every_store_is_a_spend_ledger(open_ledger: OpenLedger) -> None:
    assert isinstance(await open_ledger(), SpendLedger)


async def test_a_charge_adds_to_the_issue_and_the_day(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    assert await ledger.issue_spend("I1") == SpendTotal()
    assert await ledger.day_spend(DAY) == SpendTotal()
    first = await ledger.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=100, usd=0.25)
    assert first.issue == SpendTotal(tokens=100, usd=0.25)
    assert first.day == SpendTotal(tokens=100, usd=0.25)
    second = await ledger.add_spend(issue_id="I2", identifier="ENG-2", day=DAY, tokens=50, usd=0.5)
    assert second.issue == SpendTotal(tokens=50, usd=0.5)
    assert second.day == SpendTotal(tokens=150, usd=0.75)
    third = await ledger.add_spend(
        issue_id="I1", identifier="ENG-1", day="2026-12-08", tokens=1, usd=0.0
    )
    assert third.issue == SpendTotal(tokens=101, usd=0.25)
    assert third.day == SpendTotal(tokens=1, usd=0.0)
    assert await ledger.issue_spend("I1") == SpendTotal(tokens=101, usd=0.25)
    assert await ledger.day_spend(DAY) == SpendTotal(tokens=150, usd=0.75)
    rows = await ledger.issue_spends()
    assert [(row.issue_id, row.identifier) for row in rows] == [("I1", "ENG-1"), ("I2", "ENG-2")]
    assert [row.issue_id for row in await ledger.issue_spends(limit=1)] == ["I1"]


@pytest.mark.parametrize(
    ("tokens", "usd"), [(-1, 0.0), (1, -0.5), (1, float("nan")), (1, float("inf")), (True, 0.0)]
)
async def test_a_bad_charge_is_refused_and_changes_nothing(
    open_ledger: OpenLedger, tokens: Any, usd: float
) -> None:
    ledger = await open_ledger()
    await ledger.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=5, usd=1.0)
    with pytest.raises(ValueError, match="spend charge"):
        await ledger.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=tokens, usd=usd)
    assert await ledger.issue_spend("I1") == SpendTotal(tokens=5, usd=1.0)


async def test_spend_of_a_released_claim_is_kept(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger()
    record = claim("1")
    assert await ledger.acquire(record)
    await ledger.add_spend(issue_id=record.issue_id, identifier="ENG-1", day=DAY, tokens=9, usd=2.0)
    await ledger.release(SlotKey(record.slot_key))
    assert await ledger.issue_spend(record.issue_id) == SpendTotal(tokens=9, usd=2.0)


async def test_the_ledger_is_bounded(open_ledger: OpenLedger) -> None:
    ledger = await open_ledger(issue_spend_kept=3, day_spend_kept=2)
    for number in range(5):
        await ledger.add_spend(
            issue_id=f"I{number}",
            identifier=f"ENG-{number}",
            day=f"2026-12-0{number + 1}",
            tokens=1,
            usd=0.0,
        )
        await asyncio.sleep(0.002)  # distinct charge times for the age order
    # charging I2 again makes it the newest: I3 is then the oldest kept
    await ledger.add_spend(issue_id="I2", identifier="ENG-2", day="2026-12-05", tokens=1, usd=0.0)
    kept = [row.issue_id for row in await ledger.issue_spends()]
    assert kept == ["I2", "I4", "I3"]
    assert await ledger.issue_spend("I0") == SpendTotal()
    assert await ledger.day_spend("2026-12-05") == SpendTotal(tokens=2, usd=0.0)
    assert await ledger.day_spend("2026-12-04") == SpendTotal(tokens=1, usd=0.0)
    assert await ledger.day_spend("2026-12-03") == SpendTotal()


async def test_a_fenced_out_store_still_counts_spend(open_ledger: OpenLedger) -> None:
    old = await open_ledger("old")
    new = await open_ledger("new")
    await old.fence(1)
    await new.fence(2)
    charge = await old.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=3, usd=0.1)
    assert charge.issue == SpendTotal(tokens=3, usd=0.1)
    assert await new.issue_spend("I1") == SpendTotal(tokens=3, usd=0.1)


# -- durable stores only --------------------------------------------------------------------


async def test_spend_survives_a_graceful_restart(backend: str, store_path: Path) -> None:
    store = await BACKENDS[backend].open(store_path, owner="first")
    await store.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=10, usd=1.5)
    await store.close()
    again = await BACKENDS[backend].open(store_path, owner="second")
    try:
        assert await again.issue_spend("I1") == SpendTotal(tokens=10, usd=1.5)
        assert await again.day_spend(DAY) == SpendTotal(tokens=10, usd=1.5)
    finally:
        await again.close()


async def test_two_processes_worth_of_writers_never_lose_a_charge(
    backend: str, store_path: Path
) -> None:
    stores = [await BACKENDS[backend].open(store_path, owner=f"o{i}") for i in range(2)]
    try:

        async def charge(store: SqlClaimStore) -> None:
            for _ in range(25):
                await store.add_spend(issue_id="I1", identifier="ENG-1", day=DAY, tokens=2, usd=0.5)

        await asyncio.gather(*(charge(store) for store in stores))
        assert await stores[0].issue_spend("I1") == SpendTotal(tokens=100, usd=25.0)
        assert await stores[1].day_spend(DAY) == SpendTotal(tokens=100, usd=25.0)
    finally:
        for store in stores:
            await store.close()


def _downgrade_to_schema_2(path: Path) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TABLE issue_spend")
    raw.execute("DROP TABLE day_spend")
    raw.execute("ALTER TABLE claims DROP COLUMN stored_at")  # NB: schema 4's column
    raw.execute("UPDATE claim_store_meta SET value = '2' WHERE key = 'schema_version'")
    raw.close()


async def test_a_schema_2_store_opens_migrated_with_its_claims(store_path: Path) -> None:
    # NB: sqlite only: the file is rewritten by stdlib sqlite3 while no process has it open.
    store = await BACKENDS["sqlite"].open(store_path, owner="me")
    assert await store.acquire(claim("1"))
    await store.save_checkpoint({"completed": ["I0"]})
    await store.close()
    _downgrade_to_schema_2(store_path)

    migrated = await BACKENDS["sqlite"].open(store_path, owner="me")
    try:
        state = await migrated.load()
        assert [row.slot_key for row in state.claims] == ["1#0"]
        assert state.checkpoint == {"completed": ["I0"]}
        assert [e.body for e in await migrated.recent_events() if e.kind == "migrate"] == [
            {"from": "2", "to": SCHEMA_VERSION}
        ]
        charge = await migrated.add_spend(
            issue_id="I1", identifier="ENG-1", day=DAY, tokens=1, usd=0.0
        )
        assert charge.issue == SpendTotal(tokens=1, usd=0.0)
        assert await migrated.integrity_check() == "ok"
    finally:
        await migrated.close()


def test_spend_survives_kill_9_mid_charging(backend: str, store_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.claims.test_spend", backend, str(store_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    committed = 0
    try:
        # Each line is one committed charge; 40 of them proves the child is mid-stream.
        while committed < 40:
            ready, _, _ = select.select([child.stdout], [], [], 60)  # a generous bound
            assert ready, "the child reported no charge for 60 s"
            line = child.stdout.readline()
            if not line:
                _, err = child.communicate(timeout=10)
                raise AssertionError(f"child exited early (rc={child.returncode}):\n{err}")
            committed = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # NB: the child went on charging while this process read up to line 40 and killed it:
    # what it printed before it died are commits too (a loaded machine saw 47).
    for line in child.stdout.read().split():
        committed = max(committed, int(line))
    issue, day, integrity = asyncio.run(_read_back(backend, store_path))
    # Every reported commit is there; at most the one in flight when killed committed too.
    assert committed <= issue.tokens <= committed + 1
    # One transaction per charge: the issue and the day never disagree, nor tokens and usd.
    assert day == issue
    assert issue.usd == pytest.approx(issue.tokens * 0.5)
    assert integrity == "ok"


async def _read_back(backend: str, path: Path) -> tuple[SpendTotal, SpendTotal, str]:
    store = await BACKENDS[backend].open(path, owner="survivor")
    try:
        return (
            await store.issue_spend("I1"),
            await store.day_spend(DAY),
            await store.integrity_check(),
        )
    finally:
        await store.close()


async def _charge_until_killed(backend: str, path: Path) -> None:
    store = await BACKENDS[backend].open(path, owner="doomed")
    count = 0
    while True:
        charge = await store.add_spend(
            issue_id="I1", identifier="ENG-1", day=DAY, tokens=1, usd=0.5
        )
        count += 1
        assert charge.issue.tokens == count
        sys.stdout.write(f"{count}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(_charge_until_killed(sys.argv[1], Path(sys.argv[2])))
