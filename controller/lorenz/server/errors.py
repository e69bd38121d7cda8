"""Coded API errors and the one JSON envelope every failure answers with.

Clients (the dashboard, the CLI, scripts, the daemon's control client) branch on ``code``, never
on a message or on aiohttp's default plain-text error pages. So every failure that leaves the
server — a route that does not exist, a wrong method, a malformed body, an issue nobody knows,
even a bug in a handler — is turned into ``{"error": {"code": ..., "message": ...}}`` here, with
a status that matches it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError

logger = logging.getLogger("lorenz.server")

JSON_CONTENT_TYPE = "application/json"

ROUTE_NOT_FOUND = ErrorCode.ROUTE_NOT_FOUND
METHOD_NOT_ALLOWED = ErrorCode.METHOD_NOT_ALLOWED
ISSUE_NOT_FOUND = ErrorCode.ISSUE_NOT_FOUND
INVALID_REQUEST_BODY = ErrorCode.INVALID_REQUEST_BODY
REQUEST_BODY_TOO_DEEP = ErrorCode.REQUEST_BODY_TOO_DEEP
UNSUPPORTED_MEDIA_TYPE = ErrorCode.UNSUPPORTED_MEDIA_TYPE
HOST_NOT_ALLOWED = ErrorCode.HOST_NOT_ALLOWED
PEER_UID_REFUSED = ErrorCode.PEER_UID_REFUSED
CROSS_ORIGIN_REFUSED = ErrorCode.CROSS_ORIGIN_REFUSED
AUTH_TOKEN_MISSING = ErrorCode.AUTH_TOKEN_MISSING
AUTH_TOKEN_INVALID = ErrorCode.AUTH_TOKEN_INVALID
ORCHESTRATOR_UNAVAILABLE = ErrorCode.ORCHESTRATOR_UNAVAILABLE
REQUEST_REJECTED = ErrorCode.REQUEST_REJECTED
INTERNAL_ERROR = ErrorCode.INTERNAL_ERROR

ERROR_CODES: tuple[str, ...] = (
    ROUTE_NOT_FOUND,
    METHOD_NOT_ALLOWED,
    ISSUE_NOT_FOUND,
    INVALID_REQUEST_BODY,
    REQUEST_BODY_TOO_DEEP,
    UNSUPPORTED_MEDIA_TYPE,
    HOST_NOT_ALLOWED,
    PEER_UID_REFUSED,
    CROSS_ORIGIN_REFUSED,
    AUTH_TOKEN_MISSING,
    AUTH_TOKEN_INVALID,
    ORCHESTRATOR_UNAVAILABLE,
    REQUEST_REJECTED,
    INTERNAL_ERROR,
    ErrorCode.ISSUE_NOT_WAITING,
    ErrorCode.ANSWER_INVALID,
    ErrorCode.TEMPLATE_RENDER_ERROR,
)
"""Every code an API response can carry (docs/api.md lists them with their statuses)."""


class ApiError(LorenzError):
    """An error a client caused (or must be told about), with the HTTP status to answer."""

    code = REQUEST_REJECTED

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int = 400,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.headers = dict(headers or {})


def error_body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def error_response(
    code: str, message: str, *, status: int, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(error_body(code, message)),
        content_type=JSON_CONTENT_TYPE,
        headers=headers,
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every failure with the JSON envelope; never let an exception escape as a 500 page."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.code, exc.message, status=exc.status, headers=exc.headers)
    except web.RequestPayloadError:
        # NB: the client's fault, not ours: a body that breaks its own framing or
        # Content-Encoding (bad gzip) fails in request.read(). No traceback for it.
        return error_response(
            INVALID_REQUEST_BODY,
            f"the body of {request.method} {request.path} could not be read (broken chunking or "
            "Content-Encoding); send it plain, with a correct Content-Length",
            status=400,
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like pass through untouched
        return _from_http_exception(request, exc)
    except Exception:
        logger.exception("request failed method=%s path=%s", request.method, request.path)
        return error_response(
            INTERNAL_ERROR,
            "the server failed to answer this request; see the server log for the cause",
            status=500,
        )


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(exc.allowed_methods)
        return error_response(
            METHOD_NOT_ALLOWED,
            f"{request.method} is not allowed on {request.path}; use {', '.join(allowed)}",
            status=405,
            headers={"Allow": ", ".join(allowed)},
        )
    if isinstance(exc, web.HTTPNotFound):
        return error_response(
            ROUTE_NOT_FOUND,
            f"no route {request.path}; see /api/v1/openapi.json for the routes this server has",
            status=404,
        )
    # NB: other statuses come from aiohttp itself (413 body too large, 400 bad framing); keep
    # their status, give them a code, and never echo the raw reason (it may quote the request).
    return error_response(
        REQUEST_REJECTED,
        f"the request was rejected ({exc.status}); check its size, framing and headers",
        status=exc.status,
    )
