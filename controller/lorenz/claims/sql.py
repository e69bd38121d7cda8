"""The durable claim store, once, for every SQLite-compatible driver (stdlib sqlite3, pyturso).

Two backends speak the same SQL and must obey the same exclusion rule, so the schema, the
transactions and the row mapping live here, and a backend only says how to connect, how to tune
the connection, and what its "database is locked" error looks like (:class:`SqlDriver`).

Exclusion between processes rests on one thing: every write runs inside ``BEGIN IMMEDIATE``,
which takes the database's single write lock *before* reading anything. A claim is then one
conditional upsert ("insert, or update only if the row is already ours"), so two processes can
never both see a slot as free. A write that finds the lock taken is retried as a whole, with
jittered backoff, for a bounded time (``claim_store_busy`` after that).

The blocking driver calls run on one thread per store (a single-thread executor): the
connection is created and used only there (pyturso connections must not cross threads), and the
store's operations are serialized in the order they were awaited.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypeVar

import tenacity

from lorenz.claims.errors import (
    MAX_REBIND as MAX_REBIND,  # NB: re-exported: tests and tools import it from here
)
from lorenz.claims.errors import (
    ClaimGenerationStale,
    ClaimOwnerLost,
    ClaimRebindTooLarge,
    ClaimRecoveryTooLarge,
    ClaimStoreBusy,
    ClaimStoreSchemaUnsupported,
    ClaimStoreUnreadable,
    ClaimStoreWriteFailed,
)
from lorenz.claims.owners import Liveness, ProcessIdentity, current_process, owner_liveness
from lorenz.claims.spend import (
    DAY_SPEND_KEPT,
    ISSUE_SPEND_KEPT,
    IssueSpend,
    SpendCharge,
    SpendTotal,
    check_charge,
)
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    Clock,
    LorenzError,
    RetryKind,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
    StoredState,
    SystemClock,
    TokenUsage,
)
from lorenz.model.clocks import iso_or_none

logger = logging.getLogger(__name__)

SCHEMA_VERSION = "4"
"""The schema this code writes (``claim_store_meta.schema_version``)."""

MIGRATED_VERSIONS = frozenset({"1", "2", "3"})
"""Older schemas this code opens and migrates in place (one transaction, on first open)."""

DEFAULT_OWNER_STALE_MS = 30_000
"""Heartbeat age after which an owner is stale, when ``claim_store.owner_stale_ms`` is 0."""

EVENTS_KEPT = 500
"""How many recent mutation events the ``events`` table keeps."""


BUSY_DEADLINE_S = 10.0
"""How long one operation keeps retrying a locked database before ``claim_store_busy``."""

BUSY_TIMEOUT_MS = 2_000
"""The driver's own wait for the write lock, per attempt (``PRAGMA busy_timeout``)."""

T = TypeVar("T")


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


