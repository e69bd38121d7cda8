"""Recovery is bounded: taking over more than 1,000 claims fails closed and moves nothing.

On a real SQLite store, a crashed owner (its pid is gone: provably dead on this host) holds
1,001 claims. Taking them over — at start-up hydration or in a recovery pass — raises
``claim_rebind_too_large`` and every row keeps its owner; at 1,000 the same take-over moves
exactly those rows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lorenz.claims import ClaimRebindTooLarge, SqliteClaimStore
from lorenz.claims.owners import ProcessIdentity, current_process
from lorenz.claims.sql import MAX_REBIND
from lorenz.config import WorkflowSettings
from lorenz.model import SystemClock
from lorenz.orchestrator import Orchestrator
from tests.claims.records import claim

STALE_MS = 600_000
"""Ten minutes: only the proof of death by pid and start time makes the owner stale here."""


@pytest.fixture
def dead_owner() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    return ProcessIdentity(host=current_process().host, pid=child.pid, started_at=started).holder


async def _crashed_with(path: Path, owner: str, count: int) -> None:
    crashed = await SqliteClaimStore.open(path, owner=owner, owner_stale_ms=STALE_MS)
    for index in range(count):
        assert await crashed.acquire(claim(f"I{index}"))
    await crashed.close()


async def test_a_take_over_above_the_bound_fails_closed_and_moves_nothing(
    tmp_path: Path, dead_owner: str
) -> None:
    path = tmp_path / "claims.db"
    await _crashed_with(path, dead_owner, MAX_REBIND + 1)
    ours = await SqliteClaimStore.open(path, owner="ours", owner_stale_ms=STALE_MS)
    try:
        with pytest.raises(ClaimRebindTooLarge) as caught:
            await ours.take_over(from_owners=[dead_owner])
        assert caught.value.code == "claim_rebind_too_large"
        assert caught.value.count == MAX_REBIND + 1
        assert f"{MAX_REBIND + 1} claims" in caught.value.message
        with pytest.raises(ClaimRebindTooLarge):
            await Orchestrator(
                settings=WorkflowSettings(), store=ours, clock=SystemClock()
            ).hydrate()
        owners = {record.owner for record in (await ours.load()).claims}
        assert owners == {dead_owner}

    finally:
        await ours.close()


async def test_a_take_over_at_the_bound_moves_exactly_those_claims(
    tmp_path: Path, dead_owner: str
) -> None:
    path = tmp_path / "claims.db"
    await _crashed_with(path, dead_owner, MAX_REBIND)
    ours = await SqliteClaimStore.open(path, owner="ours", owner_stale_ms=STALE_MS)
    try:
        moved = await ours.take_over(from_owners=[dead_owner])
        assert len(moved) == MAX_REBIND
        assert {record.owner for record in (await ours.load()).claims} == {"ours"}
    finally:
        await ours.close()
