"""The ``turso`` claim store: pyturso (Turso's SQLite-compatible engine) with multi-process WAL.

Without ``experimental_features="multiprocess_wal"`` pyturso locks the file exclusively and a
second process cannot even open it; with it, processes coordinate through a ``-tshm`` sidecar.
A writer that meets another's ``BEGIN IMMEDIATE`` gets "database is locked" unless it waits:
``PRAGMA busy_timeout`` covers most of it and the store's jittered retry the rest.

NB: never let stdlib sqlite3 *write* a turso store while a turso process has it open: the two
engines coordinate differently. Reading it after every turso process closed is fine.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, ClassVar

from lorenz.claims.sql import DbConnection, SqlClaimStore, SqlDriver, check_schema

MULTIPROCESS_FEATURE = "multiprocess_wal"

WRITE_FAILURE_CLASSES: frozenset[str] = frozenset({"IoError", "DatabaseFull", "Readonly"})
"""pyturso's exception classes for a file system that refuses writes."""

WRITE_FAILURE_MARKS: tuple[str, ...] = (
    "storagefull",
    "disk is full",
    "no space left",
    "readonlyfilesystem",
    "read-only",
    "readonly",
    "i/o error",
    "ioerror",
)
"""How pyturso's messages name a file system that refuses writes (lower case)."""


def _turso() -> Any:
    # Imported on first use: the engine is a native module that `lorenz status` never needs.
    import turso

    return turso


SQLITE_HEADER = b"SQLite format 3\x00"
LEGACY_JOURNAL = 1
"""Header bytes 18/19 of a rollback-journal (non-WAL) SQLite file."""


def _refuse_foreign_legacy_file(path: Path) -> None:
    """Check a rollback-journal file's schema with stdlib sqlite3, read-only, before turso.

    NB: opening a non-WAL file, turso converts it to WAL on the spot (header bytes 18/19), which
    would break the promise that a store of an unknown schema is left untouched. Every turso or
    sqlite claim store is already in WAL mode, so only a foreign file takes this path, and no
    turso process can have it open (turso would have converted it).
    """
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except FileNotFoundError:
        return
    if len(header) < 20 or not header.startswith(SQLITE_HEADER) or header[18] != LEGACY_JOURNAL:
        return
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        check_schema(conn, path=path)
    finally:
        conn.close()


class TursoDriver:
    """pyturso, autocommit mode, multi-process WAL."""

    backend = "turso"

    def connect(self, path: Path, *, busy_timeout_ms: int) -> DbConnection:
        _refuse_foreign_legacy_file(path)
        conn: DbConnection = _turso().connect(
            str(path), experimental_features=MULTIPROCESS_FEATURE, isolation_level=None
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        return conn

    def tune(self, conn: DbConnection) -> None:
        # Turso always journals in WAL mode; only durability is ours to choose.
        conn.execute("PRAGMA synchronous = NORMAL")

    def is_busy(self, exc: BaseException) -> bool:
        turso = _turso()
        if not isinstance(exc, turso.DatabaseError):  # OperationalError is one
            return False
        text = str(exc).lower()
        return "locked" in text or "busy" in text

    def is_database_error(self, exc: BaseException) -> bool:
        return isinstance(exc, _turso().DatabaseError)

    def is_write_failure(self, exc: BaseException) -> bool:
        # NB: pyturso 0.x passes some engine errors through unmapped (``turso.IoError:
        # pwritev: StorageFull`` on a full file system, ``DatabaseFull``, ``Readonly``: plain
        # Exceptions, not DB-API ones) and carries no result code; the class name and the
        # message are all there is.
        if type(exc).__name__ in WRITE_FAILURE_CLASSES:
            return True
        if not isinstance(exc, _turso().DatabaseError):
            return False
        text = str(exc).lower()
        return any(mark in text for mark in WRITE_FAILURE_MARKS)


class TursoClaimStore(SqlClaimStore):
    """Claims in a Turso file shared by processes on this host (``claim_store.backend=turso``)."""

    backend: ClassVar[str] = "turso"

    @classmethod
    def _make_driver(cls) -> SqlDriver:
        return TursoDriver()
