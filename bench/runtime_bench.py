"""Runtime figures: tick time at 10k issues, refresh → agent spawn latency, retry timer lateness.

Run: ``.venv/bin/python bench/runtime_bench.py``. Prints figures; asserts nothing (machines
here are noisy — compare the numbers against the targets by eye: tick ≤ 50 ms at 10k issues,
spawn p50 ≤ 50 ms, timer lateness ≤ 20 ms).
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runtime.harness import build_rig, write_agent, write_workflow

from lorenz.model import EventType, Issue

BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def make_issues(count: int) -> list[Issue]:
    return [
        Issue(id=f"i{n}", identifier=f"B-{n}", title=f"bench {n}", state="Todo",
              priority=1 + n % 5, labels=("bench",),
              created_at=BASE + datetime.timedelta(seconds=n))
        for n in range(count)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(len(ordered) * q), len(ordered) - 1)]


async def tick_time(tmp: Path, *, issues: int, ticks: int) -> list[float]:
    agent = write_agent(tmp, "sleeper", "time.sleep(600)\n")
    wf = write_workflow(tmp, agent_script=agent, name="TICK.md",
                        front_matter={"agent": {"max_concurrent_agents": 10}})
    rig = build_rig(wf, issues=make_issues(issues), reload=False)
    await rig.runtime.poll_once()  # fills the 10 slots; later ticks are steady state
    samples = []
    for _ in range(ticks):
        started = time.perf_counter()
        await rig.runtime.poll_once()
        samples.append((time.perf_counter() - started) * 1000)
    rig.runtime.stop()
    await rig.runtime.wait_for_runs()
    return samples


async def spawn_latency(tmp: Path, *, runs: int) -> list[float]:
    agent = write_agent(tmp, "quick", "pass\n")
    wf = write_workflow(tmp, agent_script=agent, name="SPAWN.md",
                        front_matter={"polling": {"interval_ms": 600000},
                                      "tracker": {"kind": "memory", "terminal_states": ["Done"]}})
    rig = build_rig(wf, issues=[], reload=False)
    spawned: asyncio.Queue[float] = asyncio.Queue()
    rig.runtime.add_event_listener(
        lambda e: spawned.put_nowait(time.perf_counter())
        if e.type is EventType.RUN_UPDATE and e.agent_event == "session_started" else None
    )
    loop_task = asyncio.create_task(rig.runtime.start())
    await asyncio.sleep(0.2)
    samples = []
    for n in range(runs):
        rig.tracker.add(Issue(id=f"s{n}", identifier=f"S-{n}", title="spawn", state="Todo"))
        started = time.perf_counter()
        rig.runtime.request_refresh()
        at = await asyncio.wait_for(spawned.get(), 10)
        samples.append((at - started) * 1000)
        await rig.runtime.wait_for_runs()
        rig.tracker.set_state(f"s{n}", "Done")
    rig.runtime.stop()
    await loop_task
    return samples


async def timer_lateness(tmp: Path, *, runs: int) -> list[float]:
    agent = write_agent(tmp, "ok", "pass\n")
    wf = write_workflow(tmp, agent_script=agent, name="TIMER.md",
                        front_matter={"polling": {"interval_ms": 600000}})
    rig = build_rig(wf, issues=make_issues(runs), reload=False)
    loop_task = asyncio.create_task(rig.runtime.start())
    deadline = time.monotonic() + 60
    while len(rig.runtime._timers.fired) < runs and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    rig.runtime.stop()
    await loop_task
    return list(rig.runtime._timers.fired.values())


def report(name: str, samples: list[float], unit: str = "ms") -> None:
    print(f"{name:44} n={len(samples):4}  p50={percentile(samples, 0.5):8.2f}{unit}  "
          f"p90={percentile(samples, 0.9):8.2f}{unit}  max={max(samples):8.2f}{unit}  "
          f"mean={statistics.fmean(samples):8.2f}{unit}")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for count in (1000, 10000):
            report(f"tick, {count} issues (10 running)", await tick_time(tmp, issues=count,
                                                                          ticks=20))
        report("refresh → agent spawned", await spawn_latency(tmp, runs=30))
        report("retry timer lateness past due", await timer_lateness(tmp, runs=8))


if __name__ == "__main__":
    asyncio.run(main())
