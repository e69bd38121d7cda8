"""``lorenz answer [WORKFLOW.md] IDENTIFIER --text TEXT [--url URL] [--port N] [--json]``.

``POST /api/v1/issues/<identifier>/answer`` on the daemon found through its lease (like
``lorenz stop``: the bearer token beside the lease over TCP, the private socket otherwise): the
issue's waiting slots resume their agents' sessions with the answer at once. ``--text -`` reads
the answer from stdin. Exit codes: 0 answered, 1 not waiting / not running / unreachable,
2 usage.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from lorenz.daemon.attach import add_attach_arguments

    add_attach_arguments(parser)
    parser.add_argument("identifier", metavar="IDENTIFIER", help="the waiting issue (e.g. ABC-1)")
    parser.add_argument(
        "--text", required=True, help="the answer (`-`: read it from stdin)"
    )


def run(args: argparse.Namespace) -> int:
    from lorenz.daemon.attach import attached

    text = sys.stdin.read() if args.text == "-" else args.text
    return attached(
        args, lambda target: _answer(target, args.identifier, text=text, as_json=args.json)
    )


def _answer(target: Any, identifier: str, *, text: str, as_json: bool) -> int:
    from lorenz.daemon.attach import EXIT_OK, call, print_json

    path = f"/api/v1/issues/{urllib.parse.quote(identifier, safe='')}/answer"
    body = call(target, "POST", path, {"text": text, "source": "cli"}).body
    if as_json:
        print_json(body)
    else:
        sessions = ", ".join(s or "(new session)" for s in body.get("session_ids") or ())
        print(f"answered {body.get('identifier', identifier)}: resuming {sessions}")
    return EXIT_OK
