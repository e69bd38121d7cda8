"""The HTTP server: the JSON API, the SSE stream, ``/metrics``, and whatever else mounts on it.

One aiohttp application per runtime (:func:`build_app`) serves what people and tools look at:
the snapshot, one issue, live updates, metrics, health, and the OpenAPI document that describes
them; the dashboard (static pages) and the daemon's control routes mount on the same app.
:class:`LorenzServer` is the attachment the single-host composition root starts and stops: it
listens on TCP (``server.host`` / ``server.port``, ``--port`` wins, ``0`` = ephemeral) and/or a
unix socket (control routes of a daemon without an HTTP port).

The API observes and nudges; correctness never depends on it. So nothing a client sends can
crash it: every failure becomes a coded JSON error (see :mod:`lorenz.server.errors`).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import importlib.util
import json
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError, RuntimeSnapshot
from lorenz.runtime import LorenzRuntime
from lorenz.server.answers import answer_routes
from lorenz.server.bodies import MAX_BODY_BYTES, read_empty_object
from lorenz.server.credentials import token_file_beside, write_token_file
from lorenz.server.errors import (
    ISSUE_NOT_FOUND,
    ORCHESTRATOR_UNAVAILABLE,
    ApiError,
    error_middleware,
)
from lorenz.server.guard import RequestGuard
from lorenz.server.issues import issue_detail
from lorenz.server.journal import IssueJournal
from lorenz.server.metrics import LorenzMetrics
from lorenz.server.openapi import openapi_document
from lorenz.server.protocol_log import ProtocolErrorLog
from lorenz.server.streaming import DEFAULT_HEARTBEAT_S, DEFAULT_MIN_INTERVAL_S, SnapshotHub
from lorenz.server.webhooks import WebhookIntake, webhook_routes
from lorenz.workflow import LoadedWorkflow
from lorenz.workspaces import WorkspaceManager

logger = logging.getLogger("lorenz.server")

DaemonInfo = Callable[[], Mapping[str, Any]]

RUNTIME_KEY = web.AppKey("lorenz_runtime", LorenzRuntime)
HUB_KEY = web.AppKey("lorenz_snapshot_hub", SnapshotHub)
JOURNAL_KEY = web.AppKey("lorenz_issue_journal", IssueJournal)
METRICS_KEY = web.AppKey("lorenz_metrics", LorenzMetrics)
GUARD_KEY = web.AppKey("lorenz_request_guard", RequestGuard)
WEBHOOKS_KEY = web.AppKey("lorenz_webhook_intake", WebhookIntake)

UNIX_PATH_MAX_BYTES = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with its NUL)."""


class ServerError(LorenzError):
    """The server could not start listening."""

    code = ErrorCode.SERVER_BIND_FAILED


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


def _json(document: Any, *, status: int = 200) -> web.Response:
    return web.json_response(document, status=status, dumps=_dumps)


class _Api:
    """The handlers, bound to one runtime and its helpers."""

    def __init__(
        self,
        *,
        runtime: LorenzRuntime,
        hub: SnapshotHub,
        journal: IssueJournal,
        metrics: LorenzMetrics,
        state_document: Callable[[RuntimeSnapshot], Mapping[str, Any]],
        openapi: dict[str, Any],
    ) -> None:
        self.runtime = runtime
        self.hub = hub
        self.journal = journal
        self.metrics = metrics
        self.state_document = state_document
        self.openapi = openapi

    async def state(self, request: web.Request) -> web.StreamResponse:
        return _json(self.state_document(self.runtime.snapshot()))

    async def issue(self, request: web.Request) -> web.StreamResponse:
        identifier = request.match_info["identifier"]
        detail = issue_detail(
            self.runtime.snapshot(),
            identifier=identifier,
            journal=self.journal,
            workspaces=WorkspaceManager(settings=self.runtime.settings),
        )
        if detail is None:
            raise ApiError(
                f"no issue {identifier!r} is running, reserved, retrying or in recent history; "
                "check the identifier (GET /api/v1/state lists what the runtime holds)",
                code=ISSUE_NOT_FOUND,
                status=404,
            )
        return _json(detail)

    async def refresh(self, request: web.Request) -> web.StreamResponse:
        await read_empty_object(request)
        if self.runtime.stopped:
            raise _stopped()
        receipt = self.runtime.request_refresh()
        if not receipt.queued:
            raise _stopped()
        return _json(receipt.to_dict(), status=202)

    async def events(self, request: web.Request) -> web.StreamResponse:
        return await self.hub.stream(request)

    async def metrics_route(self, request: web.Request) -> web.StreamResponse:
        body, content_type = self.metrics.exposition(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def health(self, request: web.Request) -> web.StreamResponse:
        if self.runtime.stopped:
            raise _stopped()
        return _json({"status": "ok", "app_status": self.runtime.snapshot().app_status.value})

    async def openapi_route(self, request: web.Request) -> web.StreamResponse:
        return _json(self.openapi)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/state", self.state),
            web.get("/api/v1/issues/{identifier:.+}", self.issue),
            web.post("/api/v1/refresh", self.refresh),
            web.get("/api/v1/events", self.events),
            web.get("/metrics", self.metrics_route),
            web.get("/healthz", self.health),
            web.get("/api/v1/openapi.json", self.openapi_route),
        ]


