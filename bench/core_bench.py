"""Benchmarks of the pure scheduling core: eligibility + sort, and the claim/finish cycle.

Run: ``.venv/bin/python bench/core_bench.py`` (``--quick`` for a short run). Prints ms per
operation; the target is an eligibility + sort pass over 10k candidates in at most 10 ms.

The candidate mix is meant to look like a busy tracker: most issues active, some terminal or in
a non-active state, a required label missing on a few, blockers on about one in ten (half of
them done), a few percent of slots running and more waiting for a retry (some due, some not).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import statistics
import time

from lorenz.claims import MemoryClaimStore
from lorenz.config import WorkflowSettings
from lorenz.model import BlockerRef, Issue, ManualClock, SlotKey
from lorenz.orchestrator import DispatchCandidate, Orchestrator, Started

EPOCH = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
TARGET_10K_MS = 10.0


def candidate_issues(count: int, *, rng: random.Random) -> list[Issue]:
    states = ["Todo"] * 5 + ["In Progress"] * 3 + ["Done", "Backlog"]
    issues = []
    for n in range(count):
        blockers: tuple[BlockerRef, ...] = ()
        if rng.random() < 0.1:
            blockers = (
                BlockerRef(
                    id=f"b{n}", identifier=f"B-{n}", state=rng.choice(["Done", "In Progress"])
                ),
            )
        labels = ("agent", "backend") if rng.random() < 0.9 else ("backend",)
        issues.append(
            Issue(
                id=f"issue-{n}",
                identifier=f"ENG-{n}",
                title=f"Issue {n}",
                state=rng.choice(states),
                priority=rng.choice([None, 0, 1, 2, 3, 4]),
                created_at=EPOCH + datetime.timedelta(minutes=rng.randrange(500000)),
                labels=labels,
                blocked_by=blockers,
            )
        )
    return issues


def workflow() -> WorkflowSettings:
    return WorkflowSettings.model_validate(
        {
            "tracker": {"required_labels": ["agent"]},
            "agent": {"max_concurrent_agents": 1_000_000, "max_retry_backoff_ms": 300000},
        }
    )


async def prepared(count: int, *, rng: random.Random) -> tuple[Orchestrator, list[Issue]]:
    """An orchestrator with ~2% of the slots running and ~5% retrying (half of those due)."""
    clock = ManualClock()
    orchestrator = Orchestrator(settings=workflow(), store=MemoryClaimStore(), clock=clock)
    issues = candidate_issues(count, rng=rng)
    candidates = await orchestrator.eligible_issues(issues)
    rng.shuffle(candidates)
    running = candidates[: count // 50]
    retrying = candidates[count // 50 : count // 50 + count // 20]
    for candidate in running + retrying:
        await orchestrator.claim(candidate)
    for index, candidate in enumerate(retrying):
        await orchestrator.finish(candidate.key, normal=index % 2 == 0)
    clock.advance(5000)  # continuations (1 s) are due, failures (10 s) are not
    await orchestrator.eligible_issues(issues)  # settle: nothing left to prune after this
    return orchestrator, issues


async def bench_eligibility(count: int, *, repeats: int) -> tuple[float, float, float, int]:
    """``(median, best, cpu)`` ms per pass, and the number of eligible slots."""
    orchestrator, issues = await prepared(count, rng=random.Random(count))
    timings = []
    cpu = []
    eligible = 0
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        eligible = len(await orchestrator.eligible_issues(issues))
        timings.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.process_time() - started_cpu) * 1000.0)
    return statistics.median(timings), min(timings), statistics.median(cpu), eligible


async def bench_claim_finish(cycles: int) -> float:
    """Claim a slot (static path), finish it cleanly, release the continuation retry."""
    clock = ManualClock()
    orchestrator = Orchestrator(settings=workflow(), store=MemoryClaimStore(), clock=clock)
    candidates = [
        DispatchCandidate(issue, 0, SlotKey(f"{issue.id}#0"))
        for issue in candidate_issues(cycles, rng=random.Random(7))
    ]
    started = time.perf_counter()
    for candidate in candidates:
        result = await orchestrator.claim(candidate)
        assert isinstance(result, Started)
        await orchestrator.finish(candidate.key, normal=True)
        await orchestrator.release_retry(candidate.key)
    return (time.perf_counter() - started) * 1000.0 / cycles


async def main(*, quick: bool) -> int:
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    print("eligibility + sort, ms per pass over a realistic mix (see module docstring)")
    print(f"  {'candidates':>10}  {'median':>8}  {'best':>8}  {'cpu':>8}  eligible slots")
    figures = {}
    for size in sizes:
        repeats = 7 if size >= 100_000 else 41
        median, best, cpu, eligible = await bench_eligibility(size, repeats=repeats)
        figures[size] = median
        print(f"  {size:>10}  {median:8.2f}  {best:8.2f}  {cpu:8.2f}  {eligible}")
    cycles = 2_000 if quick else 20_000
    per_cycle = await bench_claim_finish(cycles)
    print(
        f"claim + finish + release_retry (memory store): {per_cycle * 1000:.1f} us/cycle "
        f"({1000.0 / per_cycle:,.0f} cycles/s)"
    )
    verdict = "met" if figures[10_000] <= TARGET_10K_MS else "MISSED"
    print(f"target: 10k candidates <= {TARGET_10K_MS} ms (median): {verdict}")
    print(f"machine: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    return 0 if verdict == "met" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k size")
    raise SystemExit(asyncio.run(main(quick=parser.parse_args().quick)))
