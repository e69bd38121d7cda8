"""How much agent traffic the Codex client sustains, and what steady traffic costs in CPU.

Drives the real :class:`~lorenz.agents.codex.CodexAppServerRunner` against the scripted fake
app-server (``tests/fakes/codex_agent.py``, a real subprocess):

1. *throughput*: the fake floods ``item/agentMessage/delta`` notifications as fast as it can;
   we count the updates the runner hands to ``on_update`` per second;
2. *steady cost*: the fake sends 100 notifications per second; we measure this (controller)
   process's CPU time over the window — the fake's own CPU is not counted;
3. *big lines*: one 12 MB notification, time from write to update.

Run: ``.venv/bin/python bench/agent_bench.py [--flood 50000] [--steady-seconds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from lorenz.agents.base import AgentRunRequest
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.config import AgentLaunch
from lorenz.model import AgentUpdate, Issue

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "codex_agent.py"


class Meter:
    def __init__(self) -> None:
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, update: AgentUpdate) -> None:
        if update.event != "notification":
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += 1


async def run_scenario(folder: Path, steps: list[dict[str, Any]], meter: Meter) -> float:
    scenario = folder / f"scenario-{time.monotonic_ns()}.json"
    scenario.write_text(json.dumps({"banner": "", "turns": [{"steps": steps}]}))
    workspace = folder / "workspace"
    workspace.mkdir(exist_ok=True)
    command = " ".join(shlex.quote(p) for p in (sys.executable, str(FAKE), str(scenario)))

    async def active() -> bool:
        return False

    request = AgentRunRequest(
        issue=Issue(id="b-1", identifier="BENCH-1", title="bench", state="Todo"),
        attempt=None,
        slot_index=0,
        prompt="flood",
        workspace=workspace,
        settings=AgentLaunch(command=command, read_timeout_ms=30_000),
        max_turns=1,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")},
        on_update=meter,
        issue_is_active=active,
        continuation_prompt=lambda turn, total: "continue",
    )
    started = time.perf_counter()
    await CodexAppServerRunner().run(request)
    return time.perf_counter() - started


async def throughput(folder: Path, count: int) -> tuple[float, int]:
    meter = Meter()
    await run_scenario(folder, [{"flood": {"count": count, "rate": None}}], meter)
    assert meter.first is not None
    assert meter.last is not None
    # The turn/started notification opens the window; the flood fills it.
    return (meter.count - 1) / max(meter.last - meter.first, 1e-9), meter.count


async def steady_cpu(folder: Path, seconds: float, rate: int) -> tuple[float, int]:
    meter = Meter()
    me = psutil.Process()
    before = me.cpu_times()
    wall_before = time.perf_counter()
    await run_scenario(folder, [{"flood": {"count": int(seconds * rate), "rate": rate}}], meter)
    wall = time.perf_counter() - wall_before
    after = me.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    return 100.0 * cpu / wall, meter.count


async def big_line(folder: Path, size: int) -> float:
    meter = Meter()
    return await run_scenario(folder, [{"huge": size}], meter)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=50_000, help="notifications to flood")
    parser.add_argument("--steady-seconds", type=float, default=5.0)
    parser.add_argument("--steady-rate", type=int, default=100, help="events per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorenz-agent-bench-") as tmp:
        folder = Path(tmp)
        rate, seen = await throughput(folder, args.flood)
        print(f"codex client throughput: {rate:,.0f} events/s ({seen:,} notifications)")
        cpu, seen = await steady_cpu(folder, args.steady_seconds, args.steady_rate)
        print(
            f"controller CPU at {args.steady_rate} events/s: {cpu:.1f}% of one core "
            f"({seen} events over {args.steady_seconds:.0f} s, including spawn and handshake)"
        )
        elapsed = await big_line(folder, 12 * 1024 * 1024)
        print(f"one 12 MB notification, whole run: {elapsed * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
