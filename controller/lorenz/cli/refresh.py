"""``lorenz refresh [WORKFLOW.md] [--url URL] [--port N] [--json]``: poll and reconcile now.

``POST /api/v1/refresh`` on the daemon found through its lease: the runtime queues an immediate
poll plus reconcile pass, merged with one already under way. Exit codes: 0 queued, 1 not
running or unreachable (or the daemon is stopping), 2 usage.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lorenz.daemon.attach import add_attach_arguments

    add_attach_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from lorenz.daemon.attach import attached

    return attached(args, lambda target: _refresh(target, as_json=args.json))


def _refresh(target: Any, *, as_json: bool) -> int:
    from lorenz.daemon.attach import EXIT_FAILURE, EXIT_OK, call, print_json

    body = call(target, "POST", "/api/v1/refresh").body
    if as_json:
        print_json(body)
    elif not body.get("queued", False):
        print(f"refresh not queued: the daemon at {target.endpoint.url} is stopping")
    elif body.get("coalesced"):
        print("refresh queued (merged with the poll already running)")
    else:
        operations = ", ".join(body.get("operations") or ()) or "poll"
        print(f"refresh queued ({operations})")
    return EXIT_OK if body.get("queued", False) else EXIT_FAILURE
