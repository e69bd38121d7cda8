"""The durable claim store, once, for every SQLite-compatible driver (stdlib sqlite3, pyturso).

Two backends speak the same SQL and must obey the same exclusion rule, so the store's
transactions live here, once, and a backend only says how to connect, how to tune the
connection, and what its "database is locked" error looks like
(:class:`~lorenz.claims.connections.SqlDriver`). Beside it, one module per concern: the tables
and their migrations (:mod:`.schema`), the row mapping and claim statements (:mod:`.rows`), the
bounded event log (:mod:`.events`) and the spend ledger's queries (:mod:`.ledger`).

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
from typing import Any, ClassVar, Self, TypeVar

import tenacity

from lorenz.claims.connections import DbConnection, DbCursor, SqlDriver
from lorenz.claims.errors import (
    MAX_REBIND as MAX_REBIND,  # NB: re-exported: tests and tools import it from here
)
from lorenz.claims.errors import (
    ClaimGenerationStale,
    ClaimOwnerLost,
    ClaimRecoveryTooLarge,
    ClaimStoreBusy,
    ClaimStoreUnreadable,
    ClaimStoreWriteFailed,
)
from lorenz.claims.events import EVENTS_KEPT, EventKind, StoreEvent, append_event, read_events
from lorenz.claims.ledger import add_spend, issue_spends, spend_total
from lorenz.claims.owners import Liveness, ProcessIdentity, current_process, owner_liveness
from lorenz.claims.rebinding import (
    Rebound,
    fetch_recovered,
    rebind,
    stale_owners,
    take_over_owners,
)
from lorenz.claims.rows import (
    SELECT_CLAIMS,
    SET_INTENT,
    UPSERT_CLAIM,
    claim_from_row,
    claim_params,
    intent_params,
    retry_readiness,
)
from lorenz.claims.schema import (
    MIGRATED_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    check_schema,
    migration_steps,
    schema_version,
)
from lorenz.claims.spend import (
    DAY_SPEND_KEPT,
    ISSUE_SPEND_KEPT,
    IssueSpend,
    SpendCharge,
    SpendTotal,
    check_charge,
)
from lorenz.model import (
    ClaimRecord,
    Clock,
    LorenzError,
    RecoveredClaims,
    SlotKey,
    SpawnIntent,
    StoredState,
    SystemClock,
)

__all__ = [
    # NB: the names other modules and tests import from here, now defined beside it.
    "DEFAULT_OWNER_STALE_MS",
    "EVENTS_KEPT",
    "MAX_REBIND",
    "MIGRATED_VERSIONS",
    "SCHEMA_VERSION",
    "DbConnection",
    "DbCursor",
    "EventKind",
    "SqlClaimStore",
    "SqlDriver",
    "StoreEvent",
    "check_schema",
    "migration_steps",
    "schema_version",
]

logger = logging.getLogger(__name__)

DEFAULT_OWNER_STALE_MS = 30_000
"""Heartbeat age after which an owner is stale, when ``claim_store.owner_stale_ms`` is 0."""

BUSY_DEADLINE_S = 10.0
"""How long one operation keeps retrying a locked database before ``claim_store_busy``."""

BUSY_TIMEOUT_MS = 2_000
"""The driver's own wait for the write lock, per attempt (``PRAGMA busy_timeout``)."""

