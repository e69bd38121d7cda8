"""The claim store's tables, their version, and the migrations from older versions.

A store file outlives the code that wrote it, so what the tables look like at each version and
how one version becomes the next are kept in one place, apart from the queries that use them
(:mod:`lorenz.claims.rows`) and the store's transactions (:mod:`lorenz.claims.sql`). Opening a
store checks the version first (:func:`check_schema`) and only then touches the file.
"""

from __future__ import annotations

from pathlib import Path

from lorenz.claims.connections import DbConnection
from lorenz.claims.errors import ClaimStoreSchemaUnsupported

SCHEMA_VERSION = "4"
"""The schema this code writes (``claim_store_meta.schema_version``)."""

MIGRATED_VERSIONS = frozenset({"1", "2", "3"})
"""Older schemas this code opens and migrates in place (one transaction, on first open)."""

CLAIM_COLUMNS: tuple[str, ...] = (
    "slot_key",
    "owner",
    "issue_id",
    "identifier",
    "slot_index",
    "phase",
    "attempt",
    "retry_kind",
    "due_at",
    "reservation_token",
    "host",
    "workspace_path",
    "started_at",
    "last_agent_at",
    "turn_count",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "last_error",
    "session_id",
    "updated_at",
    "generation",
)

INTENT_COLUMNS: tuple[str, ...] = (
    "handle",
    "spawn_phase",
    "intent_generation",
    "last_seq",
    "placement",
    "intent_at",
)
"""The spawn intent of a claim: written only by ``record_intent``; ``save`` keeps it, except
that a claim going back to a pending retry drops it (its run is settled)."""

_SPEND_TABLES: tuple[str, ...] = (
    # The spend ledger (lorenz.claims.spend): per issue, kept after the issue finished, pruned
    # by age of the last charge; per UTC day.
    "CREATE TABLE IF NOT EXISTS issue_spend ("
    " issue_id TEXT PRIMARY KEY, identifier TEXT NOT NULL, tokens INTEGER NOT NULL DEFAULT 0,"
    " usd REAL NOT NULL DEFAULT 0, updated_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS issue_spend_by_age ON issue_spend (updated_at)",
    "CREATE TABLE IF NOT EXISTS day_spend ("
    " day TEXT PRIMARY KEY, tokens INTEGER NOT NULL DEFAULT 0, usd REAL NOT NULL DEFAULT 0,"
    " updated_at REAL NOT NULL)",
)

_MIGRATIONS: dict[str, tuple[str, ...]] = {
    # Each entry takes a store from its version to the next; opening an older store runs the
    # steps of every version from its own up to SCHEMA_VERSION, in one transaction.
    # v3 → v4: the store's own clock at each claim write (retry readiness from the store's
    # clock, not the writer's); rows written before read as without it.
    "3": ("ALTER TABLE claims ADD COLUMN stored_at TEXT",),
    # v2 → v3: the spend ledger (new tables only; existing rows untouched).
    "2": _SPEND_TABLES,
    # v1 → v2: the generation of each claim's writer, the spawn intent, the fence row.
    "1": (
        "ALTER TABLE claims ADD COLUMN generation INTEGER",
        "ALTER TABLE claims ADD COLUMN handle TEXT",
        "ALTER TABLE claims ADD COLUMN spawn_phase TEXT",
        "ALTER TABLE claims ADD COLUMN intent_generation INTEGER",
        "ALTER TABLE claims ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE claims ADD COLUMN placement TEXT",
        "ALTER TABLE claims ADD COLUMN intent_at TEXT",
        "CREATE TABLE IF NOT EXISTS fence ("
        " id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL, holder TEXT,"
        " fenced_at REAL NOT NULL)",
    ),
}
_NEXT_VERSION: dict[str, str] = {"1": "2", "2": "3", "3": "4"}


def migration_steps(version: str) -> tuple[str, ...]:
    """The statements that take a store of ``version`` to :data:`SCHEMA_VERSION`."""
    steps: list[str] = []
    while version != SCHEMA_VERSION:
        steps.extend(_MIGRATIONS[version])
        version = _NEXT_VERSION[version]
    return tuple(steps)


SCHEMA: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS claim_store_meta ( key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS claims ("
    " slot_key TEXT PRIMARY KEY, owner TEXT NOT NULL,"
    " issue_id TEXT NOT NULL, identifier TEXT NOT NULL, slot_index INTEGER NOT NULL,"
    " phase TEXT NOT NULL, attempt INTEGER, retry_kind TEXT, due_at TEXT,"
    " reservation_token TEXT, host TEXT, workspace_path TEXT, started_at TEXT,"
    " last_agent_at TEXT, turn_count INTEGER NOT NULL DEFAULT 0,"
    " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,"
    " total_tokens INTEGER NOT NULL DEFAULT 0, last_error TEXT, session_id TEXT,"
    " updated_at TEXT, generation INTEGER, handle TEXT, spawn_phase TEXT,"
    " intent_generation INTEGER, last_seq INTEGER NOT NULL DEFAULT 0, placement TEXT,"
    " intent_at TEXT, stored_at TEXT)",
    "CREATE INDEX IF NOT EXISTS claims_by_owner ON claims (owner)",
    "CREATE TABLE IF NOT EXISTS owners ("
    " owner TEXT PRIMARY KEY, heartbeat_at REAL NOT NULL, pid INTEGER, host TEXT,"
    " started_at REAL)",
    "CREATE TABLE IF NOT EXISTS checkpoint ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL, updated_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS events ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, owner TEXT NOT NULL,"
    " kind TEXT NOT NULL, slot_key TEXT, body TEXT)",
    # One row: the newest leader generation that fenced the store. Every write of a fenced
    # store compares it with its own generation inside its transaction.
    "CREATE TABLE IF NOT EXISTS fence ("
    " id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL, holder TEXT,"
    " fenced_at REAL NOT NULL)",
    *_SPEND_TABLES,
)


def schema_version(conn: DbConnection) -> tuple[bool, str | None]:
    """``(has tables, claim_store_meta.schema_version)`` of an open database; reads only."""
    names = {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    }
    names = {n for n in names if not n.startswith("sqlite_")}
    if "claim_store_meta" not in names:
        return bool(names), None
    row = conn.execute("SELECT value FROM claim_store_meta WHERE key = 'schema_version'").fetchone()
    return True, (str(row[0]) if row is not None else None)


def check_schema(conn: DbConnection, *, path: Path) -> str | None:
    """The schema version (``None``: an empty database); raise if it is not one we open."""
    has_tables, version = schema_version(conn)
    if not has_tables:
        return None
    if version != SCHEMA_VERSION and version not in MIGRATED_VERSIONS:
        raise ClaimStoreSchemaUnsupported(path=path, version=version)
    return version
