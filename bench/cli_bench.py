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
  the runs ended (from the log);
* issue #35's figures of the whole tree. The tree is a cgroup v2 made under ``/sys/fs/cgroup``
  when one can be made (its ``cpu.stat`` counts every process ever in it, detached ones
  included), else the subreaper's ``RUSAGE_CHILDREN`` (the same processes, once reaped). The
  fake agents record their own CPU (``RUSAGE_SELF`` as their last act, then ``os._exit``: no
  interpreter teardown left uncounted) and their start and end times in a file, so the bench
  prints the *orchestration* CPU (the tree minus the agents). NB: ``bash -c``/``bash -lc``
  with one command execs it, and ``RUSAGE_SELF`` goes on across an exec: the shell's own CPU
  (the login profile's included) is in the agent's figure and subtracted with it; the bench
  prints the login shell's cost per run on its own line instead (``bash -lc true`` with the
  agents' environment). Also the peak PSS of the tree without the agents (psutil
  ``memory_full_info().pss``, sampled every 0.25 s; at the peak also split by process — the
  ``lorenz`` process, the launcher, the workers and a worker's own pages, USS) and the PSS per
  extra live run, the first
  dispatch latency (the ``lorenz`` process's first tracker request, when the waiting issues
  first appear to it, to the first agent's start; also from the process's start) and the peak
  number of agents alive at once (and their mean over the drain);
* the orchestration CPU by process: each launcher, launch child and worker writes its own
  ``RUSAGE_SELF`` as it ends (``lorenz.workers.profiling``, through ``LORENZ_PROFILE_DIR``);
  with ``LORENZ_PROFILE_CPROFILE=1`` in the bench's environment each also writes a cProfile
  (kept in ``LORENZ_PROFILE_DIR`` when the bench is given one);
* with ``--pages``, a worker's own pages by cause (``lorenz.workers.written_pages``: compared
  with the launcher's at the worker's end — written back unchanged, code objects, other
  objects' fields, reference counts only, memory of no known object), median over the workers.
  Slow: the CPU figures of such a run are not the product's.

The drain ends when every issue is Done and every run that started has ended (its end logged);
then the process gets SIGTERM. Runs: ``.venv/bin/python bench/cli_bench.py``; side by side with
an older checkout: ``--compare /tmp/old --rounds 5`` (``PYTHONPATH`` points at each checkout's
``controller``), or with a commit: ``--compare HEAD~1`` (exported with ``git archive`` into a
temporary directory). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
from bench.tracker_bench import AGENT, AGENT_OPERATION, alternate, board_main, write_workflow
from tests.fakes.linear_server import FakeLinearServer

ROOT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36
RUN_ENDS = ("run_finished", "run_failed", "run_canceled", "run_stalled")
# NB: the text log format: ``... type=run_finished ...`` and ``identifier=ENG-1`` (JSON too).
_EVENT = re.compile(r" type=(\w+)|\"type\": \"(\w+)\"")
_IDENTIFIER = re.compile(r" identifier=(\S+)|\"identifier\": \"([^\"]+)\"")

LAUNCH = "import sys; from lorenz.cli import main; sys.exit(main())"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PSS_SAMPLE_S = 0.25
AGENT_MARK = "bench_agent.py"

# NB: prepended to the tracker bench's agent: its start time, and at exit its end time and its
# own CPU (the interpreter's, nothing it started: it starts nothing), one line each, appended
# with O_APPEND (whole lines, never interleaved) to the file the bench names in the environment.
AGENT_LEDGER = """\
import atexit as _atexit, os as _os, resource as _resource, time as _time
_ledger = _os.environ["LORENZ_BENCH_LEDGER"]
def _note(text):
    fd = _os.open(_ledger, _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o600)
    _os.write(fd, (text + "\\n").encode())
    _os.close(fd)
_note(f"start {_os.getpid()} {_time.time()!r}")
def _end():
    usage = _resource.getrusage(_resource.RUSAGE_SELF)
    _note(f"end {_os.getpid()} {_time.time()!r} {usage.ru_utime + usage.ru_stime!r}")
_atexit.register(_end)
"""

# NB: appended to the agent: a run that got to its last line notes its CPU and leaves at once.
# RUSAGE_SELF read in an atexit handler cannot count what the interpreter does after it — its
# teardown, ~10 ms of CPU a run for this agent on this machine (``python3 -c 'import
# urllib.request'`` with and without ``os._exit``) — which the tree then counted as
# orchestration: the agent's own CPU, not the orchestrator's. An agent that fails still ends
# through ``atexit`` (its exit status kept).
AGENT_EPILOGUE = """
_atexit.unregister(_end)
_end()
_os._exit(0)
"""


class Tree:
    """Every process the ``lorenz`` process starts: a cgroup v2 if one can be made, else the
    descendants of this (subreaper) process."""

    def __init__(self) -> None:
        self.cgroup: Path | None = None
        if (CGROUP_ROOT / "cgroup.controllers").is_file():
            path = CGROUP_ROOT / f"lorenz-bench-{os.getpid()}"
            try:
                path.mkdir()
                self.cgroup = path
            except OSError:
                self.cgroup = None
        self.kind = "cgroup v2" if self.cgroup is not None else "subreaper"

    def enter(self) -> None:
        """In the ``lorenz`` child before its exec: join the cgroup (its forks follow)."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text("0\n")

    def cpu_s(self) -> float:
        """CPU of the tree so far: the cgroup's, or what the reaped descendants used."""
        if self.cgroup is not None:
            for line in (self.cgroup / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
        return _children_cpu_s()

    def pids(self) -> list[int]:
        if self.cgroup is not None:
            text = (self.cgroup / "cgroup.procs").read_text()
            return [int(word) for word in text.split()]
        return [p.pid for p in psutil.Process().children(recursive=True)]

    def close(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


class PssSampler:
    """Peak PSS of the tree without the agents, and PSS per live worker, every 0.25 s."""

    def __init__(self, tree: Tree, *, lorenz_pid: int) -> None:
        self.tree = tree
        self.lorenz_pid = lorenz_pid
        self.peak_bytes = 0
        self.peak_workers = 0
        self.peak_split: dict[str, float] = {}
        """At the peak: PSS of ``lorenz``, of the launcher and of the workers, and the workers'
        median USS (the pages only each worker has: what one more live run adds at least)."""
        self.per_worker: list[float] = []
        self.base: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pss", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(PSS_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        total = 0
        base = 0
        workers = 0
        split = {"lorenz": 0.0, "launcher": 0.0, "workers": 0.0}
        worker_uss: list[float] = []
        for pid in self.tree.pids():
            with contextlib.suppress(psutil.Error, OSError):
                process = psutil.Process(pid)
                cmdline = process.cmdline()
                if any(AGENT_MARK in part for part in cmdline) or not cmdline:
                    continue  # NB: an agent (or a zombie): not orchestration
                memory = process.memory_full_info()
                pss = int(memory.pss)
                total += pss
                is_launcher = "--launcher" in cmdline and process.ppid() == self.lorenz_pid
                if pid == self.lorenz_pid or is_launcher:
                    base += pss
                    split["lorenz" if pid == self.lorenz_pid else "launcher"] += pss
                elif "--launcher" in cmdline or "worker" in cmdline:
                    workers += 1
                    split["workers"] += pss
                    worker_uss.append(float(memory.uss))
        if total > self.peak_bytes:
            self.peak_bytes = total
            self.peak_workers = workers
            self.peak_split = {**split, "worker_uss": statistics.median(worker_uss)
                               if worker_uss else 0.0}
        if workers:
            self.per_worker.append((total - base) / workers)
            self.base.append(base)


def agent_ledger(path: Path) -> dict[str, Any]:
    """Start and end times and CPU of every agent, from the ledger the agents wrote."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    cpu = 0.0
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 3 and words[0] == "start":
                starts[int(words[1])] = float(words[2])
            elif len(words) >= 4 and words[0] == "end":
                ends[int(words[1])] = float(words[2])
                cpu += float(words[3])
    edges = sorted([(t, 1) for t in starts.values()] + [(t, -1) for t in ends.values()],
                   key=lambda edge: (edge[0], edge[1]))
    live = peak = 0
    lived = 0.0  # agent-seconds, to average the live agents over the drain
    previous = edges[0][0] if edges else 0.0
    for moment, step in edges:
        lived += live * (moment - previous)
        previous = moment
        live += step
        peak = max(peak, live)
    span = edges[-1][0] - edges[0][0] if edges else 0.0
    return {"agents": len(starts), "agents_cpu_s": cpu, "peak_live_agents": peak,
            "mean_live_agents": lived / span if span > 0 else 0.0,
            "first_agent_start": min(starts.values()) if starts else None}


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
    (tmp / "bench_agent.py").write_text(AGENT_LEDGER + AGENT + AGENT_EPILOGUE, encoding="utf-8")
    ledger = tmp / "agents.ledger"
    if args.no_login_shell:
        _no_login_shell(workflow)
    home = tmp / "home"
    home.mkdir()
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LANG": "C.UTF-8", "LINEAR_API_KEY": linear.api_key,
               "TMPDIR": str(tmp), "LORENZ_BENCH_LEDGER": str(ledger)}
    if os.environ.get("PYTHONPATH"):
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    # NB: every launcher, launch child and worker writes its CPU at its end (lorenz.workers.
    # profiling); LORENZ_PROFILE_DIR given to the bench keeps them there, with
    # LORENZ_PROFILE_CPROFILE=1 a cProfile of each too.
    shell_ms = shell_cpu_ms(login=not args.no_login_shell, env=environ)
    profile_dir = Path(os.environ.get("LORENZ_PROFILE_DIR") or tmp / "profile")
    profile_dir.mkdir(parents=True, exist_ok=True)
    (profile_dir / "cpu.txt").unlink(missing_ok=True)
    environ["LORENZ_PROFILE_DIR"] = str(profile_dir)
    if os.environ.get("LORENZ_PROFILE_CPROFILE"):
        environ["LORENZ_PROFILE_CPROFILE"] = os.environ["LORENZ_PROFILE_CPROFILE"]
    (profile_dir / "pages.txt").unlink(missing_ok=True)
    if args.pages:
        environ["LORENZ_PROFILE_PAGES"] = "1"
    done_id = next(s.id for s in linear._states.values() if s.name == "Done")
    tree = Tree()
    tree_before = tree.cpu_s()
    started = time.perf_counter()
    started_at = time.time()
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCH, str(workflow)], env=environ, cwd=tmp,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,  # the log
        preexec_fn=tree.enter if tree.cgroup is not None else None,
    )
    watched = psutil.Process(process.pid)
    sampler = PssSampler(tree, lorenz_pid=process.pid)
    sampler.start()
    counts: collections.Counter[str] = collections.Counter()
    ended: set[str] = set()
    lines = [0]
    finished = threading.Event()

    kept = open(args.keep_log, "wb") if args.keep_log else None  # noqa: SIM115

    def read_log() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            lines[0] += 1
            if kept is not None:
                kept.write(b"%.3f " % (time.time() - started_at) + raw)
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
    first_request_at: float | None = None
    first_request_wakeups = 0
    stop_wakeups = 0
    deadline = time.monotonic() + args.timeout
    stop_cpu = 0.0
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if first_request_cpu is None and linear.requests:
                first_request_at = time.time()  # NB: within the 20 ms of this loop
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
        sampler.stop()
        _stop(process)
    finished.wait(timeout=30)
    if kept is not None:
        kept.close()
    _reap_all(until_s=60)
    tree_s = tree.cpu_s() - tree_before
    tree.close()
    agents = agent_ledger(ledger)
    breakdown = cpu_breakdown(profile_dir / "cpu.txt")
    pages = written_pages(profile_dir / "pages.txt")
    first_agent = agents["first_agent_start"]
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
        "tree_kind": tree.kind,
        "agents": agents["agents"],
        "agents_cpu_s": agents["agents_cpu_s"],
        "orchestration_cpu_s": tree_s - agents["agents_cpu_s"],
        "peak_pss_mib": sampler.peak_bytes / 2**20,
        "pss_per_worker_mib": (statistics.median(sampler.per_worker) / 2**20
                               if sampler.per_worker else 0.0),
        "peak_pss_split_mib": {k: v / 2**20 for k, v in sampler.peak_split.items()},
        "peak_workers": sampler.peak_workers,
        "first_dispatch_s": (first_agent - first_request_at
                             if first_agent is not None and first_request_at is not None
                             else float("nan")),
        "first_dispatch_from_start_s": (first_agent - started_at if first_agent is not None
                                        else float("nan")),
        "peak_live_agents": agents["peak_live_agents"],
        "mean_live_agents": agents["mean_live_agents"],
        "breakdown": breakdown,
        "written_pages": pages,
        "shell_cpu_ms": shell_ms,
    }


def shell_cpu_ms(*, login: bool, env: dict[str, str], runs: int = 20) -> float:
    """Median CPU of the shell around an agent (``bash -lc true`` or ``bash -c true``), in ms.

    NB: the shell execs the agent's one command, so its CPU lands in the agent's own figure and
    is subtracted with it: this says what it was, on a line of its own.
    """
    samples = []
    for _ in range(runs):
        before = _children_cpu_s()
        subprocess.run(["bash", "-lc" if login else "-c", "true"], env=env, check=False)
        samples.append(1000 * (_children_cpu_s() - before))
    return statistics.median(samples)


def cpu_breakdown(path: Path) -> dict[str, tuple[int, float]]:
    """Processes and CPU seconds per kind (launcher, launch, worker) from their end lines."""
    kinds: dict[str, tuple[int, float]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 4:
                count, total = kinds.get(words[0], (0, 0.0))
                kinds[words[0]] = (count + 1, total + float(words[2]) + float(words[3]))
    return kinds


def written_pages(path: Path) -> dict[str, float]:
    """The median worker's own pages by cause, in MiB, from their end lines (``--pages``), and
    how many workers reported."""
    rows: list[dict[str, int]] = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            rows.append({k: int(v) for k, _, v in (w.partition("=") for w in line.split()[2:])})
    if not rows:
        return {}
    page_mib = os.sysconf("SC_PAGE_SIZE") / 2**20
    median = {key: statistics.median(row[key] for row in rows) * page_mib for key in rows[0]}
    return {**median, "workers": float(len(rows))}


def _no_login_shell(workflow: Path) -> None:
    """``agents.bench.login_shell: false`` in the workflow (``--no-login-shell``)."""
    text = workflow.read_text(encoding="utf-8")
    marker = '"stall_timeout_ms"' if '"stall_timeout_ms"' in text else "stall_timeout_ms:"
    head, _, tail = text.partition(marker)
    indent = head[head.rfind("\n") + 1:]
    workflow.write_text(f"{head}login_shell: false\n{indent}{marker}{tail}", encoding="utf-8")


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
    print(f"whole tree ({figures['tree_kind']}): orchestration CPU "
          f"{figures['orchestration_cpu_s']:.2f} s (tree {figures['tree_cpu_s']:.2f} s less "
          f"{figures['agents']} agents' own {figures['agents_cpu_s']:.2f} s; "
          f"{1000 * figures['orchestration_cpu_s'] / max(1, figures['agents']):.1f} ms per run)")
    print(f"the agent's shell           {figures['shell_cpu_ms']:6.1f} ms  "
          f"({'bash -c' if args.no_login_shell else 'bash -lc'} true, median; in the agents' "
          "own CPU, not in the orchestration figure)")
    print(f"peak PSS without agents     {figures['peak_pss_mib']:6.1f} MiB "
          f"(per live run {figures['pss_per_worker_mib']:.1f} MiB, median of samples)")
    split = figures.get("peak_pss_split_mib") or {}
    if split:
        workers = max(1, figures["peak_workers"])
        print(f"  at the peak, by process     lorenz {split['lorenz']:.1f}, launcher "
              f"{split['launcher']:.1f}, {figures['peak_workers']} workers {split['workers']:.1f} "
              f"MiB ({split['workers'] / workers:.1f} each; {split['worker_uss']:.1f} of it "
              "each worker's own pages, USS)")
    pages = figures.get("written_pages") or {}
    if pages:
        print(f"  a worker's own pages       {pages['own']:6.2f} MiB (median of "
              f"{int(pages['workers'])} workers, --pages): unchanged {pages['unchanged']:.2f}, "
              f"code {pages['code']:.2f}, objects {pages['objects']:.2f}, counts "
              f"{pages['counts']:.2f}, other {pages['other']:.2f}; libraries' data "
              f"{pages['libraries']:.2f} more; of all, not written by the worker's own Python "
              f"(the launcher's writes after the fork, the fork's after-fork work) "
              f"{pages.get('inherited', 0.0):.2f}")
    print(f"first dispatch              {figures['first_dispatch_s']:6.2f} s   "
          f"(first tracker request -> first agent start; "
          f"{figures['first_dispatch_from_start_s']:.2f} s from the process's start)")
    print(f"peak live agents            {figures['peak_live_agents']:6d}   "
          f"(of {args.slots} slots; {figures['mean_live_agents']:.1f} on average from the "
          "first agent's start to the last one's end)")
    breakdown = figures.get("breakdown") or {}
    if breakdown:
        counted = figures["lorenz_cpu_s"] + figures["agents_cpu_s"]
        print("orchestration CPU by process (ms per run):")
        runs = max(1, figures["agents"])
        print(f"  lorenz (controller)       {figures['lorenz_cpu_s']:6.2f} s "
              f"{1000 * figures['lorenz_cpu_s'] / runs:6.1f}  "
              f"(after its first request {figures['lorenz_cpu_after_first_request_s']:.2f} s)")
        for kind, (count, cpu) in sorted(breakdown.items()):
            counted += cpu
            print(f"  {kind:<10} x{count:<4}       {cpu:6.2f} s {1000 * cpu / runs:6.1f}  "
                  f"({1000 * cpu / max(1, count):.1f} ms each)")
        rest = figures["tree_cpu_s"] - counted
        print(f"  the rest (hooks, unreported ends)          {rest:6.2f} s "
              f"{1000 * rest / runs:6.1f}")


FIGURES = (("lorenz_cpu_s", "lorenz CPU"),
           ("lorenz_cpu_after_first_request_s", "lorenz CPU after 1st request"),
           ("wakeups_after_first_request", "lorenz wake-ups after 1st request"),
           ("others_cpu_s", "launcher+workers+agents CPU"), ("tree_cpu_s", "whole tree CPU"),
           ("requests", "tracker requests"), ("log_lines", "log lines"),
           ("orchestration_cpu_s", "orchestration CPU (tree - agents)"),
           ("peak_pss_mib", "peak PSS without agents MiB"),
           ("pss_per_worker_mib", "PSS per live run MiB"),
           ("first_dispatch_s", "first dispatch s"),
           ("first_dispatch_from_start_s", "first dispatch from start s"),
           ("peak_live_agents", "peak live agents"),
           ("mean_live_agents", "mean live agents"))


def _round_line(figures: dict[str, Any]) -> str:
    return (f"{figures['code']}: lorenz CPU {figures['lorenz_cpu_s']:5.2f} s (after 1st request "
            f"{figures['lorenz_cpu_after_first_request_s']:5.2f} s)  others "
            f"{figures['others_cpu_s']:5.2f} s  requests {figures['requests']:3d}  log lines "
            f"{figures['log_lines']:5d}  wall {figures['wall_s']:5.1f} s  orchestration "
            f"{figures['orchestration_cpu_s']:5.2f} s  PSS {figures['peak_pss_mib']:5.1f} MiB "
            f"(run {figures['pss_per_worker_mib']:4.1f})  first dispatch "
            f"{figures['first_dispatch_s']:4.2f} s  live peak {figures['peak_live_agents']} mean "
            f"{figures['mean_live_agents']:.1f}  ends "
            f"{figures['outcomes']}  load {figures['load'][0]:.2f}->{figures['load'][1]:.2f}")


def compare(args: argparse.Namespace) -> None:
    """Alternate fresh runs of this checkout and ``args.compare``; medians and ratios.

    ``args.compare`` is a checkout, or a git revision of this one (``HEAD~1``: the previous
    commit), exported into a temporary directory for the comparison."""
    if Path(args.compare).is_dir():
        alternate(args, script=__file__, round_line=_round_line, figures=FIGURES)
        return
    with tempfile.TemporaryDirectory(prefix="lorenz-bench-") as exported:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.compare],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise SystemExit(f"--compare {args.compare}: neither a directory nor a revision: "
                             f"{archive.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tar", "-x", "-C", exported], input=archive.stdout, check=True)
        print(f"other = {args.compare} ({exported})", flush=True)
        args.compare = exported
        alternate(args, script=__file__, round_line=_round_line, figures=FIGURES)


def main() -> None:
    board_main((__doc__ or "").splitlines()[0], measure=measure, report=report, compare=compare)


if __name__ == "__main__":
    main()
