"""Finding a running daemon from the command line: its lease file, and the endpoint it records.

``lorenz status|refresh|stop`` must answer in well under 300 ms, and most of that budget goes to
starting Python. So this module imports nothing but the standard library: no pydantic, no
asyncio, no psutil — not even :mod:`lorenz.leadership`, whose package import alone (asyncio,
tenacity, psutil) costs about 130 ms. The two rules it shares with that package are pinned by
tests: the lease path (:func:`lease_file_for` equals :func:`lorenz.leadership.lease_path`) and
the record format (what :class:`~lorenz.leadership.FileLeaseProvider` writes, this reads).

Coded errors (:mod:`lorenz.daemon.errors`) import :mod:`lorenz.model`; they are imported only
on the failure path, so a successful ``lorenz status`` never pays for them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import urllib.parse
from pathlib import Path
from typing import Any, NoReturn

DEFAULT_WORKFLOW = "WORKFLOW.md"
LEASE_DIR = Path(".lorenz") / "daemon"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts of ``--url`` the workflow's own token file may be sent to (without ``--token-file``)."""
UNIX_SCHEME = "unix"
"""``unix:///absolute/path.sock``: how a lease names a unix-socket endpoint."""


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a daemon's control routes answer: an HTTP base URL or a unix socket."""

    url: str
    """As recorded or given: ``http://127.0.0.1:8080`` or ``unix:///run/user/1000/x.sock``."""
    host: str | None = None
    """TCP host (HTTP endpoints)."""
    port: int | None = None
    """TCP port (HTTP endpoints)."""
    socket_path: str | None = None
    """The socket file (unix endpoints)."""
    base_path: str = ""
    """A path prefix of an HTTP URL (``http://host/lorenz`` → ``/lorenz``), without the slash."""

    @property
    def is_unix(self) -> bool:
        return self.socket_path is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """What a CLI attach command talks to, and how it was found."""

    endpoint: Endpoint
    lease: dict[str, Any] | None
    """The lease record it came from (``None`` for ``--url``/``--port``)."""
    lease_path: Path | None
    workflow_path: Path | None
    token: str | None = None
    """The bearer token sent over TCP (``--token-file``, else the workflow's token file)."""


def canonical_workflow_path(workflow: str | os.PathLike[str]) -> Path:
    """Absolute, symlinks resolved (the same rule as :mod:`lorenz.leadership.files`)."""
    return Path(os.path.abspath(workflow)).resolve()


def lease_file_for(workflow: str | os.PathLike[str]) -> Path:
    """``<workflow dir>/.lorenz/daemon/<sha256 of canonical workflow path>.lock.json``."""
    canonical = canonical_workflow_path(workflow)
    digest = hashlib.sha256(str(canonical).encode("utf-8")).hexdigest()
    return canonical.parent / LEASE_DIR / f"{digest}.lock.json"


def token_file_for(workflow: str | os.PathLike[str]) -> Path:
    """``<workflow dir>/.lorenz/daemon/<sha256>.token``: the bearer token of the workflow's
    server (``0600``, rewritten at each start; see :mod:`lorenz.server.credentials`)."""
    lease = lease_file_for(workflow)
    return lease.with_name(lease.name.removesuffix(".lock.json") + ".token")


