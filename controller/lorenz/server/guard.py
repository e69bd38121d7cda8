"""Who may talk to the server: the Host it was reached by, the page a request came from, a token.

A server on ``127.0.0.1`` is reachable by every web page the user's browser opens: a page
cannot read the answers of another origin, but it can *send* — a ``text/plain`` or form POST
is a "simple request" that needs no preflight — and with DNS rebinding (a name of the page's
own that re-resolves to 127.0.0.1) it can read them too. Other local users can connect as
well. So :class:`RequestGuard`, one aiohttp middleware, checks every request over TCP:

* **Host** (every route, GET included): the name the client dialled must be this server's —
  ``localhost``, ``127.0.0.1``, ``[::1]``, the bound address or the address the connection
  arrived on, each with the bound port, or a configured name (``server.allowed_hosts``).
  A rebound name is none of these: 403 ``host_not_allowed``.
* **Origin** (state-changing methods): a browser names the page that sent the request; it must
  be this server itself (same host and port), else 403 ``cross_origin_refused``.
  ``Sec-Fetch-Site: cross-site`` / ``same-site`` are refused the same way.
* **Content type** (state-changing methods): a body, when there is one, must be
  ``application/json`` — which browsers never send cross-origin without a preflight that this
  server does not grant — else 415 ``unsupported_media_type``.
* **Webhooks** (``POST /api/v1/webhooks/<kind>``, :mod:`lorenz.server.webhooks`): exempt from
  the Origin and Token rules — a tracker is no browser and has no token; the delivery's
  signature is its credential — but not from the Host and content type rules.
* **Token** (state-changing methods): ``Authorization: Bearer <token>``, compared in constant
  time, else 401 ``auth_token_missing`` / ``auth_token_invalid``. The token is random per
  server start and written to a ``0600`` file (:mod:`lorenz.server.credentials`) that only
  this user can read; ``lorenz refresh|stop`` send it.

The unix socket needs none of this: browsers cannot reach it, and its ``0600`` mode (in a
``0700`` directory) already admits only this user — the file system is the credential. Should
those modes ever be loosened (a ``chmod``, a restored backup, a shared ``XDG_RUNTIME_DIR``), the
kernel still says who connected: a peer of another uid (``SO_PEERCRED``) is refused with 403
``peer_uid_refused``, on every route, as the worker's socket does.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
import socket
import struct
import urllib.parse
from asyncio.trsock import TransportSocket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import hdrs, web

from lorenz.server.credentials import read_token_file
from lorenz.server.errors import (
    AUTH_TOKEN_INVALID,
    AUTH_TOKEN_MISSING,
    CROSS_ORIGIN_REFUSED,
    HOST_NOT_ALLOWED,
    JSON_CONTENT_TYPE,
    PEER_UID_REFUSED,
    UNSUPPORTED_MEDIA_TYPE,
    ApiError,
)
from lorenz.server.webhooks import is_webhook_request

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing; every other method needs the token and a same-origin sender."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})
CROSS_SITE_FETCHES = frozenset({"cross-site", "same-site"})

_HOST_HEADER = re.compile(r"[A-Za-z0-9._\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a Host header (name lower-case, IPv6 without brackets); ``None`` if
    it is not a plain host or ``host:port``."""
    value = value.strip()
    if not _HOST_HEADER.fullmatch(value):
        return None
    parts = urllib.parse.urlsplit(f"//{value}")
    try:
        port = parts.port
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    return (name, port) if name else None


