"""``/metrics`` and the snapshot API of one operator process, for every Workflow it serves.

One process runs the runtimes of every Workflow whose Lease it holds, so one server answers
for all of them: the runtime metrics come from the server layer's
:class:`~lorenz.server.LorenzMetrics` (each runtime attached under ``workflow="<ns>/<name>"``
while it runs here, detached when leadership moves), plus the operator's own series (which
Workflows it leads, Lease transitions, API requests it made, Events posted and dropped, Claim
writes refused by the fence). The snapshot API mirrors the single-host routes per Workflow:

* ``GET  /api/v1/workflows`` — every watched Workflow: leader, whether this process leads it;
* ``GET  /api/v1/workflows/{namespace}/{name}/state`` — the runtime snapshot (``GET
  /api/v1/state`` of a single host); 409 ``workflow_not_led_here`` names the leader's endpoint;
* ``POST /api/v1/workflows/{namespace}/{name}/refresh`` — poll now (like the annotation);
* ``POST /api/v1/workflows/{namespace}/{name}/issues/{identifier}/answer`` — answer a waiting
  issue's question (the single host's ``POST /api/v1/issues/{identifier}/answer``, same body,
  answers and refusals; like the ``lorenz.dev/answer`` annotation on its Claim);
* ``GET  /metrics``, ``GET /healthz``.

Every route is authenticated with the caller's Kubernetes token unless ``api_auth`` is
``none`` or the path is in ``api_open_paths`` (:mod:`lorenz.kube.operator.api_auth`).

Errors are the server layer's coded JSON envelope.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lorenz.codes import ErrorCode
from lorenz.kube.clients import KubeApi
from lorenz.kube.operator.api_auth import KubernetesAuth
from lorenz.kube.settings import OperatorSettings
from lorenz.server import ApiError, LorenzMetrics
from lorenz.server.answers import answer_handler
from lorenz.server.errors import error_middleware

ANSWER_ROUTE = "/api/v1/workflows/{namespace}/{name}/issues/{identifier:.+}/answer"
"""A waiting issue's answer, for the Workflow's runtime (authorized as ``patch`` on Claims)."""

if TYPE_CHECKING:
    from lorenz.kube.operator.process import Supervisor
    from lorenz.runtime import LorenzRuntime

WORKFLOW_NOT_FOUND = ErrorCode.WORKFLOW_NOT_FOUND
WORKFLOW_NOT_LED_HERE = ErrorCode.WORKFLOW_NOT_LED_HERE


class Metrics:
    """The runtime metrics registry plus the operator's own collector."""

    def __init__(self, *, api: KubeApi) -> None:
        self.api = api
        self.lorenz = LorenzMetrics()

    def bind(self, supervisor: Supervisor) -> None:
        self.lorenz.registry.register(_OperatorCollector(supervisor=supervisor, api=self.api))

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        return self.lorenz.exposition(accept)


class _OperatorCollector(Collector):
    def __init__(self, *, supervisor: Supervisor, api: KubeApi) -> None:
        self._supervisor = supervisor
        self._api = api

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        leading = GaugeMetricFamily(
            "lorenz_operator_leading",
            "1 while this process holds the Workflow's Lease and runs its runtime.",
            labels=["workflow"],
        )
        transitions = GaugeMetricFamily(
            "lorenz_operator_lease_transitions",
            "leaseTransitions of the Workflow's Lease as last observed.",
            labels=["workflow"],
        )
        events = CounterMetricFamily(
            "lorenz_operator_events",
            "Kubernetes Events on the Workflow, posted or dropped by the rate limit.",
            labels=["workflow", "result"],
        )
        for watched in list(self._supervisor.workflows.values()):
            name = watched.ref.display
            leading.add_metric([name], 1.0 if watched.leading else 0.0)
            record = watched.observed
            transitions.add_metric([name], float(record.transitions if record else 0))
            events.add_metric([name, "posted"], float(watched.events_posted))
            events.add_metric([name, "dropped"], float(watched.events_dropped))
        requests = CounterMetricFamily(
            "lorenz_operator_api_requests",
            "Kubernetes API requests this process made itself (kopf's watches excluded).",
            labels=["verb", "resource"],
        )
        seconds = CounterMetricFamily(
            "lorenz_operator_api_request_seconds",
            "Seconds those requests took, from the call to the answer (waiting for a free "
            "thread of the client's pool included).",
            labels=["verb", "resource"],
        )
        queued = CounterMetricFamily(
            "lorenz_operator_api_queued_seconds",
            "Of those seconds, the time requests waited for a free thread of the client's pool.",
            labels=["verb", "resource"],
        )
        for (verb, resource), count in sorted(self._api.requests.items()):
            requests.add_metric([verb, resource], float(count))
            seconds.add_metric([verb, resource], self._api.seconds[(verb, resource)])
            queued.add_metric([verb, resource], self._api.queued_seconds[(verb, resource)])
        return [leading, transitions, events, requests, seconds, queued]


