"""The ``turso`` claim store: pyturso (Turso's SQLite-compatible engine) with multi-process WAL.

Without ``experimental_features="multiprocess_wal"`` pyturso locks the file exclusively and a
second process cannot even open it; with it, processes coordinate through a ``-tshm`` sidecar.
A writer that meets another's ``BEGIN IMMEDIATE`` gets "database is locked" unless it waits:
``PRAGMA busy_timeout`` covers most of it and the store's jittered retry the rest.

NB: never let stdlib sqlite3 *write* a turso store while a turso process has it open: the two
engines coordinate differently. Reading it after every turso process closed is fine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from lorenz.claims.sql import BUSY_TIMEOUT_MS, DbConnection, SqlClaimStore, SqlDriver

MULTIPROCESS_FEATURE = "multiprocess_wal"


def _turso() -> Any:
    # Imported on first use: the engine is a native module that `lorenz status` never needs.
    import turso

    return turso


class TursoDriver:
    """pyturso, autocommit mode, multi-process WAL."""

    backend = "turso"

    def connect(self, path: Path) -> DbConnection:
        conn: DbConnection = _turso().connect(
            str(path), experimental_features=MULTIPROCESS_FEATURE, isolation_level=None
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return conn

    def tune(self, conn: DbConnection) -> None:
        # Turso always journals in WAL mode; only durability is ours to choose.
        conn.execute("PRAGMA synchronous = NORMAL")

    def is_busy(self, exc: BaseException) -> bool:
        turso = _turso()
        if not isinstance(exc, turso.OperationalError | turso.DatabaseError):
            return False
        text = str(exc).lower()
        return "locked" in text or "busy" in text

    def is_database_error(self, exc: BaseException) -> bool:
        return isinstance(exc, _turso().DatabaseError)


class TursoClaimStore(SqlClaimStore):
    """Claims in a Turso file shared by processes on this host (``claim_store.backend=turso``)."""

    backend: ClassVar[str] = "turso"

    @classmethod
    def _make_driver(cls) -> SqlDriver:
        return TursoDriver()
