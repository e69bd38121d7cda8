"""A tiny synchronous JSON client for a daemon's control routes, over TCP or a unix socket.

NB: stdlib :mod:`http.client`, not httpx: ``import httpx`` alone takes about 175 ms here (it
pulls in rich for its command line), most of the 300 ms budget of a cold ``lorenz status``.
The CLI makes one or two requests per run; a connection subclass that dials a unix socket is
all http.client lacks.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
from collections.abc import Mapping
from typing import Any

from lorenz.daemon.discovery import Endpoint

DEFAULT_TIMEOUT_S = 5.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """:class:`http.client.HTTPConnection` to a unix-domain socket."""

    def __init__(self, socket_path: str, *, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """One response: its status and its decoded JSON body (``{}`` when empty)."""

    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self) -> dict[str, Any]:
        """The ``{"error": {"code", "message"}}`` envelope's inner object, if any."""
        inner = self.body.get("error")
        return inner if isinstance(inner, dict) else {}


class Unreachable(Exception):
    """The endpoint did not answer (refused, missing socket, timeout, not HTTP)."""


def request(
    endpoint: Endpoint,
    method: str,
    path: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    token: str | None = None,
    body: Mapping[str, Any] | None = None,
) -> Reply:
    """``method path`` against ``endpoint``; raises :class:`Unreachable` on any transport error.

    ``token`` goes out as ``Authorization: Bearer`` over TCP (never over the unix socket, which
    needs none). A body that is not a JSON object is returned as ``{"text": ...}`` so callers
    can show it.
    """
    headers = {"Accept": "application/json", "Connection": "close"}
    payload = b"" if method in ("POST", "PUT") else None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None and endpoint.socket_path is None:
        headers["Authorization"] = f"Bearer {token}"
    connection: http.client.HTTPConnection
    if endpoint.socket_path is not None:
        connection = UnixHTTPConnection(endpoint.socket_path, timeout=timeout_s)
    else:
        connection = http.client.HTTPConnection(
            endpoint.host or "127.0.0.1", endpoint.port, timeout=timeout_s
        )
    try:
        connection.request(
            method,
            endpoint.base_path + path,
            body=payload,
            headers=headers,
        )
        response = connection.getresponse()
        raw = response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable(_describe(exc)) from exc
    finally:
        connection.close()
    return Reply(status=status, body=_decode(raw))


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"text": raw.decode("utf-8", "replace")[:500]}
    return value if isinstance(value, dict) else {"value": value}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "the socket file does not exist"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, PermissionError):
        return "permission denied (the socket belongs to another user)"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)
