"""Kubernetes Events on a Workflow (``kubectl describe wf``): which runtime events, how often.

People look at ``kubectl describe`` to see what happened: a run was dispatched, stalled,
failed and was scheduled for retry, a reconciliation stopped a run, leadership moved, a spec
update was rejected. Those become Events on the Workflow (posted through kopf's event queue).
Everything else (every poll, every agent line) stays in the logs and the snapshot API.

Events are rate-limited per Workflow with a token bucket (``events_per_minute``, bursts up to
that many), and an event identical to the previous one (reason and message) within
:data:`REPEAT_WINDOW_S` is dropped: a Workflow whose spec fails to reload on every tick must not
flood etcd. Dropped events are counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, cast

from lorenz.model import EventType, RuntimeEvent

logger = logging.getLogger("lorenz.kube.events")

EventKind = Literal["Normal", "Warning"]
Post = Callable[[Mapping[str, Any], EventKind, str, str], None]
"""``(object reference, type, reason, message)`` → posts one Event."""

REPEAT_WINDOW_S = 60.0
MAX_MESSAGE = 1024

RUNTIME_EVENTS: Mapping[str, tuple[EventKind, str]] = {
    EventType.RUN_STARTED.value: ("Normal", "RunStarted"),
    EventType.RUN_FINISHED.value: ("Normal", "RunFinished"),
    EventType.RUN_FAILED.value: ("Warning", "RunFailed"),
    EventType.RUN_STALLED.value: ("Warning", "RunStalled"),
    EventType.RETRY_SCHEDULED.value: ("Normal", "RetryScheduled"),
    EventType.PLACEMENT_FAILED.value: ("Warning", "PlacementFailed"),
    EventType.RUN_CANCELED.value: ("Normal", "RunCanceled"),
    EventType.RUN_RECONCILED.value: ("Normal", "ReconcileStopped"),
    EventType.WORKSPACE_CLEANUP.value: ("Normal", "ReconcileStopped"),
    EventType.WORKFLOW_RELOADED.value: ("Normal", "SpecApplied"),
    EventType.WORKFLOW_RELOAD_FAILED.value: ("Warning", "SpecRejected"),
    EventType.POLL_ERROR.value: ("Warning", "PollFailed"),
    EventType.LEADERSHIP_LOST.value: ("Warning", "LeadershipLost"),
}
"""Runtime event type → (Event type, reason). Types not listed are not posted."""


def kopf_post(reference: Mapping[str, Any], kind: EventKind, reason: str, message: str) -> None:
    """Post through kopf's queue (needs kopf's context: call from tasks kopf's handlers made)."""
    import kopf

    body = kopf.Body(cast("kopf.RawBody", dict(reference)))
    kopf.event(body, type=kind, reason=reason, message=message)


class EventPoster:
    """Rate-limited Events for one Workflow."""

    def __init__(
        self,
        *,
        reference: Mapping[str, Any],
        per_minute: int,
        post: Post = kopf_post,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reference = dict(reference)
        self._capacity = float(per_minute)
        self._tokens = float(per_minute)
        self._rate = per_minute / 60.0
        self._post = post
        self._monotonic = monotonic
        self._refilled_at = monotonic()
        self._last: tuple[str, str] | None = None
        self._last_at = -REPEAT_WINDOW_S
        self.posted = 0
        self.dropped = 0
        self.silenced = False
        """Set once the Workflow is being deleted: nothing more is posted (counted as dropped)."""

    def silence(self) -> None:
        """Post nothing from now on: the Workflow is being deleted.

        NB: when its namespace is being deleted, the API server refuses every new Event there
        (403 NamespaceTerminating) and kopf retries each one 9 times: with hundreds of Workflows
        that retry storm crowds the operator while it should be running their cleanups.
        """
        self.silenced = True

    def post(self, kind: EventKind, reason: str, message: str) -> bool:
        """Post one Event unless the limits say no; ``True`` if it was posted."""
        if self.silenced:
            self.dropped += 1
            return False
        now = self._monotonic()
        message = message[:MAX_MESSAGE]
        if self._last == (reason, message) and now - self._last_at < REPEAT_WINDOW_S:
            self.dropped += 1
            return False
        self._tokens = min(self._capacity, self._tokens + (now - self._refilled_at) * self._rate)
        self._refilled_at = now
        if self._tokens < 1.0:
            self.dropped += 1
            return False
        self._tokens -= 1.0
        self._last = (reason, message)
        self._last_at = now
        try:
            self._post(self._reference, kind, reason, message)
        except Exception:
            logger.exception("posting an Event failed reason=%s", reason)
            return False
        self.posted += 1
        return True

    def runtime_event(self, event: RuntimeEvent) -> bool:
        """Post a runtime event if it is one people should see in ``kubectl describe``."""
        mapped = RUNTIME_EVENTS.get(event.type.value)
        if mapped is None:
            return False
        kind, reason = mapped
        return self.post(kind, reason, describe(event))


def describe(event: RuntimeEvent) -> str:
    """One line for an Event: the issue and slot, then the runtime's message."""
    parts = []
    if event.identifier:
        slot = event.slot
        parts.append(f"{event.identifier}" + (f" slot {slot}" if slot is not None else ""))
    if event.attempt:
        parts.append(f"attempt {event.attempt}")
    message = event.message or event.type.value
    head = " ".join(parts)
    return f"{head}: {message}" if head else message
