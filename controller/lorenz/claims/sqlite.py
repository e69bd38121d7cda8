"""The ``sqlite`` claim store: stdlib sqlite3 in WAL mode, safe to share between processes.

SQLite's own file locking is the exclusion mechanism (see :mod:`lorenz.claims.sql`); WAL lets
readers (a ``lorenz status`` process, a recovery pass) run while a writer commits.

Durability: ``synchronous=NORMAL`` by default. In WAL mode that survives any process crash
(``kill -9``) with every committed transaction intact; only an OS crash or power loss can roll
back the last few commits, and those take every run on the host down with them anyway. ``FULL``
adds an fsync per commit (see ``bench/store_bench.py`` for both figures).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import ClassVar, Literal

from lorenz.claims.errors import ClaimStoreUnreadable
from lorenz.claims.sql import DbConnection, SqlClaimStore, SqlDriver

Synchronous = Literal["NORMAL", "FULL"]

WRITE_FAILURE_CODES: frozenset[int] = frozenset({8, 10, 13})
"""Primary SQLite result codes of a file system that refuses writes: ``SQLITE_READONLY``,
``SQLITE_IOERR`` (and its extended codes: the low byte is the primary one), ``SQLITE_FULL``."""


class SqliteDriver:
    """stdlib ``sqlite3``, autocommit mode, WAL."""

    backend = "sqlite"

    def __init__(self, *, synchronous: Synchronous = "NORMAL") -> None:
        self.synchronous: Synchronous = synchronous

    def connect(self, path: Path, *, busy_timeout_ms: int) -> DbConnection:
        # NB: isolation_level=None is autocommit: the store issues BEGIN IMMEDIATE itself;
        # the module's implicit BEGIN (DEFERRED) would upgrade to a write lock too late.
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        return conn

    def tune(self, conn: DbConnection) -> None:
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            path = conn.execute("PRAGMA database_list").fetchone()[2]
            raise ClaimStoreUnreadable(
                path=Path(path), reason=f"the file system refused WAL mode (got {mode!r})"
            )
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")

    def is_busy(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        text = str(exc).lower()
        return "database is locked" in text or "database is busy" in text

    def is_database_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.DatabaseError)

    def is_write_failure(self, exc: BaseException) -> bool:
        if not isinstance(exc, sqlite3.DatabaseError):
            return False
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in WRITE_FAILURE_CODES


class SqliteClaimStore(SqlClaimStore):
    """Claims in a local SQLite file (``claim_store.backend=sqlite``, or ``durable_claims``)."""

    backend: ClassVar[str] = "sqlite"
    synchronous: ClassVar[Synchronous] = "NORMAL"

    @classmethod
    def _make_driver(cls) -> SqlDriver:
        return SqliteDriver(synchronous=cls.synchronous)


class FullSyncSqliteClaimStore(SqliteClaimStore):
    """``synchronous=FULL``: an fsync per commit (for measurements; not selectable by flags)."""

    synchronous: ClassVar[Synchronous] = "FULL"
