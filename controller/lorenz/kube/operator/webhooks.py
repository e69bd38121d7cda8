"""The operator's webhook Service: ``POST /webhooks/<namespace>/<workflow>`` on its own port.

On a single host the daemon's server takes one workflow's deliveries
(:mod:`lorenz.server.webhooks`). An operator process runs the runtimes of every Workflow whose
shard it leads, so one route per process routes by Workflow instead, to the same
:class:`~lorenz.server.webhooks.WebhookIntake` a single host uses: the same verification per
sender, size cap, staleness and replay rules, the same coalesced refresh of the runtime and the
same ``lorenz_webhook_requests_total`` series (``workflow="<namespace>/<name>"``). The secret is
the Workflow's ``tracker.webhookSecretRef`` (loaded as ``tracker.webhook_secret``), so a
Workflow without one answers 404 ``webhook_not_found``, like a single host without the key.

Why a port of its own: the operator's API port authenticates every caller with a Kubernetes
token (:mod:`lorenz.kube.operator.api_auth`), and a tracker has none, its signature is its
credential. This port serves nothing but this route, so exposing it (an Ingress, a
LoadBalancer) exposes nothing else.

Which replica answers: the Service spreads deliveries over every ready replica, but only the
replica that leads a Workflow has its runtime. A replica that does not forwards the request
as it came (raw body, the sender's headers) to the leader's webhook port — the host of the
endpoint the leader advertises in its shard Lease, with this process's webhook port, which
every replica of a release shares — and passes the leader's answer back. A forwarded request
is never forwarded again (:data:`FORWARDED_HEADER`); when no leader is known, it cannot be
reached, or the request was already forwarded, the answer is 503 ``webhook_not_led_here``
with ``Retry-After``: the sender's retry, or the backstop poll, picks the change up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from aiohttp import hdrs, web

from lorenz.codes import ErrorCode
from lorenz.kube.settings import OperatorSettings
from lorenz.server import ApiError, LorenzMetrics
from lorenz.server.errors import error_middleware
from lorenz.server.webhooks import WebhookIntake, read_bounded
from lorenz.trackers.webhooks import WEBHOOK_KINDS, DeliveryLog, WebhookRefused

if TYPE_CHECKING:
    from lorenz.kube.operator.process import Supervisor, Watched
    from lorenz.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.kube.webhooks")

WEBHOOK_PATH = "/webhooks/{namespace}/{name}"
"""The route of the webhook Service."""
FORWARDED_HEADER = "X-Lorenz-Webhook-Forwarded"
"""Set (to the forwarding replica's identity) on a delivery passed on to the leader."""
WEBHOOK_NOT_LED_HERE = ErrorCode.WEBHOOK_NOT_LED_HERE
WORKFLOW_NOT_FOUND = ErrorCode.WORKFLOW_NOT_FOUND
RETRY_AFTER_S = 5
"""``Retry-After`` of a 503: about one Lease handover."""
FORWARD_TIMEOUT_S = 10.0
"""How long a forwarded delivery may take at the leader (trackers wait 10 s or more)."""
UNKNOWN = "unknown"
"""The ``workflow`` and ``tracker`` label of a delivery for a Workflow nobody watches (the
URL is anyone's text: it must not mint label values)."""

_HOP_HEADERS = frozenset(
    name.lower()
    for name in (
        hdrs.HOST, hdrs.CONTENT_LENGTH, hdrs.CONNECTION, hdrs.TRANSFER_ENCODING, hdrs.KEEP_ALIVE,
        hdrs.TE, hdrs.TRAILER, hdrs.UPGRADE, hdrs.PROXY_AUTHORIZATION, hdrs.ACCEPT_ENCODING,
    )
)


class WebhookServer:
    """The aiohttp server of the webhook port of one operator process."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        metrics: LorenzMetrics | None,
        settings: OperatorSettings,
    ) -> None:
        self._supervisor = supervisor
        self._metrics = metrics
        self._settings = settings
        self._intakes: dict[tuple[str, str], WebhookIntake] = {}
        """The intake of each Workflow whose runtime took deliveries here (rebuilt when the
        runtime is a new one)."""
        self._deliveries: dict[tuple[str, str], DeliveryLog] = {}
        """Each Workflow's replay log; it outlives a runtime reload in this process."""
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._client: httpx.AsyncClient | None = None

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def url(self) -> str | None:
        if self._port is None:
            return None
        host = self._settings.api_host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{self._port}"

    def app(self) -> web.Application:
        # NB: no authentication middleware: the signature is the credential (module docstring).
        app = web.Application(middlewares=[error_middleware])
        app.router.add_routes([web.post(WEBHOOK_PATH, self._deliver)])
        return app

    async def start(self) -> None:
        if self._settings.webhook_port is None:
            return
        self._client = httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S, trust_env=False)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.api_host, self._settings.webhook_port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or ()
        self._port = int(sockets[0].getsockname()[1]) if sockets else self._settings.webhook_port

    async def stop(self) -> None:
        for intake in self._intakes.values():
            intake.close()
        self._intakes.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the route -------------------------------------------------------------------------

    async def _deliver(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["namespace"], request.match_info["name"])
        watched = self._supervisor.workflows.get(key)
        if watched is None:
            self._count(UNKNOWN, UNKNOWN, WORKFLOW_NOT_FOUND)
            raise ApiError(
                f"this operator watches no Workflow {key[0]}/{key[1]}; point the tracker's "
                "webhook at /webhooks/<namespace>/<workflow name> of an existing Workflow",
                code=WORKFLOW_NOT_FOUND,
                status=404,
            )
        runtime = watched.runtime
        if runtime is None:
            return await self._forward(request, watched)
        kind = runtime.settings.tracker.kind
        return await self._intake(key, runtime).answer(
            request, kind=kind.value if kind is not None else UNKNOWN
        )

    def _intake(self, key: tuple[str, str], runtime: LorenzRuntime) -> WebhookIntake:
        intake = self._intakes.get(key)
        if intake is None or intake.runtime is not runtime:
            self._prune()
            intake = WebhookIntake(
                runtime=runtime,
                metrics=self._metrics,
                workflow=f"{key[0]}/{key[1]}",
                deliveries=self._deliveries.setdefault(key, DeliveryLog()),
            )
            self._intakes[key] = intake
        return intake

    def _prune(self) -> None:
        """Drop the intakes of runtimes that are no longer their Workflow's here, and the
        replay logs of Workflows no longer watched.

        NB: an intake holds its runtime; without this a stopped runtime (leadership moved,
        the Workflow deleted or reloaded into a new runtime) would stay in memory. Run when an
        intake is made, which is when runtimes change hands; a stale intake never answers (a
        delivery always goes to the Workflow's current runtime), it only waits to be dropped.
        """
        workflows = self._supervisor.workflows
        for key, intake in list(self._intakes.items()):
            watched = workflows.get(key)
            if watched is None or watched.runtime is not intake.runtime:
                intake.close()
                del self._intakes[key]
        for key in [key for key in self._deliveries if key not in workflows]:
            del self._deliveries[key]

    async def _forward(self, request: web.Request, watched: Watched) -> web.StreamResponse:
        """Pass the delivery on to the replica that leads the Workflow (module docstring)."""
        display = watched.ref.display
        tracker = _tracker_label(watched.body_text)
        target = self._leader_url(request, watched)
        if target is None or self._client is None:
            self._count(display, tracker, WEBHOOK_NOT_LED_HERE)
            raise _not_led_here(display, watched)
        try:
            body = await read_bounded(request)
        except WebhookRefused as refusal:
            self._count(display, tracker, refusal.code)
            raise ApiError(refusal.message, code=refusal.code, status=400) from None
        headers = {
            name: value for name, value in request.headers.items()
            if name.lower() not in _HOP_HEADERS
        }
        headers[FORWARDED_HEADER] = self._settings.identity
        try:
            answer = await self._client.post(target, content=body, headers=headers)
        except httpx.HTTPError as exc:
            logger.warning("webhook not forwarded workflow=%s to=%s error=%s", display, target,
                           exc)
            self._count(display, tracker, WEBHOOK_NOT_LED_HERE)
            raise _not_led_here(display, watched) from None
        logger.info("webhook forwarded workflow=%s to=%s status=%s", display, target,
                    answer.status_code)
        return web.Response(
            status=answer.status_code,
            body=answer.content,
            headers={
                name: value for name, value in answer.headers.items()
                if name.lower() in ("content-type", "retry-after")
            },
        )

    def _leader_url(self, request: web.Request, watched: Watched) -> str | None:
        """The leader's webhook URL for this request, or ``None`` when it cannot be forwarded."""
        if request.headers.get(FORWARDED_HEADER):
            return None  # NB: forwarded once already: a stale Lease must not make a loop
        record = watched.observed
        if record is None or not record.holder or not record.endpoint:
            return None
        if record.holder == self._settings.identity:
            return None  # NB: this replica holds the shard but has no runtime (starting)
        host = urlsplit(record.endpoint).hostname
        port = self._settings.webhook_port
        if not host or not port:
            return None
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}{request.rel_url.path}"

    def _count(self, workflow: str, tracker: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.count_webhook(workflow=workflow, tracker=tracker, outcome=outcome)


def _not_led_here(display: str, watched: Watched) -> ApiError:
    record = watched.observed
    leader = record.holder if record is not None and record.holder else "nobody"
    return ApiError(
        f"Workflow {display} is led by {leader}, not by this replica, and the delivery could "
        "not be forwarded there; the sender's retry or the backstop poll picks the change up",
        code=WEBHOOK_NOT_LED_HERE,
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _tracker_label(body_text: str) -> str:
    """The Workflow's tracker kind as a metric label (``unknown`` unless a webhook kind)."""
    try:
        spec = json.loads(body_text).get("spec") or {}
    except (ValueError, AttributeError):
        return UNKNOWN
    kind = (spec.get("tracker") or {}).get("kind") if isinstance(spec, Mapping) else None
    return kind if isinstance(kind, str) and kind in WEBHOOK_KINDS else UNKNOWN
