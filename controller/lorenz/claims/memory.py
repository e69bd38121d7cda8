"""The default claim store: claims live as long as the process, shared by nobody.

It still honours the :class:`~lorenz.model.ClaimStore` contract exactly (exclusive acquire,
owner checks, generation fencing, spawn intents), so the orchestrator behaves the same on every
backend and tests of the core run against the real default rather than a mock. Several stores
may share one :class:`MemoryClaimTable` (in one process), which is how the contract tests run
two "processes" against it.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lorenz.claims.errors import (
    MAX_REBIND,
    ClaimGenerationStale,
    ClaimRebindTooLarge,
    ClaimRecoveryTooLarge,
)
from lorenz.claims.spend import (
    DAY_SPEND_KEPT,
    ISSUE_SPEND_KEPT,
    IssueSpend,
    SpendCharge,
    SpendTotal,
    check_charge,
)
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    LorenzError,
    RecoveredClaims,
    SlotKey,
    SpawnIntent,
    StoredState,
)


@dataclasses.dataclass(slots=True)
class MemoryClaimTable:
    """What a memory store holds: claims, the checkpoint and the fence."""

    claims: dict[SlotKey, ClaimRecord] = dataclasses.field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None
    fence: int | None = None
    """The newest leader generation that fenced the table (``None``: never fenced)."""
    fence_holder: str | None = None
    issue_spend: dict[str, IssueSpend] = dataclasses.field(default_factory=dict)
    """The spend ledger per issue id (insertion order = charge order, oldest first)."""
    day_spend: dict[str, SpendTotal] = dataclasses.field(default_factory=dict)


class MemoryClaimStore:
    """Claims in a dict; ``durable`` is false."""

    def __init__(
        self,
        *,
        owner: str = "local",
        table: MemoryClaimTable | None = None,
        issue_spend_kept: int = ISSUE_SPEND_KEPT,
        day_spend_kept: int = DAY_SPEND_KEPT,
    ) -> None:
        self._owner = owner
        self._issue_spend_kept = issue_spend_kept
        self._day_spend_kept = day_spend_kept
        self._table = table if table is not None else MemoryClaimTable()
        self._generation: int | None = None
        self._on_fenced: Callable[[LorenzError], None] | None = None
        self.fenced_out: ClaimGenerationStale | None = None
        """Why our writes are refused, once a newer generation fenced the table."""
        self.closed = False

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def table(self) -> MemoryClaimTable:
        """What the store holds (the operator's spend ledger serializes its spend part)."""
        return self._table

    @property
    def durable(self) -> bool:
        return False

    @property
    def generation(self) -> int | None:
        return self._generation

    @property
    def claims(self) -> Mapping[SlotKey, ClaimRecord]:
        """A read-only view, for tests and diagnostics."""
        return self._table.claims

    async def fence(
        self, generation: int, *, on_fenced: Callable[[LorenzError], None] | None = None
    ) -> None:
        table = self._table
        if table.fence is not None and (
            table.fence > generation
            or (table.fence == generation and table.fence_holder != self._owner)
        ):
            raise ClaimGenerationStale(
                path=None, generation=generation, current=table.fence, holder=table.fence_holder
            )
        table.fence, table.fence_holder = generation, self._owner
        self._generation = generation
        self._on_fenced = on_fenced
        self.fenced_out = None

    def _check_fence(self) -> None:
        """NB: the same compare-and-swap as the SQL stores, before any mutation."""
        generation = self._generation
        if generation is None or self._table.fence == generation:
            return
        error = ClaimGenerationStale(
            path=None,
            generation=generation,
            current=self._table.fence or 0,
            holder=self._table.fence_holder,
        )
        first = self.fenced_out is None
        self.fenced_out = error
        if first and self._on_fenced is not None:
            self._on_fenced(error)
        raise error

    async def load(self, *, bound: int | None = None) -> StoredState:
        claims = self._table.claims
        if bound is not None and len(claims) > bound:
            raise ClaimRecoveryTooLarge(path=None, where="the memory claim store", limit=bound)
        return StoredState(
            claims=[copy.copy(r) for r in claims.values()],
            checkpoint=copy.deepcopy(self._table.checkpoint),
        )

    async def recover(self) -> RecoveredClaims:
        """The claims this owner holds already (an earlier store of the same owner on a shared
        table) and the checkpoint; above :data:`~lorenz.claims.errors.MAX_REBIND` of them,
        ``claim_rebind_too_large``. Nothing moves: a memory store has no stale owners (every
        owner sharing a table lives in this process), so other owners' claims stay theirs,
        found by :meth:`acquire` when their slot comes up.

        NB: the claims are a dict of this process: finding ours is a pass over it in memory,
        not a read of anyone's rows from a shared store."""
        self._check_fence()
        ours = [copy.copy(r) for r in self._table.claims.values() if r.owner == self._owner]
        if len(ours) > MAX_REBIND:
            raise ClaimRebindTooLarge(
                path=Path(":memory:"), owners=[self._owner], count=len(ours), limit=MAX_REBIND
            )
        return RecoveredClaims(
            claims=ours,
            previous_owners={record.slot_key: self._owner for record in ours},
            checkpoint=copy.deepcopy(self._table.checkpoint),
        )

    def _stored(self, record: ClaimRecord, held: ClaimRecord | None) -> ClaimRecord:
        # NB: as in the SQL stores, only record_intent writes the intent, and a claim going
        # back to a pending retry drops it.
        keep = held.intent if held is not None else None
        return dataclasses.replace(
            record,
            owner=self._owner,
            generation=self._generation,
            intent=None if record.phase is ClaimPhase.RETRY_PENDING else keep,
        )

    async def acquire(self, record: ClaimRecord) -> bool:
        self._check_fence()
        held = self._table.claims.get(record.slot_key)
        if held is not None and held.owner != self._owner:
            return False
        self._table.claims[record.slot_key] = self._stored(record, held)
        return True

    async def save(self, record: ClaimRecord) -> None:
        self._check_fence()
        held = self._table.claims.get(record.slot_key)
        if held is not None and held.owner != self._owner:
            return
        self._table.claims[record.slot_key] = self._stored(record, held)

    async def record_intent(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        return self.record_intent_now(key, intent)

    def record_intent_now(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        """:meth:`record_intent` without a coroutine (see ``ImmediateSpawnIntents``)."""
        self._check_fence()
        held = self._table.claims.get(key)
        if held is None or held.owner != self._owner:
            return False
        now = datetime.datetime.now(datetime.UTC)
        held.intent = dataclasses.replace(intent, updated_at=now) if intent is not None else None
        return True

    async def release(self, key: SlotKey) -> None:
        self._check_fence()
        held = self._table.claims.get(key)
        if held is not None and held.owner == self._owner:
            del self._table.claims[key]

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        """Re-own the claims of ``from_owners``; above :data:`~lorenz.claims.sql.MAX_REBIND`
        of them nothing moves (``claim_rebind_too_large``), as in the SQL stores."""
        self._check_fence()
        owners = set(from_owners) - {self._owner}
        count = sum(1 for record in self._table.claims.values() if record.owner in owners)
        if count > MAX_REBIND:
            # NB: counted before the first row changes: nothing is rebound.
            raise ClaimRebindTooLarge(
                path=Path(":memory:"), owners=sorted(owners), count=count, limit=MAX_REBIND
            )
        taken: list[ClaimRecord] = []
        for record in self._table.claims.values():
            if record.owner in owners:
                record.owner = self._owner
                record.generation = self._generation
                taken.append(copy.copy(record))
        return taken

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        self._check_fence()
        self._table.checkpoint = copy.deepcopy(dict(checkpoint))

    async def heartbeat(self) -> None:
        self._check_fence()

    async def close(self) -> None:
        self.closed = True

    # -- the spend ledger (lorenz.claims.spend.SpendLedger) -------------------------------------

    async def add_spend(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        check_charge(tokens=tokens, usd=usd)
        table = self._table
        now_ms = datetime.datetime.now(datetime.UTC).timestamp() * 1000.0
        held = table.issue_spend.pop(issue_id, None)
        issue_total = held.total if held is not None else SpendTotal()
        issue_total = SpendTotal(tokens=issue_total.tokens + tokens, usd=issue_total.usd + usd)
        # NB: re-inserted last, so the dict's order stays the charge order (pruning order).
        table.issue_spend[issue_id] = IssueSpend(
            issue_id=issue_id, identifier=identifier, total=issue_total, updated_at_ms=now_ms
        )
        day_total = table.day_spend.get(day, SpendTotal())
        day_total = SpendTotal(tokens=day_total.tokens + tokens, usd=day_total.usd + usd)
        table.day_spend[day] = day_total
        while len(table.issue_spend) > self._issue_spend_kept:
            del table.issue_spend[next(iter(table.issue_spend))]
        surplus = max(len(table.day_spend) - self._day_spend_kept, 0)
        for old_day in sorted(table.day_spend)[:surplus]:
            del table.day_spend[old_day]
        return SpendCharge(issue=issue_total, day=day_total)

    async def issue_spend(self, issue_id: str) -> SpendTotal:
        held = self._table.issue_spend.get(issue_id)
        return held.total if held is not None else SpendTotal()

    async def day_spend(self, day: str) -> SpendTotal:
        return self._table.day_spend.get(day, SpendTotal())

    async def issue_spends(self, *, limit: int = 100) -> list[IssueSpend]:
        rows = list(reversed(self._table.issue_spend.values()))
        return rows[: max(limit, 0)]
