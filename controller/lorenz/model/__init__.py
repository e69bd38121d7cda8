"""Plain data the whole system shares: issues, slots, claims, retries, events, snapshots.

Nothing here does I/O or knows about any backend; every layer above may import it.
"""

from lorenz.model.clocks import Clock, ManualClock, SystemClock
from lorenz.model.entries import (
    SETTLED_SPAWN_PHASES,
    ClaimPhase,
    ClaimRecord,
    ReservationRecord,
    RetryEntry,
    RetryKind,
    RunningEntry,
    SpawnIntent,
    SpawnPhase,
)
from lorenz.model.errors import LorenzError, RunFailure, stored_failure_code
from lorenz.model.events import (
    EVENT_TYPES,
    RUN_OUTCOMES,
    EventDetails,
    EventType,
    RunOutcome,
    RuntimeEvent,
)
from lorenz.model.issues import BlockerRef, Issue
from lorenz.model.ports import (
    CapacityProbe,
    ClaimStore,
    GenerationFence,
    ImmediateSpawnIntents,
    SpawnIntents,
    StaticCapacity,
    StoredState,
)
from lorenz.model.slots import SlotKey, parse_slot_key, slot_key
from lorenz.model.snapshots import (
    AppStatus,
    BlockedRow,
    ConfigError,
    OrchestratorSnapshot,
    PollStatus,
    RefreshReceipt,
    ReservingRow,
    RetryRow,
    RunIdentity,
    RunningRow,
    RunRecord,
    RuntimeSnapshot,
)
from lorenz.model.usage import AgentUpdate, TokenUsage, UsageTotals

__all__ = [
    "EVENT_TYPES",
    "RUN_OUTCOMES",
    "SETTLED_SPAWN_PHASES",
    "AgentUpdate",
    "AppStatus",
    "BlockedRow",
    "BlockerRef",
    "CapacityProbe",
    "ClaimPhase",
    "ClaimRecord",
    "ClaimStore",
    "Clock",
    "ConfigError",
    "EventDetails",
    "EventType",
    "GenerationFence",
    "ImmediateSpawnIntents",
    "Issue",
    "LorenzError",
    "ManualClock",
    "OrchestratorSnapshot",
    "PollStatus",
    "RefreshReceipt",
    "ReservationRecord",
    "ReservingRow",
    "RetryEntry",
    "RetryKind",
    "RetryRow",
    "RunFailure",
    "RunIdentity",
    "RunOutcome",
    "RunRecord",
    "RunningEntry",
    "RunningRow",
    "RuntimeEvent",
    "RuntimeSnapshot",
    "SlotKey",
    "SpawnIntent",
    "SpawnIntents",
    "SpawnPhase",
    "StaticCapacity",
    "StoredState",
    "SystemClock",
    "TokenUsage",
    "UsageTotals",
    "parse_slot_key",
    "slot_key",
    "stored_failure_code",
]
