"""The default claim store: claims live as long as the process, shared by nobody.

It still honours the :class:`~lorenz.model.ClaimStore` contract exactly (exclusive acquire,
owner checks), so the orchestrator behaves the same on every backend and tests of the core run
against the real default rather than a mock.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from lorenz.model import ClaimRecord, SlotKey, StoredState


class MemoryClaimStore:
    """Claims in a dict; ``durable`` is false."""

    def __init__(self, *, owner: str = "local") -> None:
        self._owner = owner
        self._claims: dict[SlotKey, ClaimRecord] = {}
        self._checkpoint: dict[str, Any] | None = None
        self.closed = False

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def durable(self) -> bool:
        return False

    @property
    def claims(self) -> Mapping[SlotKey, ClaimRecord]:
        """A read-only view, for tests and diagnostics."""
        return self._claims

    async def load(self) -> StoredState:
        return StoredState(
            claims=[copy.copy(r) for r in self._claims.values()],
            checkpoint=copy.deepcopy(self._checkpoint),
        )

    async def acquire(self, record: ClaimRecord) -> bool:
        held = self._claims.get(record.slot_key)
        if held is not None and held.owner != self._owner:
            return False
        stored = copy.copy(record)
        stored.owner = self._owner
        self._claims[record.slot_key] = stored
        return True

    async def save(self, record: ClaimRecord) -> None:
        held = self._claims.get(record.slot_key)
        if held is not None and held.owner != self._owner:
            return
        stored = copy.copy(record)
        stored.owner = self._owner
        self._claims[record.slot_key] = stored

    async def release(self, key: SlotKey) -> None:
        held = self._claims.get(key)
        if held is not None and held.owner == self._owner:
            del self._claims[key]

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        owners = set(from_owners) - {self._owner}
        taken: list[ClaimRecord] = []
        for key, record in self._claims.items():
            if record.owner in owners:
                record.owner = self._owner
                taken.append(copy.copy(record))
                self._claims[key] = record
        return taken

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        self._checkpoint = copy.deepcopy(dict(checkpoint))

    async def heartbeat(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True
