"""The operator's own access to the Kubernetes API: a small async REST layer, counted.

kopf watches Workflows and Claims with its own aiohttp client; everything the operator
*writes* (Claims, Leases, Workflow status and finalizers) and the few reads it makes (a Secret,
a Lease, a Claim after a conflict) go through :class:`KubeApi`. It is deliberately thin — plain
dicts in and out, one method per HTTP verb — on top of the official ``kubernetes`` client,
which keeps what is hard to get right: kubeconfig parsing (client certificates, tokens, exec
plugins), in-cluster ServiceAccount tokens that rotate, CA bundles. The official client is
synchronous, so each request runs on a small dedicated thread pool (never the loop's default
executor, which kopf's sync handlers share).

Why not the typed API classes: their models drop a ``MicroTime``'s fraction when the
microseconds are zero (the API server then refuses the Lease), and dicts keep every field the
server sends, including ones newer than the client. Why not kopf's client: it is internal
(underscored) API.

Every request is counted by ``(verb, resource)`` in :attr:`KubeApi.requests`, which is how the
"API requests per idle tick" figure is measured, and reported to an optional observer (the
metrics). Requests carry a timeout (client-go's leader-election client uses half the renew
deadline, so one hung request cannot cost leadership); a request that fails without a response
raises :class:`~lorenz.kube.errors.KubeApiError` with status 0.

Every answer's ``Date`` header is kept (:class:`ServerDate`): it is the API server's clock,
which decides when a pending retry is due (:mod:`lorenz.kube.claims.clock`), not ours.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import datetime
import email.utils
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.errors import KubeApiError, KubeConfigMissing

logger = logging.getLogger("lorenz.kube.api")

RequestObserver = Callable[[str, str, int, float], None]
"""``(verb, resource, status, seconds)`` after every request."""

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

CONCURRENT_REQUESTS = 8
"""Requests one :class:`KubeApi` has in flight at most (threads of its pool, connections).

NB: not more. Each thread decodes its answers holding the GIL, and the Lease renewer's thread
(:mod:`lorenz.kube.leaderelection.renewing`) waits behind all of them for every GIL hand-off of its
own request: with 32 threads and 1,000 Workflows starting at once on 2 loaded cores, renewals ran
past their 5 s request timeout and a replica lost all of its shards (measured). Starts wait
less for a thread by making fewer requests instead (see :mod:`lorenz.kube.controller.cleanup` and
the first status of a term)."""


@dataclasses.dataclass(slots=True)
class ServerDate:
    """The API server's clock, as the ``Date`` header of the last answer received shows it.

    NB: a ``Date`` has whole seconds, cut down (Go's ``net/http`` formats ``time.Now()``), and
    is stamped before the answer leaves the server: the server's clock is *at least* that
    ``Date`` plus the time since the answer arrived (our monotonic clock, never our wall clock).
    """

    date: datetime.datetime | None = None
    """The last ``Date`` received (``None`` before any answer, or when it had none)."""
    received: float = 0.0
    """When it arrived (``time.monotonic()``)."""

    def note(self, header: str | None, *, received: float) -> None:
        """Keep ``header`` (an HTTP date) if it arrived after the one kept."""
        if not header or received < self.received:
            return
        try:
            date = email.utils.parsedate_to_datetime(header)
        except (TypeError, ValueError):
            return
        if date.tzinfo is None:
            return  # NB: an HTTP date is always GMT; one without a zone is not a server's
        self.date, self.received = date.astimezone(datetime.UTC), received

    def at_least(self, *, monotonic: float | None = None) -> datetime.datetime | None:
        """A time the server's clock has certainly reached by ``monotonic`` (default: now)."""
        if self.date is None:
            return None
        since = (time.monotonic() if monotonic is None else monotonic) - self.received
        return self.date + datetime.timedelta(seconds=max(0.0, since))


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def workflows_path(namespace: str, name: str | None = None, *, status: bool = False) -> str:
    base = f"/apis/{resources.API_VERSION}/namespaces/{_quote(namespace)}/workflows"
    if name is None:
        return base
    return f"{base}/{_quote(name)}" + ("/status" if status else "")


def claims_path(namespace: str, name: str | None = None, *, status: bool = False) -> str:
    base = f"/apis/{resources.API_VERSION}/namespaces/{_quote(namespace)}/claims"
    if name is None:
        return base
    return f"{base}/{_quote(name)}" + ("/status" if status else "")


def leases_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_quote(namespace)}/leases"
    return base if name is None else f"{base}/{_quote(name)}"


def secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_quote(namespace)}/secrets/{_quote(name)}"


def _resource_of(path: str) -> str:
    """``claims``, ``claims/status``, ``leases``, ... from an API path (for counting)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        index = parts.index("namespaces")
        tail = parts[index + 2 :]
    else:
        tail = parts[3:] if parts and parts[0] == "apis" else parts[2:]
    if not tail:
        return "namespaces" if "namespaces" in parts else "unknown"
    resource = tail[0]
    if len(tail) >= 3:
        resource = f"{resource}/{tail[2]}"
    return resource


def load_configuration(*, kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.Configuration`` from a kubeconfig, ``$KUBECONFIG``, ``~/.kube/config``
    or the pod's ServiceAccount, in that order."""
    import kubernetes.client
    import kubernetes.config

    configuration = kubernetes.client.Configuration()
    explicit = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path(os.path.expanduser("~/.kube/config"))
    try:
        if explicit or default.is_file():
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=explicit or str(default),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif (SERVICE_ACCOUNT_DIR / "token").is_file():
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            raise KubeConfigMissing(
                f"no KUBECONFIG, no {default}, no {SERVICE_ACCOUNT_DIR / 'token'}"
            )
    except kubernetes.config.ConfigException as exc:
        raise KubeConfigMissing(str(exc)) from exc
    return configuration


