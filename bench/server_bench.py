"""Server figures: snapshot build time with 1k running entries, SSE fan-out cost to 50 clients.

    .venv/bin/python bench/server_bench.py [--running 1000] [--clients 50] [--seconds 5]

1. Snapshot: an orchestrator with ``--running`` slots running (claimed through its real API on a
   memory claim store; no agents), each with an agent message and token usage, behind a real
   :class:`LorenzRuntime`. Times the orchestrator snapshot, the full (typed) runtime snapshot,
   its wire form (``to_dict``, built only where it leaves the process), its JSON encoding, and
   ``GET /api/v1/state`` over loopback HTTP.
2. SSE fan-out: the same runtime served on 127.0.0.1; ``--clients`` streams held open by a
   separate client process (so its CPU is not counted). CPU time of the server process
   (psutil, user + system) is measured while the state changes at a low rate (every change is
   its own broadcast: CPU per broadcast) and at a high rate (bursts coalesced to one frame per
   ~100 ms per client: CPU per second). Each change is an agent update folded into one running
   entry plus the runtime's snapshot emission — exactly what a real agent event costs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import aiohttp
import psutil

from lorenz.agents import build_runner
from lorenz.claims import MemoryClaimStore
from lorenz.model import AgentUpdate, Issue, SlotKey, SystemClock, TokenUsage
from lorenz.orchestrator import Orchestrator, Started
from lorenz.runtime import LorenzRuntime
from lorenz.server import HUB_KEY, LorenzServer, SnapshotHub
from lorenz.trackers.memory import MemoryTracker
from lorenz.workflow import load_workflow
from lorenz.workspaces import WorkspaceManager

EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

CLIENT_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import aiohttp

    MARK = b"event: snapshot\\n"

    async def reader(session, url, counts, index):
        # NB: chunks, not lines: a 1k-entry snapshot is one data line of over 600 KiB.
        tail = b""
        async with session.get(url) as response:
            async for chunk in response.content.iter_any():
                data = tail + chunk
                counts[index] += data.count(MARK)
                tail = data[-(len(MARK) - 1):]

    async def main(url, clients):
        counts = [0] * clients
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks = [asyncio.create_task(reader(session, url, counts, i)) for i in range(clients)]
            loop = asyncio.get_running_loop()
            stdin = asyncio.StreamReader()
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
            while True:
                command = (await stdin.readline()).decode().strip()
                if command == "count":
                    print(json.dumps(counts), flush=True)
                elif command in ("stop", ""):
                    break
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def _workflow_file(root: Path, *, running: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "WORKFLOW.md"
    path.write_text(
        "---\n"
        "tracker: {kind: memory}\n"
        f"workspace: {{root: {root / 'workspaces'}}}\n"
        f"agent: {{kind: bench, max_concurrent_agents: {running + 10}}}\n"
        "agents: {bench: {protocol: command, command: 'true'}}\n"
        "---\nWork on {{ issue.identifier }}\n",
        encoding="utf-8",
    )
    return path


async def busy_runtime(root: Path, *, running: int) -> tuple[LorenzRuntime, list[SlotKey]]:
    """A runtime whose orchestrator holds ``running`` running slots, each with some progress."""
    loaded = load_workflow(_workflow_file(root, running=running), environ={})
    settings = loaded.settings
    issues = [
        Issue(
            id=f"issue-{n}",
            identifier=f"ENG-{n}",
            title=f"Make widget {n} faster and document why",
            state="In Progress" if n % 3 else "Todo",
            priority=n % 5,
            url=f"https://tracker.example/ENG-{n}",
            created_at=EPOCH + datetime.timedelta(minutes=n),
        )
        for n in range(running)
    ]
    orchestrator = Orchestrator(
        settings=settings, store=MemoryClaimStore(owner="bench"), clock=SystemClock()
    )
    keys: list[SlotKey] = []
    for candidate in await orchestrator.eligible_issues(issues):
        result = await orchestrator.claim(candidate)
        assert isinstance(result, Started)
        keys.append(result.entry.key)
        await orchestrator.apply_update(
            result.entry.key,
            AgentUpdate(
                event="notification",
                message="Running the test suite after reworking the widget cache",
                session_id=f"thread-{len(keys)}",
                usage=TokenUsage(input_tokens=1200, output_tokens=340, total_tokens=1540),
                pid=10000 + len(keys),
            ),
        )
    tracker = MemoryTracker(issues, settings=settings)
    runtime = LorenzRuntime(
        workflow=loaded,
        orchestrator=orchestrator,
        tracker=tracker,
        workspaces=WorkspaceManager(settings=settings),
        runner_factory=build_runner,
        clock=SystemClock(),
    )
    return runtime, keys


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {p50 * 1000:7.2f} ms   p95 {p95 * 1000:7.2f} ms"


async def bench_snapshot(runtime: LorenzRuntime, *, url: str, rounds: int) -> None:
    running = len(runtime.orchestrator.state.running)
    print(f"\n== snapshot with {running} running entries ({rounds} rounds)")
    orchestrator_times, runtime_times, dict_times, encode_times, http_times = [], [], [], [], []
    size = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        runtime.orchestrator.snapshot()
        t1 = time.perf_counter()
        snapshot = runtime.snapshot()
        t2 = time.perf_counter()
        document = snapshot.to_dict()
        t3 = time.perf_counter()
        encoded = json.dumps(document, separators=(",", ":"), default=str)
        t4 = time.perf_counter()
        orchestrator_times.append(t1 - t0)
        runtime_times.append(t2 - t1)
        dict_times.append(t3 - t2)
        encode_times.append(t4 - t3)
        size = len(encoded)
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            t0 = time.perf_counter()
            async with session.get(f"{url}/api/v1/state") as response:
                await response.read()
            http_times.append(time.perf_counter() - t0)
    print(f"  orchestrator.snapshot()          {_ms(orchestrator_times)}")
    print(f"  runtime.snapshot() (typed)       {_ms(runtime_times)}")
    print(f"  snapshot.to_dict() (wire form)   {_ms(dict_times)}")
    print(f"  json encoding                    {_ms(encode_times)}   ({size / 1024:.0f} KiB)")
    print(f"  GET /api/v1/state over loopback  {_ms(http_times)}")


class Clients:
    """``count`` SSE streams held by a child process (its CPU is not the server's)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def open(cls, url: str, count: int) -> Clients:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT_SCRIPT, f"{url}/api/v1/events", str(count),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def counts(self) -> list[int]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(b"count\n")
        await self.process.stdin.drain()
        counts: list[int] = json.loads(await self.process.stdout.readline())
        return counts

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"stop\n")
        await self.process.stdin.drain()
        await asyncio.wait_for(self.process.wait(), timeout=10)


