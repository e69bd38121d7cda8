"""How fast a run is stopped at a spend cap: capped usage update → agent process gone.

Drives the real runners with the runtime's own spend meter (:class:`~lorenz.runtime.spending.
RunMeter` over a :class:`~lorenz.runtime.spending.Spending` with a memory ledger) against
agents that keep spending until stopped:

* ``codex``: the scripted Codex app-server (``tests/fakes/codex_agent.py``, a ``spend`` step:
  a cumulative ``thread/tokenUsage/updated`` every ``--interval`` s); stopped with
  ``turn/interrupt``, then its process group;
* ``command``: a ``command`` agent appending running totals to ``LORENZ_USAGE_FILE``; stopped
  through its process group. NB: Lorenz reads that file every 50 ms, so the figure starts when
  the line is *read* (the update Lorenz sees), as for every protocol.

For each run: ``t0`` when the meter sees the update that crosses ``budget.max_tokens_per_run``
(and requests the stop), ``t1`` when the agent's pid is gone (no process, or a zombie, polled
every millisecond from ``t0``). Prints p50/p99/max per protocol.

Run: ``.venv/bin/python bench/budget_bench.py [--runs 20] [--interval 0.05]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from lorenz.agents import AgentRunError
from lorenz.agents.base import AgentRunner, AgentRunRequest, TurnStop
from lorenz.agents.codex import CodexAppServerRunner
from lorenz.agents.command import CommandRunner
from lorenz.config import AgentLaunch, AgentProtocol
from lorenz.model import AgentUpdate, Issue, SystemClock, slot_key
from lorenz.runtime.providers import InForce
from lorenz.runtime.reporting import Reporting
from lorenz.runtime.spending import Spending
from lorenz.workflow import load_workflow

FAKE_CODEX = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "codex_agent.py"
CAP_TOKENS = 5000
"""Each update adds 1000 tokens: the fifth crosses the cap."""

COMMAND_AGENT = """\
import json, os, pathlib, sys, time
sys.stdin.read()
usage = pathlib.Path(os.environ['LORENZ_USAGE_FILE'])
n = 0
while True:
    n += 1
    with usage.open('a') as out:
        out.write(json.dumps({'input_tokens': n * 900, 'output_tokens': n * 100}) + '\\n')
    time.sleep(%r)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def one_run(
    folder: Path, *, protocol: AgentProtocol, interval: float, spending: Spending, n: int
) -> float:
    workspace = folder / f"ws-{n}"
    workspace.mkdir()
    if protocol is AgentProtocol.CODEX_APP_SERVER:
        scenario = folder / f"codex-{n}.json"
        scenario.write_text(json.dumps({"turns": [{"steps": [{"spend": {
            "input": 900, "output": 100, "interval_s": interval,
        }}]}]}))
        command = " ".join(shlex.quote(p) for p in (sys.executable, str(FAKE_CODEX), str(scenario)))
        runner: AgentRunner = CodexAppServerRunner(terminate_grace_s=1.0)
    else:
        script = folder / "spender.py"
        script.write_text(COMMAND_AGENT % interval)
        command = " ".join(shlex.quote(p) for p in (sys.executable, str(script)))
        runner = CommandRunner()
    issue = Issue(id=f"b-{n}", identifier=f"BENCH-{n}", title="bench", state="Todo")
    stop = TurnStop()
    meter = spending.meter(
        key=slot_key(issue.id, 0), slot_index=0, issue=issue, command=command, stop=stop
    )
    pids: list[int] = []
    crossed: list[float] = []

    def on_update(update: AgentUpdate) -> None:
        if update.pid is not None:
            pids.append(update.pid)
        requested = stop.requested
        meter.observe(update)
        if stop.requested and not requested:
            crossed.append(time.perf_counter())

    async def active() -> bool:
        return True

    request = AgentRunRequest(
        issue=issue,
        attempt=None,
        slot_index=0,
        prompt="spend",
        workspace=workspace,
        settings=AgentLaunch(command=command, protocol=protocol, read_timeout_ms=30_000),
        max_turns=1,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")},
        on_update=on_update,
        issue_is_active=active,
        continuation_prompt=lambda turn, total: "continue",
        stop=stop,
        scratch_dir=folder,
    )
    run = asyncio.ensure_future(runner.run(request))
    while not crossed:
        if run.done():
            run.result()
            raise RuntimeError("the run ended before its cap")
        await asyncio.sleep(0.001)
    assert pids, "the runner reported no pid"
    while not _gone(pids[-1]):
        await asyncio.sleep(0.001)
    gone = time.perf_counter()
    try:
        await run
    except AgentRunError as exc:
        if exc.code != "budget_exhausted":
            raise
    spending.forget(meter)
    return gone - crossed[0]


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per protocol")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between updates")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lorenz-budget-bench-") as tmp:
        folder = Path(tmp)
        workflow_path = folder / "WORKFLOW.md"
        workflow_path.write_text(
            f"---\ntracker: {{kind: memory}}\nbudget: {{max_tokens_per_run: {CAP_TOKENS}}}\n"
            "---\nbench\n"
        )
        workflow = load_workflow(workflow_path, environ={})
        in_force = InForce(workflow)
        clock = SystemClock()
        spending = Spending(
            reporting=Reporting(clock=clock, workflow=in_force, base_env={}),
            clock=clock,
            settings=lambda: in_force.current.settings,
            ledger=None,
        )
        print(f"cap {CAP_TOKENS} tokens per run, an update of 1000 tokens every "
              f"{args.interval:g} s, {args.runs} runs per protocol, load {os.getloadavg()[0]:.1f}")
        n = 0
        for protocol in (AgentProtocol.CODEX_APP_SERVER, AgentProtocol.COMMAND):
            figures = []
            for _ in range(args.runs):
                n += 1
                figures.append(await one_run(
                    folder, protocol=protocol, interval=args.interval, spending=spending, n=n
                ))
            ms = [f * 1000.0 for f in figures]
            print(f"{protocol.value:>18}: capped update → process gone "
                  f"p50 {statistics.median(ms):.1f} ms, p99 {_percentile(ms, 0.99):.1f} ms, "
                  f"max {max(ms):.1f} ms")
        await spending.flush()


if __name__ == "__main__":
    asyncio.run(main())
