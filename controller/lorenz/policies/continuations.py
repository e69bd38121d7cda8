"""The continuation limit: an agent that keeps ending cleanly while its issue stays active.

A clean exit is not a failure, so the retry budget (``retry.max_attempts``) never stops it: the
slot is run again after :data:`~lorenz.policies.backoff.CONTINUATION_DELAY_MS`, as long as the
issue is active. An agent that ends every run without moving its issue would run forever. So
clean runs *in a row* are counted per slot, and after ``agent.max_continuation_runs``
continuation re-runs the next clean exit blocks the slot (reason ``continuation_limit``) instead
of scheduling one more; a refresh or a change of the issue unblocks it, as any blocked slot.

What counts: each clean exit adds one; a failure (or any other retry kind), a release and the
issue leaving the candidates start the count again. The count lives in memory only (a restart
starts it again, as the checkpoint's form is unchanged): the limit bounds a loop, it does not
meter a budget. The same rule holds on the single host and in the operator.
"""

from __future__ import annotations

from lorenz.model import RetryKind

DEFAULT_MAX_CONTINUATION_RUNS = 10
"""``agent.max_continuation_runs`` when unset."""


def next_continuation_streak(previous: int, *, kind: RetryKind | None) -> int:
    """Clean runs in a row after a run that left a retry of ``kind`` (``None``: no retry)."""
    return max(previous, 0) + 1 if kind is RetryKind.CONTINUATION else 0


def continuation_limit_reached(streak: int, *, limit: int) -> bool:
    """Whether a slot with ``streak`` clean runs in a row (the one just ended included) is
    held instead of run again: more than ``limit`` of them, the first run and ``limit``
    continuation re-runs. ``limit`` 0 never holds."""
    return limit > 0 and streak > limit
