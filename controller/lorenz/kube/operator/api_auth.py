"""Who may read the operator's HTTP API: the caller's Kubernetes token, checked by Kubernetes.

The snapshot API shows issue titles, workspace paths and process ids of every Workflow a
replica leads, across namespaces, and ``POST …/refresh`` changes what it does; so, as
kube-rbac-proxy does, every request carries a bearer token that the API server authenticates
(``TokenReview``) and whose user the API server authorizes (``SubjectAccessReview``) for what
the route touches:

* ``GET /api/v1/workflows/{ns}/{name}/state``: ``get`` on that Workflow in ``{ns}``;
* ``POST /api/v1/workflows/{ns}/{name}/refresh``: ``patch`` on it (what the annotation needs);
* ``POST /api/v1/workflows/{ns}/{name}/issues/{identifier}/answer``: ``patch`` on Claims in
  ``{ns}`` (what the ``lorenz.dev/answer`` annotation needs);
* ``GET /api/v1/workflows``: lists only namespaces where the caller may ``list`` Workflows;
* ``GET /metrics``, ``GET /healthz``: ``get`` on the non-resource URL.

Paths in ``api_open_paths`` (say ``/metrics,/healthz`` for a Prometheus without a token) skip
the check. Answers are cached briefly (token digests, never tokens) so a dashboard polling every
second costs the API server two reviews per cache period, not per request.

NB: bearer tokens are not sent by browsers on their own, so there is no cross-site request
forgery to fear; a ``POST`` with a foreign ``Origin`` is refused anyway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.server import ApiError

logger = logging.getLogger("lorenz.kube.api_auth")

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_SECONDS = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated user, as the TokenReview named it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def review_spec(self) -> dict[str, Any]:
        return {
            "user": self.username,
            "uid": self.uid,
            "groups": list(self.groups),
            "extra": {key: list(values) for key, values in self.extra},
        }


def workflow_attributes(*, namespace: str, name: str | None, verb: str) -> dict[str, Any]:
    """The ``resourceAttributes`` of a SubjectAccessReview about Workflows."""
    attributes = {
        "namespace": namespace,
        "verb": verb,
        "group": "lorenz.dev",
        "resource": "workflows",
    }
    if name is not None:
        attributes["name"] = name
    return attributes


class KubernetesAuth:
    """TokenReview + SubjectAccessReview for every request outside the open paths."""

    def __init__(
        self,
        *,
        api: KubeApi,
        open_paths: tuple[str, ...] = (),
        cache_seconds: float = CACHE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._open = frozenset(open_paths)
        self._cache_seconds = cache_seconds
        self._monotonic = monotonic
        self._users: dict[str, tuple[float, Caller | None]] = {}
        self._decisions: dict[tuple[Caller, str], tuple[float, bool]] = {}

    # -- the aiohttp side ------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "POST":
            _refuse_cross_origin(request)
        if request.path in self._open:
            return await handler(request)
        caller = await self.caller_of(request)
        request["lorenz_caller"] = caller
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        info = request.match_info
        if route.endswith("/answer"):
            attributes = {"resourceAttributes": {
                "namespace": info["namespace"], "verb": "patch", "group": "lorenz.dev",
                "resource": "claims",
            }}
            what = f"patch claims.lorenz.dev in namespace {info['namespace']}"
        elif route.endswith("/state") or route.endswith("/refresh"):
            verb = "get" if request.method == "GET" else "patch"
            attributes = {"resourceAttributes": workflow_attributes(
                namespace=info["namespace"], name=info["name"], verb=verb
            )}
            what = f"{verb} workflows.lorenz.dev {info['name']} in namespace {info['namespace']}"
        elif route == "/api/v1/workflows":
            return await handler(request)  # NB: filtered per namespace by the route itself
        else:
            attributes = {"nonResourceAttributes": {"path": request.path, "verb": "get"}}
            what = f"get {request.path}"
        if not await self.allowed(caller, attributes):
            raise ApiError(
                f"{caller.username} may not {what}; grant it with a Role (or ClusterRole for a "
                "non-resource URL)",
                code=ErrorCode.FORBIDDEN,
                status=403,
            )
        return await handler(request)

    async def caller_of(self, request: web.Request) -> Caller:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthenticated("send a Kubernetes token: Authorization: Bearer <token>")
        caller = await self.authenticate(token)
        if caller is None:
            raise _unauthenticated("the token was not accepted by the Kubernetes API server")
        return caller

    # -- the Kubernetes side ---------------------------------------------------------------

    async def authenticate(self, token: str) -> Caller | None:
        """The user of ``token`` (``None``: not authenticated)."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._monotonic()
        cached = self._users.get(digest)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        review = await self._review(
            TOKEN_REVIEWS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
             "spec": {"token": token}},
        )
        status = review.get("status") or {}
        caller: Caller | None = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            extra = user.get("extra") or {}
            caller = Caller(
                username=str(user.get("username") or ""),
                uid=str(user.get("uid") or ""),
                groups=tuple(str(g) for g in user.get("groups") or ()),
                extra=tuple(sorted((str(k), tuple(map(str, v))) for k, v in extra.items())),
            )
        self._remember(self._users, digest, (now, caller))
        return caller

    async def allowed(self, caller: Caller, attributes: Mapping[str, Any]) -> bool:
        """Whether ``caller`` may do what ``attributes`` describe (a SubjectAccessReview)."""
        key = (caller, repr(sorted((k, sorted(v.items())) for k, v in attributes.items())))
        now = self._monotonic()
        cached = self._decisions.get(key)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        review = await self._review(
            ACCESS_REVIEWS,
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
             "spec": {**caller.review_spec(), **attributes}},
        )
        allowed = bool((review.get("status") or {}).get("allowed"))
        self._remember(self._decisions, key, (now, allowed))
        return allowed

    async def may_list_workflows(self, caller: Caller, namespace: str) -> bool:
        return await self.allowed(
            caller,
            {"resourceAttributes": workflow_attributes(
                namespace=namespace, name=None, verb="list"
            )},
        )

    async def _review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._api.create(path, body)
        except KubeApiError as exc:
            logger.warning("Access review failed path=%s error=%s", path, exc)
            raise ApiError(
                "the operator could not ask the Kubernetes API server to check this request "
                f"({exc.status} {exc.reason}); grant its ServiceAccount create on tokenreviews "
                "and subjectaccessreviews (the chart does)",
                code=ErrorCode.AUTH_UNAVAILABLE,
                status=503,
            ) from exc

    def _remember(self, cache: dict[Any, Any], key: Any, value: Any) -> None:
        # NB: bounded: a flood of random tokens must not grow the process without limit.
        if len(cache) >= 4096:
            cache.clear()
        cache[key] = value


def _unauthenticated(message: str) -> ApiError:
    return ApiError(message, code=ErrorCode.UNAUTHENTICATED, status=401)


def _refuse_cross_origin(request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is None:
        return
    host = origin.split("://", 1)[-1].rstrip("/")
    if host != request.host:
        raise ApiError(
            f"cross-origin POST from {origin} refused; call the API from a client, not a page",
            code=ErrorCode.CROSS_ORIGIN_REFUSED,
            status=403,
        )
