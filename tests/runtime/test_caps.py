"""Concurrency caps hold under load: 50 issues, real agent processes, intervals measured."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

from lorenz.model import Issue
from tests.runtime.harness import build_rig, write_agent, write_workflow

INTERVAL_AGENT = """
log = pathlib.Path(env["CAPS_LOG"])
def record(kind):
    line = f"{kind} {time.monotonic():.6f} {env['LORENZ_ISSUE_ID']} {env['LORENZ_ISSUE_STATE']}\\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line.encode())
    os.close(fd)
record("start")
time.sleep(0.15)
record("end")
"""


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))
    current = best = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


async def test_fifty_issues_never_exceed_global_or_per_state_caps(tmp_path: Path) -> None:
    log = tmp_path / "intervals.log"
    agent = write_agent(tmp_path, "caps", INTERVAL_AGENT)
    wf = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "agent": {"max_concurrent_agents": 4,
                      "max_concurrent_agents_by_state": {"In Progress": 1}},
            "agents": {"test": {"protocol": "command", "command": f"python3 {agent}",
                                "env": {"CAPS_LOG": str(log)}}},
            "tracker": {"kind": "memory", "terminal_states": ["Done"]},
        },
    )
    base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    issues = [
        Issue(id=f"i{n}", identifier=f"C-{n}", title=f"cap {n}",
              state="In Progress" if n % 5 == 0 else "Todo", priority=1 + n % 4,
              created_at=base + datetime.timedelta(seconds=n))
        for n in range(50)
    ]
    rig = build_rig(wf, issues=issues)
    occupied: list[int] = []
    rig.runtime.subscribe(lambda snap: occupied.append(len(snap.lanes.running) +
                                                       len(snap.lanes.reserving)))

    async def close_finished() -> None:
        # move each issue to Done once its first run ended, so the loop drains
        while True:
            ended = {line.split()[2] for line in log.read_text().splitlines()
                     if line.startswith("end")} if log.exists() else set()
            for issue_id in ended:
                if rig.tracker.get(issue_id).state != "Done":
                    rig.tracker.set_state(issue_id, "Done")
            if len(ended) == 50:
                return
            await asyncio.sleep(0.05)

    runner = asyncio.create_task(rig.runtime.start())
    await asyncio.wait_for(close_finished(), timeout=120)
    rig.runtime.stop()
    await asyncio.wait_for(runner, 30)

    starts: dict[str, float] = {}
    intervals: list[tuple[float, float]] = []
    progress: list[tuple[float, float]] = []
    for line in log.read_text().splitlines():
        kind, at, issue_id, *state = line.split()
        if kind == "start":
            starts[issue_id] = float(at)
        else:
            interval = (starts[issue_id], float(at))
            intervals.append(interval)
            if state == ["In", "Progress"]:
                progress.append(interval)
    assert len(intervals) == 50
    assert max_overlap(intervals) <= 4
    assert max_overlap(intervals) >= 2, "the test must actually run agents concurrently"
    assert max_overlap(progress) == 1
    assert max(occupied) <= 4
