"""Claim records to rows and back, and the statements that read and write them.

Every path that touches the ``claims`` table (acquire, save, load, take-over, the spawn intent)
goes through the same column order, so the mapping and the statements built from the column
lists live together; hydration converts every row at start-up, so the row reader is kept fast
(see the ``NB`` in :func:`claim_from_row`).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from lorenz.claims.connections import DbConnection
from lorenz.claims.schema import CLAIM_COLUMNS, INTENT_COLUMNS
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    RetryKind,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
    TokenUsage,
)
from lorenz.model.clocks import iso_or_none

SELECT_CLAIMS = f"SELECT {', '.join(CLAIM_COLUMNS + INTENT_COLUMNS)} FROM claims"
# NB: the WHERE on the DO UPDATE branch is the whole exclusion rule: a row held by anyone else
# is left untouched and changes() stays 0. Stale owners are no exception (see take_over).
STORE_NOW = "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')"
"""The store's own clock (SQLite's, or the Turso server's), never the writer's."""
UPSERT_CLAIM = (
    f"INSERT INTO claims ({', '.join(CLAIM_COLUMNS)}, stored_at)"
    f" VALUES ({', '.join('?' for _ in CLAIM_COLUMNS)}, {STORE_NOW})"
    " ON CONFLICT (slot_key) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*CLAIM_COLUMNS, "stored_at") if c != "slot_key")
    + ", "
    # NB: a claim back to a pending retry has a settled run: its intent has nothing to probe.
    + ", ".join(
        f"{c} = CASE WHEN excluded.phase = 'RetryPending' THEN"
        f" {'0' if c == 'last_seq' else 'NULL'} ELSE claims.{c} END"
        for c in INTENT_COLUMNS
    )
    + " WHERE claims.owner = excluded.owner"
)
SET_INTENT = (
    "UPDATE claims SET "
    + ", ".join(f"{c} = ?" for c in INTENT_COLUMNS)
    + " WHERE slot_key = ? AND owner = ?"
)

_parse_when = datetime.datetime.fromisoformat


def retry_readiness(
    conn: DbConnection, *, bound: int | None, owner: str | None = None
) -> dict[SlotKey, float]:
    """Milliseconds until each pending retry (of ``owner``, when given) is due, on the
    store's clock.

    The writer's delay (``due_at - updated_at``, both its own clock, so its skew cancels) is
    counted from ``stored_at``, the store's clock at that write, against the store's clock now.
    Rows without ``stored_at`` (written before schema 4) are left out: their wall-clock
    ``due_at`` is used, as before.
    """
    rows = conn.execute(
        f"SELECT slot_key, due_at, updated_at, stored_at, {STORE_NOW} FROM claims"
        " WHERE phase = 'RetryPending' AND due_at IS NOT NULL AND updated_at IS NOT NULL"
        " AND stored_at IS NOT NULL" + (" AND owner = ?" if owner is not None else "") + " LIMIT ?",
        (*(() if owner is None else (owner,)), -1 if bound is None else bound + 1),
    ).fetchall()
    ready: dict[SlotKey, float] = {}
    for key, due_at, updated_at, stored_at, now in rows:
        try:
            delay = _parse_when(due_at) - _parse_when(updated_at)
            elapsed = _parse_when(now) - _parse_when(stored_at)
        except (TypeError, ValueError):
            continue  # NB: an unreadable stamp falls back to the wall-clock due_at
        ready[SlotKey(str(key))] = (delay - elapsed).total_seconds() * 1000.0
    return ready


def claim_params(
    record: ClaimRecord, *, owner: str, now: datetime.datetime, generation: int | None
) -> tuple[Any, ...]:
    return (
        record.slot_key,
        owner,
        record.issue_id,
        record.identifier,
        record.slot_index,
        record.phase.value,
        record.attempt,
        record.retry_kind.value if record.retry_kind is not None else None,
        iso_or_none(record.due_at),
        record.reservation_token,
        record.host,
        record.workspace_path,
        iso_or_none(record.started_at),
        iso_or_none(record.last_agent_at),
        record.turn_count,
        record.usage.input_tokens,
        record.usage.output_tokens,
        record.usage.total_tokens,
        record.last_error,
        record.session_id,
        iso_or_none(record.updated_at or now),
        generation,
    )


def intent_params(intent: SpawnIntent | None) -> tuple[Any, ...]:
    if intent is None:
        return (None, None, None, 0, None, None)
    return (
        intent.handle,
        intent.phase.value,
        intent.generation,
        intent.last_seq,
        intent.placement,
        iso_or_none(intent.updated_at),
    )


_PHASES: dict[str, ClaimPhase] = {p.value: p for p in ClaimPhase}
_SPAWN_PHASES: dict[str, SpawnPhase] = {p.value: p for p in SpawnPhase}
_RETRY_KINDS: dict[str | None, RetryKind | None] = {k.value: k for k in RetryKind}
_NO_USAGE = TokenUsage()


def claim_from_row(row: Sequence[Any]) -> ClaimRecord:
    # NB: hydration converts every row of the store at start-up (10k rows in well under 200 ms
    # is a target), so this avoids per-field helper calls and Enum() lookups on purpose.
    (
        key,
        owner,
        issue_id,
        identifier,
        slot_index,
        phase,
        attempt,
        retry_kind,
        due_at,
        token,
        host,
        workspace_path,
        started_at,
        last_agent_at,
        turn_count,
        input_tokens,
        output_tokens,
        total_tokens,
        last_error,
        session_id,
        updated_at,
        generation,
        handle,
        spawn_phase,
        intent_generation,
        last_seq,
        placement,
        intent_at,
    ) = row
    intent = (
        SpawnIntent(
            handle=handle,
            phase=_SPAWN_PHASES[spawn_phase],
            generation=intent_generation,
            last_seq=last_seq or 0,
            placement=placement,
            updated_at=_parse_when(intent_at) if intent_at else None,
        )
        if handle and spawn_phase in _SPAWN_PHASES
        else None
    )
    return ClaimRecord(
        slot_key=key,
        issue_id=issue_id,
        identifier=identifier,
        slot_index=slot_index,
        phase=_PHASES[phase],
        owner=owner,
        attempt=attempt,
        retry_kind=_RETRY_KINDS.get(retry_kind),
        due_at=_parse_when(due_at) if due_at else None,
        reservation_token=token,
        host=host,
        workspace_path=workspace_path,
        started_at=_parse_when(started_at) if started_at else None,
        last_agent_at=_parse_when(last_agent_at) if last_agent_at else None,
        turn_count=turn_count,
        usage=TokenUsage(input_tokens, output_tokens, total_tokens)
        if input_tokens or output_tokens or total_tokens
        else _NO_USAGE,
        last_error=last_error,
        session_id=session_id,
        updated_at=_parse_when(updated_at) if updated_at else None,
        generation=generation,
        intent=intent,
    )
