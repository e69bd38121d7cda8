"""Builders shared by the core tests: issues, settings, orchestrators, a multi-owner store.

``SharedClaims`` is a faithful in-process implementation of the ClaimStore contract for several
owners at once (exclusive acquire, stale-owner takeover, heartbeats): the durable stores are the
only other backends with more than one owner, and the core must be tested against that contract
without waiting for them. A contract test (``tests/claims/test_contract.py``) holds it to the
very cases the SQL stores pass, so a core test cannot pass on behaviour no real store has.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lorenz.claims import (
    DEFAULT_OWNER_STALE_MS,
    ClaimOwnerLost,
    ClaimRebindTooLarge,
    ClaimRecoveryTooLarge,
    MemoryClaimStore,
)
from lorenz.claims.errors import MAX_REBIND
from lorenz.claims.owners import Liveness, owner_liveness
from lorenz.config import WorkflowSettings
from lorenz.model import (
    BlockerRef,
    ClaimRecord,
    Clock,
    Issue,
    ManualClock,
    RecoveredClaims,
    SlotKey,
    StoredState,
)
from lorenz.orchestrator import Orchestrator

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SHARED_PATH = Path("shared-claims")
"""What ``claim_owner_lost`` names as the store of :class:`SharedClaims`."""


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
    """The rows of one claim store, shared by several owners (as one sqlite file would be).

    It keeps the durable stores' contract exactly — ``tests/claims/test_contract.py`` runs the
    same cases against it, the memory store and both SQL backends: ``acquire`` refuses *any*
    other owner's row, stale ones included (those come back only through ``take_over``, which
    re-checks staleness and drops the old owner's heartbeat); an owner is stale when its
    heartbeat is older than ``owner_stale_ms`` by ``clock``, when it closed, or when ``liveness``
    proves it dead; and a taken-over owner's next heartbeat raises ``claim_owner_lost`` once.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        owner_stale_ms: int = DEFAULT_OWNER_STALE_MS,
        liveness: Callable[[str], Liveness] | None = None,
    ) -> None:
        self.rows: dict[SlotKey, ClaimRecord] = {}
        self.checkpoint: dict[str, Any] | None = None
        self.clock: Clock = clock or ManualClock()
        self.owner_stale_ms = owner_stale_ms
        self.liveness: Callable[[str], Liveness] = liveness or owner_liveness
        self.heartbeat_at: dict[str, float] = {}
        """Owner → wall-clock ms of its last heartbeat (0: closed or declared dead)."""
        self.stale: set[str] = set()
        """Owners declared dead, as ``mark_owners_dead`` does: stale whatever their heartbeat."""
        self.heartbeats: dict[str, int] = {}
        """How many heartbeats each owner sent."""

    def store(self, owner: str) -> SharedStore:
        """Open the store for ``owner`` (registers its heartbeat, like opening a file)."""
        self.heartbeat_at[owner] = self.now_ms()
        return SharedStore(self, owner=owner)

    def now_ms(self) -> float:
        return self.clock.now().timestamp() * 1000.0

    def is_stale(self, owner: str) -> bool:
        """The SQL stores' rule (``SqlClaimStore._owner_is_stale``)."""
        heartbeat = self.heartbeat_at.get(owner)
        if owner in self.stale or heartbeat == 0.0:
            return True
        liveness = self.liveness(owner)
        if liveness is Liveness.DEAD:
            return True
        if liveness is Liveness.ALIVE:
            return False
        return heartbeat is None or heartbeat < self.now_ms() - self.owner_stale_ms

    def stale_owners(self, *, reader: str) -> frozenset[str]:
        owners = self.heartbeat_at.keys() | {r.owner for r in self.rows.values()}
        return frozenset(o for o in owners - {reader} if self.is_stale(o))


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

    def _ours_or_free(self, key: SlotKey) -> bool:
        held = self.shared.rows.get(key)
        return held is None or held.owner == self._owner

    async def load(self, *, bound: int | None = None) -> StoredState:
        self.calls.append("load")
        if bound is not None and len(self.shared.rows) > bound:
            raise ClaimRecoveryTooLarge(path=None, where="the test store", limit=bound)
        checkpoint = self.shared.checkpoint
        return StoredState(
            claims=[copy.copy(r) for r in self.shared.rows.values()],
            checkpoint=copy.deepcopy(checkpoint),
            stale_owners=self.shared.stale_owners(reader=self._owner),
        )

    async def stale_owners(self) -> frozenset[str]:
        return self.shared.stale_owners(reader=self._owner)

    async def recover(self) -> RecoveredClaims:
        """The SQL stores' rebind: the stale owners' rows become ours (above ``MAX_REBIND``
        with ours counted, nothing moves), and exactly those and ours come back."""
        self.calls.append("recover")
        stale = self.shared.stale_owners(reader=self._owner)
        owners = stale | {self._owner}
        previous = {k: r.owner for k, r in self.shared.rows.items() if r.owner in owners}
        if len(previous) > MAX_REBIND:
            raise ClaimRebindTooLarge(
                path=SHARED_PATH, owners=sorted(owners), count=len(previous), limit=MAX_REBIND
            )
        if stale:
            await self.take_over(from_owners=stale)
        return RecoveredClaims(
            claims=[copy.copy(self.shared.rows[key]) for key in previous],
            previous_owners=previous,
            checkpoint=copy.deepcopy(self.shared.checkpoint),
        )

    async def acquire(self, record: ClaimRecord) -> bool:
        self.calls.append(f"acquire {record.slot_key}")
        # NB: a stale owner's row is refused like any other: see SqlClaimStore.acquire.
        if not self._ours_or_free(record.slot_key):
            return False
        stored = copy.copy(record)
        stored.owner = self._owner
        self.shared.rows[record.slot_key] = stored
        return True

    async def save(self, record: ClaimRecord) -> None:
        self.calls.append(f"save {record.slot_key} {record.phase.value}")
        if not self._ours_or_free(record.slot_key):
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
        stale = self.shared.stale_owners(reader=self._owner)
        now = self.shared.clock.now()
        taken = []
        for owner in sorted(owners & stale):
            for key, record in list(self.shared.rows.items()):
                if record.owner == owner:
                    moved = dataclasses.replace(record, owner=self._owner, updated_at=now)
                    self.shared.rows[key] = moved
                    taken.append(copy.copy(moved))
            self.shared.heartbeat_at.pop(owner, None)
            self.shared.stale.discard(owner)
        return taken

    async def mark_owners_dead(self, owners: Iterable[str]) -> list[str]:
        marked = []
        for owner in sorted(set(owners) - {self._owner}):
            if self.shared.heartbeat_at.get(owner, 0.0) != 0.0:
                self.shared.heartbeat_at[owner] = 0.0
                marked.append(owner)
        return marked

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        self.calls.append("save_checkpoint")
        self.shared.checkpoint = copy.deepcopy(dict(checkpoint))

    async def heartbeat(self) -> None:
        shared = self.shared
        shared.heartbeats[self._owner] = shared.heartbeats.get(self._owner, 0) + 1
        present = self._owner in shared.heartbeat_at
        shared.heartbeat_at[self._owner] = shared.now_ms()
        if not present:
            raise ClaimOwnerLost(path=SHARED_PATH, owner=self._owner)

    async def close(self) -> None:
        self.shared.heartbeat_at[self._owner] = 0.0
