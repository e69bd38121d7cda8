"""A start-up reads a bounded set of claims: above 1,000 it fails closed and recovers nothing.

Issue #32 point 6 (seed 004: "recovery is not subject to that page: it uses the exact bounded
IDs ... both storage adapters fail closed if more than 1,000"). Before, ``hydrate()`` read every
row the store held, however many: 1,001 claims of a live other owner came back as 1,001
foreign slots. Now the store's read itself is bounded (``LIMIT 1,001`` in SQL) and 1,001 rows
raise ``claim_rebind_too_large``; the rows are left as they were. At 1,000 the start-up is the
usual one. A plain ``load()`` (diagnostics, tests) stays unbounded.
"""

from __future__ import annotations

import pytest

from lorenz.claims import ClaimRecoveryTooLarge, MemoryClaimStore
from lorenz.claims.memory import MemoryClaimTable
from lorenz.config import WorkflowSettings
from lorenz.model import ClaimStore, SystemClock
from lorenz.orchestrator import Orchestrator
from lorenz.orchestrator.hydration import RECOVERY_BOUND
from tests.claims.records import OpenStore, claim

STALE_MS = 600_000
"""Ten minutes: the other owner stays live (heartbeat fresh) through the test."""


def _orchestrator(store: ClaimStore) -> Orchestrator:
    return Orchestrator(settings=WorkflowSettings(), store=store, clock=SystemClock())


async def test_sql_start_up_above_the_bound_fails_closed(open_store: OpenStore) -> None:
    other = await open_store("other", owner_stale_ms=STALE_MS)
    for index in range(RECOVERY_BOUND + 1):
        assert await other.acquire(claim(f"I{index}"))
    ours = await open_store("ours", owner_stale_ms=STALE_MS)
    with pytest.raises(ClaimRecoveryTooLarge) as caught:
        await _orchestrator(ours).hydrate()
    assert caught.value.code == "claim_rebind_too_large"
    assert f"more than {RECOVERY_BOUND} claims" in caught.value.message
    stored = await ours.load()
    assert len(stored.claims) == RECOVERY_BOUND + 1
    assert {record.owner for record in stored.claims} == {"other"}


async def test_sql_start_up_at_the_bound_recovers_as_usual(open_store: OpenStore) -> None:
    other = await open_store("other", owner_stale_ms=STALE_MS)
    for index in range(RECOVERY_BOUND):
        assert await other.acquire(claim(f"I{index}"))
    ours = await open_store("ours", owner_stale_ms=STALE_MS)
    report = await _orchestrator(ours).hydrate()
    assert len(report.foreign) == RECOVERY_BOUND


async def test_memory_start_up_above_the_bound_fails_closed() -> None:
    table = MemoryClaimTable()
    other = MemoryClaimStore(owner="other", table=table)
    for index in range(RECOVERY_BOUND + 1):
        assert await other.acquire(claim(f"I{index}"))
    ours = MemoryClaimStore(owner="ours", table=table)
    with pytest.raises(ClaimRecoveryTooLarge):
        await _orchestrator(ours).hydrate()
    assert {record.owner for record in table.claims.values()} == {"other"}
    assert len((await ours.load()).claims) == RECOVERY_BOUND + 1


async def test_memory_start_up_at_the_bound_recovers_as_usual() -> None:
    table = MemoryClaimTable()
    other = MemoryClaimStore(owner="other", table=table)
    for index in range(RECOVERY_BOUND):
        assert await other.acquire(claim(f"I{index}"))
    report = await _orchestrator(MemoryClaimStore(owner="ours", table=table)).hydrate()
    assert len(report.foreign) == RECOVERY_BOUND