class KubeApi:
    """Async, counted REST calls to one API server (dicts in, dicts out)."""

    def __init__(
        self,
        configuration: Any,
        *,
        request_timeout_s: float = 10.0,
        max_workers: int = CONCURRENT_REQUESTS,
        observer: RequestObserver | None = None,
    ) -> None:
        import kubernetes.client

        # NB: urllib3 keeps at most this many connections per host (the client's default is 5
        # per core); a thread beyond it opens a new TLS connection for every request and
        # discards it.
        configuration.connection_pool_maxsize = max(
            int(configuration.connection_pool_maxsize or 0), max_workers
        )
        self._client = kubernetes.client.ApiClient(configuration)
        self._client.user_agent = "lorenz-operator"
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="lorenz-kube"
        )
        self._timeout = request_timeout_s
        self._observer = observer
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        """Requests made so far, by ``(verb, resource)``."""
        self.seconds: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(
            float
        )
        """Seconds spent on them by ``(verb, resource)``, from the call until the answer (the
        wait for a free thread of the pool included)."""
        self.queued_seconds: collections.defaultdict[tuple[str, str], float] = (
            collections.defaultdict(float)
        )
        """Of those, the seconds spent waiting for a free thread of the pool."""
        self.server_date = ServerDate()
        """The API server's clock, from its answers' ``Date`` headers."""

    @classmethod
    def from_kubeconfig(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        request_timeout_s: float = 10.0,
        observer: RequestObserver | None = None,
    ) -> KubeApi:
        """Connect with :func:`load_configuration`'s credentials."""
        configuration = load_configuration(kubeconfig=kubeconfig, context=context)
        return cls(configuration, request_timeout_s=request_timeout_s, observer=observer)

    def dedicated(self, *, max_workers: int = 4, request_timeout_s: float | None = None) -> KubeApi:
        """Another client to the same server with the same credentials and request counter, but
        its own connections and threads: requests that must never wait behind the others (Lease
        renewals) go through it."""
        sibling = KubeApi(
            self._client.configuration,
            request_timeout_s=request_timeout_s if request_timeout_s is not None else self._timeout,
            max_workers=max_workers,
            observer=self._observer,
        )
        sibling.requests = self.requests
        sibling.seconds = self.seconds
        sibling.queued_seconds = self.queued_seconds
        sibling.server_date = self.server_date
        return sibling

    @property
    def configuration(self) -> Any:
        """The ``kubernetes.client.Configuration`` (credentials) of this client."""
        return self._client.configuration

    @property
    def server(self) -> str:
        return str(self._client.configuration.host)

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.get_running_loop().run_in_executor(None, self._client.close)

    # -- verbs -------------------------------------------------------------------------------

    async def get(self, path: str, *, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        return await self.request("GET", path, query=query)

    async def list_items(
        self, path: str, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a collection (follows ``continue`` tokens)."""
        items: list[dict[str, Any]] = []
        query: dict[str, str] = {"limit": "500"}
        if label_selector:
            query["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", path, query=query, verb="list")
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = token

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body, verb="create")

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT: the body's ``metadata.resourceVersion`` makes it a compare-and-swap."""
        return await self.request("PUT", path, body=body, verb="update")

    async def merge_patch(
        self, path: str, patch: Mapping[str, Any], *, field_manager: str | None = None
    ) -> dict[str, Any]:
        """A JSON merge patch; with ``metadata.resourceVersion`` in it, a compare-and-swap.

        ``field_manager``: whose write the server records in ``metadata.managedFields``
        (default: the user agent's, ``lorenz-operator``)."""
        query = {"fieldManager": field_manager} if field_manager else None
        return await self.request(
            "PATCH", path, query=query, body=patch, content_type=MERGE_PATCH
        )

    async def json_patch(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch (RFC 6902); a failed ``test`` op is a 422 reported as a conflict."""
        try:
            return await self.request("PATCH", path, body=ops, content_type=JSON_PATCH)
        except KubeApiError as exc:
            if exc.status == 422 and "test" in exc.detail.lower():
                raise KubeApiError(
                    method=exc.method,
                    path=exc.path,
                    status=409,
                    reason="Conflict",
                    detail=exc.detail,
                    body=exc.body,
                ) from exc
            raise

    async def delete(
        self,
        path: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_s: int | None = None,
    ) -> dict[str, Any]:
        """DELETE, with preconditions so that a successor of the same name survives;
        ``grace_period_s`` overrides the object's (0: a Pod's containers are killed now)."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        preconditions = {}
        if uid is not None:
            preconditions["uid"] = uid
        if resource_version is not None:
            preconditions["resourceVersion"] = resource_version
        if preconditions:
            body["preconditions"] = preconditions
        return await self.request("DELETE", path, body=body, verb="delete")

    # -- transport ---------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        verb: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One HTTP request; raises :class:`KubeApiError` for anything but a 2xx answer."""
        resource = _resource_of(path)
        verb = verb or {"GET": "get", "PATCH": "patch"}.get(method, method.lower())
        self.requests[(verb, resource)] += 1
        if method != "GET":
            # NB: one line per write, logged before it is sent: the order of a replica's
            # writes and its leadership changes in its log is what the fencing tests read.
            logger.debug("API write verb=%s path=%s", verb, path)
        timeout = timeout_s if timeout_s is not None else self._timeout
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        status = 0
        sent_at = started
        try:
            sent_at, status, data, date = await loop.run_in_executor(
                self._executor,
                self._send,
                method,
                path,
                dict(query or {}),
                body,
                content_type,
                timeout,
            )
            self.server_date.note(date, received=time.monotonic())
        finally:
            ended = time.monotonic()
            self.seconds[(verb, resource)] += ended - started
            self.queued_seconds[(verb, resource)] += sent_at - started
            if self._observer is not None:
                try:
                    self._observer(verb, resource, status, ended - started)
                except Exception:
                    logger.exception("request observer failed")
        if 200 <= status < 300:
            return data if isinstance(data, dict) else {}
        reason = str(data.get("reason") or "") if isinstance(data, dict) else ""
        detail = str(data.get("message") or "") if isinstance(data, dict) else str(data)[:500]
        raise KubeApiError(
            method=method,
            path=path,
            status=status,
            reason=reason or _STATUS_REASONS.get(status, "Error"),
            detail=detail,
            body=data if isinstance(data, dict) else None,
        )

    def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        content_type: str,
        timeout: float,
    ) -> tuple[float, int, Any, str | None]:
        """``(when this thread took the request, status, decoded body, its Date header)``."""
        import urllib3

        sent_at = time.monotonic()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method, url, headers, _, _ = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query.items()) or None,
                header_params=headers,
                auth_settings=["BearerToken"],
            )
            payload = None if body is None else json.dumps(body)
            response = self._client.rest_client.pool_manager.request(
                method,
                url,
                body=payload,
                headers=headers,
                timeout=urllib3.Timeout(connect=min(timeout, 5.0), read=timeout),
                preload_content=True,
                # NB: connection errors only (nothing was sent); a read error is not retried,
                # the caller decides (a CAS write may have landed).
                retries=urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0),
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            unreachable = {"reason": "Unreachable", "message": f"{type(exc).__name__}: {exc}"}
            return sent_at, 0, unreachable, None
        raw = response.data
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:500].decode("utf-8", "replace")}
        return sent_at, int(response.status), data, response.headers.get("Date")


_STATUS_REASONS = {
    0: "Unreachable",
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
