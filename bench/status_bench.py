"""``lorenz status`` cold wall time: a fresh interpreter per run, against a real daemon.

    .venv/bin/python bench/status_bench.py [--runs 30] [--http]

Starts one daemon (``lorenz WORKFLOW.md --feature daemon``, no issues) in a temp folder, then
times ``--runs`` cold ``lorenz status`` processes end to end (fork/exec, interpreter start,
imports, lease read, one request over the unix socket — or over HTTP with ``--http`` — and the
printout), plus the same against a workflow without a daemon (the ``daemon_not_running``
path). Prints p50/p90/max, the interpreter's bare start for comparison, and the slowest
imports of one run (``-X importtime``). Target (issue 5): ≤ 300 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.daemon.harness import (  # noqa: E402  (the harness lives with the tests)
    CLI,
    DaemonProcess,
    daemon_environ,
    write_daemon_workflow,
)

LORENZ = Path(sys.executable).with_name("lorenz")


def timed(command: list[str], *, env: dict[str, str], cwd: Path, expect: int) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True)
    elapsed = time.perf_counter() - started
    if result.returncode != expect:
        raise SystemExit(f"{command} exited {result.returncode}: {result.stderr.decode()}")
    return elapsed * 1000.0


def summary(label: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (
        f"{label:<38} p50 {statistics.median(ordered):6.1f} ms   p90 {p90:6.1f} ms"
        f"   max {ordered[-1]:6.1f} ms   (n={len(ordered)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--http", action="store_true", help="serve HTTP (--port 0), not a socket")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="lzb-", dir="/tmp"))
    try:
        runtime_dir = work / "run"
        runtime_dir.mkdir()
        home = work / "home"
        home.mkdir()
        env = daemon_environ(runtime_dir, home)
        workflow = write_daemon_workflow(work / "wf", issues=())
        extra = ["--port", "0"] if args.http else []
        daemon = DaemonProcess(
            workflow, env=env, args=["--feature", "daemon", *extra], output=work / "daemon.log"
        ).start()
        try:
            lease = daemon.wait_ready()
            print(f"daemon pid {daemon.pid} endpoint {lease['endpoint']}")
            script = [str(LORENZ)] if LORENZ.exists() else CLI
            bare = [timed([sys.executable, "-c", "pass"], env=env, cwd=work, expect=0)]
            bare += [
                timed([sys.executable, "-c", "pass"], env=env, cwd=work, expect=0)
                for _ in range(args.runs - 1)
            ]
            running = [
                timed([*script, "status"], env=env, cwd=workflow.parent, expect=0)
                for _ in range(args.runs)
            ]
            as_json = [
                timed([*script, "status", "--json"], env=env, cwd=workflow.parent, expect=0)
                for _ in range(args.runs)
            ]
            empty = work / "none"
            empty.mkdir()
            (empty / "WORKFLOW.md").write_text("---\n---\n")
            missing = [
                timed([*script, "status"], env=env, cwd=empty, expect=1) for _ in range(args.runs)
            ]
            transport = "http" if args.http else "unix socket"
            print(summary("python -c pass (interpreter only)", bare))
            print(summary(f"lorenz status ({transport})", running))
            print(summary(f"lorenz status --json ({transport})", as_json))
            print(summary("lorenz status (no daemon: exit 1)", missing))
            trace = subprocess.run(
                [sys.executable, "-X", "importtime", *CLI[1:], "status"],
                env=env,
                cwd=workflow.parent,
                capture_output=True,
                text=True,
            )
            rows: list[tuple[int, str]] = []
            for line in trace.stderr.splitlines():
                parts = line.split("|")
                if not line.startswith("import time:") or len(parts) != 3:
                    continue
                if not parts[1].strip().isdigit():
                    continue  # the header line
                rows.append((int(parts[1]), parts[2].strip()))
            print("slowest imports (cumulative):")
            for cumulative, name in sorted(rows, reverse=True)[:8]:
                print(f"  {cumulative / 1000.0:6.1f} ms  {name}")
        finally:
            daemon.terminate()
            daemon.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
