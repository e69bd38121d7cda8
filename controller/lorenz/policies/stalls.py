"""When a running slot counts as stalled: no agent activity for longer than the threshold.

Activity is the last agent event's monotonic timestamp, or the run's start when the agent has
not said anything yet. The threshold is the agent kind's ``stall_timeout_ms``; ``<= 0`` turns
stall detection off. Strictly longer than the threshold is a stall; exactly the threshold is not.
"""

from __future__ import annotations

from lorenz.model import RunningEntry


def last_activity_ms(entry: RunningEntry) -> float:
    """The monotonic time of the last sign of life of a run."""
    if entry.last_agent_timestamp_ms is not None:
        return entry.last_agent_timestamp_ms
    return entry.started_at_ms


def stalled_for_ms(entry: RunningEntry, *, now_ms: float, stall_timeout_ms: int) -> float | None:
    """How long the run has been silent, if that is a stall; ``None`` if it is not."""
    if stall_timeout_ms <= 0:
        return None
    elapsed = now_ms - last_activity_ms(entry)
    return elapsed if elapsed > stall_timeout_ms else None


def is_stalled(entry: RunningEntry, *, now_ms: float, stall_timeout_ms: int) -> bool:
    return stalled_for_ms(entry, now_ms=now_ms, stall_timeout_ms=stall_timeout_ms) is not None


def stall_error(elapsed_ms: float) -> str:
    """The error text a stall-finished run carries into its retry entry."""
    return f"stalled for {int(elapsed_ms)}ms without agent activity"