def _stopped() -> ApiError:
    return ApiError(
        "the runtime has stopped and takes no more requests; restart lorenz to resume",
        code=ORCHESTRATOR_UNAVAILABLE,
        status=503,
    )


def build_app(
    *,
    runtime: LorenzRuntime,
    extra_routes: Sequence[web.AbstractRouteDef] = (),
    daemon_info: DaemonInfo | None = None,
    static_routes: Sequence[web.AbstractRouteDef] = (),
    metrics: LorenzMetrics | None = None,
    metrics_workflow: str | None = None,
    extra_openapi_paths: Mapping[str, Any] | None = None,
    sse_min_interval: float = DEFAULT_MIN_INTERVAL_S,
    sse_heartbeat: float = DEFAULT_HEARTBEAT_S,
    guard: RequestGuard | None = None,
) -> web.Application:
    """The application for one runtime.

    ``extra_routes`` (the daemon's control routes) win over a built-in route with the same
    method and path. ``static_routes`` (the dashboard: ``/`` and its assets) are added last.
    ``metrics``: a shared :class:`LorenzMetrics` the caller attaches runtimes to itself (the
    operator); by default the app makes its own and attaches ``runtime`` under
    ``metrics_workflow`` (default: the workflow path) while it runs. ``extra_openapi_paths`` are
    merged into the OpenAPI document (document your extra routes there). ``guard`` checks Host,
    Origin and the bearer token (:mod:`lorenz.server.guard`); by default one with a fresh random
    token (``app[GUARD_KEY].token``) and no extra host names.
    """
    owns_metrics = metrics is None
    metrics = metrics if metrics is not None else LorenzMetrics()
    journal = IssueJournal()

    def state_document(snapshot: RuntimeSnapshot) -> Mapping[str, Any]:
        """The snapshot as JSON, plus the ``daemon`` block when a daemon runs this workflow."""
        document = snapshot.to_dict()
        if daemon_info is not None:
            document["daemon"] = dict(daemon_info())
        return document

    # The SSE stream carries the same document as GET /api/v1/state.
    hub = SnapshotHub(
        runtime=runtime,
        render=state_document,
        min_interval=sse_min_interval,
        heartbeat=sse_heartbeat,
    )
    api = _Api(
        runtime=runtime,
        hub=hub,
        journal=journal,
        metrics=metrics,
        state_document=state_document,
        openapi=openapi_document(extra_paths=extra_openapi_paths),
    )
    guard = guard if guard is not None else RequestGuard()
    # NB: error_middleware is the outer one, so the guard's refusals get the JSON envelope.
    app = web.Application(
        middlewares=[error_middleware, guard.middleware], client_max_size=MAX_BODY_BYTES
    )
    app[GUARD_KEY] = guard
    app[RUNTIME_KEY] = runtime
    app[HUB_KEY] = hub
    app[JOURNAL_KEY] = journal
    app[METRICS_KEY] = metrics
    # NB: always mounted; it answers 404 until tracker.webhook_secret is set (read per request,
    # so a reload turns it on or off).
    webhooks = WebhookIntake(
        runtime=runtime,
        metrics=metrics,
        workflow=metrics_workflow if metrics_workflow is not None else str(runtime.workflow.path),
    )
    app[WEBHOOKS_KEY] = webhooks

    overridden = {_method_and_path(route) for route in extra_routes} - {None}
    app.router.add_routes(
        [route for route in api.routes() if _method_and_path(route) not in overridden]
    )
    app.router.add_routes(list(extra_routes))
    app.router.add_routes(webhook_routes(webhooks))
    app.router.add_routes(answer_routes(runtime))
    app.router.add_routes(list(static_routes))

    detachers: list[Callable[[], None]] = []

    async def on_startup(app: web.Application) -> None:
        detachers.append(runtime.add_event_listener(journal.on_event))
        if owns_metrics:
            detachers.append(metrics.attach(runtime, workflow=metrics_workflow))

    async def on_shutdown(app: web.Application) -> None:
        hub.close()  # ends the SSE streams, so shutdown does not wait on them

    async def on_cleanup(app: web.Application) -> None:
        webhooks.close()
        while detachers:
            detachers.pop()()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def _method_and_path(route: web.AbstractRouteDef) -> tuple[str, str] | None:
    if isinstance(route, web.RouteDef):
        return route.method.upper(), route.path
    return None


