"""The daemon's control routes, and the transport that serves them when no HTTP server runs.

Three routes make a daemon controllable from the command line (``lorenz status|refresh|stop``):

* ``GET /api/v1/daemon`` — who leads (pid, process start, host), the endpoint, the heartbeat,
  the workflow, the leadership store kind, and lane counts;
* ``POST /api/v1/refresh`` — queue an immediate poll and reconcile pass (``202``);
* ``POST /api/v1/stop`` — graceful shutdown: ``202`` first, then the host's shutdown begins.

They mount on whichever transport is active (:class:`DaemonControl`): the HTTP server
(:mod:`lorenz.server`) when a port is configured, else the same application on a private unix
socket (see :mod:`lorenz.daemon.sockets`). NB: the server owns ``POST /api/v1/refresh``
already, so the routes mounted on it are built with ``include_refresh=False`` and the server's
own handler answers — one implementation, whatever the transport.

Errors use the server's envelope, ``{"error": {"code": ..., "message": ...}}``. A body other
than empty or ``{}`` is refused on both POST routes (400 ``invalid_request_body``).

Over TCP the server's request guard (:mod:`lorenz.server.guard`) also asks the POST routes for
the daemon's bearer token — fresh at every start, in the ``0600`` file
:func:`~lorenz.daemon.discovery.token_file_for` names beside the lease — and refuses foreign
Host headers and cross-origin senders. The unix socket asks for no token: only this user can
open it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.daemon.discovery import token_file_for
from lorenz.daemon.errors import ControlSocketPathTooLong
from lorenz.daemon.sockets import SUN_PATH_MAX, ensure_private_dir, unix_endpoint
from lorenz.server.bodies import parse_json_body, read_empty_object
from lorenz.server.errors import INVALID_REQUEST_BODY, ApiError

if TYPE_CHECKING:
    from lorenz.daemon.daemons import Daemon
    from lorenz.runtime import LorenzRuntime
    from lorenz.server import LorenzServer

logger = logging.getLogger("lorenz.daemon")

DAEMON_PATH = "/api/v1/daemon"
REFRESH_PATH = "/api/v1/refresh"
STOP_PATH = "/api/v1/stop"


def error_response(status: int, *, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers or None
    )


async def read_stop_body(request: web.Request) -> bool:
    """``POST /api/v1/stop`` takes nothing, ``{}`` or ``{"now": true|false}``; returns ``now``."""
    route = f"{request.method} {request.path}"
    raw = await request.read()
    if not raw.strip():
        return False
    body = parse_json_body(raw, route=route)
    if not isinstance(body, dict) or set(body) - {"now"} or not isinstance(
        body.get("now", False), bool
    ):
        raise ApiError(
            f"{route} refused its body: it takes nothing, {{}} or {{\"now\": true}}",
            code=INVALID_REQUEST_BODY,
            status=400,
        )
    return bool(body.get("now", False))


def control_routes(*, daemon: Daemon, include_refresh: bool = True) -> list[web.RouteDef]:
    """The daemon's routes, as ``extra_routes`` of the HTTP server (or any aiohttp app)."""

    async def get_daemon(request: web.Request) -> web.Response:
        return web.json_response(daemon.info())

    async def post_refresh(request: web.Request) -> web.Response:
        await read_empty_object(request)
        runtime = daemon.runtime
        if runtime is None:
            return error_response(
                503, code=ErrorCode.DAEMON_STARTING, message="the runtime is not up yet; retry"
            )
        return web.json_response(runtime.request_refresh().to_dict(), status=202)

    async def post_stop(request: web.Request) -> web.Response:
        now = await read_stop_body(request)
        record = daemon.record
        body = {
            "stopping": True,
            "pid": record.pid if record is not None else os.getpid(),
            "requested_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "now": now,
        }
        # NB: the shutdown starts on a later loop iteration, after this response is written;
        # the server is stopped only after the runtime, so the reply always gets out.
        asyncio.get_running_loop().call_soon(
            lambda: daemon.request_stop(reason="api_now" if now else "api", now=now)
        )
        return web.json_response(body, status=202)

    routes = [web.get(DAEMON_PATH, get_daemon), web.post(STOP_PATH, post_stop)]
    if include_refresh:
        routes.append(web.post(REFRESH_PATH, post_refresh))
    return routes


def control_openapi_paths() -> dict[str, Any]:
    """OpenAPI path items for the routes :func:`control_routes` adds (merged into the server's)."""
    error = {"$ref": "#/components/schemas/Error"}
    return {
        DAEMON_PATH: {
            "get": {
                "operationId": "getDaemon",
                "summary": "The daemon: owner, endpoint, heartbeat, workflow, leadership store",
                "responses": {
                    "200": {
                        "description": "The daemon block (also under `daemon` in the state).",
                        "content": {"application/json": {"schema": DAEMON_SCHEMA}},
                    }
                },
            }
        },
        STOP_PATH: {
            "post": {
                "operationId": "stopDaemon",
                "summary": "Graceful shutdown: answered first, then the drain and the shutdown "
                "order run (`{\"now\": true}`: no drain, every run cancelled)",
                "security": [{"bearerToken": []}, {}],
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": STOP_REQUEST_SCHEMA}},
                },
                "responses": {
                    "202": {
                        "description": "Shutdown begins.",
                        "content": {"application/json": {"schema": STOP_SCHEMA}},
                    },
                    "400": {
                        "description": "A body other than empty, `{}` or `{\"now\": bool}`.",
                        "content": {"application/json": {"schema": error}},
                    },
                    "401": {
                        "description": "Over TCP: no bearer token, or not this daemon's.",
                        "content": {"application/json": {"schema": error}},
                    },
                    "403": {
                        "description": "A foreign Host header or a cross-origin sender.",
                        "content": {"application/json": {"schema": error}},
                    },
                    "405": {
                        "description": "Wrong method.",
                        "content": {"application/json": {"schema": error}},
                    },
                    "415": {
                        "description": "A body declared as anything but application/json.",
                        "content": {"application/json": {"schema": error}},
                    },
                },
            }
        },
    }