T = TypeVar("T")


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
        """Every claim (of every owner), the checkpoint, and the owners that are stale now
        (diagnostics and tests; a start-up uses :meth:`recover`).

        With ``bound``, the read itself is bounded (``LIMIT bound + 1``) and more rows than
        ``bound`` fail closed (``claim_rebind_too_large``)."""
        return await self._run(lambda: self._load_sync(bound=bound))

    async def recover(self) -> RecoveredClaims:
        """Rebind the claims of the owners stale now to us (one write transaction, above
        ``MAX_REBIND`` with ours counted nothing moves), then read exactly those rows and ours
        back by slot key, with the checkpoint (one read transaction).

        NB: no statement walks the claims of live owners: owners are found by index seeks
        and rows by owner or slot key (:mod:`lorenz.claims.rebinding`)."""
        rebound = await self._run(self._rebind_sync)
        previous = rebound.previous_owners
        claims, checkpoint = await self._run(
            lambda: self._transaction(lambda conn: fetch_recovered(conn, [*previous]), write=False)
        )
        return RecoveredClaims(
            claims=claims,
            previous_owners=previous,
            checkpoint=checkpoint,
            retry_ready_in_ms=rebound.retry_ready_in_ms,
        )

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
        """Declare ``owners`` dead, so the next :meth:`recover` finds them stale at once.

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
        append_event(
            conn,
            owner=self._owner,
            kind=kind,
            now_ms=now_ms,
            kept=self._events_kept,
            slot_key=slot_key,
            body=body,
        )

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
            for statement in SCHEMA:
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
        """The owners (not us) stale now, by the rule of :func:`.rebinding.owner_is_stale`."""
        return stale_owners(
            conn,
            own=self._owner,
            now_ms=now_ms,
            stale_ms=self._owner_stale_ms,
            liveness=self._liveness,
            path=self._path,
        )

    def _load_sync(self, *, bound: int | None = None) -> StoredState:
        def body(conn: DbConnection) -> StoredState:
            if bound is None:
                rows = conn.execute(SELECT_CLAIMS).fetchall()
            else:
                # NB: one row past the bound proves "too many" without reading them all.
                rows = conn.execute(f"{SELECT_CLAIMS} LIMIT ?", (bound + 1,)).fetchall()
                if len(rows) > bound:
                    raise ClaimRecoveryTooLarge(
                        path=self._path, where=f"claim store {self._path}", limit=bound
                    )
            claims = [claim_from_row(row) for row in rows]
            row = conn.execute("SELECT body FROM checkpoint WHERE id = 1").fetchone()
            checkpoint = json.loads(row[0]) if row is not None else None
            stale = self._stale_set(conn, self._now_ms())
            return StoredState(
                claims=claims,
                checkpoint=checkpoint,
                stale_owners=stale,
                retry_ready_in_ms=retry_readiness(conn, bound=bound),
            )

        return self._transaction(body, write=False)

    def _stale_owners_sync(self) -> frozenset[str]:
        return self._transaction(lambda conn: self._stale_set(conn, self._now_ms()), write=False)

    def _put_sync(self, record: ClaimRecord, *, kind: str) -> bool:
        now = self._clock.now()
        params = claim_params(record, owner=self._owner, now=now, generation=self._generation)

        def body(conn: DbConnection) -> bool:
            conn.execute(UPSERT_CLAIM, params)
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
            stale = self._stale_set(conn, now.timestamp() * 1000.0)
            movable = [owner for owner in dict.fromkeys(owners) if owner in stale]
            taken, taken_from = take_over_owners(
                conn,
                movable,
                to=self._owner,
                now=now,
                generation=self._generation,
                path=self._path,
            )
            self._note_take_over(conn, now=now, owners=taken_from, keys=[r.slot_key for r in taken])
            return taken

        taken = self._transaction(body)
        if taken:
            logger.info(
                "claims taken over",
                extra={"path": str(self._path), "owner": self._owner, "count": len(taken)},
            )
        return taken

    def _rebind_sync(self) -> Rebound:
        def body(conn: DbConnection) -> Rebound:
            now = self._clock.now()
            stale = self._stale_set(conn, now.timestamp() * 1000.0)
            rebound = rebind(
                conn,
                stale=sorted(stale),
                own=self._owner,
                now=now,
                generation=self._generation,
                path=self._path,
            )
            moved = [k for k, o in rebound.previous_owners.items() if o != self._owner]
            self._note_take_over(conn, now=now, owners=rebound.taken_from, keys=moved)
            return rebound

        rebound = self._transaction(body)
        if rebound.taken_from:
            logger.info(
                "claims taken over",
                extra={"path": str(self._path), "owner": self._owner, "owners": rebound.taken_from},
            )
        return rebound

    def _note_take_over(
        self,
        conn: DbConnection,
        *,
        now: datetime.datetime,
        owners: Sequence[str],
        keys: Sequence[SlotKey],
    ) -> None:
        if owners:
            self._append_event(
                conn,
                kind=EventKind.TAKE_OVER,
                now_ms=now.timestamp() * 1000.0,
                body={"from_owners": list(owners), "slot_keys": sorted(keys)},
            )

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
            conn.execute(SET_INTENT, (*intent_params(stamped), key, self._owner))
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
            return add_spend(
                conn,
                issue_id=issue_id,
                identifier=identifier,
                day=day,
                tokens=tokens,
                usd=usd,
                now_ms=self._now_ms(),
                issue_spend_kept=self._issue_spend_kept,
                day_spend_kept=self._day_spend_kept,
            )

        return self._transaction(body, fenced=False)

    def _read_total_sync(self, table: str, column: str, key: str) -> SpendTotal:
        return self._transaction(lambda conn: spend_total(conn, table, column, key), write=False)

    def _issue_spends_sync(self, limit: int) -> list[IssueSpend]:
        return self._transaction(lambda conn: issue_spends(conn, limit=limit), write=False)

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
        return read_events(self._connection(), limit=limit)

    def _integrity_sync(self) -> str:
        rows = self._connection().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(row[0]) for row in rows)
