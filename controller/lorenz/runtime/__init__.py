"""The runtime: the I/O shell that drives the orchestrator (layer 6)."""

from lorenz.model import AbortReason
from lorenz.runtime.projection import RECENT_EVENTS_CAP, RUN_HISTORY_CAP, Projection
from lorenz.runtime.retry_timers import SYNC_DELAY_MS, RetryTimers
from lorenz.runtime.runs import ActiveRun, ActiveRuns
from lorenz.runtime.runtime import LorenzRuntime, WorkerPool, WorkerSlot

__all__ = [
    "RECENT_EVENTS_CAP",
    "RUN_HISTORY_CAP",
    "SYNC_DELAY_MS",
    "AbortReason",
    "ActiveRun",
    "ActiveRuns",
    "LorenzRuntime",
    "Projection",
    "RetryTimers",
    "WorkerPool",
    "WorkerSlot",
]
