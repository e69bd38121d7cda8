"""Plain data the whole system shares: issues, slots, claims, retries, events, snapshots.

Nothing here does I/O or knows about any backend; every layer above may import it.

NB: the names are loaded on first use (PEP 562), each from its own module: a command that
needs one error class (``lorenz validate``, ``lorenz status``) does not pay for building the
snapshot, event and entry dataclasses (~40 ms of a ~300 ms budget, bench/README.md). Type
checkers read the imports under ``TYPE_CHECKING``; ``_EXPORTS`` says where each name lives at
run time, and tests/model/test_package.py checks that the two agree with ``__all__``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_EXPORTS: dict[str, tuple[str, ...]] = {
    "clocks": ("Clock", "ManualClock", "SystemClock"),
    "entries": (
        "SETTLED_SPAWN_PHASES",
        "ClaimPhase",
        "ClaimRecord",
        "ReservationRecord",
        "RetryEntry",
        "RetryKind",
        "RunningEntry",
        "SpawnIntent",
        "SpawnPhase",
    ),
    "errors": ("LorenzError", "RunFailure", "stored_failure_code"),
    "events": (
        "EVENT_TYPES",
        "RUN_OUTCOMES",
        "EventDetails",
        "EventType",
        "RunOutcome",
        "RuntimeEvent",
    ),
    "issues": ("BlockerRef", "Issue"),
    "ports": (
        "CapacityProbe",
        "ClaimStore",
        "GenerationFence",
        "ImmediateSpawnIntents",
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
    # NB: hidden from type checkers: a module ``__getattr__`` would make them accept any name
    # (``from lorenz.model import Isue``); they read the imports above instead.

    def __getattr__(name: str) -> object:
        module = _HOMES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # NB: the next use is a plain global, no __getattr__
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
