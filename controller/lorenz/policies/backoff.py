"""How long a slot waits before it may run again, and how long a reservation may hold a slot.

Pure arithmetic, kept apart so the numbers the docs promise (10 s, 20 s, 40 s, ... capped, or
whatever ``retry.backoff`` says) are tested in one place and the orchestrator cannot drift from
them.
"""

from __future__ import annotations

from lorenz.model import RetryKind

CONTINUATION_DELAY_MS = 1000
"""A clean exit re-checks the issue after this fixed delay."""
CONTINUATION_ATTEMPT = 1
"""A continuation retry always carries attempt 1."""
FAILURE_BASE_DELAY_MS = 10000
"""The first failure waits this long by default (``retry.backoff.initial_ms``)."""
FAILURE_MULTIPLIER = 2
"""Each further failure multiplies the delay by this by default (``retry.backoff.multiplier``)."""
MAX_BACKOFF_EXPONENT = 30
"""NB: the exponent is capped so a huge attempt number cannot build a huge integer; any
configurable cap (``retry.backoff.max_ms``) is reached long before ``2**30 * 10 s``."""

RESERVATION_EXPIRY_MARGIN_MS = 60000
"""Added to twice the acquire timeout to get a reservation's defensive lifetime."""


def failure_backoff_ms(
    attempt: int,
    *,
    max_backoff_ms: int,
    initial_ms: int = FAILURE_BASE_DELAY_MS,
    multiplier: int = FAILURE_MULTIPLIER,
) -> int:
    """``min(initial_ms * multiplier**(attempt-1), max_backoff_ms)``; attempts below 1 count
    as 1."""
    exponent = min(max(attempt, 1) - 1, MAX_BACKOFF_EXPONENT)
    delay = initial_ms
    for _ in range(exponent):
        if delay >= max_backoff_ms:
            break
        delay *= multiplier
    return min(delay, max_backoff_ms)


def next_failure_attempt(previous_attempt: int | None) -> int:
    """The attempt number of the retry after a failed run (a first run counts as attempt 0)."""
    return (previous_attempt or 0) + 1


def retry_plan(
    *,
    kind: RetryKind,
    previous_attempt: int | None,
    max_backoff_ms: int,
    initial_ms: int = FAILURE_BASE_DELAY_MS,
    multiplier: int = FAILURE_MULTIPLIER,
) -> tuple[int, int]:
    """``(attempt, delay_ms)`` of the retry written when a run ends.

    A continuation (clean exit) is always attempt 1 after 1000 ms, whatever came before; a
    failure is the previous attempt plus one, with capped exponential backoff.
    """
    if kind is RetryKind.CONTINUATION:
        return CONTINUATION_ATTEMPT, CONTINUATION_DELAY_MS
    attempt = next_failure_attempt(previous_attempt)
    delay = failure_backoff_ms(
        attempt, max_backoff_ms=max_backoff_ms, initial_ms=initial_ms, multiplier=multiplier
    )
    return attempt, delay


def reservation_lifetime_ms(acquire_timeout_ms: int) -> int:
    """``acquire_timeout_ms * 2 + 60000``: after this a reservation is swept (cancelled)."""
    return acquire_timeout_ms * 2 + RESERVATION_EXPIRY_MARGIN_MS


PLACEMENT_WAIT_MS = 5000
"""How long a slot whose run could not be placed (its Pod unschedulable, its image not pulled,
a quota full) waits before it is claimed again: long enough not to hammer the API server, short
enough that a freed node or quota is used soon."""


PLACEMENT_WAIT_MAX_MS = 300_000
"""The longest wait between two placements of one slot that keep failing."""


def placement_wait_ms(failures: int = 1) -> int:
    """The wait after the ``failures``-th placement failure in a row of one slot: nothing
    ran, so nothing counts as a failed attempt, but an image that never pulls must not be
    tried every 5 s for ever (#37): the wait doubles with each failure in a row, up to
    :data:`PLACEMENT_WAIT_MAX_MS`."""
    return int(min(PLACEMENT_WAIT_MS * 2 ** max(failures - 1, 0), PLACEMENT_WAIT_MAX_MS))
