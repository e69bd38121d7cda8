"""Child processes for the multi-process claim-store tests (``python -m tests.claims.workers``).

Each command opens a real store on a shared file, prints ``ready``, waits for a ``go`` line on
stdin (so that every child starts contending at the same moment), works, and prints one JSON
line with what it saw.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import random
import sys
import time
from pathlib import Path

from lorenz.claims import SqlClaimStore
from lorenz.model import SlotKey
from tests.claims.records import BACKENDS, claim


def _report(payload: object) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _open(args: argparse.Namespace) -> SqlClaimStore:
    return await BACKENDS[args.backend].open(Path(args.path), owner=args.owner)


def _wait_for_go() -> None:
    _report("ready")
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected go, got {line!r}")


async def contend(args: argparse.Namespace) -> None:
    """Loop acquire → hold → release over a few keys shared with another process.

    While it holds a key, a marker file ``<holders>/<key>`` exists, created with O_EXCL after
    the store granted the key and removed before the store releases it. So the marker's life
    lies inside the store's ownership, and if the store ever let two owners hold one key at
    once, the second O_EXCL would fail (an overlap).
    """
    store = await _open(args)
    rng = random.Random(args.seed)
    holders = Path(args.holders)
    acquired = refused = 0
    overlaps: list[str] = []
    _wait_for_go()
    try:
        for _ in range(args.attempts):
            issue = f"K{rng.randrange(args.keys)}"
            record = claim(issue)
            if not await store.acquire(record):
                refused += 1
                continue
            acquired += 1
            marker = holders / issue
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
                owned_marker = True
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                overlaps.append(issue)
                owned_marker = False
            await asyncio.sleep(rng.random() * 0.002)
            await store.save(record)
            if owned_marker:
                marker.unlink()
            await store.release(SlotKey(record.slot_key))
    finally:
        await store.close()
    _report({"acquired": acquired, "refused": refused, "overlaps": overlaps})


async def write(args: argparse.Namespace) -> None:
    """Acquire ``count`` keys of our own, and race everyone for one common key."""
    store = await _open(args)
    errors: list[str] = []
    won_common = False
    _wait_for_go()
    try:
        won_common = await store.acquire(claim("common"))
        for i in range(args.count):
            try:
                if not await store.acquire(claim(f"{args.owner}-{i}")):
                    errors.append(f"{args.owner}-{i}: refused")
            except Exception as exc:
                errors.append(f"{args.owner}-{i}: {type(exc).__name__}: {exc}")
    finally:
        await store.close()
    _report({"errors": errors, "won_common": won_common})


async def churn(args: argparse.Namespace) -> None:
    """Write forever (until killed): claim key i, then checkpoint ``{"count": i}``."""
    store = await _open(args)
    i = 0
    started = time.monotonic()
    while True:
        i += 1
        await store.acquire(claim(f"C{i}"))
        await store.save_checkpoint({"count": i})
        if i == 5:
            _report({"ready": True, "after_s": time.monotonic() - started})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["contend", "write", "churn"])
    parser.add_argument("backend", choices=sorted(BACKENDS))
    parser.add_argument("path")
    parser.add_argument("owner")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=300)
    parser.add_argument("--holders", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    command = {"contend": contend, "write": write, "churn": churn}[args.command]
    asyncio.run(command(args))


if __name__ == "__main__":
    main()
