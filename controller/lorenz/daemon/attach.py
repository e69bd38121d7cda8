"""What ``lorenz status``, ``lorenz refresh`` and ``lorenz stop`` share: find the daemon, call it.

The daemon is found through its lease (``[WORKFLOW.md]``, default ``./WORKFLOW.md``), which
records its endpoint — an HTTP URL when the dashboard server is on, else a unix socket. For a
daemon on another host, ``--url`` (``http://host:port`` or ``unix:///path``) or ``--port``
(``http://127.0.0.1:PORT``) name the endpoint directly and the lease is not read.

Over TCP ``refresh`` and ``stop`` carry the daemon's bearer token (``Authorization: Bearer``),
read from the file beside the lease (``--token-file PATH`` names another, e.g. one copied from
the daemon's host); without it the daemon refuses them with 401. ``status`` sends none (reads
need none), and a ``--url`` to another host gets only a token named with ``--token-file``.

Exit codes: 0 ok; 1 the daemon is not running, unreachable or refused (coded:
``daemon_not_running``, ``daemon_unreachable``, ``daemon_request_failed``,
``daemon_lock_unreadable``, ``daemon_stop_timeout``); 2 usage (``control_url_invalid``).

NB: this module is on the cold path of ``lorenz status`` (target ≤ 300 ms): standard library
only at import time; anything heavier is imported where an error is being built.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lorenz.codes import ErrorCode
from lorenz.daemon.client import Reply, Unreachable, request
from lorenz.daemon.discovery import Target, find_target

if TYPE_CHECKING:
    from lorenz.model import LorenzError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def add_attach_arguments(parser: argparse.ArgumentParser) -> None:
    """``[WORKFLOW.md] [--url URL] [--port N] [--token-file PATH] [--json]``."""
    parser.add_argument(
        "workflow",
        nargs="?",
        default=None,
        metavar="WORKFLOW.md",
        help="the workflow whose daemon to talk to (default: ./WORKFLOW.md)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        default=None,
        help="the daemon's endpoint, http://HOST:PORT or unix:///PATH (skips the lease)",
    )
    where.add_argument(
        "--port",
        type=int,
        default=None,
        help="the daemon's HTTP port on 127.0.0.1 (skips the lease)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="file holding the daemon's bearer token (default: the one beside its lease)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def attached(args: argparse.Namespace, action: Callable[[Target], int]) -> int:
    """Find the daemon the arguments name and run ``action`` on it; coded errors → exit code."""
    try:
        target = find_target(
            workflow=args.workflow,
            url=args.url,
            port=args.port,
            token_file=getattr(args, "token_file", None),
        )
        return action(target)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if not isinstance(code, str):
            raise
        if args.json:
            message = getattr(exc, "message", str(exc))
            print(json.dumps({"error": {"code": code, "message": message}}, indent=2))
        print(f"lorenz: {exc}", file=sys.stderr)
        return EXIT_USAGE if code == ErrorCode.CONTROL_URL_INVALID else EXIT_FAILURE


def call(
    target: Target,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 5.0,
) -> Reply:
    """``method path`` on the daemon; raises the coded errors (never returns a non-2xx reply)."""
    try:
        reply = request(
            target.endpoint,
            method,
            path,
            timeout_s=timeout_s,
            token=_token_for(target, method),
            body=body,
        )
    except Unreachable as exc:
        raise unreachable_error(target, reason=str(exc)) from None
    if not reply.ok:
        from lorenz.daemon.errors import DaemonRequestFailed

        raise DaemonRequestFailed(
            endpoint=target.endpoint.url, path=path, status=reply.status, error=reply.error()
        )
    return reply


def try_call(target: Target, method: str, path: str) -> Reply | None:
    """Like :func:`call`, but a 404/405 (a server without that route) gives ``None``."""
    try:
        reply = request(target.endpoint, method, path, token=_token_for(target, method))
    except Unreachable as exc:
        raise unreachable_error(target, reason=str(exc)) from None
    if reply.status in (404, 405):
        return None
    if not reply.ok:
        from lorenz.daemon.errors import DaemonRequestFailed

        raise DaemonRequestFailed(
            endpoint=target.endpoint.url, path=path, status=reply.status, error=reply.error()
        )
    return reply


def _token_for(target: Target, method: str) -> str | None:
    """The bearer token goes out only where it is needed: state-changing requests."""
    return None if method in ("GET", "HEAD") else target.token


def unreachable_error(target: Target, *, reason: str) -> LorenzError:
    """``daemon_not_running`` if the lease holder is provably dead, else ``daemon_unreachable``."""
    from lorenz.daemon.errors import DaemonNotRunning, DaemonUnreachable

    lease = target.lease
    if lease is not None and lease.get("host") == socket.gethostname():
        from lorenz.leadership import Liveness, local_liveness

        pid = lease.get("pid")
        started = lease.get("process_started_at")
        if (
            isinstance(pid, int)
            and local_liveness(pid, float(started) if isinstance(started, int | float) else None)
            is Liveness.DEAD
        ):
            return DaemonNotRunning(
                workflow=target.workflow_path, lease_path=target.lease_path, dead_pid=pid
            )
    return DaemonUnreachable(endpoint=target.endpoint.url, lease=lease, reason=reason)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def wait_until_stopped(target: Target, *, timeout_s: float, poll_s: float = 0.05) -> None:
    """Block until the daemon let go: its lease is gone or changed hands, or (no lease known)
    its endpoint stopped answering. Raises ``daemon_stop_timeout`` after ``timeout_s``."""
    import time

    from lorenz.daemon.discovery import read_lease

    deadline = time.monotonic() + timeout_s
    holder = target.lease.get("holder") if target.lease is not None else None
    while time.monotonic() < deadline:
        if target.lease_path is not None:
            current = read_lease(target.lease_path)
            if current is None or current.get("holder") != holder:
                return
        else:
            try:
                request(target.endpoint, "GET", "/api/v1/daemon", timeout_s=1.0)
            except Unreachable:
                return
        time.sleep(poll_s)
    from lorenz.daemon.errors import DaemonStopTimeout

    raise DaemonStopTimeout(endpoint=target.endpoint.url, waited_s=timeout_s)
