"""Start-up cost: time (and CPU) to the first tracker request, and ``lorenz validate``.

    .venv/bin/python bench/startup_bench.py [--runs 20]

The package is byte-compiled first (``compileall``), so no sample pays for writing ``.pyc``
files: a first import after an edit costs several times a warm one. Each sample is a fresh
``lorenz`` process in a temp folder:

* **first tracker request** — ``lorenz WORKFLOW.md --no-tui`` against the local Linear fake
  (``tests/fakes/linear_server.py``, served from a thread of this process): wall time from the
  spawn to the fake receiving the first GraphQL request, and the CPU time (user + system) the
  process had used by then. Also with the files tracker: wall time to the first
  ``poll_completed`` event in the event log (the files tracker makes no network request);
* **``lorenz validate``** — wall and CPU time of the whole process (``wait4`` rusage).

Prints min/p50/p90/max of each (on a shared machine the minimum is the least disturbed
sample), the 1-minute load average before and after each series, a bare ``python -c pass``
for comparison, and the slowest imports of run mode (``-X importtime``). Targets: first
request ≤ 1 s, ``validate`` ≤ 300 ms.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.linear_server import FakeLinearServer  # noqa: E402  (fakes live with tests)

LORENZ = Path(sys.executable).with_name("lorenz")
HANG_GUARD_S = 60.0
T = TypeVar("T")

WORKFLOW = """---
tracker:
{tracker}
polling:
  interval_ms: 30000
workspace:
  root: workspaces
agent:
  kind: idle
agents:
  idle:
    protocol: command
    command: "true"
logging:
  log_file: events.jsonl
---
Work on {{{{ issue.identifier }}}}.
"""


def summary(label: str, samples: list[float], unit: str = "ms") -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (
        f"{label:<44} min {ordered[0]:7.1f}   p50 {statistics.median(ordered):7.1f}   "
        f"p90 {p90:7.1f}   max {ordered[-1]:7.1f} {unit}   (n={len(ordered)})"
    )


def load_average() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def series(loads: dict[str, str], name: str, runs: int, sample: Callable[[], T]) -> list[T]:
    """``runs`` samples of ``sample``; records the 1-minute load before and after in ``loads``."""
    before = os.getloadavg()[0]
    samples = [sample() for _ in range(runs)]
    loads[name] = f"[load {before:.2f} -> {os.getloadavg()[0]:.2f}]"
    return samples


def run_with_rusage(command: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one process run to completion."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = (time.perf_counter() - started) * 1000.0
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{command} exited {process.returncode}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)


def first_linear_request(folder: Path, linear: FakeLinearServer) -> tuple[float, float]:
    """(wall ms, CPU ms) from spawn to the fake's first request."""
    tracker = (
        f"  kind: linear\n  endpoint: {linear.url}\n  api_key: $LINEAR_API_KEY\n"
        f"  project_slug: {linear.project_slug}"
    )
    (folder / "WORKFLOW.md").write_text(WORKFLOW.format(tracker=tracker), encoding="utf-8")
    env = {**os.environ, "LINEAR_API_KEY": linear.api_key}
    seen = len(linear.requests)
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(LORENZ), "WORKFLOW.md", "--no-tui"],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(linear.requests) > seen, "the first tracker request")
        wall = (time.perf_counter() - started) * 1000.0
        times = psutil.Process(process.pid).cpu_times()
        cpu = (times.user + times.system) * 1000.0
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=HANG_GUARD_S)
    return wall, cpu


def first_files_poll(folder: Path) -> float:
    """Wall ms from spawn to the first ``poll_completed`` event of a files-tracker run."""
    (folder / "issues").mkdir(exist_ok=True)
    tracker = "  kind: files\n  path: issues"
    (folder / "WORKFLOW.md").write_text(WORKFLOW.format(tracker=tracker), encoding="utf-8")
    events = folder / "events.jsonl"
    events.unlink(missing_ok=True)

    def polled() -> bool:
        try:
            lines = events.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return False
        return any(json.loads(line).get("type") == "poll_completed" for line in lines if line)

    started = time.perf_counter()
    process = subprocess.Popen(
        [str(LORENZ), "WORKFLOW.md", "--no-tui"],
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(polled, "the first poll")
        return (time.perf_counter() - started) * 1000.0
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=HANG_GUARD_S)


def slowest_imports(folder: Path, *, count: int = 8) -> list[str]:
    probe = "import lorenz.cli.run, lorenz.daemon.host, lorenz.daemon.logs"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe],
        cwd=folder, capture_output=True, text=True, check=True,
    )
    rows: list[tuple[int, str]] = []
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if match and len(match.group(2)) <= 3:  # top-level and direct children only
            rows.append((int(match.group(1)), match.group(3)))
    rows.sort(reverse=True)
    return [f"  {us / 1000:7.1f} ms  {name}" for us, name in rows[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = dict(os.environ)
    # NB: a sample that writes .pyc files measures the compiler, not the start-up.
    if not compileall.compile_dir(str(ROOT / "controller" / "lorenz"), quiet=1):
        raise SystemExit("compileall failed")
    with tempfile.TemporaryDirectory(prefix="lorenz-startup-") as scratch:
        folder = Path(scratch)
        (folder / "issues").mkdir()
        (folder / "WORKFLOW.md").write_text(
            WORKFLOW.format(tracker="  kind: files\n  path: issues"), encoding="utf-8"
        )
        loads: dict[str, str] = {}
        bare = series(loads, "bare", args.runs, lambda: run_with_rusage(
            [sys.executable, "-c", "pass"], cwd=folder, env=env))
        validate = series(loads, "validate", args.runs, lambda: run_with_rusage(
            [str(LORENZ), "validate", "WORKFLOW.md"], cwd=folder, env=env))
        files = series(loads, "files", args.runs, lambda: first_files_poll(folder))
        with FakeLinearServer().running_in_thread() as linear:
            linear.add_issue("ENG-1", title="Something", state="Backlog")
            linear_samples = series(loads, "linear", args.runs,
                                    lambda: first_linear_request(folder, linear))
        print(f"machine: {os.cpu_count()} CPUs, load average now {load_average()} "
              "(1/5/15 min; each series shows its 1-min load before -> after)")
        print(summary("python -c pass (wall)", [w for w, _ in bare]), loads["bare"])
        print(summary("lorenz validate (wall)", [w for w, _ in validate]), loads["validate"])
        print(summary("lorenz validate (CPU)", [c for _, c in validate]))
        print(summary("first tracker request, Linear fake (wall)", [w for w, _ in linear_samples]),
              loads["linear"])
        print(summary("first tracker request, Linear fake (CPU)", [c for _, c in linear_samples]))
        print(summary("first poll completed, files tracker (wall)", files), loads["files"])
        print("slowest imports of run mode (cumulative):")
        print("\n".join(slowest_imports(folder)))
    print("targets: first request <= 1000 ms, lorenz validate <= 300 ms")


if __name__ == "__main__":
    main()
