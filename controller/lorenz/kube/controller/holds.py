"""The continuation limit of one Workflow: a slot whose agent keeps ending cleanly is held.

An agent that ends cleanly while its issue is still active gets a continuation retry; one that
does so ``agent.max_continuation_runs`` times in a row without moving the issue would run
forever. The core counts them and blocks the slot (:mod:`lorenz.policies.continuations`, the
same rule as on a single host); the operator turns that block into a durable hold, the
``lorenz.dev/hold`` annotation on its Claim (a person removes it to run the issue again). The
annotation's patch and the slots held meanwhile live here, beside the controller that feeds it
the runtime's events and the term's claim store that refuses the held slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path
from lorenz.kube.controller.posting import EventKind
from lorenz.kube.errors import KubeApiError
from lorenz.kube.settings import OperatorSettings
from lorenz.model import BlockReason, ClaimRecord, EventType, RuntimeEvent, SlotKey
from lorenz.model.slots import slot_key
from lorenz.tasks import BackgroundTasks

# NB: the name the controller's log lines have always had (these were its methods).
logger = logging.getLogger("lorenz.kube.controllers")

HOLD_ATTEMPTS = 5
"""Tries of the hold annotation's patch (a continuation limit) before the slot is let go."""


class HoldingClaimStore(ClaimResourceStore):
    """The term's claim store, which also refuses the slots this replica is holding itself.

    NB: the continuation limit holds a slot with an annotation on its Claim, and the watch
    that sees it stops the slot; under load that round trip took longer than the next
    continuation retry, so runs slipped through (and each reset the count). A slot in
    ``holding`` is refused at once, as a held Claim would be, until the watch has seen the
    annotation (then the Claim itself refuses it) or the patch gave up.
    """

    def __init__(self, *, holding: set[SlotKey], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._holding = holding

    async def acquire(self, record: ClaimRecord) -> bool:
        if record.slot_key in self._holding:
            return False
        return await super().acquire(record)


class ContinuationHolds:
    """Continuation retries in a row per slot of one Workflow, and the holds they lead to."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        settings: OperatorSettings,
        limit: Callable[[], int],
        holds_lease: Callable[[], bool],
        post: Callable[[EventKind, str, str], None],
        background: BackgroundTasks,
    ) -> None:
        self._api = api
        self._workflow = workflow
        """The Workflow (its namespace and name, which never change)."""
        self._settings = settings
        self._limit = limit
        """The continuation limit in force (the runtime's ``agent.max_continuation_runs``)."""
        self._holds_lease = holds_lease
        self._post = post
        self._background = background
        self.holding: set[SlotKey] = set()
        """Slots held by the continuation limit whose hold the watch has not shown yet (see
        :class:`HoldingClaimStore`)."""

    def on_runtime_event(self, event: RuntimeEvent) -> None:
        """Hold a slot that the core blocked at its continuation limit.

        The core counts the clean runs in a row and blocks the slot past
        ``agent.max_continuation_runs`` (:mod:`lorenz.policies.continuations`; the operator's
        ``--max-continuation-runs`` bounds that setting). A block lives in the leader's memory
        only, so the operator makes it durable and visible: the ``lorenz.dev/hold``
        annotation on the slot's Claim (a new leader, or a restart, keeps refusing the slot
        until a person removes it) and a ``ContinuationLimit`` Warning Event.
        """
        if (
            event.type is not EventType.SLOT_BLOCKED
            or event.reason != BlockReason.CONTINUATION_LIMIT.value
            or event.slot is None
            or not event.identifier
        ):
            return
        slot, identifier = event.slot, event.identifier
        key = slot_key(event.issue_id or identifier, slot)
        runs = self._limit() + 1
        # NB: at once: the patch below lands later, and a refresh could otherwise release the
        # core's block before the Claim says held.
        self.holding.add(key)
        self._post(
            "Warning",
            "ContinuationLimit",
            f"{identifier} slot {slot}: the agent ended cleanly {runs} times in a row "
            f"and the issue is still active, so it is held instead of run again "
            f"({resources.HOLD_ANNOTATION} on its Claim); remove the annotation to run it "
            "again",
        )
        self._background.spawn(self._hold(key, note=f"{runs} clean runs without progress"))

    async def _hold(self, key: SlotKey, *, note: str) -> None:
        """Annotate the slot's Claim as held (the slot is refused locally meanwhile); a patch
        that keeps failing lets the slot go again, its count started afresh."""
        workflow = self._workflow
        path = claims_path(workflow.namespace, resources.claim_name(workflow.name, key))
        delay = self._settings.retry_period_seconds
        for attempt in range(1, HOLD_ATTEMPTS + 1):
            if not self._holds_lease():
                break
            try:
                await self._api.merge_patch(
                    path, {"metadata": {"annotations": {resources.HOLD_ANNOTATION: note}}}
                )
            except KubeApiError as exc:
                logger.warning(
                    "Holding the issue failed workflow=%s slot=%s attempt=%d error=%s",
                    workflow.display, key, attempt, exc,
                )
                if exc.not_found:
                    break
                await asyncio.sleep(delay * attempt)
            else:
                return  # NB: the local hold ends when the watch shows the annotation
        self.holding.discard(key)
