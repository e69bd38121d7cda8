"""Plain data the whole system shares: issues, slots, claims, retries, events, snapshots.

Nothing here does I/O or knows about any backend; every layer above may import it.
"""

from lorenz.model.clocks import Clock, ManualClock, SystemClock
from lorenz.model.entries import (
    ClaimPhase,
    ClaimRecord,
    ReservationRecord,
    RetryEntry,
    RetryKind,
    RunningEntry,
)
from lorenz.model.errors import LorenzError, RunFailure
from lorenz.model.events import EVENT_TYPES, RUN_OUTCOMES, EventType, RunOutcome
from lorenz.model.issues import BlockerRef, Issue
from lorenz.model.ports import CapacityProbe, ClaimStore, StaticCapacity, StoredState
from lorenz.model.slots import SlotKey, parse_slot_key, slot_key
from lorenz.model.usage import AgentUpdate, TokenUsage, UsageTotals

__all__ = [
    "EVENT_TYPES",
    "RUN_OUTCOMES",
    "AgentUpdate",
    "BlockerRef",
    "CapacityProbe",
    "ClaimPhase",
    "ClaimRecord",
    "ClaimStore",
    "Clock",
    "EventType",
    "Issue",
    "LorenzError",
    "ManualClock",
    "ReservationRecord",
    "RetryEntry",
    "RetryKind",
    "RunFailure",
    "RunOutcome",
    "RunningEntry",
    "SlotKey",
    "StaticCapacity",
    "StoredState",
    "SystemClock",
    "TokenUsage",
    "UsageTotals",
    "parse_slot_key",
    "slot_key",
]