_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_NUM = {"type": ["number", "null"]}
DAEMON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "holder",
        "pid",
        "process_started_at",
        "host",
        "claim_owner",
        "endpoint",
        "heartbeat_at",
        "heartbeat_age_ms",
        "heartbeat_ms",
        "stale_ms",
        "acquired_at",
        "transitions",
        "workflow_path",
        "lease_path",
        "leadership_store",
    ],
    "properties": {
        "holder": _NULLABLE_STR,
        "pid": _NULLABLE_INT,
        "process_started_at": _NULLABLE_STR,
        "host": _NULLABLE_STR,
        "claim_owner": {"type": "string"},
        "endpoint": _NULLABLE_STR,
        "heartbeat_at": _NULLABLE_STR,
        "heartbeat_age_ms": _NULLABLE_NUM,
        "heartbeat_ms": {"type": "integer"},
        "stale_ms": {"type": "integer"},
        "acquired_at": _NULLABLE_STR,
        "transitions": _NULLABLE_INT,
        "workflow_path": {"type": "string"},
        "lease_path": _NULLABLE_STR,
        "leadership_store": {"type": "string", "enum": ["file", "kubernetes"]},
        "last_heartbeat_error": _NULLABLE_STR,
        "stop_requested": _NULLABLE_STR,
        "app_status": _NULLABLE_STR,
        "lanes": {
            "type": "object",
            "required": ["running", "reserving", "retrying", "blocked"],
            "properties": {
                lane: {"type": "integer", "minimum": 0}
                for lane in ("running", "reserving", "retrying", "blocked")
            },
        },
        "poll": {"type": ["object", "null"]},
        "config_error": {"type": ["object", "null"]},
        "waiting": {
            "type": "array",
            "description": "Issues waiting for an answer to their agent's question.",
            "items": {
                "type": "object",
                "properties": {
                    "identifier": {"type": "string"},
                    "question": {"type": "string"},
                    "asked_at": {"type": "string"},
                },
            },
        },
        "budget": {"type": "object"},
    },
}
STOP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["stopping", "pid", "requested_at"],
    "properties": {
        "stopping": {"type": "boolean"},
        "pid": {"type": "integer"},
        "requested_at": {"type": "string"},
        "now": {"type": "boolean"},
    },
}
STOP_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"now": {"type": "boolean"}},
}


class DaemonControl:
    """The host attachment that serves the control routes and publishes where.

    With a port (``--port`` / ``server.port``) it is *the* HTTP server: the whole API and the
    dashboard, with the control routes and the ``daemon`` state block added. Without one it
    serves the same application on the private unix socket (no dashboard assets). Either way
    the endpoint goes into the lease once the listener is up.

    ``serves = True`` puts it in the *server* step of the shutdown order (after the worker pool
    drained), not in the terminal-view step.
    """

    serves = True

    def __init__(
        self,
        *,
        daemon: Daemon,
        socket_path: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        if (socket_path is None) == (port is None):
            raise ValueError("serve either a unix socket or a TCP port")
        from lorenz.server import LorenzServer

        self._daemon = daemon
        self._socket_path = socket_path
        self._host = host
        self._server = LorenzServer(
            host=host,
            port=port,
            unix_socket=socket_path,
            extra_routes=control_routes(daemon=daemon, include_refresh=False),
            daemon_info=daemon.info,
            static_routes=() if socket_path is not None else None,
            extra_openapi_paths=control_openapi_paths(),
            # NB: over TCP the state-changing routes need this daemon's token, rotated at each
            # start; the unix socket needs none (its 0600 mode admits only this user).
            token_file=token_file_for(daemon.workflow_path) if port is not None else None,
        )
        self.endpoint: str | None = None

    @property
    def server(self) -> LorenzServer:
        """The :class:`lorenz.server.LorenzServer` underneath."""
        return self._server

    async def start(self, runtime: LorenzRuntime) -> None:
        if self._socket_path is not None:
            if len(os.fsencode(self._socket_path)) > SUN_PATH_MAX:
                raise ControlSocketPathTooLong(path=self._socket_path, limit=SUN_PATH_MAX)
            ensure_private_dir(self._socket_path.parent)
        await self._server.start(runtime)
        if self._socket_path is not None:
            self.endpoint = unix_endpoint(self._socket_path)
        else:
            self.endpoint = f"http://{_dial_host(self._host)}:{self._server.port}"
        await self._daemon.set_endpoint(self.endpoint)

    async def stop(self) -> None:
        await self._server.stop()


def _dial_host(host: str) -> str:
    """The address a local client should dial for a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
