"""Builders shared by the core tests: issues, settings, orchestrators, a multi-owner store.

``SharedClaims`` is a faithful in-process implementation of the ClaimStore contract for several
owners at once (exclusive acquire, stale-owner takeover, heartbeats): the durable stores are the
only other backends with more than one owner, and the core must be tested against that contract
without waiting for them.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from lorenz.claims import MemoryClaimStore
from lorenz.config import WorkflowSettings
from lorenz.model import BlockerRef, ClaimRecord, Issue, ManualClock, SlotKey, StoredState
from lorenz.orchestrator import Orchestrator

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def issue(
    n: int | str = 1,
    *,
    state: str = "Todo",
    priority: int | None = None,
    created: float | None = None,
    labels: Iterable[str] = (),
    blockers: Iterable[str | None] = (),
    dispatchable: bool = True,
    identifier: str | None = None,
    title: str = "Fix it",
) -> Issue:
    """Issue ``i<n>`` / ``ABC-<n>``; ``created`` is hours after EPOCH; blockers are states."""
    return Issue(
        id=f"i{n}",
        identifier=identifier if identifier is not None else f"ABC-{n}",
        title=title,
        state=state,
        priority=priority,
        created_at=EPOCH + datetime.timedelta(hours=created) if created is not None else None,
        labels=tuple(labels),
        blocked_by=tuple(
            BlockerRef(id=f"b{k}", identifier=f"B-{k}", state=s) for k, s in enumerate(blockers)
        ),
        dispatchable=dispatchable,
    )


def settings(**sections: Any) -> WorkflowSettings:
    """``settings(agent={"max_concurrent_agents": 2}, worker={...})``."""
    return WorkflowSettings.model_validate(sections)


def make(
    *,
    config: WorkflowSettings | None = None,
    store: Any = None,
    clock: ManualClock | None = None,
    capacity: Any = None,
) -> tuple[Orchestrator, Any, ManualClock]:
    clock = clock or ManualClock()
    store = store if store is not None else MemoryClaimStore()
    orchestrator = Orchestrator(
        settings=config or settings(), store=store, clock=clock, capacity=capacity
    )
    return orchestrator, store, clock


class PoolProbe:
    """A worker pool's CapacityProbe: governs dispatch, with a switchable room flag."""

    def __init__(self, *, governs: bool = True, room: bool = True) -> None:
        self.governing = governs
        self.room = room

    def governs(self) -> bool:
        return self.governing

    def has_capacity(self) -> bool:
        return self.room


class SharedClaims:
    """The rows of one claim store, shared by several owners (as one sqlite file would be)."""

    def __init__(self) -> None:
        self.rows: dict[SlotKey, ClaimRecord] = {}
        self.checkpoint: dict[str, Any] | None = None
        self.stale: set[str] = set()
        self.heartbeats: dict[str, int] = {}

    def store(self, owner: str) -> SharedStore:
        return SharedStore(self, owner=owner)


class SharedStore:
    """One owner's view of :class:`SharedClaims`, honouring the ClaimStore contract."""

    def __init__(self, shared: SharedClaims, *, owner: str) -> None:
        self.shared = shared
        self._owner = owner
        self.calls: list[str] = []

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def durable(self) -> bool:
        return True

    def _may_write(self, key: SlotKey) -> bool:
        held = self.shared.rows.get(key)
        return held is None or held.owner == self._owner or held.owner in self.shared.stale

    async def load(self) -> StoredState:
        self.calls.append("load")
        checkpoint = self.shared.checkpoint
        return StoredState(
            claims=[copy.copy(r) for r in self.shared.rows.values()],
            checkpoint=copy.deepcopy(checkpoint),
            stale_owners=frozenset(self.shared.stale),
        )

    async def acquire(self, record: ClaimRecord) -> bool:
        self.calls.append(f"acquire {record.slot_key}")
        if not self._may_write(record.slot_key):
            return False
        stored = copy.copy(record)
        stored.owner = self._owner
        self.shared.rows[record.slot_key] = stored
        return True

    async def save(self, record: ClaimRecord) -> None:
        self.calls.append(f"save {record.slot_key} {record.phase.value}")
        held = self.shared.rows.get(record.slot_key)
        if held is not None and held.owner != self._owner:
            return
        stored = copy.copy(record)
        stored.owner = self._owner
        self.shared.rows[record.slot_key] = stored

    async def release(self, key: SlotKey) -> None:
        self.calls.append(f"release {key}")
        held = self.shared.rows.get(key)
        if held is not None and held.owner == self._owner:
            del self.shared.rows[key]

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        owners = set(from_owners) - {self._owner}
        self.calls.append(f"take_over {sorted(owners)}")
        taken = []
        for record in self.shared.rows.values():
            if record.owner in owners:
                record.owner = self._owner
                taken.append(copy.copy(record))
        return taken

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        self.calls.append("save_checkpoint")
        self.shared.checkpoint = copy.deepcopy(dict(checkpoint))

    async def heartbeat(self) -> None:
        self.shared.heartbeats[self._owner] = self.shared.heartbeats.get(self._owner, 0) + 1

    async def close(self) -> None:
        return None
