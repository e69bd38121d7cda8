"""Tracker work per drained board: how many requests, candidate scans and loop CPU seconds.

One host run (the single-host composition root, as ``lorenz WORKFLOW.md`` builds it) drains a
board of 100 Todo issues from the fake Linear server with 10 slots. Each agent is a small
``command`` script that does what a real coding agent does at the end of its work: it moves its
own issue to Done over Linear's API, then goes on for a moment (a push, a comment) and exits 0.

It prints what a user pays for that drain:

* tracker requests Lorenz sent (the agents' own mutations are not counted), by operation;
* candidate scans (full ``LorenzCandidates`` pages) and by-id reads;
* CPU seconds of the event-loop thread from the runtime's construction to the end (the
  orchestrator, the runtime and its HTTP client; the fake server runs in its own thread and
  the agents in their own processes; imports and start-up are not counted);
* CPU seconds of the whole process over the same window, less the fake server's thread: the
  loop thread plus every other thread Lorenz used (``asyncio.to_thread`` work such as
  workspace deletion, and on the older code asyncio's ``waitpid`` thread per agent), so work
  moved off the loop's thread is still counted;
* how each run ended: ``success`` or ``canceled`` (a run cut off after its issue went Done).

Run: ``.venv/bin/python bench/tracker_bench.py [--issues 100] [--slots 10]``. Prints figures
and the machine's load average; asserts nothing.

Side by side with other code (a checkout of an older commit, e.g. ``git worktree add /tmp/old
c523cb9``): ``bench/tracker_bench.py --compare /tmp/old --rounds 5`` runs this script in fresh
processes, alternating this checkout and ``/tmp/old/controller`` (same bench, same fake
server, same measurement window), and prints each run, the medians and their ratios. Works with
code from before the typed runtime events (c523cb9): listeners then received dicts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from tests.fakes.linear_server import FakeLinearServer

from lorenz.daemon.host import HostOptions, run_host
from lorenz.runtime import LorenzRuntime

if TYPE_CHECKING:
    from lorenz.model import RuntimeEvent

ROOT = Path(__file__).resolve().parents[1]

AGENT = """\
import json, os, sys, time, urllib.request
sys.stdin.read()
url, key_file, done_state, linger = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
key = open(key_file, encoding="utf-8").read().strip()
body = json.dumps({
    "operationName": "BenchAgentDone",
    "query": "mutation BenchAgentDone($id: String!, $state: String!) "
             "{ issueUpdate(id: $id, input: {stateId: $state}) { success } }",
    "variables": {"id": os.environ["LORENZ_ISSUE_ID"], "state": done_state},
}).encode()
request = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": key})
urllib.request.urlopen(request, timeout=30).read()
print("moved to Done; pushing", flush=True)
time.sleep(linger)
print("pushed", flush=True)
"""

AGENT_OPERATION = "BenchAgentDone"


def write_workflow(tmp: Path, linear: FakeLinearServer, *, slots: int, linger_s: float,
                   interval_ms: int) -> Path:
    script = tmp / "bench_agent.py"
    script.write_text(AGENT, encoding="utf-8")
    key_file = tmp / "linear.key"
    key_file.write_text(linear.api_key, encoding="utf-8")
    done = next(s for s in linear._states.values() if s.name == "Done")
    command = " ".join(shlex.quote(str(p)) for p in (
        sys.executable, script, linear.url, key_file, done.id, linger_s))
    config: dict[str, Any] = {
        "tracker": {
            "kind": "linear",
            "endpoint": linear.url,
            "api_key": "$LINEAR_API_KEY",
            "project_slug": linear.project_slug,
            "active_states": ["Todo", "In Progress"],
            "terminal_states": ["Done", "Canceled", "Duplicate"],
        },
        "polling": {"interval_ms": interval_ms},
        "workspace": {"root": str(tmp / "workspaces")},
        "agent": {"kind": "bench", "max_turns": 1, "max_concurrent_agents": slots},
        "agents": {"bench": {"protocol": "command", "command": command,
                             "stall_timeout_ms": 60000, "turn_timeout_ms": 60000}},
    }
    path = tmp / "WORKFLOW.md"
    path.write_text(f"---\n{yaml.safe_dump(config, sort_keys=False)}---\nWork on "
                    "{{ issue.identifier }}\n", encoding="utf-8")
    return path


async def drain(tmp: Path, linear: FakeLinearServer, *, issues: int, slots: int,
                linger_s: float, interval_ms: int, timeout_s: float) -> dict[str, Any]:
    for n in range(issues):
        linear.add_issue(f"ENG-{n + 1}", title=f"bench issue {n + 1}", state="Todo",
                         priority=1 + n % 4)
    workflow = write_workflow(tmp, linear, slots=slots, linger_s=linger_s,
                              interval_ms=interval_ms)
    home = tmp / "home"
    home.mkdir()
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
               "LINEAR_API_KEY": linear.api_key}
    # NB: the listener runs on the loop thread, inside the measured window: it keeps the
    # events as they come (converted after the window) and compares against one state id.
    events: list[RuntimeEvent | dict[str, Any]] = []
    holder: list[LorenzRuntime] = []
    done_id = _done_id(linear)
    ending = {"run_finished", "run_failed", "run_canceled", "run_reconciled",
              "workspace_cleanup", "poll_completed"}

    def all_done() -> bool:
        return all(i.state_id == done_id for i in linear._issues.values())

    def listen(event: RuntimeEvent | dict[str, Any]) -> None:
        # NB: code from before the typed runtime events (c523cb9) hands listeners dicts.
        events.append(event)
        runtime = holder[0]
        kind = event["type"] if isinstance(event, dict) else str(event.type)
        if kind in ending and all_done():
            snapshot = runtime.orchestrator.snapshot()
            if not snapshot.running and not snapshot.reserving:
                runtime.stop()

    started: list[float] = []
    server = next(t for t in threading.enumerate() if t.name == linear.thread_name)
    server_clock = time.pthread_getcpuclockid(server.ident or 0)

    def ready(runtime: LorenzRuntime) -> None:
        # NB: measured from here, so imports and start-up (bench/startup_bench.py) stay out.
        started.extend((time.thread_time(), time.perf_counter(), time.process_time(),
                        time.clock_gettime(server_clock)))
        if profiler is not None:
            profiler.enable()
        holder.append(runtime)
        runtime.add_event_listener(listen)

    # NB: LORENZ_BENCH_PROFILE=<file> profiles the loop's thread over the window
    # (``cProfile`` on ``time.thread_time``) into <file> for ``pstats``; the figures then
    # include the profiler's own overhead, so never compare them with unprofiled runs.
    profile_path = os.environ.get("LORENZ_BENCH_PROFILE")
    profiler = cProfile.Profile(time.thread_time) if profile_path else None
    options = HostOptions(workflow_path=str(workflow), tui=False, environ=environ)
    try:
        await asyncio.wait_for(run_host(options, ready=ready), timeout=timeout_s)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_path)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
    cpu_s = time.thread_time() - started[0]
    wall_s = time.perf_counter() - started[1]
    server_s = time.clock_gettime(server_clock) - started[3]
    process_cpu_s = time.process_time() - started[2] - server_s
    return {
        "cpu_s": cpu_s,
        "process_cpu_s": process_cpu_s,
        "wall_s": wall_s,
        "events": [e if isinstance(e, dict) else e.to_dict() for e in events],
        "runtime": holder[0],
    }


_OUTCOMES = {"run_finished": "success", "run_failed": "failed", "run_canceled": "canceled",
             "run_stalled": "stalled"}


def _done_id(linear: FakeLinearServer) -> str:
    return next(s.id for s in linear._states.values() if s.name == "Done")


def _load_transport_stack() -> None:
    """Import httpx's transport stack before the measured window.

    NB: imports stay out of the window (see ``ready``), but Lorenz imports httpcore, h11 and
    anyio's asyncio backend only at its first tracker request (start-up stays fast), which is
    inside it. Loading them here keeps that one-time cost out for both sides of ``--compare``
    (older code imported them at start-up, where this is a no-op).
    """
    import anyio._backends._asyncio  # noqa: F401
    import h11  # noqa: F401
    import httpcore
    import httpcore._backends.anyio  # noqa: F401


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One drain in this process; the figures as a dict (also what ``--json`` prints)."""
    load_before = os.getloadavg()[0]
    _load_transport_stack()
    linear = FakeLinearServer(request_limit=1_000_000)
    with linear.running_in_thread(), tempfile.TemporaryDirectory() as tmp_dir:
        result = asyncio.run(drain(Path(tmp_dir), linear, issues=args.issues, slots=args.slots,
                                   linger_s=args.linger, interval_ms=args.interval_ms,
                                   timeout_s=args.timeout))
        requests = [r for r in linear.requests if r.operation_name != AGENT_OPERATION]
    by_operation = collections.Counter(r.operation_name or "?" for r in requests)
    # A scan is one walk through the candidate pages: its first page has no cursor.
    candidate_scans = sum(1 for r in requests if r.operation_name == "LorenzIssuesByStates"
                          and not r.variables.get("after"))
    events = result["events"]
    outcomes = collections.Counter(_OUTCOMES[e["type"]] for e in events if e["type"] in _OUTCOMES)
    continuation_retries = sum(
        1 for e in events if e["type"] == "retry_scheduled" and e.get("retry_kind") ==
        "continuation")
    return {
        "code": str(Path(sys.modules["lorenz"].__file__ or "?").parents[1]),
        "wall_s": result["wall_s"],
        "cpu_s": result["cpu_s"],
        "process_cpu_s": result["process_cpu_s"],
        "requests": len(requests),
        "by_operation": dict(sorted(by_operation.items())),
        "candidate_scans": candidate_scans,
        "runs": sum(outcomes.values()),
        "outcomes": dict(sorted(outcomes.items())),
        "continuation_retries": continuation_retries,
        "load": [load_before, os.getloadavg()[0]],
    }


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    outcomes = figures["outcomes"]
    print(f"board: {args.issues} issues, {args.slots} slots, agent lingers {args.linger}s "
          f"after moving its issue to Done, poll interval {args.interval_ms} ms")
    print(f"code: {figures['code']}; load average {figures['load'][0]:.2f} -> "
          f"{figures['load'][1]:.2f} ({os.cpu_count()} CPUs)")
    print(f"drained in {figures['wall_s']:.1f} s wall")
    print(f"tracker requests        {figures['requests']:6d}   "
          + ", ".join(f"{name}={count}" for name, count in figures["by_operation"].items()))
    print(f"candidate scans         {figures['candidate_scans']:6d}")
    print(f"loop thread CPU         {figures['cpu_s']:8.2f} s")
    print(f"process CPU             {figures['process_cpu_s']:8.2f} s   (all threads but the "
          "fake server's)")
    print(f"runs                    {figures['runs']:6d}   "
          + ", ".join(f"{name}={count}" for name, count in outcomes.items()))
    print(f"runs canceled           {outcomes.get('canceled', 0):6d} of {figures['runs']}")
    print(f"continuation retries    {figures['continuation_retries']:6d}   "
          "(retry_scheduled continuation)")