def installed_dashboard_routes() -> list[web.AbstractRouteDef]:
    """The dashboard's routes when :mod:`lorenz.server.dashboard` is installed, else none."""
    name = "lorenz.server.dashboard"
    if importlib.util.find_spec(name) is None:
        return []
    module = importlib.import_module(name)
    factory = getattr(module, "dashboard_routes", None)
    return list(factory()) if callable(factory) else []


class PortOptions(Protocol):
    """What :func:`attachment_factory` reads from the host's options (``--port``)."""

    @property
    def port(self) -> int | None: ...


class LorenzServer:
    """The server attachment: serves :func:`build_app` on TCP and/or a unix socket."""

    serves = True
    """Tells the host this attachment is a server: stopped after the worker pool drained."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        unix_socket: Path | None = None,
        extra_routes: Sequence[web.AbstractRouteDef] = (),
        daemon_info: DaemonInfo | None = None,
        static_routes: Sequence[web.AbstractRouteDef] | None = None,
        metrics: LorenzMetrics | None = None,
        extra_openapi_paths: Mapping[str, Any] | None = None,
        sse_min_interval: float = DEFAULT_MIN_INTERVAL_S,
        sse_heartbeat: float = DEFAULT_HEARTBEAT_S,
        shutdown_timeout: float = 5.0,
        token_file: Path | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> None:
        """``static_routes=None`` mounts the dashboard if it is installed; ``()`` mounts none.

        ``token_file``: where :meth:`start` writes this server's fresh bearer token (``0600``);
        ``allowed_hosts``: Host names accepted beside loopback and the bound address (default:
        the runtime's ``server.allowed_hosts``).
        """
        if port is None and unix_socket is None:
            raise ServerError(
                "the server has nowhere to listen; set server.port (or --port), or a unix socket",
                code=ErrorCode.SERVER_LISTENER_MISSING,
            )
        self._host = host
        self._requested_port = port
        self._unix_socket = Path(unix_socket) if unix_socket is not None else None
        self._extra_routes = tuple(extra_routes)
        self._daemon_info = daemon_info
        self._static_routes = None if static_routes is None else tuple(static_routes)
        self._metrics = metrics
        self._extra_openapi_paths = extra_openapi_paths
        self._sse_min_interval = sse_min_interval
        self._sse_heartbeat = sse_heartbeat
        self._shutdown_timeout = shutdown_timeout
        self._token_file = token_file
        self._allowed_hosts = None if allowed_hosts is None else tuple(allowed_hosts)
        self.guard: RequestGuard | None = None
        """The request guard of the running app (its ``token`` is what clients must send)."""
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None
        self._socket_inode: int | None = None
        self.app: web.Application | None = None

    @property
    def port(self) -> int | None:
        """The TCP port actually bound (after :meth:`start`)."""
        return self._bound_port

    @property
    def url(self) -> str | None:
        """``http://host:port`` of the TCP listener (after :meth:`start`)."""
        if self._bound_port is None:
            return None
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._bound_port}"

    @property
    def unix_socket(self) -> Path | None:
        return self._unix_socket

    @property
    def endpoint(self) -> str | None:
        """Where a client reaches the control routes: the URL, else ``unix:///path``."""
        if self.url is not None:
            return self.url
        if self._unix_socket is not None and self._runner is not None:
            return f"unix://{self._unix_socket}"
        return None

    async def start(self, runtime: LorenzRuntime) -> None:
        static = (
            installed_dashboard_routes() if self._static_routes is None else self._static_routes
        )
        app = build_app(
            runtime=runtime,
            extra_routes=self._extra_routes,
            daemon_info=self._daemon_info,
            static_routes=static,
            metrics=self._metrics,
            extra_openapi_paths=self._extra_openapi_paths,
            sse_min_interval=self._sse_min_interval,
            sse_heartbeat=self._sse_heartbeat,
            guard=RequestGuard(
                token_file=self._token_file,
                allowed_hosts=(
                    runtime.settings.server.allowed_hosts
                    if self._allowed_hosts is None
                    else self._allowed_hosts
                ),
                bind_host=self._host,
            ),
        )
        guard = app[GUARD_KEY]
        if self._token_file is not None and self._requested_port is not None:
            # NB: before the listener opens: the first client already finds this start's token.
            self._publish_token(self._token_file, guard.token)
        # NB: handler_cancellation ends an SSE handler as soon as its client disconnects;
        # otherwise it would only notice at its next write (up to a heartbeat later).
        # ``logger``: requests the HTTP parser refuses become rate-limited warnings, not
        # tracebacks (lorenz.server.protocol_log).
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout,
            logger=ProtocolErrorLog(),
        )
        await runner.setup()
        try:
            if self._requested_port is not None:
                await self._start_tcp(runner)
            if self._unix_socket is not None:
                await self._start_unix(runner, self._unix_socket)
        except BaseException:
            await runner.cleanup()
            self._bound_port = None
            raise
        self._runner = runner
        self.app = app
        self.guard = guard
        logger.info("server listening endpoint=%s", self.endpoint)

    @staticmethod
    def _publish_token(path: Path, token: str) -> None:
        """Write the token file; if that fails, serve anyway (reads need no token) and say so."""
        try:
            write_token_file(path, token)
        except OSError as exc:
            # NB: a read-only checkout must not stop the dashboard; only state-changing
            # requests from the lorenz commands are lost (SIGTERM still stops a daemon).
            logger.warning(
                "token file not written code=server_token_file_unwritable path=%s error=%s; "
                "lorenz refresh/stop over TCP will be refused until the directory is writable",
                path,
                exc.strerror or exc,
            )

    async def _start_tcp(self, runner: web.AppRunner) -> None:
        assert self._requested_port is not None
        site = web.TCPSite(runner, self._host, self._requested_port)
        try:
            await site.start()
        except OSError as exc:
            raise _bind_error(exc, host=self._host, port=self._requested_port) from exc
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self._bound_port = int(address[1])
                break

    async def _start_unix(self, runner: web.AppRunner, path: Path) -> None:
        if len(os.fsencode(path)) > UNIX_PATH_MAX_BYTES:
            raise ServerError(
                f"unix socket path {path} is longer than {UNIX_PATH_MAX_BYTES} bytes; use a "
                "shorter runtime directory",
                code=ErrorCode.SERVER_SOCKET_PATH_TOO_LONG,
            )
        _prepare_socket_directory(path)
        site = web.UnixSite(runner, str(path))
        try:
            await site.start()
        except OSError as exc:
            raise ServerError(
                f"cannot listen on unix socket {path}: {exc.strerror or exc}; check the "
                "directory exists and is writable",
                code=ErrorCode.SERVER_BIND_FAILED,
            ) from exc
        self._socket_inode = _secure_socket(path)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            await runner.cleanup()
        finally:
            self._remove_own_socket()
            self._bound_port = None
            self.app = None
            self.guard = None

    def _remove_own_socket(self) -> None:
        path = self._unix_socket
        if path is None or self._socket_inode is None:
            return
        with contextlib.suppress(OSError):
            # NB: only our own socket: another process may have replaced the file since.
            if path.stat().st_ino == self._socket_inode:
                path.unlink()
        self._socket_inode = None


