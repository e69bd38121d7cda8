"""Child processes for the leadership tests (``python -m tests.leadership.workers``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from lorenz.leadership import FileLeaseProvider, LeadershipError


def _say(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def race(workflow: Path, endpoint: str) -> None:
    """Wait for ``go``, try to take the lease, report, then hold on until told to exit."""
    provider = FileLeaseProvider(workflow_path=workflow, endpoint=endpoint)
    _say("ready")
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    try:
        record = asyncio.run(provider.acquire())
        _say({"won": True, "pid": os.getpid(), "transitions": record.transitions})
    except LeadershipError as exc:
        _say(
            {
                "won": False,
                "pid": os.getpid(),
                "code": exc.code,
                "owner_pid": getattr(exc, "pid", None),
            }
        )
    sys.stdin.readline()  # the winner must stay alive while the losers decide


def torn(workflow: Path, endpoint: str) -> None:
    """Take the lease, then freeze inside the next write, between temp file and rename."""
    provider = FileLeaseProvider(workflow_path=workflow, endpoint=endpoint)
    record = asyncio.run(provider.acquire())
    _say({"acquired": record.to_dict()})

    def frozen_replace(src: Any, dst: Any, **_: Any) -> None:
        _say({"paused": str(src)})
        time.sleep(3600)

    os.replace = frozen_replace  # type: ignore[assignment]
    asyncio.run(provider.heartbeat())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["race", "torn"])
    parser.add_argument("workflow")
    parser.add_argument("--endpoint", default="")
    args = parser.parse_args()
    endpoint = args.endpoint or f"http://127.0.0.1:{40000 + os.getpid() % 20000}"
    {"race": race, "torn": torn}[args.command](Path(args.workflow), endpoint)


if __name__ == "__main__":
    main()