_CLAIM_COLUMNS: tuple[str, ...] = (
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

_INTENT_COLUMNS: tuple[str, ...] = (
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

_SCHEMA: tuple[str, ...] = (
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

_SELECT_CLAIMS = f"SELECT {', '.join(_CLAIM_COLUMNS + _INTENT_COLUMNS)} FROM claims"
# NB: the WHERE on the DO UPDATE branch is the whole exclusion rule: a row held by anyone else
# is left untouched and changes() stays 0. Stale owners are no exception (see take_over).
_STORE_NOW = "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')"
"""The store's own clock (SQLite's, or the Turso server's), never the writer's."""
_UPSERT_CLAIM = (
    f"INSERT INTO claims ({', '.join(_CLAIM_COLUMNS)}, stored_at)"
    f" VALUES ({', '.join('?' for _ in _CLAIM_COLUMNS)}, {_STORE_NOW})"
    " ON CONFLICT (slot_key) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*_CLAIM_COLUMNS, "stored_at") if c != "slot_key")
    + ", "
    # NB: a claim back to a pending retry has a settled run: its intent has nothing to probe.
    + ", ".join(
        f"{c} = CASE WHEN excluded.phase = 'RetryPending' THEN"
        f" {'0' if c == 'last_seq' else 'NULL'} ELSE claims.{c} END"
        for c in _INTENT_COLUMNS
    )
    + " WHERE claims.owner = excluded.owner"
)
_SET_INTENT = (
    "UPDATE claims SET "
    + ", ".join(f"{c} = ?" for c in _INTENT_COLUMNS)
    + " WHERE slot_key = ? AND owner = ?"
)


def _retry_readiness(conn: DbConnection, *, bound: int | None) -> dict[SlotKey, float]:
    """Milliseconds until each pending retry is due, on the store's clock.

    The writer's delay (``due_at - updated_at``, both its own clock, so its skew cancels) is
    counted from ``stored_at``, the store's clock at that write, against the store's clock now.
    Rows without ``stored_at`` (written before schema 4) are left out: their wall-clock
    ``due_at`` is used, as before.
    """
    rows = conn.execute(
        f"SELECT slot_key, due_at, updated_at, stored_at, {_STORE_NOW} FROM claims"
        " WHERE phase = 'RetryPending' AND due_at IS NOT NULL AND updated_at IS NOT NULL"
        " AND stored_at IS NOT NULL LIMIT ?",
        (-1 if bound is None else bound + 1,),
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


def _claim_params(
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


def _intent_params(intent: SpawnIntent | None) -> tuple[Any, ...]:
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
_parse_when = datetime.datetime.fromisoformat


def _claim_from_row(row: Sequence[Any]) -> ClaimRecord:
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


_SPEND_TABLE_KEYS: frozenset[tuple[str, str]] = frozenset(
    {("issue_spend", "issue_id"), ("day_spend", "day")}
)


def _total_row(conn: DbConnection, table: str, column: str, key: str) -> SpendTotal:
    # NB: table and column are spliced into SQL: only the two ledger tables are allowed.
    if (table, column) not in _SPEND_TABLE_KEYS:
        raise ValueError(f"not a spend table: {table}.{column}")
    row = conn.execute(f"SELECT tokens, usd FROM {table} WHERE {column} = ?", (key,)).fetchone()
    if row is None:
        return SpendTotal()
    return SpendTotal(tokens=int(row[0]), usd=float(row[1]))


def _rollback_quietly(conn: DbConnection) -> None:
    # NB: a failed COMMIT or a busy error may already have ended the transaction.
    with contextlib.suppress(Exception):
        conn.execute("ROLLBACK")


class SqlClaimStore(abc.ABC):
    """A :class:`~lorenz.model.ClaimStore` in one SQLite-compatible file, shared by processes.

    Build it with ``await <Backend>.open(path, owner=...)``; the constructor does no I/O.
    """

    backend: ClassVar[str] = "sql"

    def __init__(
        self,
        *,
        driver: SqlDriver,
        path: Path,
        owner: str,
        owner_stale_ms: int = 0,
        clock: Clock | None = None,
        events_kept: int = EVENTS_KEPT,
        issue_spend_kept: int = ISSUE_SPEND_KEPT,
        day_spend_kept: int = DAY_SPEND_KEPT,
        busy_deadline_s: float = BUSY_DEADLINE_S,
        process: ProcessIdentity | None = None,
        liveness: Callable[[str], Liveness] | None = None,
    ) -> None:
        if not owner:
            raise ValueError("a claim store needs a non-empty owner id")
        self._driver = driver
        self._path = path
        self._owner = owner
        self._owner_stale_ms = owner_stale_ms or DEFAULT_OWNER_STALE_MS
        self._clock: Clock = clock or SystemClock()
        self._events_kept = events_kept
        self._issue_spend_kept = issue_spend_kept
        self._day_spend_kept = day_spend_kept
        self._busy_deadline_s = busy_deadline_s
        self._process = process or current_process()
        self._liveness: Callable[[str], Liveness] = liveness or owner_liveness
        self._conn: DbConnection | None = None
        self._closed = False
        self._generation: int | None = None
        self._on_fenced: Callable[[LorenzError], None] | None = None
        self._fenced_out: ClaimGenerationStale | None = None
        self._write_failure: ClaimStoreWriteFailed | None = None
        self._write_succeeded = False
        """Set by the store's thread when a write transaction committed (reset per call)."""
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"lorenz-claims-{driver.backend}"
        )
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(driver.is_busy),
            wait=tenacity.wait_random_exponential(multiplier=0.005, max=0.25),
            stop=tenacity.stop_after_delay(busy_deadline_s),
            reraise=True,
        )

    # -- construction --------------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def _make_driver(cls) -> SqlDriver:
        """The DB-API driver of this backend (each backend module overrides it)."""

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        owner: str,
        owner_stale_ms: int = 0,
        clock: Clock | None = None,
        events_kept: int = EVENTS_KEPT,
        issue_spend_kept: int = ISSUE_SPEND_KEPT,
        day_spend_kept: int = DAY_SPEND_KEPT,
        busy_deadline_s: float = BUSY_DEADLINE_S,
        liveness: Callable[[str], Liveness] | None = None,
    ) -> Self:
        """Open (creating if needed) the store at ``path`` and register ``owner``'s heartbeat.

        ``liveness`` says whether an owner id's process still runs (default
        :func:`~lorenz.claims.owners.owner_liveness`: pid and start time, on this host only).
        Raises :class:`ClaimStoreSchemaUnsupported` for a file of another schema version, and
        :class:`ClaimStoreUnreadable` for a file that is not a database.
        """
        store = cls(
            driver=cls._make_driver(),
            path=path,
            owner=owner,
            owner_stale_ms=owner_stale_ms,
            clock=clock,
            events_kept=events_kept,
            issue_spend_kept=issue_spend_kept,
            day_spend_kept=day_spend_kept,
            busy_deadline_s=busy_deadline_s,
            liveness=liveness,
        )
        try:
            await store._run(store._open_sync, opening=True)
        except BaseException:
            await store._dispose()
            raise
        return store

    # -- the ClaimStore port -----------------------------------------------------------------

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def durable(self) -> bool:
        return True

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def owner_stale_ms(self) -> int:
        """The effective stale threshold (the default when 0 was configured)."""
        return self._owner_stale_ms

    @property
    def generation(self) -> int | None:
        """The leader generation our writes carry and are conditioned on (``None``: unfenced)."""
        return self._generation

    @property
    def write_failure(self) -> ClaimStoreWriteFailed | None:
        """Why the last write was refused by the file system (full, read-only), until a write
        succeeds again; ``None`` while writes succeed.

        The runtime pauses dispatch while this is set (a claim it cannot record must not be
        run) and resumes when a later write (the next heartbeat) clears it.
        """
        return self._write_failure

    @property
    def fenced_out(self) -> ClaimGenerationStale | None:
        """Why our writes are refused, once a newer generation fenced the store."""
        return self._fenced_out

    async def fence(
        self, generation: int, *, on_fenced: Callable[[LorenzError], None] | None = None
    ) -> None:
        """Raise the store's fence to ``generation``; from now on every write is conditioned on it.

        In one write transaction: a fence already *higher* than ``generation`` is refused with
        :class:`ClaimGenerationStale` (a newer leader exists) and nothing changes; otherwise the
        fence row becomes ours. Every later write of this store first re-reads the fence in its
        own transaction and is refused, before it changes anything, once it moved on.
        """
        self._on_fenced = on_fenced
        await self._run(lambda: self._fence_sync(generation))
        self._generation = generation
        self._fenced_out = None

    async def record_intent(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        """Write the spawn intent of our claim on ``key`` (``None`` clears it); ``False`` when
        the claim is absent or another owner's. Fenced like every write."""
        return await self._run(lambda: self._intent_sync(key, intent))

    async def load(self, *, bound: int | None = None) -> StoredState:
        """Every claim (of every owner), the checkpoint, and the owners that are stale now.

        With ``bound``, the read itself is bounded (``LIMIT bound + 1``) and more rows than
        ``bound`` fail closed (``claim_rebind_too_large``)."""
        return await self._run(lambda: self._load_sync(bound=bound))

    async def acquire(self, record: ClaimRecord) -> bool:
        """Claim ``record.slot_key``; ``False`` when any other owner's row holds it.

        NB: a *stale* owner's row is refused too: its claims are recovered only through
        :meth:`take_over`, so that an interrupted run comes back as a failure retry rather than
        being silently overwritten as new work.
        """
        return await self._run(lambda: self._put_sync(record, kind=EventKind.ACQUIRE))

    async def save(self, record: ClaimRecord) -> None:
        """Update our claim (or create it if the slot is free); a no-op if another owns it."""
        await self._run(lambda: self._put_sync(record, kind=EventKind.SAVE))

    async def release(self, key: SlotKey) -> None:
        await self._run(lambda: self._release_sync(key))

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        """Re-own the claims of those ``from_owners`` that are stale *at commit time*.

        Owners that are live again (their heartbeat resumed) are skipped, and so is this owner.
        The taken owners' heartbeat rows are deleted with their claims moved, in one transaction.
        """
        owners = sorted(set(from_owners) - {self._owner})
        if not owners:
            return []
        return await self._run(lambda: self._take_over_sync(owners))

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        """Persist the orchestrator checkpoint (one row, last writer wins); must be JSON-safe."""
        body = json.dumps(dict(checkpoint), sort_keys=True)
        await self._run(lambda: self._checkpoint_sync(body))

    async def heartbeat(self) -> None:
        """Refresh this owner's heartbeat row (wall clock).

        Raises :class:`ClaimOwnerLost` (once) when our row had been removed: we were stale and
        another owner took our claims over, so the runs we still have are no longer ours.
        """
        await self._run(self._heartbeat_sync)

    async def close(self) -> None:
        """Mark this owner closed (heartbeat 0, so a successor may take over at once) and close.

        Claim rows are kept: on a graceful stop the runtime releases what it no longer holds;
        whatever remains is for the next process to recover.
        """
        if self._closed:
            return
        try:
            if self._conn is not None:
                await self._run(self._close_sync)
        except ClaimGenerationStale:
            pass  # NB: fenced out: a deposed leader leaves the store as its successor has it
        except ClaimStoreWriteFailed as exc:
            # NB: a full disk must not turn a clean stop into a crash. Our heartbeat row stays
            # as it was: a successor on this host sees our pid gone and takes over at once;
            # elsewhere it waits for the row to go stale, as after a kill.
            logger.warning("claim store closed without marking its owner closed: %s", exc)
        finally:
            await self._dispose()

    # -- extras for recovery passes and diagnostics ----------------------------------------------

    async def mark_owners_dead(self, owners: Iterable[str]) -> list[str]:
        """Declare ``owners`` dead, so the next :meth:`load` reports them stale at once.

        For a caller that *proved* the processes gone — the daemon, whose lease verified its
        predecessor's pid and start time on this host. Their heartbeat is set to 0, exactly what
        their own :meth:`close` would have written; no claim row changes (recovery still goes
        through :meth:`take_over`). Owners without a row are stale already; this owner is never
        touched. Returns the owners whose rows were marked.
        """
        wanted = sorted(set(owners) - {self._owner})
        if not wanted:
            return []
        return await self._run(lambda: self._mark_dead_sync(wanted))

    async def stale_owners(self) -> frozenset[str]:
        """Owners (other than us) holding claims or heartbeat rows, whose heartbeat is stale."""
        return await self._run(self._stale_owners_sync)

    async def recent_events(self, *, limit: int = 100) -> list[StoreEvent]:
        """The newest ``limit`` mutation events, newest first."""
        return await self._run(lambda: self._events_sync(limit))

    async def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"``, or the problems found, one per line."""
        return await self._run(self._integrity_sync)

    # -- the spend ledger (lorenz.claims.spend.SpendLedger) -------------------------------------

    async def add_spend(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        """Add one usage delta to the issue's and the day's totals, in one transaction."""
        check_charge(tokens=tokens, usd=usd)
        return await self._run(
            lambda: self._add_spend_sync(
                issue_id=issue_id, identifier=identifier, day=day, tokens=tokens, usd=usd
            )
        )

    async def issue_spend(self, issue_id: str) -> SpendTotal:
        return await self._run(lambda: self._read_total_sync("issue_spend", "issue_id", issue_id))

    async def day_spend(self, day: str) -> SpendTotal:
        return await self._run(lambda: self._read_total_sync("day_spend", "day", day))

    async def issue_spends(self, *, limit: int = 100) -> list[IssueSpend]:
        return await self._run(lambda: self._issue_spends_sync(limit))

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T], *, opening: bool = False) -> T:
        if self._closed or (self._conn is None and not opening):
            raise RuntimeError(f"claim store {self._path} is closed")
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor, fn)
        except ClaimGenerationStale as exc:
            self._refused(exc)
            raise
        except ClaimStoreWriteFailed as exc:
            if self._write_failure is None:
                # NB: once per outage, without a traceback: the caller reports the coded error,
                # and a poll every few seconds must not flood the log with the same one.
                logger.warning("claim store writes failing: %s", exc)
            self._write_failure = exc
            raise
        if self._write_failure is not None and self._write_succeeded:
            logger.info("claim store writes succeed again path=%s", self._path)
            self._write_failure = None
        return result

    def _refused(self, exc: ClaimGenerationStale) -> None:
        first = self._fenced_out is None
        self._fenced_out = exc
        if first:
            logger.error("claim write refused: %s", exc)
            if self._on_fenced is not None:
                self._on_fenced(exc)

    async def _dispose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)

    def _now_ms(self) -> float:
        return self._clock.now().timestamp() * 1000.0

    def _is_stale(self, heartbeat_ms: float, now_ms: float) -> bool:
        return heartbeat_ms < now_ms - self._owner_stale_ms

    def _connection(self) -> DbConnection:
        if self._conn is None:
            raise RuntimeError(f"claim store {self._path} is closed")
        return self._conn

    def _transaction(
        self, body: Callable[[DbConnection], T], *, write: bool = True, fenced: bool = True
    ) -> T:
        """Run ``body`` in one transaction, retrying it whole while the database is locked.

        A write of a fenced store first compares the fence row with our generation, in the same
        transaction (so under the same write lock), and raises :class:`ClaimGenerationStale`
        before ``body`` runs if a newer generation fenced the store.
        """
        conn = self._connection()
        self._write_succeeded = False
        try:
            for attempt in self._retrying:
                with attempt:
                    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                    try:
                        if write and fenced and self._generation is not None:
                            self._check_fence(conn, self._generation)
                        result = body(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        _rollback_quietly(conn)
                        raise
                    self._write_succeeded = write
                    return result
        except Exception as exc:
            if self._driver.is_busy(exc):
                raise ClaimStoreBusy(path=self._path, waited_s=self._busy_deadline_s) from exc
            if self._driver.is_write_failure(exc):
                raise ClaimStoreWriteFailed(path=self._path, reason=str(exc)) from exc
            raise
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _check_fence(self, conn: DbConnection, generation: int) -> None:
        row = conn.execute("SELECT generation, holder FROM fence WHERE id = 1").fetchone()
        current = int(row[0]) if row is not None else None
        if current != generation:
            raise ClaimGenerationStale(
                path=self._path,
                generation=generation,
                current=current if current is not None else 0,
                holder=str(row[1]) if row is not None and row[1] is not None else None,
            )

    def _append_event(
        self,
        conn: DbConnection,
        *,
        kind: str,
        now_ms: float,
        slot_key: str | None = None,
        body: Any = None,
    ) -> None:
        text = json.dumps(body, sort_keys=True) if body is not None else None
        # NB: no RETURNING here or anywhere: turso 0.8 takes milliseconds per RETURNING statement.
        conn.execute(
            "INSERT INTO events (at, owner, kind, slot_key, body) VALUES (?, ?, ?, ?, ?)",
            (now_ms, self._owner, kind, slot_key, text),
        )
        (last_id,) = conn.execute("SELECT last_insert_rowid()").fetchone()
        # NB: AUTOINCREMENT ids only grow, so "the last N" is an id range; the trim rides in the
        # mutation's own transaction and the table can never exceed N rows.
        conn.execute("DELETE FROM events WHERE id <= ?", (int(last_id) - self._events_kept,))

    def _upsert_owner(self, conn: DbConnection, *, heartbeat_ms: float) -> None:
        conn.execute(
            "INSERT INTO owners (owner, heartbeat_at, pid, host, started_at)"
            " VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
            " pid = excluded.pid, host = excluded.host, started_at = excluded.started_at",
            (
                self._owner,
                heartbeat_ms,
                self._process.pid,
                self._process.host,
                self._process.started_at * 1000.0,
            ),
        )

    # -- the blocking operations (run on the store's thread) ----------------------------------

    def _open_sync(self) -> None:
        try:
            self._conn = self._driver.connect(
                self._path, busy_timeout_ms=min(BUSY_TIMEOUT_MS, int(self._busy_deadline_s * 1000))
            )
            self._transaction(self._check_schema, write=False)
            self._driver.tune(self._conn)
            self._transaction(self._create_sync, fenced=False)
        except Exception as exc:
            if self._driver.is_busy(exc):
                raise ClaimStoreBusy(path=self._path, waited_s=0) from exc
            if self._driver.is_write_failure(exc):
                raise ClaimStoreWriteFailed(path=self._path, reason=str(exc)) from exc
            if self._driver.is_database_error(exc):
                raise ClaimStoreUnreadable(path=self._path, reason=str(exc)) from exc
            raise

    def _check_schema(self, conn: DbConnection) -> None:
        # NB: this runs before any pragma that could rewrite the file (journal_mode=WAL), so a
        # store of an unknown version is left exactly as it was found.
        check_schema(conn, path=self._path)

    def _create_sync(self, conn: DbConnection) -> None:
        # Re-checked under the write lock: another process may have created (or replaced, or
        # migrated) the schema between our first look and now.
        version = check_schema(conn, path=self._path)
        now_ms = self._now_ms()
        if version is None:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO claim_store_meta (key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
        elif version != SCHEMA_VERSION:
            # NB: one transaction: a process killed mid-migration leaves the old schema whole.
            for step in migration_steps(version):
                conn.execute(step)
            conn.execute(
                "UPDATE claim_store_meta SET value = ? WHERE key = 'schema_version'",
                (SCHEMA_VERSION,),
            )
            self._append_event(
                conn,
                kind=EventKind.MIGRATE,
                now_ms=now_ms,
                body={"from": version, "to": SCHEMA_VERSION},
            )
            logger.info(
                "claim store migrated path=%s from=%s to=%s", self._path, version, SCHEMA_VERSION
            )
        self._upsert_owner(conn, heartbeat_ms=now_ms)
        # Owner rows of long-gone processes that hold nothing are noise for every later load.
        conn.execute(
            "DELETE FROM owners WHERE owner != ? AND heartbeat_at < ?"
            " AND owner NOT IN (SELECT DISTINCT owner FROM claims)",
            (self._owner, now_ms - self._owner_stale_ms),
        )
        self._append_event(
            conn,
            kind=EventKind.OWNER_OPEN,
            now_ms=now_ms,
            body={"pid": self._process.pid, "host": self._process.host},
        )

    def _stale_set(self, conn: DbConnection, now_ms: float) -> frozenset[str]:
        heartbeats = {
            str(owner): float(at)
            for owner, at in conn.execute("SELECT owner, heartbeat_at FROM owners").fetchall()
        }
        claim_owners = {
            str(row[0]) for row in conn.execute("SELECT DISTINCT owner FROM claims").fetchall()
        }
        return frozenset(
            owner
            for owner in (heartbeats.keys() | claim_owners) - {self._owner}
            if self._owner_is_stale(owner, heartbeats.get(owner), now_ms)
        )

    def _owner_is_stale(self, owner: str, heartbeat_ms: float | None, now_ms: float) -> bool:
        """The one staleness rule, for every reader (load, stale_owners, take_over).

        * heartbeat 0 — the owner closed, or was declared dead — stale;
        * on this host, its pid and start time decide at once: dead is stale, and alive is
          *not*, however old its heartbeat (a hung Lorenz must be stopped, not shadowed: its
          agents may still be working, and taking its claims would run them twice);
        * otherwise (another host, a custom owner id) the heartbeat's age decides, and an owner
          with claims but no heartbeat row cannot be proven live: stale.
        """
        if heartbeat_ms == 0.0:
            return True
        liveness = self._liveness(owner)
        if liveness is Liveness.DEAD:
            return True
        if liveness is Liveness.ALIVE:
            return False
        return heartbeat_ms is None or self._is_stale(heartbeat_ms, now_ms)

    def _load_sync(self, *, bound: int | None = None) -> StoredState:
        def body(conn: DbConnection) -> StoredState:
            if bound is None:
                rows = conn.execute(_SELECT_CLAIMS).fetchall()
            else:
                # NB: one row past the bound proves "too many" without reading them all.
                rows = conn.execute(f"{_SELECT_CLAIMS} LIMIT ?", (bound + 1,)).fetchall()
                if len(rows) > bound:
                    raise ClaimRecoveryTooLarge(
                        path=self._path, where=f"claim store {self._path}", limit=bound
                    )
            claims = [_claim_from_row(row) for row in rows]
            row = conn.execute("SELECT body FROM checkpoint WHERE id = 1").fetchone()
            checkpoint = json.loads(row[0]) if row is not None else None
            stale = self._stale_set(conn, self._now_ms())
            return StoredState(
                claims=claims,
                checkpoint=checkpoint,
                stale_owners=stale,
                retry_ready_in_ms=_retry_readiness(conn, bound=bound),
            )

        return self._transaction(body, write=False)

    def _stale_owners_sync(self) -> frozenset[str]:
        return self._transaction(lambda conn: self._stale_set(conn, self._now_ms()), write=False)

    def _put_sync(self, record: ClaimRecord, *, kind: str) -> bool:
        now = self._clock.now()
        params = _claim_params(record, owner=self._owner, now=now, generation=self._generation)

        def body(conn: DbConnection) -> bool:
            conn.execute(_UPSERT_CLAIM, params)
            (changed,) = conn.execute("SELECT changes()").fetchone()
            if not changed:
                return False
            stored = dataclasses.replace(
                record, owner=self._owner, generation=self._generation, intent=None
            )
            self._append_event(
                conn,
                kind=kind,
                now_ms=now.timestamp() * 1000.0,
                slot_key=record.slot_key,
                body=stored.to_dict(),
            )
            return True

        return self._transaction(body)

    def _release_sync(self, key: SlotKey) -> None:
        def body(conn: DbConnection) -> None:
            conn.execute("DELETE FROM claims WHERE slot_key = ? AND owner = ?", (key, self._owner))
            (changed,) = conn.execute("SELECT changes()").fetchone()
            if changed:
                self._append_event(
                    conn, kind=EventKind.RELEASE, now_ms=self._now_ms(), slot_key=key
                )

        self._transaction(body)

    def _take_over_sync(self, owners: Sequence[str]) -> list[ClaimRecord]:
        def body(conn: DbConnection) -> list[ClaimRecord]:
            now = self._clock.now()
            now_ms = now.timestamp() * 1000.0
            stale = self._stale_set(conn, now_ms)
            taken: list[ClaimRecord] = []
            taken_from: list[str] = []
            movable = [owner for owner in dict.fromkeys(owners) if owner in stale]
            count = 0
            for owner in movable:
                (held,) = conn.execute(
                    "SELECT COUNT(*) FROM claims WHERE owner = ?", (owner,)
                ).fetchone()
                count += int(held)
            if count > MAX_REBIND:
                # NB: before the first UPDATE, in the same transaction: nothing is rebound.
                raise ClaimRebindTooLarge(
                    path=self._path, owners=movable, count=count, limit=MAX_REBIND
                )
            for owner in movable:
                rows = conn.execute(f"{_SELECT_CLAIMS} WHERE owner = ?", (owner,)).fetchall()
                conn.execute(
                    # NB: updated_at and stored_at move together: a pending retry's delay is
                    # due_at - updated_at, counted from stored_at on the store's clock.
                    "UPDATE claims SET owner = ?, updated_at = ?, generation = ?,"
                    f" stored_at = {_STORE_NOW} WHERE owner = ?",
                    (self._owner, now.isoformat(), self._generation, owner),
                )
                taken.extend(
                    dataclasses.replace(
                        _claim_from_row(row),
                        owner=self._owner,
                        updated_at=now,
                        generation=self._generation,
                    )
                    for row in rows
                )
                conn.execute("DELETE FROM owners WHERE owner = ?", (owner,))
                taken_from.append(owner)
            if taken_from:
                self._append_event(
                    conn,
                    kind=EventKind.TAKE_OVER,
                    now_ms=now_ms,
                    body={
                        "from_owners": taken_from,
                        "slot_keys": sorted(r.slot_key for r in taken),
                    },
                )
            return taken

        taken = self._transaction(body)
        if taken:
            logger.info(
                "claims taken over",
                extra={"path": str(self._path), "owner": self._owner, "count": len(taken)},
            )
        return taken

    def _fence_sync(self, generation: int) -> None:
        def body(conn: DbConnection) -> None:
            row = conn.execute("SELECT generation, holder FROM fence WHERE id = 1").fetchone()
            if row is not None and int(row[0]) > generation:
                raise ClaimGenerationStale(
                    path=self._path,
                    generation=generation,
                    current=int(row[0]),
                    holder=str(row[1]) if row[1] is not None else None,
                )
            if row is not None and int(row[0]) == generation and row[1] != self._owner:
                # NB: one generation is one acquisition of leadership: two owners claiming the
                # same one means a broken lease, and neither may write.
                raise ClaimGenerationStale(
                    path=self._path, generation=generation, current=generation, holder=row[1]
                )
            now_ms = self._now_ms()
            conn.execute(
                "INSERT INTO fence (id, generation, holder, fenced_at) VALUES (1, ?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET generation = excluded.generation,"
                " holder = excluded.holder, fenced_at = excluded.fenced_at",
                (generation, self._owner, now_ms),
            )
            self._append_event(
                conn,
                kind=EventKind.FENCE,
                now_ms=now_ms,
                body={"generation": generation, "previous": int(row[0]) if row else None},
            )

        self._transaction(body, fenced=False)

    def _intent_sync(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        now = self._clock.now()
        stamped = dataclasses.replace(intent, updated_at=now) if intent is not None else None

        def body(conn: DbConnection) -> bool:
            conn.execute(_SET_INTENT, (*_intent_params(stamped), key, self._owner))
            (changed,) = conn.execute("SELECT changes()").fetchone()
            if not changed:
                return False
            self._append_event(
                conn,
                kind=EventKind.INTENT,
                now_ms=now.timestamp() * 1000.0,
                slot_key=key,
                body=stamped.to_dict() if stamped is not None else None,
            )
            return True

        return self._transaction(body)

    def _checkpoint_sync(self, body_text: str) -> None:
        def body(conn: DbConnection) -> None:
            now_ms = self._now_ms()
            conn.execute(
                "INSERT INTO checkpoint (id, body, updated_at) VALUES (1, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET body = excluded.body,"
                " updated_at = excluded.updated_at",
                (body_text, now_ms),
            )
            self._append_event(
                conn, kind=EventKind.CHECKPOINT, now_ms=now_ms, body={"bytes": len(body_text)}
            )

        self._transaction(body)

    def _add_spend_sync(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        def body(conn: DbConnection) -> SpendCharge:
            now_ms = self._now_ms()
            conn.execute(
                "INSERT INTO issue_spend (issue_id, identifier, tokens, usd, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (issue_id) DO UPDATE SET"
                " identifier = excluded.identifier, tokens = issue_spend.tokens + excluded.tokens,"
                " usd = issue_spend.usd + excluded.usd, updated_at = excluded.updated_at",
                (issue_id, identifier, tokens, usd, now_ms),
            )
            conn.execute(
                "INSERT INTO day_spend (day, tokens, usd, updated_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (day) DO UPDATE SET tokens = day_spend.tokens + excluded.tokens,"
                " usd = day_spend.usd + excluded.usd, updated_at = excluded.updated_at",
                (day, tokens, usd, now_ms),
            )
            # NB: bounded ledger: the oldest charged issues and days beyond the limits go.
            conn.execute(
                "DELETE FROM issue_spend WHERE issue_id IN (SELECT issue_id FROM issue_spend"
                " ORDER BY updated_at DESC, issue_id LIMIT -1 OFFSET ?)",
                (self._issue_spend_kept,),
            )
            conn.execute(
                "DELETE FROM day_spend WHERE day IN (SELECT day FROM day_spend"
                " ORDER BY day DESC LIMIT -1 OFFSET ?)",
                (self._day_spend_kept,),
            )
            return SpendCharge(
                issue=_total_row(conn, "issue_spend", "issue_id", issue_id),
                day=_total_row(conn, "day_spend", "day", day),
            )

        return self._transaction(body, fenced=False)

    def _read_total_sync(self, table: str, column: str, key: str) -> SpendTotal:
        return self._transaction(lambda conn: _total_row(conn, table, column, key), write=False)

    def _issue_spends_sync(self, limit: int) -> list[IssueSpend]:
        def body(conn: DbConnection) -> list[IssueSpend]:
            rows = conn.execute(
                "SELECT issue_id, identifier, tokens, usd, updated_at FROM issue_spend"
                " ORDER BY updated_at DESC, issue_id LIMIT ?",
                (max(int(limit), 0),),
            ).fetchall()
            return [
                IssueSpend(
                    issue_id=str(row[0]),
                    identifier=str(row[1]),
                    total=SpendTotal(tokens=int(row[2]), usd=float(row[3])),
                    updated_at_ms=float(row[4]),
                )
                for row in rows
            ]

        return self._transaction(body, write=False)

    def _heartbeat_sync(self) -> None:
        # NB: heartbeats are not events: one every few seconds would push every real mutation
        # out of the bounded event table within minutes.
        def body(conn: DbConnection) -> bool:
            present = conn.execute(
                "SELECT 1 FROM owners WHERE owner = ?", (self._owner,)
            ).fetchone()
            self._upsert_owner(conn, heartbeat_ms=self._now_ms())
            return present is not None

        if not self._transaction(body):
            # Our row existed since open; only a take_over (or the prune of a stale owner)
            # removes it. Said once: the row is back now.
            raise ClaimOwnerLost(path=self._path, owner=self._owner)

    def _mark_dead_sync(self, owners: Sequence[str]) -> list[str]:
        def body(conn: DbConnection) -> list[str]:
            marked: list[str] = []
            for owner in owners:
                row = conn.execute(
                    "SELECT heartbeat_at FROM owners WHERE owner = ?", (owner,)
                ).fetchone()
                if row is None or float(row[0]) == 0.0:
                    continue
                conn.execute("UPDATE owners SET heartbeat_at = 0 WHERE owner = ?", (owner,))
                marked.append(owner)
            if marked:
                self._append_event(
                    conn, kind=EventKind.OWNER_DEAD, now_ms=self._now_ms(), body={"owners": marked}
                )
            return marked

        return self._transaction(body)

    def _close_sync(self) -> None:
        def body(conn: DbConnection) -> None:
            self._upsert_owner(conn, heartbeat_ms=0.0)
            self._append_event(conn, kind=EventKind.OWNER_CLOSE, now_ms=self._now_ms())

        self._transaction(body)

    def _events_sync(self, limit: int) -> list[StoreEvent]:
        rows = (
            self._connection()
            .execute(
                "SELECT id, at, owner, kind, slot_key, body FROM events ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            .fetchall()
        )
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

    def _integrity_sync(self) -> str:
        rows = self._connection().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(row[0]) for row in rows)
