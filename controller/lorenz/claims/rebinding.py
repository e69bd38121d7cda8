"""The statements that move claims to a new owner, and touch no other row.

Why a module of its own: recovery must read and write exactly the rows it rebinds. A start-up
that read every claim of every owner failed once another live host held more than the bound,
and read rows it had no business with (issue #32). So a take-over (a recovery pass) and a
start-up's rebind (:meth:`~lorenz.claims.sql.SqlClaimStore.recover`) are built from the
statements here: owners found by index seeks (one per owner, never a walk of the claims),
rows counted and listed by owner (the ``claims_by_owner`` index), moved in the caller's
transaction, and read back by their exact slot keys.
:class:`~lorenz.claims.sql.SqlClaimStore` runs them and keeps the connection and the
transactions; the one staleness rule (:func:`owner_is_stale`) is
here, beside the reads it judges.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lorenz.claims.connections import DbConnection
from lorenz.claims.errors import MAX_REBIND, ClaimRebindTooLarge, ClaimRecoveryTooLarge
from lorenz.claims.owners import Liveness
from lorenz.claims.rows import SELECT_CLAIMS, STORE_NOW, claim_from_row, retry_readiness
from lorenz.model import ClaimRecord, SlotKey

MAX_OWNERS = 1_000
"""Owners a staleness read takes at most (owner rows, and distinct owners of claims); above
it the read fails closed (``claim_rebind_too_large``): no workflow has that many processes."""

FETCH_CHUNK = 500
"""Slot keys per ``IN (...)`` of :func:`fetch_claims` (under every SQLite's variable limit)."""

_CLAIM_OWNERS = (
    # NB: a loose index scan: each step seeks the next owner in claims_by_owner, so the cost
    # is one seek per owner, however many claims each holds (a DISTINCT walks every entry).
    "WITH RECURSIVE held(owner) AS ("
    " SELECT MIN(owner) FROM claims"
    " UNION ALL SELECT (SELECT MIN(owner) FROM claims WHERE owner > held.owner)"
    " FROM held WHERE held.owner IS NOT NULL LIMIT ?)"
    " SELECT owner FROM held WHERE owner IS NOT NULL"
)


def owner_heartbeats(
    conn: DbConnection, *, path: Path, limit: int = MAX_OWNERS
) -> dict[str, float | None]:
    """Every owner the store knows of (a heartbeat row, or claims without one: ``None``),
    at most ``limit`` of each; more fail closed."""
    rows = conn.execute("SELECT owner, heartbeat_at FROM owners LIMIT ?", (limit + 1,))
    heartbeats: dict[str, float | None] = {str(owner): float(at) for owner, at in rows.fetchall()}
    holding = [str(row[0]) for row in conn.execute(_CLAIM_OWNERS, (limit + 1,)).fetchall()]
    if len(heartbeats) > limit or len(holding) > limit:
        raise ClaimRecoveryTooLarge(
            path=path, where=f"claim store {path}", limit=limit, what="owners"
        )
    for owner in holding:
        heartbeats.setdefault(owner, None)
    return heartbeats


def owner_is_stale(
    owner: str,
    heartbeat_ms: float | None,
    *,
    now_ms: float,
    stale_ms: float,
    liveness: Callable[[str], Liveness],
) -> bool:
    """The one staleness rule, for every reader (load, stale_owners, take_over, recover).

    * heartbeat 0 — the owner closed, or was declared dead — stale;
    * on this host, its pid and start time decide at once: dead is stale, and alive is
      *not*, however old its heartbeat (a hung Lorenz must be stopped, not shadowed: its
      agents may still be working, and taking its claims would run them twice);
    * otherwise (another host, a custom owner id) the heartbeat's age decides, and an owner
      with claims but no heartbeat row cannot be proven live: stale.
    """
    if heartbeat_ms == 0.0:
        return True
    alive = liveness(owner)
    if alive is Liveness.DEAD:
        return True
    if alive is Liveness.ALIVE:
        return False
    return heartbeat_ms is None or heartbeat_ms < now_ms - stale_ms


def stale_owners(
    conn: DbConnection,
    *,
    own: str,
    now_ms: float,
    stale_ms: float,
    liveness: Callable[[str], Liveness],
    path: Path,
) -> frozenset[str]:
    """The owners other than ``own`` that are stale now (:func:`owner_is_stale`)."""
    return frozenset(
        owner
        for owner, heartbeat_ms in owner_heartbeats(conn, path=path).items()
        if owner != own
        and owner_is_stale(owner, heartbeat_ms, now_ms=now_ms, stale_ms=stale_ms, liveness=liveness)
    )


def count_held(conn: DbConnection, owners: Iterable[str]) -> int:
    """How many claims ``owners`` hold (an index count per owner)."""
    count = 0
    for owner in owners:
        (held,) = conn.execute("SELECT COUNT(*) FROM claims WHERE owner = ?", (owner,)).fetchone()
        count += int(held)
    return count


def held_keys(conn: DbConnection, owner: str) -> list[SlotKey]:
    """The slot keys of ``owner``'s claims."""
    rows = conn.execute("SELECT slot_key FROM claims WHERE owner = ?", (owner,)).fetchall()
    return [SlotKey(str(row[0])) for row in rows]


def held_claims(conn: DbConnection, owner: str) -> list[ClaimRecord]:
    """``owner``'s claims, whole."""
    return [
        claim_from_row(row)
        for row in conn.execute(f"{SELECT_CLAIMS} WHERE owner = ?", (owner,)).fetchall()
    ]


def move_claims(
    conn: DbConnection,
    *,
    from_owner: str,
    to_owner: str,
    now: datetime.datetime,
    generation: int | None,
) -> None:
    """Give ``from_owner``'s claims to ``to_owner`` and drop ``from_owner``'s heartbeat row
    (its next heartbeat says it lost them)."""
    conn.execute(
        # NB: updated_at and stored_at move together: a pending retry's delay is
        # due_at - updated_at, counted from stored_at on the store's clock.
        "UPDATE claims SET owner = ?, updated_at = ?, generation = ?,"
        f" stored_at = {STORE_NOW} WHERE owner = ?",
        (to_owner, now.isoformat(), generation, from_owner),
    )
    conn.execute("DELETE FROM owners WHERE owner = ?", (from_owner,))


def fetch_claims(conn: DbConnection, keys: Sequence[SlotKey]) -> list[ClaimRecord]:
    """The claims of exactly ``keys`` (a key without a row is left out), in ``keys``' order."""
    found: dict[str, ClaimRecord] = {}
    for start in range(0, len(keys), FETCH_CHUNK):
        chunk = keys[start : start + FETCH_CHUNK]
        marks = ", ".join("?" for _ in chunk)
        rows = conn.execute(f"{SELECT_CLAIMS} WHERE slot_key IN ({marks})", tuple(chunk))
        for row in rows.fetchall():
            record = claim_from_row(row)
            found[record.slot_key] = record
    return [found[key] for key in keys if key in found]


def fetch_recovered(
    conn: DbConnection, keys: Sequence[SlotKey]
) -> tuple[list[ClaimRecord], Mapping[str, Any] | None]:
    """The claims of exactly ``keys`` and the orchestrator checkpoint (what a start-up reads
    after its rebind)."""
    row = conn.execute("SELECT body FROM checkpoint WHERE id = 1").fetchone()
    return fetch_claims(conn, keys), json.loads(row[0]) if row is not None else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rebound:
    """What a start-up's rebind moved (and found ours already), before anything is read."""

    previous_owners: dict[SlotKey, str]
    """Every rebound slot key, with the owner it was held by (ours for an earlier life's)."""
    retry_ready_in_ms: dict[SlotKey, float]
    """Their pending retries' time left on the store's clock, read before the move."""
    taken_from: list[str]
    """The stale owners whose claims moved."""


def _check_bound(conn: DbConnection, owners: list[str], *, path: Path) -> None:
    count = count_held(conn, owners)
    if count > MAX_REBIND:
        # NB: before the first UPDATE, in the same transaction: nothing is rebound.
        raise ClaimRebindTooLarge(path=path, owners=owners, count=count, limit=MAX_REBIND)


def take_over_owners(
    conn: DbConnection,
    owners: list[str],
    *,
    to: str,
    now: datetime.datetime,
    generation: int | None,
    path: Path,
) -> tuple[list[ClaimRecord], list[str]]:
    """Move the claims of ``owners`` (stale, checked by the caller) to ``to``: the moved
    records as they are now, and the owners that held any. Above :data:`MAX_REBIND` claims,
    nothing moves."""
    _check_bound(conn, owners, path=path)
    taken: list[ClaimRecord] = []
    for owner in owners:
        rows = held_claims(conn, owner)
        move_claims(conn, from_owner=owner, to_owner=to, now=now, generation=generation)
        taken.extend(
            dataclasses.replace(row, owner=to, updated_at=now, generation=generation)
            for row in rows
        )
    return taken, list(owners)


def rebind(
    conn: DbConnection,
    *,
    stale: list[str],
    own: str,
    now: datetime.datetime,
    generation: int | None,
    path: Path,
) -> Rebound:
    """A start-up's move: the claims of the ``stale`` owners become ``own``'s; the slot keys
    of those and of ``own``'s claims come back. Above :data:`MAX_REBIND` of them (ours
    counted), nothing moves.

    NB: ``own``'s rows are not rewritten: their ``updated_at`` and ``stored_at`` time their
    pending retries on the store's clock, and they are ours already.
    """
    owners = [*stale, own]
    _check_bound(conn, owners, path=path)
    previous: dict[SlotKey, str] = {}
    ready: dict[SlotKey, float] = {}
    taken_from: list[str] = []
    # NB: every key and readiness is read before the first move: a moved row is ours after.
    for owner in owners:
        previous.update(dict.fromkeys(held_keys(conn, owner), owner))
        ready.update(retry_readiness(conn, bound=None, owner=owner))
    holding = set(previous.values())
    for owner in stale:
        move_claims(conn, from_owner=owner, to_owner=own, now=now, generation=generation)
        if owner in holding:
            taken_from.append(owner)
    return Rebound(previous_owners=previous, retry_ready_in_ms=ready, taken_from=taken_from)
