"""Claim stores shared by real processes: exclusion, parallel writers, and kill -9 mid-write."""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lorenz.model import ManualClock
from tests.claims.records import BACKENDS, claim

REPO = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.claims.workers", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def expect_line(child: subprocess.Popen[str]) -> Any:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        _, err = child.communicate()
        raise AssertionError(f"child exited early (rc={child.returncode}):\n{err}")
    return json.loads(line)


def run_together(children: list[subprocess.Popen[str]]) -> list[Any]:
    """Wait until every child is ready, release them at once, collect their reports."""
    for child in children:
        assert expect_line(child) == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, err = child.communicate()
        assert child.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def create_store(backend: str, path: Path) -> None:
    async def _create() -> None:
        store = await BACKENDS[backend].open(path, owner="creator")
        await store.close()

    asyncio.run(_create())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_two_processes_never_hold_one_slot_at_once(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "claims.db"
    create_store(backend, path)
    holders = tmp_path / "holders"
    holders.mkdir()
    children = [
        spawn(
            "contend",
            backend,
            str(path),
            owner,
            "--keys",
            "3",
            "--attempts",
            "600",
            "--holders",
            str(holders),
            "--seed",
            str(seed),
        )
        for seed, owner in enumerate(["p1", "p2"])
    ]
    reports = run_together(children)
    assert [r["overlaps"] for r in reports] == [[], []]
    assert sum(r["acquired"] for r in reports) >= 500
    assert sum(r["refused"] for r in reports) > 0  # they really contended
    assert list(holders.iterdir()) == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_parallel_writers_all_land(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "claims.db"
    create_store(backend, path)
    writers = 8
    per_writer = 20
    children = [
        spawn("write", backend, str(path), f"w{i}", "--count", str(per_writer))
        for i in range(writers)
    ]
    reports = run_together(children)
    assert [r["errors"] for r in reports] == [[]] * writers
    assert sum(r["won_common"] for r in reports) == 1

    async def _check() -> None:
        store = await BACKENDS[backend].open(path, owner="inspector")
        try:
            claims = (await store.load()).claims
            assert await store.integrity_check() == "ok"
        finally:
            await store.close()
        owners = [c.owner for c in claims if c.issue_id != "common"]
        assert len(claims) == writers * per_writer + 1
        assert {o: owners.count(o) for o in set(owners)} == {
            f"w{i}": per_writer for i in range(writers)
        }
        assert all(c.slot_key.startswith(c.owner) for c in claims if c.issue_id != "common")

    asyncio.run(_check())


def kill_during_writes(backend: str, path: Path, *, rng: random.Random) -> None:
    """Start a writer in a tight loop, SIGKILL it mid-flight, check the store it left."""
    child = spawn("churn", backend, str(path), "victim")
    expect_line(child)
    time.sleep(rng.uniform(0.02, 0.3))
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert child.returncode == -signal.SIGKILL

    async def _check() -> None:
        store = await BACKENDS[backend].open(path, owner="inspector")
        try:
            assert await store.integrity_check() == "ok"
            state = await store.load()
            count = (state.checkpoint or {})["count"]
            numbers = sorted(int(c.issue_id[1:]) for c in state.claims)
            # Each claim and each checkpoint is its own transaction: the claims are exactly
            # C1..Cn, and the checkpoint is n (killed after it) or n-1 (killed before it).
            assert numbers == list(range(1, len(numbers) + 1))
            assert len(numbers) in (count, count + 1)
            assert {c.owner for c in state.claims} == {"victim"}
            # The victim's heartbeat is fresh: a store cannot know the process died, so its
            # claims stay untouched until the heartbeat is stale.
            assert "victim" not in state.stale_owners
            assert await store.take_over(from_owners=["victim"]) == []
            events = await store.recent_events(limit=10_000)
            assert len(events) <= 500
            assert [e.id for e in events] == list(
                range(events[0].id, events[0].id - len(events), -1)
            )
        finally:
            await store.close()
        later = ManualClock(
            wall=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        )
        heir = await BACKENDS[backend].open(path, owner="heir", clock=later)
        try:
            taken = await heir.take_over(from_owners=(await heir.load()).stale_owners)
            assert len(taken) == len(numbers)
            assert await heir.acquire(claim("after-crash"))
        finally:
            await heir.close()

    asyncio.run(_check())


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_kill_9_during_writes_leaves_a_readable_store(backend: str, tmp_path: Path) -> None:
    rng = random.Random(5)
    for round_ in range(3):
        kill_during_writes(backend, tmp_path / f"round{round_}.db", rng=rng)


@pytest.mark.soak
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_kill_9_soak(backend: str, tmp_path: Path) -> None:
    rng = random.Random()
    for round_ in range(25):
        kill_during_writes(backend, tmp_path / f"round{round_}.db", rng=rng)
