"""Claim-store figures: commit latency per mutation, and hydrate time for 10k claims.

    .venv/bin/python bench/store_bench.py [--ops 2000] [--claims 10000] [--dir /some/fs]

For each backend (memory, sqlite with synchronous=NORMAL — the default —, sqlite with FULL,
turso) it times ``acquire``, ``save`` and ``release`` as the orchestrator awaits them (thread hop
included), then ``load()`` of a store holding ``--claims`` rows. Targets (issue 5): sqlite
p50 <= 1 ms per mutation, hydrate <= 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from lorenz.claims import MemoryClaimStore, SqliteClaimStore, TursoClaimStore
from lorenz.claims.sqlite import FullSyncSqliteClaimStore
from lorenz.model import ClaimPhase, ClaimRecord, ClaimStore, RetryKind, SlotKey, slot_key

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

Opener = Callable[[Path], Awaitable[ClaimStore]]


async def _memory(_: Path) -> ClaimStore:
    return MemoryClaimStore(owner="bench")


async def _sqlite(path: Path) -> ClaimStore:
    return await SqliteClaimStore.open(path, owner="bench")


async def _sqlite_full(path: Path) -> ClaimStore:
    return await FullSyncSqliteClaimStore.open(path, owner="bench")


async def _turso(path: Path) -> ClaimStore:
    return await TursoClaimStore.open(path, owner="bench")


BACKENDS: dict[str, Opener] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "sqlite-full": _sqlite_full,
    "turso": _turso,
}


def record(i: int) -> ClaimRecord:
    return ClaimRecord(
        slot_key=slot_key(f"issue-{i}", 0),
        issue_id=f"issue-{i}",
        identifier=f"ENG-{i}",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="",
        attempt=i % 5 or None,
        retry_kind=RetryKind.FAILURE if i % 5 else None,
        due_at=T0 + datetime.timedelta(seconds=i),
        host="worker-1",
        workspace_path=f"/w/ENG-{i}",
        started_at=T0,
        last_agent_at=T0,
        turn_count=3,
        session_id=f"thread-{i}",
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def time_each(n: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await op(i)
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


async def bench_backend(name: str, opener: Opener, *, folder: Path, ops: int, claims: int) -> None:
    store = await opener(folder / f"{name}.db")
    try:
        acquire = await time_each(ops, lambda i: store.acquire(record(i)))
        pending = ClaimPhase.RETRY_PENDING
        save = await time_each(
            ops, lambda i: store.save(dataclasses.replace(record(i), phase=pending))
        )
        release = await time_each(ops, lambda i: store.release(SlotKey(f"issue-{i}#0")))
        for label, samples in (("acquire", acquire), ("save", save), ("release", release)):
            print(
                f"{name:<12} {label:<8} p50 {percentile(samples, 0.5):7.3f} ms"
                f"   p99 {percentile(samples, 0.99):7.3f} ms   (n={len(samples)})"
            )
        for i in range(claims):
            await store.acquire(record(i))
        loads = []
        for _ in range(5):
            start = time.perf_counter()
            state = await store.load()
            loads.append((time.perf_counter() - start) * 1000.0)
            assert len(state.claims) == claims
        print(
            f"{name:<12} hydrate  {claims} claims: median {statistics.median(loads):7.1f} ms"
            f"   best {min(loads):7.1f} ms"
        )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="mutations timed per kind")
    parser.add_argument("--claims", type=int, default=10_000, help="claims for the hydrate test")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the store files")
    parser.add_argument("--backend", action="append", choices=sorted(BACKENDS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for name in args.backend or list(BACKENDS):
            await bench_backend(
                name, BACKENDS[name], folder=Path(folder), ops=args.ops, claims=args.claims
            )


if __name__ == "__main__":
    asyncio.run(main())