def _cpu_seconds() -> float:
    times = psutil.Process(os.getpid()).cpu_times()
    return times.user + times.system


async def _change_at(
    runtime: LorenzRuntime,
    keys: list[SlotKey],
    *,
    rate: float,
    seconds: float,
    hub_only: bool = False,
    hub: SnapshotHub | None = None,
) -> int:
    """Make changes at ``rate`` per second for ``seconds``; returns how many were made.

    A change is an agent update folded into a random running entry followed by the runtime's
    snapshot emission; with ``hub_only`` the hub is only told "changed" (no agent update, no
    other listener): its own cost per frame, the snapshot it builds per frame included.
    """
    rng = random.Random(7)
    interval = 1.0 / rate
    loop = asyncio.get_running_loop()
    start = loop.time()
    changes = 0
    while loop.time() - start < seconds:
        if hub_only:
            assert hub is not None
            hub._on_change()
        else:
            key = rng.choice(keys)
            await runtime.orchestrator.apply_update(
                key, AgentUpdate(event="notification", message=f"step {changes} of the plan")
            )
            # NB: the runtime's own emitter, as its agent-update path calls it after each update.
            runtime._emit_snapshot()
        changes += 1
        next_at = start + changes * interval
        await asyncio.sleep(max(next_at - loop.time(), 0))
    return changes


async def bench_fanout(
    runtime: LorenzRuntime, keys: list[SlotKey], *, server: LorenzServer, clients: int,
    seconds: float,
) -> None:
    assert server.url is not None
    assert server.app is not None
    hub = server.app[HUB_KEY]
    running = len(runtime.orchestrator.state.running)
    print(f"\n== SSE fan-out: {clients} clients, {running} running entries")
    streams = await Clients.open(server.url, clients)
    try:
        async with asyncio.timeout(30):
            while hub.client_count < clients:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        for mode, rate in (("runtime", 5.0), ("runtime", 20.0), ("runtime", 100.0),
                           ("hub only", 5.0), ("hub only", 100.0)):
            before_counts = sum(await streams.counts())
            frames0 = hub.frames_encoded
            cpu0 = _cpu_seconds()
            wall0 = time.perf_counter()
            changes = await _change_at(
                runtime, keys, rate=rate, seconds=seconds, hub=hub,
                hub_only=mode == "hub only",
            )
            changed_for = time.perf_counter() - wall0
            await asyncio.sleep(0.3)  # the last coalesced frames go out
            cpu = _cpu_seconds() - cpu0
            wall = time.perf_counter() - wall0
            delivered = sum(await streams.counts()) - before_counts
            frames = hub.frames_encoded - frames0
            print(
                f"  {mode:8} {rate:4.0f}/s asked, {changes / changed_for:5.1f}/s made: "
                f"{changes:4} changes -> {frames:3} frames, {delivered / clients:4.0f} per "
                f"client; CPU {cpu / wall * 100:5.1f}% of a core, "
                f"{cpu / max(frames, 1) * 1000:6.2f} ms per broadcast frame"
            )
    finally:
        await streams.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorenz-server-bench-") as tmp:
        for running in sorted({10, args.running}):
            runtime, keys = await busy_runtime(Path(tmp) / f"r{running}", running=running)
            server = LorenzServer(port=0, static_routes=())
            await server.start(runtime)
            try:
                assert server.url is not None
                await bench_snapshot(runtime, url=server.url, rounds=args.rounds)
                await bench_fanout(
                    runtime, keys, server=server, clients=args.clients, seconds=args.seconds
                )
            finally:
                await server.stop()
                runtime.stop()


if __name__ == "__main__":
    asyncio.run(main())
