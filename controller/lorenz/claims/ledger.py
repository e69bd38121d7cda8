"""The spend ledger's SQL: the queries behind :class:`~lorenz.claims.spend.SpendLedger` for the
SQL claim store.

The ledger's rules (one transaction for an issue's and a day's addition, bounded tables, no
fence) are :mod:`lorenz.claims.spend`'s; the statements that carry them out on the
``issue_spend`` and ``day_spend`` tables (:mod:`lorenz.claims.schema`) are here, apart from the
claims' own queries. Each function runs inside a transaction the store opened.
"""

from __future__ import annotations

from lorenz.claims.connections import DbConnection
from lorenz.claims.spend import IssueSpend, SpendCharge, SpendTotal

_SPEND_TABLE_KEYS: frozenset[tuple[str, str]] = frozenset(
    {("issue_spend", "issue_id"), ("day_spend", "day")}
)


def spend_total(conn: DbConnection, table: str, column: str, key: str) -> SpendTotal:
    """The total of one issue (``issue_spend``/``issue_id``) or one day (``day_spend``/``day``)."""
    # NB: table and column are spliced into SQL: only the two ledger tables are allowed.
    if (table, column) not in _SPEND_TABLE_KEYS:
        raise ValueError(f"not a spend table: {table}.{column}")
    row = conn.execute(f"SELECT tokens, usd FROM {table} WHERE {column} = ?", (key,)).fetchone()
    if row is None:
        return SpendTotal()
    return SpendTotal(tokens=int(row[0]), usd=float(row[1]))


def add_spend(
    conn: DbConnection,
    *,
    issue_id: str,
    identifier: str,
    day: str,
    tokens: int,
    usd: float,
    now_ms: float,
    issue_spend_kept: int,
    day_spend_kept: int,
) -> SpendCharge:
    """Add one charge to its issue's and its day's totals, prune beyond the bounds, and return
    both new totals."""
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
        (issue_spend_kept,),
    )
    conn.execute(
        "DELETE FROM day_spend WHERE day IN (SELECT day FROM day_spend"
        " ORDER BY day DESC LIMIT -1 OFFSET ?)",
        (day_spend_kept,),
    )
    return SpendCharge(
        issue=spend_total(conn, "issue_spend", "issue_id", issue_id),
        day=spend_total(conn, "day_spend", "day", day),
    )


def issue_spends(conn: DbConnection, *, limit: int) -> list[IssueSpend]:
    """The ``limit`` most recently charged issues, newest first."""
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
