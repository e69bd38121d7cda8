"""``lorenz stop [WORKFLOW.md] [--url URL] [--port N] [--json] [--force] [--wait [--timeout S]]``.

``POST /api/v1/stop`` on the daemon found through its lease: it answers ``202`` and begins the
graceful shutdown: the drain (no new runs; runs in flight go on for the daemon's
``--grace-seconds``), then runtime, terminal view, worker pool, server, tracker, claim store,
lease — in that order. ``--force`` (alias ``--now``) skips the drain (or ends one under
way): every run is cancelled at once — the explicit way to kill, as a second SIGTERM/SIGINT
is ignored. With ``--wait`` the command returns only once the daemon has let go of its
lease (or, with ``--url``/``--port``, once its endpoint stops answering); ``daemon_stop_timeout``
after ``--timeout`` seconds. Exit codes: 0 stopping (or stopped), 1 not running, unreachable or
timed out, 2 usage.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lorenz.daemon.attach import add_attach_arguments

    add_attach_arguments(parser)
    parser.add_argument(
        "--wait", action="store_true", help="return only when the daemon has stopped"
    )
    parser.add_argument(
        "--force",
        "--now",
        dest="now",
        action="store_true",
        help="no drain: cancel every run at once (also ends a drain under way); the explicit "
        "way to kill, since a second SIGTERM/SIGINT is ignored",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long --wait waits (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    from lorenz.daemon.attach import attached

    return attached(
        args,
        lambda target: _stop(
            target, as_json=args.json, wait=args.wait, timeout_s=args.timeout, now=args.now
        ),
    )


def _stop(target: Any, *, as_json: bool, wait: bool, timeout_s: float, now: bool) -> int:
    from lorenz.daemon.attach import EXIT_OK, call, print_json, wait_until_stopped

    body = call(target, "POST", "/api/v1/stop", {"now": True} if now else None).body
    if wait:
        wait_until_stopped(target, timeout_s=timeout_s)
        body = {**body, "stopped": True}
    if as_json:
        print_json(body)
    else:
        state = "stopped" if wait else "stopping"
        print(f"daemon pid {body.get('pid')} {state} ({target.endpoint.url})")
    return EXIT_OK