def read_token(path: Path) -> str | None:
    """The token in ``path``; ``None`` when there is none (or it is not readable by us)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(1025)
    except OSError:
        return None
    token = raw.decode("ascii", "replace").strip()
    return token if token and len(raw) <= 1024 else None


def read_lease(path: Path) -> dict[str, Any] | None:
    """The lease record at ``path`` as a plain dict; ``None`` if there is no file.

    Raises :class:`~lorenz.leadership.DaemonLockUnreadable` for a file that does not parse.
    """
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _unreadable(path, exc.strerror or str(exc))
    try:
        record = json.loads(text)
    except ValueError as exc:
        _unreadable(path, f"not JSON: {exc}")
    if not isinstance(record, dict) or not isinstance(record.get("holder"), str):
        _unreadable(path, "not a lease record")
    return record


def _unreadable(path: Path, reason: str) -> NoReturn:
    from lorenz.leadership import DaemonLockUnreadable

    raise DaemonLockUnreadable(path=path, reason=reason)


def parse_endpoint(text: str) -> Endpoint:
    """An endpoint from ``http://host:port[/prefix]`` or ``unix:///path`` (or a bare ``/path``).

    Raises :class:`~lorenz.daemon.errors.ControlUrlInvalid` for anything else.
    """
    value = text.strip()
    if value.startswith("/"):
        return Endpoint(url=f"{UNIX_SCHEME}://{value}", socket_path=value)
    parts = urllib.parse.urlsplit(value)
    if parts.scheme == UNIX_SCHEME:
        path = urllib.parse.unquote(parts.path)
        if parts.netloc or not path.startswith("/"):
            _invalid(value, "a unix endpoint is unix:///absolute/path.sock")
        return Endpoint(url=value, socket_path=path)
    if parts.scheme != "http":
        _invalid(value, "use http://HOST:PORT or unix:///path/to/socket")
    try:
        port = parts.port
    except ValueError:
        _invalid(value, "the port is not a number from 1 to 65535")
    if not parts.hostname:
        _invalid(value, "the URL has no host")
    return Endpoint(
        url=value.rstrip("/"),
        host=parts.hostname,
        port=port or 80,
        base_path=parts.path.rstrip("/"),
    )


def _invalid(value: str, why: str) -> NoReturn:
    from lorenz.daemon.errors import ControlUrlInvalid

    raise ControlUrlInvalid(url=value, reason=why)


def find_target(
    *,
    workflow: str | None,
    url: str | None = None,
    port: int | None = None,
    token_file: str | None = None,
) -> Target:
    """The daemon to talk to: ``--url``, else ``--port`` (on 127.0.0.1), else the lease.

    The token is read from ``token_file`` (``--token-file``) when given, else from the
    workflow's token file (``WORKFLOW.md`` defaults to ``./WORKFLOW.md``) — for ``--url`` only
    when it names this machine's loopback: a local daemon's token is never sent to a host the
    command line named. Raises :class:`~lorenz.daemon.errors.DaemonNotRunning` when there is no
    lease, :class:`~lorenz.daemon.errors.DaemonUnreachable` when the lease has no endpoint yet.
    """
    workflow_path = canonical_workflow_path(workflow or DEFAULT_WORKFLOW)
    token = read_token(Path(token_file) if token_file else token_file_for(workflow_path))
    if url is not None:
        endpoint = parse_endpoint(url)
        if token_file is None and not endpoint.is_unix and endpoint.host not in LOOPBACK_HOSTS:
            token = None
        return Target(
            endpoint=endpoint,
            lease=None,
            lease_path=None,
            workflow_path=None,
            token=token,
        )
    if port is not None:
        if not 0 < port < 65536:
            _invalid(str(port), "--port takes a number from 1 to 65535")
        endpoint = Endpoint(url=f"http://127.0.0.1:{port}", host="127.0.0.1", port=port)
        return Target(
            endpoint=endpoint, lease=None, lease_path=None, workflow_path=None, token=token
        )
    path = lease_file_for(workflow_path)
    lease = read_lease(path)
    if lease is None:
        from lorenz.daemon.errors import DaemonNotRunning

        raise DaemonNotRunning(workflow=workflow_path, lease_path=path)
    recorded = lease.get("endpoint")
    if not isinstance(recorded, str) or not recorded:
        from lorenz.daemon.errors import DaemonUnreachable

        raise DaemonUnreachable(
            endpoint=None, lease=lease, reason="it has not published an endpoint yet"
        )
    return Target(
        endpoint=parse_endpoint(recorded),
        lease=lease,
        lease_path=path,
        workflow_path=workflow_path,
        token=token,
    )
