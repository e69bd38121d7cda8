"""The Workflow's status, patched by its leader: settled, rate-limited, only when it changed.

The controller knows the facts (``WorkflowController.status_inputs``) and marks them changed;
:class:`StatusPublisher` decides when the status is computed
(:func:`~lorenz.kube.controller.status.workflow_status`) and written: a burst of changes settles
first, at most one patch per ``status_interval_seconds``, none when nothing changed, and a change
of bookkeeping only (when the last poll was) at most once per ``idle_status_interval_seconds``. It
lives as long as its controller (what it last wrote is compared across terms); its loop runs once
per term.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import Condition
from lorenz.kube.clients import KubeApi, workflows_path
from lorenz.kube.controller.flags import Flag
from lorenz.kube.controller.status import (
    STARTING_REASON,
    StatusInputs,
    only_bookkeeping_changed,
    ready_condition,
    workflow_status,
)
from lorenz.kube.errors import KubeApiError
from lorenz.kube.settings import OperatorSettings
from lorenz.model.clocks import utc_now
from lorenz.runtime import LorenzRuntime
from lorenz.tasks import first_of

# NB: the name the controller's log lines have always had (this was part of it).
logger = logging.getLogger("lorenz.kube.controllers")



class RuntimeAttacher(Protocol):
    """Where a runtime is announced while it runs, beside its status (the shared metrics
    registry)."""

    def attach(self, runtime: LorenzRuntime, *, workflow: str | None = None) -> Callable[[], None]:
        ...


STATUS_SETTLE_S = 0.05
"""How long a burst of snapshots may settle before the status is computed and patched."""


class StatusPublisher:
    """Writes one Workflow's status for its controller, while its term may write."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        settings: OperatorSettings,
        inputs: Callable[[], StatusInputs],
        seen_status: Callable[[], Mapping[str, Any]],
        may_write: Callable[[], bool],
    ) -> None:
        self._api = api
        self._workflow = workflow
        """The Workflow (its namespace and name, which never change)."""
        self._settings = settings
        self._inputs = inputs
        """The facts the status depends on, now."""
        self._seen_status = seen_status
        """The status of the newest watched object (its conditions' transition times, before
        this process wrote one)."""
        self._may_write = may_write
        """Whether the current term may write the status now."""
        self._dirty = Flag()
        self._last_status: dict[str, Any] | None = None
        self._last_write_at = 0.0
        self._deferred: asyncio.TimerHandle | None = None
        """A status write postponed by the idle rate limit."""

    def dirty(self) -> None:
        """Something the status depends on changed: compute it again (soon)."""
        self._dirty.set()

    def end_term(self) -> None:
        """The term ended: drop a write postponed by the idle rate limit."""
        self._cancel_deferred()

    def _cancel_deferred(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None

    async def run(self) -> None:
        """Publish the status whenever it may have changed (one term's loop)."""
        first = True
        while True:
            await self._dirty.wait()
            # NB: one tick emits a burst of snapshots (start, end, next poll scheduled); letting
            # it settle first makes an idle tick cost one status patch, not three.
            await asyncio.sleep(STATUS_SETTLE_S)
            if first:
                first = False
                await self._first_status_settles()
            self._dirty.clear()
            try:
                await self.publish()
            except KubeApiError as exc:
                logger.warning(
                    "Status patch failed workflow=%s error=%s", self._workflow.display, exc
                )
            await asyncio.sleep(self._settings.status_interval_seconds)

    async def _first_status_settles(self) -> None:
        """Hold a term's first status until it says more than "starting" (bounded).

        A runtime usually builds and polls within a second: its first status then goes out
        as ``Ready`` in one patch instead of ``Starting`` followed by ``Ready`` a moment
        later — with 1,000 Workflows starting at once, that was 1,000 patches (and 1,000 watch
        events at every replica) fewer. A start slower than ``first_status_wait_seconds``
        (queued behind other starts, or failing) still shows ``Starting`` then.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.first_status_wait_seconds
        while ready_condition(self._inputs())[1] == STARTING_REASON:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._dirty.clear()
            await first_of(self._dirty.wait(), timeout_s=left)

    def status_body(self) -> dict[str, Any]:
        """The status this leader would write now (conditions keep their transition times)."""
        # NB: the conditions last written are read back from that status (its wire form is
        # kept anyway) instead of being kept a second time as models: ~3 KiB per led Workflow.
        written = self._last_status
        previous = _conditions_of(written if written is not None else self._seen_status())
        return workflow_status(self._inputs(), previous, utc_now())

    async def publish(self, *, force: bool = False) -> bool:
        """Patch the status if it changed (and this term may write); ``True`` if patched."""
        if not self._may_write():
            return False
        status = self.status_body()
        if not force and status == self._last_status:
            return False
        if not force and self._last_status is not None and only_bookkeeping_changed(
            status, self._last_status
        ):
            wait = self._last_write_at + self._settings.idle_status_interval_seconds
            wait -= time.monotonic()
            if wait > 0:
                # NB: nothing a user acts on changed (only when the last poll was): write it
                # later, once, instead of on every idle tick.
                if self._deferred is None:
                    self._deferred = asyncio.get_running_loop().call_later(wait, self.dirty)
                return False
        self._cancel_deferred()
        workflow = self._workflow
        path = workflows_path(workflow.namespace, workflow.name, status=True)
        try:
            await self._api.merge_patch(path, {"status": status})
        except KubeApiError as exc:
            if exc.not_found:
                return False
            raise
        self._last_status = status
        self._last_write_at = time.monotonic()
        return True


def _conditions_of(status: Mapping[str, Any]) -> list[Condition]:
    found = []
    for raw in status.get("conditions") or ():
        with contextlib.suppress(ValueError):
            found.append(Condition.model_validate(raw))
    return found
