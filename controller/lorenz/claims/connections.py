"""The DB-API surface the SQL claim store needs, and what a driver must say about itself.

The store (:mod:`lorenz.claims.sql`) is written once for every SQLite-compatible driver; these
protocols are the whole contract between it and a backend (:mod:`lorenz.claims.sqlite`,
:mod:`lorenz.claims.turso`), kept apart so a backend imports the contract without the store's
transactions and queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class DbCursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class DbConnection(Protocol):
    """The DB-API subset the store uses (autocommit mode: transactions are explicit)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> DbCursor: ...

    def close(self) -> None: ...


class SqlDriver(Protocol):
    """What differs between SQLite-compatible drivers."""

    backend: str
    """The ``claim_store.backend`` value this driver serves."""

    def connect(self, path: Path, *, busy_timeout_ms: int) -> DbConnection:
        """Open ``path`` in autocommit mode (no implicit transactions) with a busy timeout."""
        ...

    def tune(self, conn: DbConnection) -> None:
        """Set journal/durability pragmas; called only after the schema version was accepted."""
        ...

    def is_busy(self, exc: BaseException) -> bool:
        """Whether ``exc`` means "another connection holds the lock; try again"."""
        ...

    def is_database_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the driver's error for an unusable file (not a database, ...)."""
        ...

    def is_write_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the file system refused a write (full, read-only, I/O error)."""
        ...
