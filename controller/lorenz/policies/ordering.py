"""The deterministic dispatch order: who gets a free slot first.

Determinism matters more than the exact order: two replicas (or a test and production) given
the same candidates must choose the same issues, and a retry must not jump the queue by luck of
the tracker's pagination. Order: priority ``1..4`` ascending (anything else — null, 0, 5+ —
ranks 5, after 4); then ``created_at`` oldest first, unknown last; then ``identifier``, then
``id`` as the final tie-break (identifiers should be unique, but trackers are not perfect).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from lorenz.model import Issue

UNRANKED_PRIORITY = 5
"""The rank of a missing or out-of-range priority: after every real one."""

_PRIORITY_RANKS: dict[object, int] = {1: 1, 2: 2, 3: 3, 4: 4}
_NO_TIMESTAMP = float("inf")

SortKey = tuple[int, float, str, str]


def priority_rank(priority: int | None) -> int:
    """``1..4`` rank as themselves; anything else ranks :data:`UNRANKED_PRIORITY`."""
    # NB: bools are ints in Python (True == 1); a tracker never sends one, but do not rank it.
    if isinstance(priority, bool):
        return UNRANKED_PRIORITY
    return _PRIORITY_RANKS.get(priority, UNRANKED_PRIORITY)


def created_rank(created_at: datetime.datetime | None) -> float:
    """Seconds since the epoch (naive timestamps are taken as UTC); unknown sorts last."""
    if created_at is None:
        return _NO_TIMESTAMP
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=datetime.UTC)
    return created_at.timestamp()


def dispatch_sort_key(issue: Issue) -> SortKey:
    """The key :func:`sort_for_dispatch` orders by; smaller dispatches first."""
    return (
        priority_rank(issue.priority),
        created_rank(issue.created_at),
        issue.identifier,
        issue.id,
    )


def sort_for_dispatch(issues: Iterable[Issue]) -> list[Issue]:
    """A new list of ``issues`` in dispatch order (stable for fully equal keys)."""
    return sorted(issues, key=dispatch_sort_key)
