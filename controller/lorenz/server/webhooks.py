"""``POST /api/v1/webhooks/<tracker kind>``: tracker pushes that make the runtime look now.

Polling finds a new issue up to one interval late and spends most of its tracker requests on
finding nothing. With ``tracker.webhook_secret`` set, the tracker tells the server instead, and
this route turns the deliveries it can verify into :meth:`LorenzRuntime.request_refresh` calls:
the runtime's usual poll and reconcile pass, which reads the tracker (the delivery itself is
never trusted for state), starts what became eligible and stops what became terminal, exactly
as a poll would.

A burst (a bulk edit, a label added to 300 issues) must not become a burst of tracker reads.
The runtime merges the refreshes asked for while a pass runs into one follow-up pass; on top of
that, :class:`RefreshCoalescer` asks at most once per :data:`REFRESH_MIN_GAP_S`: the first
delivery after a quiet spell asks at once (no added latency), the ones that follow within the
gap share one refresh at its end (none is lost).

What this route refuses, and why (the verification itself is
:mod:`lorenz.trackers.webhooks`, shared with any other shape that takes deliveries):

* no ``tracker.webhook_secret``, or a kind that is not the workflow's tracker: 404 (off);
* a body over :data:`~lorenz.trackers.webhooks.MAX_WEBHOOK_BODY_BYTES` (read no further);
* unsigned or wrongly signed: 401; stale (Linear), too deep, not JSON, or a delivery id seen
  within the :class:`~lorenz.trackers.webhooks.DeliveryLog`'s TTL: 400.

Every refusal is a coded JSON error, is counted in ``lorenz_webhook_requests_total`` by
outcome, and changes nothing. The browser-origin rules and the bearer token of
:mod:`lorenz.server.guard` do not apply here (a tracker is not a browser and has no token; the
signature is the credential); the Host check, the JSON content type and the size cap do.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping

from aiohttp import hdrs, web

from lorenz.codes import ErrorCode
from lorenz.model import RefreshReceipt
from lorenz.runtime import LorenzRuntime
from lorenz.server.errors import ORCHESTRATOR_UNAVAILABLE, ApiError
from lorenz.server.metrics import LorenzMetrics
from lorenz.trackers.webhooks import (
    MAX_WEBHOOK_BODY_BYTES,
    WEBHOOK_KINDS,
    DeliveryLog,
    WebhookEvent,
    WebhookRefused,
    body_too_large,
    replayed,
    verify_delivery,
)

logger = logging.getLogger("lorenz.server.webhooks")

WEBHOOK_ROUTE = "/api/v1/webhooks/{kind}"
"""The route, one per server (the server serves one workflow)."""
WEBHOOK_NOT_FOUND = ErrorCode.WEBHOOK_NOT_FOUND
"""404: webhooks are off for this workflow, or the kind is not its tracker's."""
ACCEPTED = "accepted"
"""Outcome: verified, and a refresh was queued for the issues it names."""
IGNORED = "ignored"
"""Outcome: verified, but it names no issue (a ping, a project update): nothing queued."""

REFRESH_MIN_GAP_S = 0.25
"""Least time between two refreshes asked for by deliveries (see the module docstring)."""

_READ_CHUNK = 64 * 1024


