"""Adoption of N live workers through a real controller restart: ``kill -9``, start, re-attached.

``worker_bench.py`` times the re-attach loop of :class:`~lorenz.workers.handles.WorkerHandle`
alone. This is the whole path a user meets: a real daemon (``--feature daemon --feature
durable_claims``, a SQLite claim store, a files tracker with N issues, ``worker.detached: true``,
N slots) runs N detached workers whose agents wait, silent, on a gate file. Once every claim
says ``running``, the daemon's whole process group is SIGKILLed; once every worker has dropped
the dead controller's connection, the next daemon starts. From its start (the ``Popen``):

* *ready*: its API answers;
* *hydrated*: its ``claims hydrated`` log line (``adopting=N``);
* *adopting*: the last of its N ``adopting the worker of a lost controller`` log lines;
* *re-attached*: every worker holds a controller connection on its control socket again —
  counted from the workers' side (their socket file descriptors), so it is the attach itself,
  not the intent to attach.

``--restarts R`` repeats the kill and start R times over the same workers (each restart is
measured). The machine's load average is printed with each figure.

Run: ``.venv/bin/python bench/adoption_bench.py [--workers 100] [--restarts 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.daemon.harness import (  # noqa: E402
    DaemonProcess,
    call,
    daemon_environ,
    kill_marked,
    write_daemon_workflow,
)

from lorenz.daemon.client import Unreachable  # noqa: E402
from lorenz.workers.journal import JOURNAL_NAME, last_record  # noqa: E402
from lorenz.workers.states import list_handles, worker_pid  # noqa: E402

DAEMON = ("--feature", "daemon", "--feature", "durable_claims")
BOUND_S = 600.0
"""Hang protection only."""
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} (1/5 min) on {os.cpu_count()} CPUs"


def wait_for(predicate: object, what: str, *, timeout_s: float = BOUND_S) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def phases(store: Path) -> list[str]:
    if not store.exists():
        return []
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return [str(p) for (p,) in conn.execute("SELECT spawn_phase FROM claims")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def sockets_of(pid: int) -> int:
    """How many sockets ``pid`` holds (its listening control socket, its event loop's
    self-pipe, and one per attached client)."""
    count = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    count += 1
    return count


def log_times(text: str, marker: str) -> list[float]:
    """Wall times (epoch s) of the log lines that contain ``marker``."""
    times = []
    for line in text.splitlines():
        if marker in line and (match := LOG_TIME.match(line)):
            stamp = datetime.datetime.fromisoformat(match.group(1)).replace(tzinfo=datetime.UTC)
            times.append(stamp.timestamp())
    return times


def api_answers(daemon: DaemonProcess) -> bool:
    from lorenz.daemon.discovery import lease_file_for, read_lease

    with contextlib.suppress(Exception):
        lease = read_lease(lease_file_for(daemon.workflow))
        if lease and lease.get("pid") == daemon.pid and lease.get("endpoint"):
            with contextlib.suppress(Unreachable):
                return call(lease["endpoint"], "GET", "/api/v1/daemon").ok
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    count = args.workers
    # NB: short, under /tmp: the workers' socket paths must stay under 108 bytes.
    work = Path(tempfile.mkdtemp(prefix="lzab-", dir="/tmp"))
    state = work / "w"
    gate = work / "gate"
    root = work / "wf"
    store = root / "claims.db"
    (work / "home").mkdir()
    (work / "rt").mkdir(mode=0o700)
    env = {**daemon_environ(work / "rt", work / "home"), "LORENZ_WORKER_STATE": str(state)}
    agent = f"echo started; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 1; done; echo done"
    workflow = write_daemon_workflow(
        root,
        issues=[f"B-{n}" for n in range(count)],
        front_matter={
            "worker": {"detached": True},
            "polling": {"interval_ms": 1000},
            "agent": {"max_concurrent_agents": count},
            # NB: the agents are silent on purpose; the default stall timeout would cancel
            # them (and their workers) a minute in, in the middle of the restarts.
            "agents": {
                "recorder": {
                    "protocol": "command",
                    "command": f"sh -c {shlex.quote(agent)}",
                    "stall_timeout_ms": 3_600_000,
                    "turn_timeout_ms": 3_600_000,
                }
            },
            "flags": {"claim_store.path": str(store), "daemon.heartbeat_ms": 1000},
        },
    )
    daemons: list[DaemonProcess] = []
    try:
        first = DaemonProcess(
            workflow, env=env, args=DAEMON, output=root / "daemon-0.log", session=True
        )
        daemons.append(first.start())
        started = time.perf_counter()
        first.wait_ready(timeout_s=BOUND_S)
        wait_for(
            lambda: phases(store).count("running") == count,
            f"{count} claims in phase running",
        )
        print(
            f"{count} detached workers running {time.perf_counter() - started:.1f} s after the "
            f"first daemon started ({load()})"
        )
        workers = {h: worker_pid(state / h) for h in list_handles(state)}
        pids = [pid for pid in workers.values() if pid is not None]
        assert len(pids) == count, workers
        current = first
        for restart in range(1, args.restarts + 1):
            attached = {pid: sockets_of(pid) for pid in pids}
            current.kill9_group()
            wait_for(
                lambda attached=attached: all(
                    sockets_of(pid) == attached[pid] - 1 for pid in pids
                ),
                "every worker to drop the dead controller's connection",
            )
            output = root / f"daemon-{restart}.log"
            nxt = DaemonProcess(workflow, env=env, args=DAEMON, output=output, session=True)
            daemons.append(nxt)
            t0_wall, t0 = time.time(), time.perf_counter()
            nxt.start()
            ready_s: float | None = None
            while True:
                if ready_s is None and api_answers(nxt):
                    ready_s = time.perf_counter() - t0
                if all(sockets_of(pid) >= attached[pid] for pid in pids):
                    reattached_s = time.perf_counter() - t0
                    break
                if not nxt.alive():
                    raise SystemExit(f"the daemon died:\n{nxt.log()[-3000:]}")
                if time.perf_counter() - t0 > BOUND_S:
                    raise SystemExit("timed out waiting for every worker to be re-attached")
                time.sleep(0.02)
            wait_for(lambda nxt=nxt: api_answers(nxt), "the API")
            ready_s = ready_s if ready_s is not None else time.perf_counter() - t0
            text = nxt.log()
            hydrated = log_times(text, "claims hydrated")
            adopting = log_times(text, "adopting the worker of a lost controller")
            assert f"adopting={count}" in text, text[-3000:]
            assert len(adopting) == count, f"{len(adopting)} adoptions logged"
            print(
                f"restart {restart}: {count} live workers re-attached {reattached_s:.2f} s after "
                f"the start (ready {ready_s:.2f} s, hydrated {hydrated[0] - t0_wall:.2f} s, "
                f"last adoption logged {max(adopting) - t0_wall:.2f} s; {load()})"
            )
            current = nxt
        # The runs are whole: the gate opens and every one of them ends as a success.
        gate.write_text("open")
        wait_for(
            lambda: all(
                (last := last_record(state / h / JOURNAL_NAME)) is not None and last.is_final
                for h in workers
            ),
            "every run to end",
        )
        outcomes = [
            last.data.get("outcome")
            for h in workers
            if (last := last_record(state / h / JOURNAL_NAME)) is not None
        ]
        assert outcomes == ["success"] * count, outcomes
    finally:
        for daemon in daemons:
            if daemon.alive():
                daemon.kill9_group()
        kill_marked("LORENZ_WORKER_STATE", str(state))
        for pid in [worker_pid(state / h) for h in list_handles(state)]:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