def _bind_error(exc: OSError, *, host: str, port: int) -> ServerError:
    if exc.errno == errno.EADDRINUSE:
        return ServerError(
            f"port {port} on {host} is already in use; choose another server.port or --port "
            "(0 picks a free one)",
            code=ErrorCode.SERVER_PORT_IN_USE,
        )
    return ServerError(
        f"cannot listen on {host}:{port}: {exc.strerror or exc}; check server.host is an "
        "address of this machine and the port is allowed",
        code=ErrorCode.SERVER_BIND_FAILED,
    )


def _prepare_socket_directory(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _clear_stale_socket(path)


def _secure_socket(path: Path) -> int:
    """Owner-only access (control routes live here); returns the inode to recognise it by."""
    os.chmod(path, 0o600)
    return path.stat().st_ino


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse a live one or a file that is no socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ServerError(
            f"{path} exists and is not a socket; remove it or choose another socket path",
            code=ErrorCode.SERVER_SOCKET_PATH_TAKEN,
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    except OSError as exc:
        raise ServerError(
            f"cannot check unix socket {path}: {exc.strerror or exc}; remove it or choose "
            "another socket path",
            code=ErrorCode.SERVER_BIND_FAILED,
        ) from exc
    finally:
        probe.close()
    raise ServerError(
        f"another process is listening on {path}; stop it first or choose another socket path",
        code=ErrorCode.SERVER_SOCKET_IN_USE,
    )


def attachment_factory(loaded: LoadedWorkflow, options: PortOptions) -> LorenzServer | None:
    """For ``lorenz.daemon.host.ATTACHMENTS``: a server when a port is configured, else none."""
    settings = loaded.settings.server
    port = options.port if options.port is not None else settings.port
    if port is None:
        return None
    from lorenz.leadership import lease_path

    return LorenzServer(
        host=settings.host,
        port=port,
        token_file=token_file_beside(lease_path(loaded.canonical_path)),
    )

