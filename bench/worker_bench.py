"""What a run in its own worker process costs, against the in-process runner it replaces.

Real ``lorenz worker`` processes under a temporary state root; agents are scripts (the gated
Codex app-server of ``tests/workers`` and, for the many-workers figures, a ``command`` agent
that waits on a gate file), so only Lorenz's own cost is measured:

1. *spawn*: wall time of ``launch`` (the worker forked, detached, its socket serving);
2. *idle worker*: RSS and USS of a worker whose agent is mid-turn and silent;
3. *controller CPU per 1,000 agent events*: this process's CPU time while it follows a worker
   through N events, against the same N events through ``CodexAppServerRunner`` in-process;
4. *re-attach*: a fresh controller attaches to 20 and to 100 live workers (handles, attach
   after the last seq, replay, live) — the adoption cost after a restart.

Run: ``.venv/bin/python bench/worker_bench.py [--events 20000] [--many 20,100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from lorenz.agents.base import AgentRunRequest
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.config import AgentLaunch, AgentProtocol
from lorenz.model import AgentUpdate, Issue
from lorenz.workers.handles import LocalTransport, WorkerHandle
from lorenz.workers.journal import Record
from lorenz.workers.spec import HookSpec, IssueSpec, RunSpec
from lorenz.workers.states import worker_pid
from lorenz.workflow import continuation_prompt

GATED = Path(__file__).resolve().parent.parent / "tests" / "workers" / "gated_codex.py"


def env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()),
            "LANG": "C.UTF-8"}


def codex_command(scenario: dict[str, Any], path: Path) -> str:
    path.write_text(json.dumps(scenario))
    return " ".join(shlex.quote(p) for p in (sys.executable, str(GATED), str(path)))


def make_spec(
    work: Path, n: int, *, command: str, protocol: AgentProtocol = AgentProtocol.CODEX_APP_SERVER
) -> RunSpec:
    workspace = work / f"ws{n}"
    workspace.mkdir(exist_ok=True)
    return RunSpec(
        workflow=str(work / "WORKFLOW.md"),
        issue=IssueSpec(id=f"id-{n}", identifier=f"BENCH-{n}", title="bench", state="Todo"),
        prompt="bench",
        agent=AgentLaunch(command=command, protocol=protocol, read_timeout_ms=60000),
        max_turns=1,
        workspace=str(workspace),
        hooks=HookSpec(env=env()),
        env=env(),
        linger_ms=0,
    )


def gate_command(gate: Path) -> str:
    return f"echo started; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.2; done; echo done"


async def bench_spawn_and_idle(work: Path, transport: LocalTransport, count: int) -> None:
    gate = work / "gate-idle"
    spawn_ms: list[float] = []
    handles = []
    for n in range(count):
        command = codex_command(
            {"turns": [{"steps": [{"message": "hi"}, {"gate": str(gate)}]}]},
            work / f"idle{n}.json",
        )
        spec = make_spec(work, 1000 + n, command=command)
        started = time.perf_counter()
        result = await transport.launch(spec)
        spawn_ms.append((time.perf_counter() - started) * 1000)
        handles.append(result)
    await asyncio.sleep(3.0)  # let every agent reach its gate; workers are then idle
    rss, uss = [], []
    for result in handles:
        assert result.pid is not None
        info = psutil.Process(result.pid).memory_full_info()
        rss.append(info.rss / 2**20)
        uss.append(info.uss / 2**20)
    print(
        f"spawn (launch → socket serving), {count} sequential: median "
        f"{statistics.median(spawn_ms):.0f} ms, min {min(spawn_ms):.0f}, max {max(spawn_ms):.0f}"
    )
    print(
        f"idle worker (agent mid-turn, silent): RSS median {statistics.median(rss):.1f} MiB, "
        f"USS median {statistics.median(uss):.1f} MiB"
    )
    gate.write_text("open")


def interpreter_baseline() -> None:
    """What starting Python (and importing the worker) costs on this machine right now."""
    import subprocess

    def wall(argv: list[str]) -> float:
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run(argv, check=True)
            runs.append((time.perf_counter() - started) * 1000)
        return statistics.median(runs)

    bare = wall([sys.executable, "-c", "pass"])
    imports = wall([sys.executable, "-c", "import lorenz.workers.launch"])
    print(
        f"baseline: python start {bare:.0f} ms, python + worker imports {imports:.0f} ms "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )


async def bench_events(work: Path, transport: LocalTransport, events: int) -> None:
    scenario = {"turns": [{"steps": [{"burst": events}]}]}
    # In-process: today's path, the runner parses the agent's JSON-RPC in this process.
    count = 0

    def on_update(update: AgentUpdate) -> None:
        nonlocal count
        count += 1

    async def active() -> bool:
        return False

    request = AgentRunRequest(
        issue=Issue(id="x", identifier="BENCH-X", title="bench", state="Todo"),
        attempt=None,
        slot_index=0,
        prompt="bench",
        workspace=work,
        settings=AgentLaunch(command=codex_command(scenario, work / "inproc.json"),
                                   read_timeout_ms=60000),
        max_turns=1,
        env=env(),
        on_update=on_update,
        issue_is_active=active,
        continuation_prompt=continuation_prompt,
    )
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await CodexAppServerRunner().run(request)
    in_cpu, in_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    # Worker: the controller only reads journal records from the socket.
    spec = make_spec(work, 2000, command=codex_command(scenario, work / "worker.json"))
    result = await transport.launch(spec)
    handle = WorkerHandle(transport=transport, handle=result.handle)
    received = 0

    def on_record(record: Record) -> None:
        nonlocal received
        received += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await handle.follow(on_record)
    w_cpu, w_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    per_k_in = in_cpu * 1000 / max(count, 1) * 1000
    per_k_w = w_cpu * 1000 / max(received, 1) * 1000
    print(
        f"controller CPU per 1,000 agent events: worker {per_k_w:.1f} ms "
        f"({received} records, {w_wall:.2f} s wall) vs in-process {per_k_in:.1f} ms "
        f"({count} updates, {in_wall:.2f} s wall)"
    )


async def bench_reattach(work: Path, transport: LocalTransport, count: int) -> None:
    gate = work / f"gate-many-{count}"
    results = await asyncio.gather(
        *(
            transport.launch(
                make_spec(work, 10_000 * count + n, command=gate_command(gate),
                          protocol=AgentProtocol.COMMAND)
            )
            for n in range(count)
        )
    )
    await asyncio.sleep(2.0)
    # Each "previous controller" collected the first two records; a new one adopts them all.
    handles = [WorkerHandle(transport=transport, handle=r.handle, last_seq=2) for r in results]
    started = time.perf_counter()
    connections = []

    async def adopt(handle: WorkerHandle) -> None:
        connection = await handle.connect()
        await connection.attach(after_seq=handle.last_seq)
        await connection.live.wait()
        connections.append(connection)

    await asyncio.gather(*(adopt(h) for h in handles))
    elapsed = (time.perf_counter() - started) * 1000
    print(f"re-attach {count} live workers (connect, replay, live): {elapsed:.0f} ms")
    for connection in connections:
        await connection.close()
    gate.write_text("open")
    await asyncio.gather(*(h.follow(lambda r: None) for h in handles))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--idle", type=int, default=5)
    parser.add_argument("--many", default="20,100")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lzb", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="lorenz-worker-bench-"))
    transport = LocalTransport(state_root=root, env=env())
    try:
        interpreter_baseline()
        await bench_spawn_and_idle(work, transport, args.idle)
        await bench_events(work, transport, args.events)
        for count in (int(c) for c in args.many.split(",") if c):
            await bench_reattach(work, transport, count)
    finally:
        clean_up(root, work)


def clean_up(root: Path, work: Path) -> None:
    """Kill what is left (by the pids in the state directories), remove the directories."""
    for status in root.glob("*/worker.json"):
        pid = worker_pid(status.parent)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
