"""The ports the scheduling core talks through: claim persistence and worker capacity.

The orchestrator never opens a file, a socket or a database. It persists every mutation of
claim state through a :class:`ClaimStore` handed to it by a composition root, and asks a
:class:`CapacityProbe` whether a worker pool governs dispatch. Implementations live in layer 5
(``lorenz.claims``, ``lorenz.workers``) and in the operator (``lorenz.kube``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from lorenz.model.entries import ClaimRecord, SpawnIntent
from lorenz.model.errors import LorenzError
from lorenz.model.slots import SlotKey


@dataclasses.dataclass(slots=True)
class StoredState:
    """Everything a claim store holds, as a diagnostic read (:meth:`ClaimStore.load`) sees it.

    NB: recovery never reads this: a start-up reads exactly the claims it rebinds
    (:class:`RecoveredClaims`)."""

    claims: list[ClaimRecord] = dataclasses.field(default_factory=list)
    """Every claim row, of every owner."""
    checkpoint: Mapping[str, Any] | None = None
    """The last orchestrator checkpoint (usage totals, completed ids, ...), if any."""
    stale_owners: frozenset[str] = frozenset()
    """Owners whose heartbeat is older than the stale threshold at read time."""
    retry_ready_in_ms: Mapping[SlotKey, float] = dataclasses.field(default_factory=dict)
    """Per pending retry, milliseconds until it is due on the *store's* clock (negative:
    overdue), where the store has a clock of its own; a slot left out falls back to its
    wall-clock ``due_at`` against the reader's clock."""


@dataclasses.dataclass(slots=True)
class RecoveredClaims:
    """What a start-up recovers (:meth:`ClaimStore.recover`): exactly the claims rebound to
    this owner, read back by their slot keys, and the checkpoint."""

    claims: list[ClaimRecord] = dataclasses.field(default_factory=list)
    """The rebound rows, as read after the move (their owner is this one now)."""
    previous_owners: Mapping[SlotKey, str] = dataclasses.field(default_factory=dict)
    """The owner each rebound slot was held by before the move: a stale owner, or this
    owner's own id (the rows of an earlier life, which stay where they are)."""
    checkpoint: Mapping[str, Any] | None = None
    """The last orchestrator checkpoint (usage totals, completed ids, ...), if any."""
    retry_ready_in_ms: Mapping[SlotKey, float] = dataclasses.field(default_factory=dict)
    """Per rebound pending retry, milliseconds until it is due on the *store's* clock
    (negative: overdue), taken before the move, where the store has a clock of its own; a
    slot left out falls back to its wall-clock ``due_at`` against the reader's clock."""


