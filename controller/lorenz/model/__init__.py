"""Plain data the whole system shares: issues, slots, claims, retries, events, snapshots.

Nothing here does I/O or knows about any backend; every layer above may import it.

NB: the names are loaded on first use (PEP 562), each from its own module: a command that
needs one error class (``lorenz validate``, ``lorenz status``) does not pay for building the
snapshot, event and entry dataclasses (~40 ms of a ~300 ms budget, bench/README.md). Type
checkers read the imports under ``TYPE_CHECKING``; ``_EXPORTS`` says where each name lives at
run time (``__all__`` is made from it), and tests/model/test_package.py checks that the two
lists agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorenz.lazy_names import lazy_attributes

if TYPE_CHECKING:
    # NB: one block per module, every name re-exported explicitly (``X as X``): with the
    # lazy table below these are the package's two name lists; ``__all__`` is derived.
    from lorenz.model.clocks import (  # noqa: I001
        Clock as Clock,
        ManualClock as ManualClock,
        SystemClock as SystemClock,
    )
    from lorenz.model.entries import (
        ClaimRecord as ClaimRecord,
        ReservationRecord as ReservationRecord,
        RetryEntry as RetryEntry,
        RunningEntry as RunningEntry,
        SpawnIntent as SpawnIntent,
    )
    from lorenz.model.errors import (
        LorenzError as LorenzError,
        RunFailure as RunFailure,
        stored_failure_code as stored_failure_code,
    )
    from lorenz.model.events import (
        EVENT_TYPES as EVENT_TYPES,
        RUN_OUTCOMES as RUN_OUTCOMES,
        EventDetails as EventDetails,
        EventType as EventType,
        RuntimeEvent as RuntimeEvent,
    )
    from lorenz.model.issues import (
        BlockerRef as BlockerRef,
        Issue as Issue,
    )
    from lorenz.model.lifecycle import (
        SETTLED_SPAWN_PHASES as SETTLED_SPAWN_PHASES,
        AbortReason as AbortReason,
        ActionOutcome as ActionOutcome,
        BlockReason as BlockReason,
        ClaimPhase as ClaimPhase,
        RetryKind as RetryKind,
        RunOutcome as RunOutcome,
        SpawnPhase as SpawnPhase,
        StopReason as StopReason,
        WorkerPhase as WorkerPhase,
    )
    from lorenz.model.ports import (
        CapacityProbe as CapacityProbe,
        ClaimStore as ClaimStore,
        GenerationFence as GenerationFence,
        ImmediateSpawnIntents as ImmediateSpawnIntents,
        RecoveredClaims as RecoveredClaims,
        SpawnIntents as SpawnIntents,
        StaticCapacity as StaticCapacity,
        StoredState as StoredState,
    )
    from lorenz.model.slots import (
        SlotKey as SlotKey,
        parse_slot_key as parse_slot_key,
        slot_key as slot_key,
    )
    from lorenz.model.snapshots import (
        AppStatus as AppStatus,
        BlockedRow as BlockedRow,
        ConfigError as ConfigError,
        OrchestratorSnapshot as OrchestratorSnapshot,
        DispatchPause as DispatchPause,
        PollStatus as PollStatus,
        RefreshReceipt as RefreshReceipt,
        ReservingRow as ReservingRow,
        RetryRow as RetryRow,
        RunIdentity as RunIdentity,
        RunningRow as RunningRow,
        RunRecord as RunRecord,
        RuntimeSnapshot as RuntimeSnapshot,
    )
    from lorenz.model.usage import (
        AgentUpdate as AgentUpdate,
        TokenUsage as TokenUsage,
        UsageTotals as UsageTotals,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "clocks": ("Clock", "ManualClock", "SystemClock"),
    "entries": (
        "ClaimRecord",
        "ReservationRecord",
        "RetryEntry",
        "RunningEntry",
        "SpawnIntent",
    ),
    "errors": ("LorenzError", "RunFailure", "stored_failure_code"),
    "events": (
        "EVENT_TYPES",
        "RUN_OUTCOMES",
        "EventDetails",
        "EventType",
        "RuntimeEvent",
    ),
    "issues": ("BlockerRef", "Issue"),
    "lifecycle": (
        "SETTLED_SPAWN_PHASES",
        "AbortReason",
        "ActionOutcome",
        "BlockReason",
        "ClaimPhase",
        "RetryKind",
        "RunOutcome",
        "SpawnPhase",
        "StopReason",
        "WorkerPhase",
    ),
    "ports": (
        "CapacityProbe",
        "ClaimStore",
        "GenerationFence",
        "ImmediateSpawnIntents",
        "RecoveredClaims",
        "SpawnIntents",
        "StaticCapacity",
        "StoredState",
    ),
    "slots": ("SlotKey", "parse_slot_key", "slot_key"),
    "snapshots": (
        "AppStatus",
        "BlockedRow",
        "ConfigError",
        "OrchestratorSnapshot",
        "DispatchPause",
        "PollStatus",
        "RefreshReceipt",
        "ReservingRow",
        "RetryRow",
        "RunIdentity",
        "RunningRow",
        "RunRecord",
        "RuntimeSnapshot",
    ),
    "usage": ("AgentUpdate", "TokenUsage", "UsageTotals"),
}
_HOMES: dict[str, str] = {name: module for module, names in _EXPORTS.items() for name in names}


if not TYPE_CHECKING:
    # NB: hidden from type checkers (lorenz.lazy_names): they read the imports above.
    __getattr__, __dir__ = lazy_attributes(
        package=__name__, homes=_HOMES, namespace=globals()
    )


__all__ = sorted(_HOMES)
"""NB: derived from ``_EXPORTS``; type checkers read the explicit ``X as X`` imports above."""
