"""The memory store bounds a take-over like the SQL stores: above 1,000 claims it fails closed.

Two memory stores share one table (two owners of one process's store): the first holds the
claims, the second takes them over. 1,001 claims: ``claim_rebind_too_large`` and every row
keeps its owner; 1,000 move (issue #32 point 6, seed 004: "both storage adapters fail closed").
"""

from __future__ import annotations

import pytest

from lorenz.claims import ClaimRebindTooLarge, MemoryClaimStore
from lorenz.claims.memory import MemoryClaimTable
from lorenz.claims.sql import MAX_REBIND
from tests.claims.records import claim


async def _held_by_crashed(table: MemoryClaimTable, count: int) -> None:
    crashed = MemoryClaimStore(owner="crashed", table=table)
    for index in range(count):
        assert await crashed.acquire(claim(f"issue-{index}"))


async def test_more_than_the_bound_moves_nothing() -> None:
    table = MemoryClaimTable()
    await _held_by_crashed(table, MAX_REBIND + 1)
    successor = MemoryClaimStore(owner="successor", table=table)
    with pytest.raises(ClaimRebindTooLarge) as caught:
        await successor.take_over(from_owners=["crashed"])
    assert caught.value.code == "claim_rebind_too_large"
    assert caught.value.count == MAX_REBIND + 1
    stored = await successor.load()
    assert {record.owner for record in stored.claims} == {"crashed"}


async def test_the_bound_itself_moves_every_claim() -> None:
    table = MemoryClaimTable()
    await _held_by_crashed(table, MAX_REBIND)
    successor = MemoryClaimStore(owner="successor", table=table)
    moved = await successor.take_over(from_owners=["crashed"])
    assert len(moved) == MAX_REBIND
    stored = await successor.load()
    assert {record.owner for record in stored.claims} == {"successor"}