class OperatorServer:
    """The aiohttp server of one operator process."""

    def __init__(
        self,
        *,
        supervisor: Supervisor,
        metrics: Metrics,
        settings: OperatorSettings,
        auth: KubernetesAuth | None = None,
    ) -> None:
        self._supervisor = supervisor
        self._metrics = metrics
        self._settings = settings
        self._auth = auth
        """``None``: every request is served (``api_auth: none``)."""
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        metrics.bind(supervisor)

    @property
    def url(self) -> str | None:
        if self._port is None:
            return None
        host = self._settings.api_host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{self._port}"

    @property
    def port(self) -> int | None:
        return self._port

    def app(self) -> web.Application:
        middlewares: list[Any] = [error_middleware]
        if self._auth is not None:
            middlewares.append(self._auth.middleware)
        app = web.Application(middlewares=middlewares)
        app.router.add_routes(
            [
                web.get("/metrics", self._metrics_route),
                web.get("/healthz", self._health),
                web.get("/api/v1/workflows", self._list),
                web.get("/api/v1/workflows/{namespace}/{name}/state", self._state),
                web.post("/api/v1/workflows/{namespace}/{name}/refresh", self._refresh),
                web.post(ANSWER_ROUTE, answer_handler(self._led_runtime)),
            ]
        )
        return app

    async def start(self) -> None:
        if self._settings.api_port is None:
            return
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._settings.api_host, self._settings.api_port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or ()
        self._port = int(sockets[0].getsockname()[1]) if sockets else self._settings.api_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- routes ----------------------------------------------------------------------------

    async def _metrics_route(self, request: web.Request) -> web.StreamResponse:
        body, content_type = self._metrics.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _health(self, request: web.Request) -> web.StreamResponse:
        # NB: an open path (the readiness probe sends no token), reachable from any Pod that
        # reaches the port: it says ok or not, never how many Workflows there are (#37).
        if self._supervisor.healthy():
            return _json({"status": "ok"})
        return _json({"status": "not ok"}, status=503)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        rows = []
        caller = request.get("lorenz_caller")
        visible: dict[str, bool] = {}
        for (namespace, name), watched in sorted(self._supervisor.workflows.items()):
            if self._auth is not None and caller is not None:
                if namespace not in visible:
                    visible[namespace] = await self._auth.may_list_workflows(caller, namespace)
                if not visible[namespace]:
                    continue
            record = watched.observed
            rows.append(
                {
                    "namespace": namespace,
                    "name": name,
                    "leading": watched.leading,
                    "leader": record.holder if record is not None and record.holder else None,
                    "leader_endpoint": record.endpoint if record is not None else None,
                }
            )
        return _json({"identity": self._settings.identity, "workflows": rows})

    def _led_runtime(self, request: web.Request) -> LorenzRuntime:
        """The runtime of the Workflow the request names, if this replica leads it."""
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        watched = self._supervisor.workflows.get((namespace, name))
        if watched is None:
            raise ApiError(
                f"this operator does not watch a Workflow {namespace}/{name}; "
                "GET /api/v1/workflows lists the ones it does",
                code=WORKFLOW_NOT_FOUND,
                status=404,
            )
        runtime = watched.runtime
        if runtime is None:
            record = watched.observed
            leader = record.holder if record is not None and record.holder else "nobody"
            where = record.endpoint if record is not None and record.endpoint else "unknown"
            raise ApiError(
                f"Workflow {namespace}/{name} is run by {leader} (endpoint {where}), not by "
                "this replica; ask that replica",
                code=WORKFLOW_NOT_LED_HERE,
                status=409,
            )
        return runtime

    async def _state(self, request: web.Request) -> web.StreamResponse:
        return _json(self._led_runtime(request).snapshot().to_dict())

    async def _refresh(self, request: web.Request) -> web.StreamResponse:
        return _json(self._led_runtime(request).request_refresh().to_dict(), status=202)


def _json(document: Any, *, status: int = 200) -> web.Response:
    return web.json_response(
        document, status=status, dumps=lambda value: json.dumps(value, default=str)
    )
