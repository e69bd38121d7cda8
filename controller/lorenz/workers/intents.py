"""The spawn intent of a worker run, recorded through the claim store before and after the spawn.

A controller that dies between claiming a slot and following its worker leaves only the claim
behind; the intent in it (phase, handle, collected ``last_seq``) is what its successor adopts
from (see :mod:`lorenz.workers.runner`). Apart from the runner because the ordering rules of
these writes (the first mandatory, the rest coalesced and best effort) are a concern of their
own, with a test-only pause hook to kill a controller in a given phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Final, cast

from lorenz.agents import AgentRunError
from lorenz.codes import ErrorCode
from lorenz.model import ImmediateSpawnIntents, SlotKey, SpawnIntent, SpawnIntents, SpawnPhase

logger = logging.getLogger(__name__)


PAUSE_AT_SPAWN_PHASE_ENV: Final = "LORENZ_TEST_PAUSE_AT_SPAWN_PHASE"
"""Test-only: a spawn phase (``provisioning``, ``spawn_requested``) at which this controller's
runs stop for ever right after the claim recorded it, so that a test can ``kill -9`` the
controller in exactly that phase. Not a setting and not supported."""


class IntentRecorder:
    """Writes one slot's spawn intent through the claim store, newest state last.

    The intent before a spawn is mandatory (:meth:`require`: no worker starts unless the claim
    says so first). The updates after it — phase ``running``, the collected ``last_seq`` — are
    coalesced into one writer task and best effort: NB, a failed write is logged and never
    touches the worker (a live worker is never killed because a write failed).
    """

    def __init__(
        self, *, store: SpawnIntents, key: SlotKey, generation: int | None, placement: str | None
    ) -> None:
        self._store = store
        self._key = key
        self._generation = generation
        self._placement = placement
        self._wanted: SpawnIntent | None = None
        self._written: SpawnIntent | None = None
        self._writer: asyncio.Task[None] | None = None
        # NB: not the writer task then: one task per journal record cost more on the loop
        # than the write it made (~6 a run), and the intent is written earlier, not later.
        # (An attribute test: isinstance() against a runtime-checkable protocol cost ~0.1 ms.)
        self._immediate: ImmediateSpawnIntents | None = (
            cast(ImmediateSpawnIntents, store)
            if callable(getattr(store, "record_intent_now", None))
            else None
        )

    def intent(self, handle: str, phase: SpawnPhase, last_seq: int = 0) -> SpawnIntent:
        return SpawnIntent(
            handle=handle,
            phase=phase,
            generation=self._generation,
            last_seq=last_seq,
            placement=self._placement,
        )

    async def require(self, handle: str, phase: SpawnPhase, last_seq: int = 0) -> None:
        """Record ``phase`` before the step it names; :class:`AgentRunError` if it cannot be."""
        intent = self.intent(handle, phase, last_seq)
        try:
            await self._store.record_intent(self._key, intent)
        except Exception as exc:
            raise AgentRunError(
                f"the spawn intent of {self._key} could not be recorded ({exc}); no worker "
                "was started",
                code=getattr(exc, "code", ErrorCode.SPAWN_INTENT_FAILED),
            ) from exc
        self._written = intent
        if os.environ.get(PAUSE_AT_SPAWN_PHASE_ENV) == phase.value:
            logger.warning("test pause at spawn phase=%s handle=%s", phase.value, handle)
            await asyncio.Event().wait()

    def update(self, intent: SpawnIntent) -> None:
        """Ask for ``intent`` to be written soon (coalesced with later updates).

        A store whose writes never suspend (the memory store) is written at once instead.
        """
        self._wanted = intent
        if self._immediate is not None:
            self._write_now(self._immediate, intent)
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def flush(self) -> None:
        while self._writer is not None and not self._writer.done():
            # NB: the writer logs its own failures; flushing only waits for it to end.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._writer)

    def _write_now(self, store: ImmediateSpawnIntents, intent: SpawnIntent) -> None:
        if intent == self._written:
            return
        try:
            store.record_intent_now(self._key, intent)
        except Exception as exc:  # noqa: BLE001 - logged; the worker goes on regardless
            logger.warning("spawn intent not recorded slot=%s: %s", self._key, exc)
            return
        self._written = intent

    async def _write(self) -> None:
        while self._wanted is not None and self._wanted != self._written:
            wanted = self._wanted
            try:
                await self._store.record_intent(self._key, wanted)
            except Exception as exc:  # noqa: BLE001 - logged; the worker goes on regardless
                logger.warning("spawn intent not recorded slot=%s: %s", self._key, exc)
                return
            self._written = wanted