def _round_line(figures: dict[str, Any]) -> str:
    return (f"{figures['code']}: requests {figures['requests']:3d}  scans "
            f"{figures['candidate_scans']:3d}  loop CPU {figures['cpu_s']:5.2f} s  process CPU "
            f"{figures['process_cpu_s']:5.2f} s  wall {figures['wall_s']:5.1f} s  canceled "
            f"{figures['outcomes'].get('canceled', 0):3d}  continuation retries "
            f"{figures['continuation_retries']:3d}  load "
            f"{figures['load'][0]:.2f}->{figures['load'][1]:.2f}")


def compare(args: argparse.Namespace) -> None:
    """Alternate fresh runs of this checkout and ``args.compare``; medians and ratios."""
    alternate(args, script=__file__, round_line=_round_line,
              figures=(("requests", "tracker requests"), ("cpu_s", "loop thread CPU"),
                       ("process_cpu_s", "process CPU")))


def alternate(
    args: argparse.Namespace,
    *,
    script: str,
    round_line: Callable[[dict[str, Any]], str],
    figures: Sequence[tuple[str, str]],
) -> None:
    """``--compare``: ``script --json`` in fresh processes, alternating this checkout and
    ``args.compare`` (``PYTHONPATH`` at each one's ``controller``); each run's line, then the
    medians of ``figures`` (key, label) and their ratios."""
    checkouts = {"this": ROOT / "controller",
                 "other": Path(args.compare).resolve() / "controller"}
    passed = board_argv(args)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    for round_number in range(1, args.rounds + 1):
        for name, controller in checkouts.items():
            environ = {**os.environ, "PYTHONPATH": str(controller)}
            result = subprocess.run([sys.executable, script, *passed], env=environ,
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise SystemExit(f"{name} run failed:\n{result.stderr[-2000:]}")
            measured = json.loads(result.stdout.strip().splitlines()[-1])
            samples[name].append(measured)
            print(f"round {round_number} {name:5} {round_line(measured)}", flush=True)
    width = max(len(label) for _, label in figures)
    for key, label in figures:
        this = statistics.median(s[key] for s in samples["this"])
        old = statistics.median(s[key] for s in samples["other"])
        print(f"median {label:{width}} this {this:8.2f}   other {old:8.2f}   ratio "
              f"{this / old:5.2f}x")


def board_parser(description: str) -> argparse.ArgumentParser:
    """The board's options (shared with ``cli_bench.py``, which drains the same board)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--issues", type=int, default=100)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--linger", type=float, default=0.3,
                        help="seconds an agent keeps working after moving its issue to Done")
    parser.add_argument("--interval-ms", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument("--compare", metavar="CHECKOUT",
                        help="alternate runs of this code and CHECKOUT/controller")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (--compare)")
    parser.add_argument("--no-login-shell", action="store_true",
                        help="cli_bench.py only: agents.bench.login_shell: false (bash -c)")
    parser.add_argument("--pages", action="store_true",
                        help="cli_bench.py only: each worker files the pages it wrote by cause "
                        "(slow: the CPU figures of such a run are not the product's)")
    parser.add_argument("--keep-log", metavar="PATH",
                        help="cli_bench.py only: the lorenz log, each line prefixed with the "
                        "seconds since the process's start")
    return parser


def board_argv(args: argparse.Namespace) -> list[str]:
    """The options a ``--compare`` round passes on to each side's run (with ``--json``)."""
    return ["--issues", str(args.issues), "--slots", str(args.slots), "--linger",
            str(args.linger), "--interval-ms", str(args.interval_ms), "--timeout",
            str(args.timeout), "--json", *(["--no-login-shell"] if args.no_login_shell else []),
            *(["--pages"] if args.pages else [])]


def board_main(
    description: str,
    *,
    measure: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[argparse.Namespace, dict[str, Any]], None],
    compare: Callable[[argparse.Namespace], None],
) -> None:
    """Parse the board's options; compare, or measure once and print (``--json``: one line)."""
    args = board_parser(description).parse_args()
    if args.compare:
        compare(args)
        return
    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
    else:
        report(args, figures)


def main() -> None:
    board_main((__doc__ or "").splitlines()[0], measure=measure, report=report, compare=compare)


if __name__ == "__main__":
    main()