class RefreshCoalescer:
    """Asks ``request`` (the runtime's refresh) at most once per ``min_gap_s``.

    Leading edge at once, trailing edge at the end of the gap for whatever came meanwhile;
    :meth:`close` drops a trailing refresh not yet asked (the server is going away).
    """

    def __init__(
        self,
        *,
        request: Callable[[], RefreshReceipt],
        min_gap_s: float = REFRESH_MIN_GAP_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = request
        self._min_gap_s = min_gap_s
        self._monotonic = monotonic
        self._last_asked: float | None = None
        self._trailing: asyncio.TimerHandle | None = None
        self.asked = 0
        """How many refreshes were asked of the runtime (the bench reads it)."""

    def ask(self) -> RefreshReceipt:
        """Ask now, or join the refresh due at the end of the current gap."""
        now = self._monotonic()
        if self._trailing is not None:
            return _joined()
        if self._last_asked is None or now - self._last_asked >= self._min_gap_s:
            return self._ask_now(now)
        delay = self._min_gap_s - (now - self._last_asked)
        self._trailing = asyncio.get_running_loop().call_later(delay, self._fire_trailing)
        return _joined()

    def close(self) -> None:
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None

    def _ask_now(self, now: float) -> RefreshReceipt:
        self._last_asked = now
        self.asked += 1
        return self._request()

    def _fire_trailing(self) -> None:
        self._trailing = None
        self._ask_now(self._monotonic())


def _joined() -> RefreshReceipt:
    return RefreshReceipt(
        queued=True,
        coalesced=True,
        requested_at=datetime.datetime.now(datetime.UTC),
        operations=("poll", "reconcile"),
    )


class WebhookIntake:
    """One workflow's webhook deliveries: verify, refuse replays, queue the refresh, count.

    The operator's webhook Service can hold one of these per Workflow (routing
    ``/webhooks/<namespace>/<workflow>`` to it) and call :meth:`take` with what it read.
    """

    def __init__(
        self,
        *,
        runtime: LorenzRuntime,
        metrics: LorenzMetrics | None = None,
        workflow: str | None = None,
        deliveries: DeliveryLog | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``workflow``: the metrics label (default: the workflow path); ``wall_clock``: seconds
        since the epoch (Linear's freshness check and the replay log's TTL)."""
        self.runtime = runtime
        self.metrics = metrics
        self.workflow = workflow if workflow is not None else str(runtime.workflow.path)
        self.deliveries = deliveries if deliveries is not None else DeliveryLog()
        self.refreshes = RefreshCoalescer(request=runtime.request_refresh)
        self._wall_clock = wall_clock

    def close(self) -> None:
        """Drop a refresh still waiting for its gap to end (the server stops)."""
        self.refreshes.close()

    def secret_for(self, kind: str) -> str | None:
        """The secret deliveries of ``kind`` are verified with; ``None``: the route is off."""
        tracker = self.runtime.settings.tracker
        own_kind = tracker.kind.value if tracker.kind is not None else None
        if kind not in WEBHOOK_KINDS or kind != own_kind or not tracker.webhook_secret:
            return None
        return tracker.webhook_secret

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The aiohttp handler of :data:`WEBHOOK_ROUTE` (the kind is in the URL)."""
        return await self.answer(request, kind=request.match_info["kind"])

    async def answer(self, request: web.Request, *, kind: str) -> web.StreamResponse:
        """Answer one delivery of ``kind`` (a route that names the workflow instead of the
        kind passes the workflow's ``tracker.kind``)."""
        secret = self.secret_for(kind)
        if secret is None:
            self._count(kind, WEBHOOK_NOT_FOUND)
            raise ApiError(
                f"no webhook route for {kind[:40]!r} on this workflow; webhooks need "
                "tracker.webhook_secret and the workflow's own tracker kind in the URL",
                code=WEBHOOK_NOT_FOUND,
                status=404,
            )
        if self.runtime.stopped:
            self._count(kind, ORCHESTRATOR_UNAVAILABLE)
            raise _stopped()
        try:
            body = await read_bounded(request)
            event = self.take(kind=kind, headers=dict(request.headers), body=body, secret=secret)
        except WebhookRefused as refusal:
            raise self._refused(kind, refusal) from None
        if not event.names_issues:
            self._count(kind, IGNORED)
            return web.json_response({"accepted": True, "event": event.to_dict(), "refresh": None},
                                     status=202)
        receipt = self.refreshes.ask()
        if not receipt.queued:
            # NB: not acted on; let the sender's retry in once a runtime takes deliveries again.
            self.deliveries.forget(kind=kind, delivery_id=event.delivery_id)
            self._count(kind, ORCHESTRATOR_UNAVAILABLE)
            raise _stopped()
        self._count(kind, ACCEPTED)
        logger.info(
            "webhook accepted kind=%s delivery=%s event=%s change=%s issues=%s",
            kind, event.delivery_id, event.event, event.change.value,
            ",".join(event.identifiers or event.issue_ids),
        )
        return web.json_response(
            {"accepted": True, "event": event.to_dict(), "refresh": receipt.to_dict()},
            status=202,
        )

    def take(
        self, *, kind: str, headers: Mapping[str, str], body: bytes, secret: str
    ) -> WebhookEvent:
        """Verify one delivery and record its id; :class:`WebhookRefused` if it is not taken."""
        now = self._wall_clock()
        event = verify_delivery(kind=kind, headers=headers, body=body, secret=secret, now=now)
        if not self.deliveries.record(kind=kind, delivery_id=event.delivery_id, now=now):
            raise replayed(event.delivery_id)
        return event

    def _refused(self, kind: str, refusal: WebhookRefused) -> ApiError:
        self._count(kind, refusal.code)
        logger.warning("webhook refused kind=%s code=%s", kind, refusal.code)
        return ApiError(
            refusal.message,
            code=refusal.code,
            status=401 if refusal.unauthenticated else 400,
        )

    def _count(self, kind: str, outcome: str) -> None:
        if self.metrics is not None:
            # NB: an unknown kind in the URL is anyone's text: it must not mint label values.
            label = kind if kind in WEBHOOK_KINDS else "unknown"
            self.metrics.count_webhook(workflow=self.workflow, tracker=label, outcome=outcome)


def _stopped() -> ApiError:
    return ApiError(
        "the runtime has stopped and takes no deliveries; the sender's retry or the next poll "
        "after a restart picks the change up",
        code=ORCHESTRATOR_UNAVAILABLE,
        status=503,
    )


async def read_bounded(request: web.Request) -> bytes:
    """The body, or :func:`body_too_large` as soon as it is over the cap (declared or read)."""
    declared = request.content_length
    if declared is not None and declared > MAX_WEBHOOK_BODY_BYTES:
        raise body_too_large(declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(_READ_CHUNK):
        size += len(chunk)
        if size > MAX_WEBHOOK_BODY_BYTES:
            raise body_too_large(None)
        chunks.append(chunk)
    return b"".join(chunks)


def webhook_routes(intake: WebhookIntake) -> list[web.RouteDef]:
    return [web.post(WEBHOOK_ROUTE, intake.handle)]


def is_webhook_request(request: web.Request) -> bool:
    """Whether ``request`` was routed to the webhook route (by the route matched, not the text
    of the path: a path that only looks like it gets no exemption)."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return (
        resource is not None
        and resource.canonical == WEBHOOK_ROUTE
        and request.method == hdrs.METH_POST
    )
