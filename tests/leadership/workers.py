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


def race(workflow: Path, count: int) -> None:
    """Fork ``count`` racers that take the lease together; the parent pays the imports once.

    NB: a racer started as its own interpreter costs an interpreter start and the imports of
    ``lorenz.leadership`` each; twenty of them a round, on a loaded 2-core machine, made the
    soak's rounds outlast any sensible bound. Forked children are distinct processes all the
    same (own pid, own start time, hence own holder id): the race is the real one.

    Protocol on stdin/stdout: the parent prints the children's pids (one JSON line) once all
    are forked and waiting; ``go`` releases them at once; each child prints its report (one
    JSON line; a write under ``PIPE_BUF`` is atomic); ``exit`` lets the losers exit, while the
    winner holds the lease until the test kills it. The parent exits once every child has.
    """
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    hold_r, hold_w = os.pipe()
    sys.stdout.flush()
    pids: list[int] = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            os.close(hold_w)
            endpoint = f"http://127.0.0.1:{40000 + os.getpid() % 20000}"
            provider = FileLeaseProvider(workflow_path=workflow, endpoint=endpoint)
            os.write(ready_w, b"x")
            os.read(go_r, 1)  # returns at EOF: when the parent closes its end
            try:
                record = asyncio.run(provider.acquire())
                report: dict[str, Any] = {
                    "won": True, "pid": os.getpid(), "transitions": record.transitions
                }
            except LeadershipError as exc:
                report = {
                    "won": False,
                    "pid": os.getpid(),
                    "code": exc.code,
                    "owner_pid": getattr(exc, "pid", None),
                }
            _say(report)
            if report["won"]:
                while True:  # holds the lease until the test kills it
                    time.sleep(3600)
            os.read(hold_r, 1)  # the winner must stay alive while the losers decide
            os._exit(0)
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    os.close(hold_r)
    ready = 0
    while ready < count:
        chunk = os.read(ready_r, count)
        if not chunk:
            break
        ready += len(chunk)
    _say(pids)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected go")
    os.close(go_w)
    sys.stdin.readline()
    os.close(hold_w)
    for pid in pids:
        os.waitpid(pid, 0)


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
    parser.add_argument("--count", type=int, default=1)
    args = parser.parse_args()
    if args.command == "race":
        race(Path(args.workflow), args.count)
        return
    endpoint = args.endpoint or f"http://127.0.0.1:{40000 + os.getpid() % 20000}"
    torn(Path(args.workflow), endpoint)


if __name__ == "__main__":
    main()
