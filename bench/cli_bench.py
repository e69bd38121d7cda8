"""The tracker bench's drain as a user runs it: ``lorenz WORKFLOW.md`` in a process of its own.

``bench/tracker_bench.py`` drives the runtime inside the bench process (``run_host`` with no
attachments), so it leaves out what the command line adds around it: logging configured from
the workflow (every runtime event is a log line, scrubbed and given its run's context), the
log attachment that follows each snapshot, and start-up. Issue #11's figures came from outside
the process, in a side-by-side run; this bench measures the same way. It drains the same board
(100 Todo issues on the fake Linear server, 10 slots, agents that move their own issue to Done
and then linger) with ``python -c 'lorenz.cli.main()' WORKFLOW.md`` and prints:

* the ``lorenz`` process's CPU seconds (user + system, from ``/proc``), in all and from its
  first tracker request on (start-up excluded), read just before it is stopped;
* its wake-ups over that window: voluntary context switches, i.e. waits that blocked (mostly
  the event loop's ``epoll_wait``) — a count, so far less noisy than CPU seconds;
* the CPU seconds of everything else the run started (launcher, workers, agents), which the
  process's own figure leaves out: the bench makes itself the child subreaper of the tree, so
  every process of it is reaped here and counted in this process's ``RUSAGE_CHILDREN``;
* tracker requests and candidate scans (as ``tracker_bench.py``), log lines written, and how
  the runs ended (from the log).

The drain ends when every issue is Done and every run that started has ended (its end logged);
then the process gets SIGTERM. Runs: ``.venv/bin/python bench/cli_bench.py``; side by side with
an older checkout: ``--compare /tmp/old --rounds 5`` (``PYTHONPATH`` points at each checkout's
``controller``). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
from bench.tracker_bench import AGENT_OPERATION, alternate, board_main, write_workflow
from tests.fakes.linear_server import FakeLinearServer

ROOT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36
RUN_ENDS = ("run_finished", "run_failed", "run_canceled", "run_stalled")
# NB: the text log format: ``... type=run_finished ...`` and ``identifier=ENG-1`` (JSON too).
_EVENT = re.compile(r" type=(\w+)|\"type\": \"(\w+)\"")
_IDENTIFIER = re.compile(r" identifier=(\S+)|\"identifier\": \"([^\"]+)\"")

LAUNCH = "import sys; from lorenz.cli import main; sys.exit(main())"


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _reap_all(*, until_s: float) -> None:
    """Wait for every descendant that is left (workers outlive their controller by design)."""
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a graceful stop, as a user's ^C), SIGKILL after 120 s; its launcher goes with it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _wakeups(process: psutil.Process) -> int:
    """Voluntary context switches of every thread: each is a wait that blocked (mostly the
    loop's ``epoll_wait``), so it counts the process's wake-ups."""
    return int(process.num_ctx_switches().voluntary)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain(args: argparse.Namespace, tmp: Path, linear: FakeLinearServer) -> dict[str, Any]:
    for n in range(args.issues):
        linear.add_issue(f"ENG-{n + 1}", title=f"bench issue {n + 1}", state="Todo",
                         priority=1 + n % 4)
    workflow = write_workflow(tmp, linear, slots=args.slots, linger_s=args.linger,
                              interval_ms=args.interval_ms)
    home = tmp / "home"
    home.mkdir()
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LANG": "C.UTF-8", "LINEAR_API_KEY": linear.api_key,
               "TMPDIR": str(tmp)}
    if os.environ.get("PYTHONPATH"):
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done_id = next(s.id for s in linear._states.values() if s.name == "Done")
    children_before = _children_cpu_s()
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(workflow)], env=environ, cwd=tmp,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # the log

    )
    watched = psutil.Process(process.pid)
    counts: collections.Counter[str] = collections.Counter()
    ended: set[str] = set()
    lines = [0]
    finished = threading.Event()

    def read_log() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            lines[0] += 1
            line = raw.decode("utf-8", "replace")
            match = _EVENT.search(line)
            if match is None:
                continue
            event = match.group(1) or match.group(2)
            counts[event] += 1
            if event in RUN_ENDS:
                who = _IDENTIFIER.search(line)
                if who is not None:
                    ended.add(who.group(1) or who.group(2))
        finished.set()

    reader = threading.Thread(target=read_log, name="bench-log", daemon=True)
    reader.start()
    first_request_cpu: float | None = None
    first_request_wakeups = 0
    stop_wakeups = 0
    deadline = time.monotonic() + args.timeout
    stop_cpu = 0.0
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if first_request_cpu is None and linear.requests:
                first_request_cpu = _cpu_s(watched)
                first_request_wakeups = _wakeups(watched)
            all_done = all(i.state_id == done_id for i in linear._issues.values())
            running = counts["run_started"] - sum(counts[e] for e in RUN_ENDS)
            if all_done and len(ended) >= args.issues and running <= 0:
                stop_cpu = _cpu_s(watched)
                stop_wakeups = _wakeups(watched)
                break
            time.sleep(0.02)
        else:
            raise SystemExit(f"not drained in {args.timeout} s (or lorenz exited "
                             f"{process.poll()}); events {dict(counts)}")
        wall_s = time.perf_counter() - started
    finally:
        # NB: on every way out, a timeout included: a lorenz left running outlives the bench.
        _stop(process)
    finished.wait(timeout=30)
    _reap_all(until_s=60)
    tree_s = _children_cpu_s() - children_before
    requests = [r for r in linear.requests if r.operation_name != AGENT_OPERATION]
    by_operation = collections.Counter(r.operation_name or "?" for r in requests)
    scans = sum(1 for r in requests if r.operation_name == "LorenzIssuesByStates"
                and not r.variables.get("after"))
    return {
        "code": os.environ.get("PYTHONPATH") or str(ROOT / "controller"),
        "wall_s": wall_s,
        "lorenz_cpu_s": stop_cpu,
        "lorenz_cpu_after_first_request_s": stop_cpu - (first_request_cpu or 0.0),
        "wakeups_after_first_request": stop_wakeups - first_request_wakeups,
        "tree_cpu_s": tree_s,
        "others_cpu_s": tree_s - stop_cpu,
        "requests": len(requests),
        "by_operation": dict(sorted(by_operation.items())),
        "candidate_scans": scans,
        "log_lines": lines[0],
        "outcomes": {e: counts[e] for e in RUN_ENDS if counts[e]},
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    _become_subreaper()
    load_before = os.getloadavg()[0]
    linear = FakeLinearServer(request_limit=1_000_000)
    with linear.running_in_thread(), tempfile.TemporaryDirectory() as tmp_dir:
        figures = drain(args, Path(tmp_dir), linear)
    figures["load"] = [load_before, os.getloadavg()[0]]
    return figures


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    print(f"code: {figures['code']}; load average {figures['load'][0]:.2f} -> "
          f"{figures['load'][1]:.2f} ({os.cpu_count()} CPUs)")
    print(f"drained in {figures['wall_s']:.1f} s wall (from the process's start)")
    print(f"lorenz process CPU          {figures['lorenz_cpu_s']:6.2f} s   "
          f"({figures['lorenz_cpu_after_first_request_s']:.2f} s from its first tracker request)")
    print(f"lorenz wake-ups             {figures['wakeups_after_first_request']:6d}   "
          "(voluntary context switches from its first tracker request)")
    print(f"launcher, workers, agents   {figures['others_cpu_s']:6.2f} s   "
          f"(the whole tree: {figures['tree_cpu_s']:.2f} s)")
    print(f"tracker requests            {figures['requests']:6d}   "
          + ", ".join(f"{k}={v}" for k, v in figures["by_operation"].items()))
    print(f"candidate scans             {figures['candidate_scans']:6d}")
    print(f"log lines                   {figures['log_lines']:6d}")
    print("run ends                    " + ", ".join(
        f"{k}={v}" for k, v in figures["outcomes"].items()))


FIGURES = (("lorenz_cpu_s", "lorenz CPU"),
           ("lorenz_cpu_after_first_request_s", "lorenz CPU after 1st request"),
           ("wakeups_after_first_request", "lorenz wake-ups after 1st request"),
           ("others_cpu_s", "launcher+workers+agents CPU"), ("tree_cpu_s", "whole tree CPU"),
           ("requests", "tracker requests"), ("log_lines", "log lines"))


def _round_line(figures: dict[str, Any]) -> str:
    return (f"{figures['code']}: lorenz CPU {figures['lorenz_cpu_s']:5.2f} s (after 1st request "
            f"{figures['lorenz_cpu_after_first_request_s']:5.2f} s)  others "
            f"{figures['others_cpu_s']:5.2f} s  requests {figures['requests']:3d}  log lines "
            f"{figures['log_lines']:5d}  wall {figures['wall_s']:5.1f} s  ends "
            f"{figures['outcomes']}  load {figures['load'][0]:.2f}->{figures['load'][1]:.2f}")


def compare(args: argparse.Namespace) -> None:
    """Alternate fresh runs of this checkout and ``args.compare``; medians and ratios."""
    alternate(args, script=__file__, round_line=_round_line, figures=FIGURES)


def main() -> None:
    board_main((__doc__ or "").splitlines()[0], measure=measure, report=report, compare=compare)


if __name__ == "__main__":
    main()
