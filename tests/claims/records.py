"""Shared helpers for claim-store tests: backends by name and claim records to store."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable

from lorenz.claims import SqlClaimStore, SqliteClaimStore, TursoClaimStore
from lorenz.model import ClaimPhase, ClaimRecord, SlotKey, slot_key

OpenStore = Callable[..., Awaitable[SqlClaimStore]]
"""The ``open_store`` fixture: ``await open_store(owner, **open_kwargs)``."""

BACKENDS: dict[str, type[SqlClaimStore]] = {
    "sqlite": SqliteClaimStore,
    "turso": TursoClaimStore,
}


def claim(
    issue: str,
    index: int = 0,
    *,
    phase: ClaimPhase = ClaimPhase.RUNNING,
    owner: str = "",
    attempt: int | None = None,
) -> ClaimRecord:
    """A claim record for slot ``index`` of ``issue`` (the store fills in the owner)."""
    return ClaimRecord(
        slot_key=slot_key(issue, index),
        issue_id=issue,
        identifier=f"ISS-{issue}",
        slot_index=index,
        phase=phase,
        owner=owner,
        attempt=attempt,
        started_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


def keys_of(records: list[ClaimRecord]) -> set[SlotKey]:
    return {r.slot_key for r in records}