class RequestGuard:
    """The checks above, for one server; :meth:`middleware` goes into the app's middlewares."""

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        allowed_hosts: Iterable[str] = (),
        bind_host: str | None = None,
    ) -> None:
        """``token``: the bearer token (default: a fresh random one). ``token_file``: where the
        token lives; the token in it is accepted too, so every server of a workflow honours the
        one file the commands read. ``allowed_hosts``: extra names, ``name`` (any port) or
        ``name:port``. ``bind_host``: the configured bind address (allowed as a Host name)."""
        self.token = token or secrets.token_urlsafe(32)
        self.token_file = token_file
        self._any_port: set[str] = set()
        self._with_port: set[tuple[str, int]] = set()
        for entry in allowed_hosts:
            parsed = split_host(entry)
            if parsed is None:
                raise ValueError(f"not a host name or host:port: {entry!r}")
            name, port = parsed
            if port is None:
                self._any_port.add(name)
            else:
                self._with_port.add((name, port))
        self._bind_host = (bind_host or "").strip("[]").lower()

    # -- the checks ---------------------------------------------------------------------------

    def host_allowed(self, header: str, *, local_address: str, local_port: int) -> bool:
        """Whether a request that arrived on ``local_address:local_port`` may say ``Host:``."""
        parsed = split_host(header)
        if parsed is None:
            return False
        name, port = parsed
        if name in self._any_port or (port is not None and (name, port) in self._with_port):
            return True
        if (port if port is not None else 80) != local_port:
            return False
        own = {*LOOPBACK_NAMES, _unmapped(local_address)}
        if self._bind_host not in WILDCARD_ADDRESSES:
            own.add(self._bind_host)
        return name in own

    def token_accepted(self, presented: str) -> bool:
        if hmac.compare_digest(presented.encode(), self.token.encode()):
            return True
        if self.token_file is None:
            return False
        on_file = read_token_file(self.token_file)
        return on_file is not None and hmac.compare_digest(presented.encode(), on_file.encode())

    def check(self, request: web.Request) -> None:
        """Raise the coded refusal for ``request``, or return if it may go on."""
        local = _tcp_local_address(request)
        if local is None:
            # The unix socket: its modes admit only this user; the kernel's word checks it.
            _check_peer_uid(request)
            return
        host = request.headers.get(hdrs.HOST)
        target = request.raw_path
        if not target.startswith("/") and target != "*":
            # NB: an absolute-form target (``GET http://name/path``) names the host itself and
            # wins over the Host header (RFC 9112 §3.2.2): check that name instead.
            host = urllib.parse.urlsplit(target).netloc or host or ""
        if host is not None and not self.host_allowed(
            host, local_address=local[0], local_port=local[1]
        ):
            raise ApiError(
                f"this server does not answer to the host name {host[:100]!r}; use "
                f"http://127.0.0.1:{local[1]}, or add the name to server.allowed_hosts",
                code=HOST_NOT_ALLOWED,
                status=403,
            )
        if request.method in SAFE_METHODS or request.match_info.http_exception is not None:
            return  # NB: no route (404) or wrong method (405): nothing can change, say so
        if not is_webhook_request(request):
            # NB: a tracker's webhook delivery is not a browser's and carries no token: its
            # signature is its credential (lorenz.server.webhooks). Host and type still apply.
            self._check_origin(request, host)
            self._check_token(request)
        self._check_content_type(request)

    def _check_content_type(self, request: web.Request) -> None:
        # NB: only a body that is there (or may be: chunked) must be JSON; clients label empty
        # bodies freely (aiohttp's says application/octet-stream).
        declared = request.headers.get(hdrs.CONTENT_TYPE)
        has_body = request.content_length != 0 or hdrs.TRANSFER_ENCODING in request.headers
        if declared is not None and has_body and request.content_type != JSON_CONTENT_TYPE:
            raise ApiError(
                f"{request.method} {request.path} takes application/json (or no body), not "
                f"{request.content_type[:100]!r}",
                code=UNSUPPORTED_MEDIA_TYPE,
                status=415,
            )

    def _check_origin(self, request: web.Request, host: str | None) -> None:
        origin = request.headers.get(hdrs.ORIGIN)
        fetch_site = request.headers.get("Sec-Fetch-Site", "").strip().lower()
        if origin is None and fetch_site not in CROSS_SITE_FETCHES:
            return
        if fetch_site not in CROSS_SITE_FETCHES and origin is not None and host is not None:
            parts = urllib.parse.urlsplit(origin.strip())
            if parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
                return
        raise ApiError(
            f"{request.method} {request.path} is refused from another origin "
            f"({(origin or fetch_site)[:100]!r}); use the dashboard of this server or the "
            "lorenz commands",
            code=CROSS_ORIGIN_REFUSED,
            status=403,
        )

    def _check_token(self, request: web.Request) -> None:
        where = (
            f"it is in {self.token_file} (lorenz refresh and lorenz stop read it)"
            if self.token_file is not None
            else "ask whoever started this server for it"
        )
        scheme, _, presented = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise ApiError(
                f"{request.method} {request.path} needs 'Authorization: Bearer <token>'; {where}",
                code=AUTH_TOKEN_MISSING,
                status=401,
                headers={hdrs.WWW_AUTHENTICATE: 'Bearer realm="lorenz"'},
            )
        if not self.token_accepted(presented.strip()):
            raise ApiError(
                f"the token sent to {request.method} {request.path} is not this server's; "
                f"{where} (it changes every time the server starts)",
                code=AUTH_TOKEN_INVALID,
                status=401,
                headers={hdrs.WWW_AUTHENTICATE: 'Bearer realm="lorenz", error="invalid_token"'},
            )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.check(request)
        return await handler(request)


PEERCRED = struct.Struct("3i")
"""``struct ucred``: pid, uid, gid of the process that connected (Linux)."""


def peer_uid(sock: socket.socket | TransportSocket) -> int | None:
    """The uid of the process at the other end of a unix socket (``None``: not known here)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None  # NB: not Linux; the file modes are all there is
    raw = sock.getsockopt(socket.SOL_SOCKET, option, PEERCRED.size)
    _, uid, _ = PEERCRED.unpack(raw)
    return int(uid)


def _check_peer_uid(request: web.Request) -> None:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    uid = peer_uid(sock) if sock is not None else None
    if uid is not None and uid != os.getuid():
        raise ApiError(
            f"this server's unix socket answers only its own user (uid {os.getuid()}), not uid "
            f"{uid}; run the command as that user, and keep the socket's directory 0700",
            code=PEER_UID_REFUSED,
            status=403,
        )


def _tcp_local_address(request: web.Request) -> tuple[str, int] | None:
    """``(address, port)`` the connection arrived on; ``None`` for a unix socket."""
    transport = request.transport
    if transport is None:
        return ("", 0)  # gone already: check as strictly as TCP
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        return None
    sockname = transport.get_extra_info("sockname")
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return str(sockname[0]).lower(), int(sockname[1])
    return ("", 0)


def _unmapped(address: str) -> str:
    """``::ffff:127.0.0.1`` → ``127.0.0.1``; any other address unchanged."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)