class ClaimStore(Protocol):
    """Persistence of slot claims, shared by every process that works one workflow.

    NB: :meth:`acquire` is the only exclusion point between processes: it must be a single
    transaction that succeeds only if the slot is free or already ours. A row of any other
    owner is refused, a stale one's included: those come back only through :meth:`take_over`,
    so an interrupted run is retried as a failure instead of being overwritten as new work.
    """

    @property
    def owner(self) -> str:
        """This process's owner identity, written into every record it acquires."""
        ...

    @property
    def durable(self) -> bool:
        """Whether claims survive this process (``memory`` does not)."""
        ...

    async def load(self, *, bound: int | None = None) -> StoredState:
        """Read every claim of every owner and the checkpoint: diagnostics and tests only.

        With ``bound``, at most ``bound + 1`` claim rows are read, and more than ``bound``
        raises a coded error (``claim_rebind_too_large``) instead of returning.
        NB: recovery does not call it (see :meth:`recover`): a start-up reads no row it does
        not rebind.
        """
        ...

    async def recover(self) -> RecoveredClaims:
        """A start-up's recovery: rebind, in one transaction, every claim of the owners that
        are stale (or dead) now — and count the claims this owner id already holds (an
        earlier life of it) — then read exactly those rows back by slot key, and the
        checkpoint.

        Above ``MAX_REBIND`` (1,000) claims to rebind, nothing moves and the coded error
        ``claim_rebind_too_large`` is raised. Rows of live other owners are neither read nor
        counted: :meth:`acquire` refuses them when their slot comes up.
        """
        ...

    async def acquire(self, record: ClaimRecord) -> bool:
        """Claim ``record.slot_key`` for this owner; ``False`` if any other owner holds it."""
        ...

    async def save(self, record: ClaimRecord) -> None:
        """Update a claim this owner holds (phase, attempt, usage, ...)."""
        ...

    async def release(self, key: SlotKey) -> None:
        """Drop this owner's claim on ``key`` (no-op when absent or not ours)."""
        ...

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        """Re-own every claim of those ``from_owners`` that are stale (or dead) at commit time,
        and return exactly the moved records (a recovery pass, while running).

        Above ``MAX_REBIND`` (1,000) claims to move, nothing moves
        (``claim_rebind_too_large``)."""
        ...

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        """Persist the orchestrator's non-claim state (totals, completed ids)."""
        ...

    async def heartbeat(self) -> None:
        """Record that this owner is alive."""
        ...

    async def close(self) -> None:
        """Release resources; the composition root calls it once, at shutdown."""
        ...


@runtime_checkable
class GenerationFence(Protocol):
    """A claim store that refuses the writes of a deposed leader (generation fencing).

    Leadership rotates a *generation* on every acquisition (``LeadershipProvider.generation``).
    A leader calls :meth:`fence` with it before its first write; from then on every mutation of
    this store — claims, intents, checkpoint, heartbeat, close — first compares the store's
    fence with that generation *inside the write's own transaction* and is refused, with
    nothing changed, once a newer generation fenced the store (``claim_generation_stale``).

    NB: a store that was never fenced (a plain run without leadership) writes unfenced: its
    exclusion is the owner rule alone. Fencing orders successive leaders.
    """

    @property
    def generation(self) -> int | None:
        """The generation our writes carry (``None`` until :meth:`fence`)."""
        ...

    async def fence(
        self, generation: int, *, on_fenced: Callable[[LorenzError], None] | None = None
    ) -> None:
        """Raise the store's fence to ``generation`` (refused if it is higher already).

        ``on_fenced`` is called (on the event loop) with the error the first time a later write
        of ours is refused because a newer generation fenced the store.
        """
        ...


@runtime_checkable
class SpawnIntents(Protocol):
    """A claim store that records the spawn intent of a slot's worker (see ``SpawnPhase``)."""

    async def record_intent(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        """Write ``intent`` on our claim of ``key`` (``None`` clears it); ``False`` when the
        claim is not ours (or absent). Fenced like every other write."""
        ...


class ImmediateSpawnIntents(SpawnIntents, Protocol):
    """A spawn-intent store whose write never suspends (it keeps the claims in this process).

    The runner writes a running slot's intent updates (its phase, the collected ``last_seq``)
    through :meth:`record_intent_now` at once, instead of coalescing them in a writer task: a
    task per journal record cost more on the controller's loop than the write itself.

    NB: not runtime-checkable on purpose: the runner tests for ``record_intent_now`` itself,
    an ``isinstance()`` against a protocol walks its members on every call.
    """

    def record_intent_now(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        """:meth:`record_intent`, done before it returns (the same result and errors)."""
        ...


class CapacityProbe(Protocol):
    """The orchestrator's view of a worker pool: whether it governs dispatch, and if it has room.

    When :meth:`governs` is true, claims become reservations that the runtime binds once the
    pool hands out a real host (two-phase dispatch).
    """

    def governs(self) -> bool: ...

    def has_capacity(self) -> bool: ...


class StaticCapacity:
    """No pool: the static/local path (claims go straight to running)."""

    def governs(self) -> bool:
        return False

    def has_capacity(self) -> bool:
        return True
