"""Recovery-pass figures: what a periodic pass costs when nobody is stale, and when one died.

    .venv/bin/python bench/recovery_bench.py [--claims 10000] [--passes 200] [--dir /some/fs]

A store holds ``--claims`` claim rows of a live owner (this process, so the proof by pid and
start time says *alive*) and of four other live owners. Printed, per backend (sqlite, turso):

* ``stale_owners()`` — the read a pass makes every ``claim_store.recovery_interval_ms`` —
  p50 / p99 over ``--passes`` calls, nobody stale;
* the orphan sweep's process scan (psutil, every process's environment) on this machine;
* one full pass (``RecoveryPasses.run_once``: stale_owners, sweep, take_over of 100 claims of
  a dead owner, retries written) — best of 5.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from lorenz.claims import SqlClaimStore, SqliteClaimStore, TursoClaimStore
from lorenz.claims.owners import ProcessIdentity, current_process
from lorenz.config import WorkflowSettings
from lorenz.daemon.orphans import find_orphans
from lorenz.daemon.recovery import RecoveryPasses
from lorenz.model import ClaimPhase, ClaimRecord, SystemClock, slot_key
from lorenz.orchestrator import Orchestrator

BACKENDS: dict[str, type[SqlClaimStore]] = {"sqlite": SqliteClaimStore, "turso": TursoClaimStore}


def record(prefix: str, i: int) -> ClaimRecord:
    return ClaimRecord(
        slot_key=slot_key(f"{prefix}-{i}", 0),
        issue_id=f"{prefix}-{i}",
        identifier=f"ENG-{i}",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="",
    )


def dead_owner() -> str:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    return ProcessIdentity(host=current_process().host, pid=child.pid, started_at=started).holder


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered) * 1000:.3f} / {p99 * 1000:.3f} ms"


async def bench_backend(name: str, folder: Path, *, claims: int, passes: int) -> None:
    path = folder / f"{name}.db"
    me = current_process()
    live_ids = [me.holder] + [
        ProcessIdentity(host=f"peer-{k}", pid=me.pid, started_at=me.started_at).holder
        for k in range(4)
    ]
    stores = [
        await BACKENDS[name].open(path, owner=owner, owner_stale_ms=600_000) for owner in live_ids
    ]
    ours = stores[0]
    for i in range(claims):
        await stores[i % len(stores)].acquire(record("live", i))

    timings: list[float] = []
    for _ in range(passes):
        started = time.perf_counter()
        assert await ours.stale_owners() == frozenset()
        timings.append(time.perf_counter() - started)
    print(f"{name:7} stale_owners() with {claims} claims, 5 owners, nobody stale: {ms(timings)}")

    best = float("inf")
    for round_no in range(5):
        crashed = await BACKENDS[name].open(path, owner=dead_owner(), owner_stale_ms=600_000)
        for i in range(100):
            await crashed.acquire(record(f"dead{round_no}", i))
        orchestrator = Orchestrator(settings=WorkflowSettings(), store=ours, clock=SystemClock())
        passes_ = RecoveryPasses(store=ours, orchestrator=orchestrator, interval_ms=1000)
        started = time.perf_counter()
        report = await passes_.run_once()
        best = min(best, time.perf_counter() - started)
        assert report is not None
        assert len(report.interrupted) == 100
        await crashed.close()
    print(f"{name:7} one pass taking over 100 claims of a dead owner (sweep included): "
          f"{best * 1000:.1f} ms (best of 5)")
    for store in stores:
        await store.close()


def bench_sweep_scan() -> None:
    timings = []
    for _ in range(20):
        started = time.perf_counter()
        find_orphans({"nobody:1:1.00"})
        timings.append(time.perf_counter() - started)
    count = len(psutil.pids())
    print(f"orphan sweep scan over {count} processes: {ms(timings)} (p50 / p99 of 20)")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for name in BACKENDS:
            await bench_backend(name, Path(folder), claims=args.claims, passes=args.passes)
    bench_sweep_scan()


if __name__ == "__main__":
    asyncio.run(main())
