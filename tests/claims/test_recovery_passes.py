"""One recovery pass, on a real SQLite store: prove, find, sweep, then take over — in that order.

The pass (:class:`lorenz.daemon.recovery.RecoveryPasses`) is what brings back the claims of an
owner that died after start-up; these cases pin its order and its refusals. The end-to-end
versions, with real ``lorenz`` processes, are in ``tests/daemon/test_chaos.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import psutil
import pytest

from lorenz.claims import SqliteClaimStore
from lorenz.claims.owners import ProcessIdentity, current_process
from lorenz.config import WorkflowSettings
from lorenz.daemon.errors import DaemonOrphansAlive
from lorenz.daemon.recovery import RecoveryPasses
from lorenz.leadership import LeadershipLost
from lorenz.model import ClaimPhase, RetryKind, SlotKey, SystemClock
from lorenz.orchestrator import Orchestrator
from tests.claims.records import claim

STALE_MS = 600_000
"""Ten minutes: only the proof of death by pid and start time can make an owner stale here."""


@pytest.fixture
def dead_owner() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    return ProcessIdentity(host=current_process().host, pid=child.pid, started_at=started).holder


@pytest.fixture
async def stores(tmp_path: Path, dead_owner: str) -> AsyncIterator[tuple[SqliteClaimStore, ...]]:
    path = tmp_path / "claims.db"
    crashed = await SqliteClaimStore.open(path, owner=dead_owner, owner_stale_ms=STALE_MS)
    ours = await SqliteClaimStore.open(path, owner="ours", owner_stale_ms=STALE_MS)
    yield crashed, ours
    await ours.close()
    await crashed.close()


async def owners_of(store: SqliteClaimStore) -> dict[str, str]:
    return {r.slot_key: r.owner for r in (await store.load()).claims}


def orchestrator_for(store: SqliteClaimStore) -> Orchestrator:
    return Orchestrator(settings=WorkflowSettings(), store=store, clock=SystemClock())


async def test_a_pass_with_nobody_stale_sweeps_nothing(
    stores: tuple[SqliteClaimStore, ...], dead_owner: str
) -> None:
    _, ours = stores
    swept: list[set[str]] = []

    def sweep(owners: Collection[str]) -> list[int]:
        swept.append(set(owners))
        return []

    passes = RecoveryPasses(
        store=ours, orchestrator=orchestrator_for(ours), interval_ms=1000, sweep=sweep
    )
    # The crashed owner holds no claims, but its agents may still run: it is swept once...
    report = await passes.run_once()
    assert report is not None
    assert swept == [{dead_owner}]
    # ...and taken over (its heartbeat row goes), so the next pass finds nobody.
    assert await passes.run_once() is None
    assert swept == [{dead_owner}]
    assert passes.passes == 2


async def test_a_dead_owners_agents_are_swept_before_its_claims_become_ours(
    stores: tuple[SqliteClaimStore, ...], dead_owner: str
) -> None:
    crashed, ours = stores
    assert await crashed.acquire(claim("1"))
    assert await crashed.acquire(claim("2", phase=ClaimPhase.RETRY_PENDING, attempt=3))
    orchestrator = orchestrator_for(ours)
    await orchestrator.hydrate()  # (hydration already sees it dead; start from a clean slate)
    assert await crashed.acquire(claim("3"))  # a claim it made "after" our start-up
    seen_at_sweep: list[dict[str, str]] = []

    def sweep(owners: Collection[str]) -> list[int]:
        assert set(owners) == {dead_owner}
        # NB: still the dead owner's at this moment: nothing may be dispatched before the sweep.
        loop_rows = asyncio.run_coroutine_threadsafe(owners_of(ours), main_loop).result()
        seen_at_sweep.append(loop_rows)
        return [4242]

    refreshed: list[bool] = []
    main_loop = asyncio.get_running_loop()
    passes = RecoveryPasses(
        store=ours,
        orchestrator=orchestrator,
        interval_ms=1000,
        sweep=sweep,
        on_recovered=lambda: refreshed.append(True),
    )
    report = await passes.run_once()
    assert report is not None
    assert seen_at_sweep == [{"1#0": "ours", "2#0": "ours", "3#0": dead_owner}]
    assert report.interrupted == (SlotKey("3#0"),)
    assert report.taken_over_from == frozenset({dead_owner})
    assert refreshed == [True]
    assert await owners_of(ours) == {"1#0": "ours", "2#0": "ours", "3#0": "ours"}
    retry = orchestrator.state.retry_attempts[SlotKey("3#0")]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)


async def test_orphans_that_survive_leave_the_claims_where_they_are(
    stores: tuple[SqliteClaimStore, ...], dead_owner: str
) -> None:
    crashed, ours = stores
    assert await crashed.acquire(claim("1"))
    attempts: list[int] = []

    def stubborn(owners: Collection[str]) -> list[int]:
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise DaemonOrphansAlive(pids=[4242], waited_s=10.0)
        return []

    passes = RecoveryPasses(
        store=ours, orchestrator=orchestrator_for(ours), interval_ms=10, sweep=stubborn
    )
    with pytest.raises(DaemonOrphansAlive):
        await passes.run_once()
    assert await owners_of(ours) == {"1#0": dead_owner}  # not taken while an agent may work
    # The loop survives failed passes and takes over once the sweep succeeds.
    passes.start()
    try:
        for _ in range(2000):
            if await owners_of(ours) == {"1#0": "ours"}:
                break
            await asyncio.sleep(0.01)
    finally:
        await passes.stop()
    assert await owners_of(ours) == {"1#0": "ours"}
    assert len(attempts) >= 3


async def test_a_process_that_lost_leadership_takes_nothing(
    stores: tuple[SqliteClaimStore, ...], dead_owner: str
) -> None:
    crashed, ours = stores
    assert await crashed.acquire(claim("1"))

    async def lost() -> None:
        raise LeadershipLost(path=None, holder="someone else")

    passes = RecoveryPasses(
        store=ours,
        orchestrator=orchestrator_for(ours),
        interval_ms=1000,
        prove_leadership=lost,
        sweep=lambda owners: pytest.fail("swept without leadership"),
    )
    with pytest.raises(LeadershipLost):
        await passes.run_once()
    assert await owners_of(ours) == {"1#0": dead_owner}
