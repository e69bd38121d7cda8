"""The store's bounded event log: the recent mutations, for diagnostics.

Every write of the SQL claim store appends one row to ``events`` inside its own transaction,
so the log shows what each owner did to the store (``lorenz status``, the recovery report);
the table keeps only the newest :data:`EVENTS_KEPT` rows, trimmed in the same transaction.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from lorenz.claims.connections import DbConnection
from lorenz.model import SlotKey

EVENTS_KEPT = 500
"""How many recent mutation events the ``events`` table keeps."""


class EventKind:
    """The ``events.kind`` vocabulary."""

    ACQUIRE = "acquire"
    SAVE = "save"
    RELEASE = "release"
    TAKE_OVER = "take_over"
    CHECKPOINT = "checkpoint"
    OWNER_OPEN = "owner_open"
    OWNER_CLOSE = "owner_close"
    OWNER_DEAD = "owner_dead"
    FENCE = "fence"
    INTENT = "intent"
    MIGRATE = "migrate"


@dataclasses.dataclass(frozen=True, slots=True)
class StoreEvent:
    """One row of the bounded ``events`` table: a recent mutation, for diagnostics."""

    id: int
    at_ms: float
    """Wall-clock epoch milliseconds of the commit."""
    owner: str
    kind: str
    slot_key: SlotKey | None
    body: Any
    """The JSON body (the claim record for acquire/save, the keys for take_over), or None."""


def append_event(
    conn: DbConnection,
    *,
    owner: str,
    kind: str,
    now_ms: float,
    kept: int,
    slot_key: str | None = None,
    body: Any = None,
) -> None:
    """Append one event in the caller's transaction and trim the table to ``kept`` rows."""
    text = json.dumps(body, sort_keys=True) if body is not None else None
    # NB: no RETURNING here or anywhere: turso 0.8 takes milliseconds per RETURNING statement.
    conn.execute(
        "INSERT INTO events (at, owner, kind, slot_key, body) VALUES (?, ?, ?, ?, ?)",
        (now_ms, owner, kind, slot_key, text),
    )
    (last_id,) = conn.execute("SELECT last_insert_rowid()").fetchone()
    # NB: AUTOINCREMENT ids only grow, so "the last N" is an id range; the trim rides in the
    # mutation's own transaction and the table can never exceed N rows.
    conn.execute("DELETE FROM events WHERE id <= ?", (int(last_id) - kept,))


def read_events(conn: DbConnection, *, limit: int) -> list[StoreEvent]:
    """The newest ``limit`` events, newest first."""
    rows = conn.execute(
        "SELECT id, at, owner, kind, slot_key, body FROM events ORDER BY id DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [
        StoreEvent(
            id=int(row[0]),
            at_ms=float(row[1]),
            owner=str(row[2]),
            kind=str(row[3]),
            slot_key=SlotKey(row[4]) if row[4] is not None else None,
            body=json.loads(row[5]) if row[5] is not None else None,
        )
        for row in rows
    ]
