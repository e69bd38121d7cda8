"""Chaos with detached workers: ``kill -9`` of the controller's process group, and of workers.

Real daemons (``--feature daemon --feature durable_claims``, a real SQLite claim store, a files
tracker whose issues never leave ``Todo``) run every agent in a detached ``lorenz worker``
(``worker.detached: true``, explicit). The scripted agent ticks on stdout (each tick is a journal
record) and appends its own start and end marks — pid, issue, slot, attempt, run handle, wall
time — to an append-only log, holding a per-slot ``flock`` while it runs (a second agent of the
slot alive at the same time logs ``dup``).

The round starts a daemon, waits for a seeded random moment (its lease taken, its claims
hydrated, ready, an agent mid-turn, any instant), SIGKILLs the daemon's whole process group and
starts the next one; now and then it also SIGKILLs a worker (while a controller runs, or between
two). Checked at the end, from the agents' marks, the workers' journals, the store and the
controllers' logs:

* no slot ran twice at once (no ``dup``; closed runs of a slot do not overlap by their marks);
* every adoptable run — a worker alive at a controller's kill and not killed itself — ran its
  agent exactly once, to its natural end, and some controller collected its final record;
* every journal's ``seq`` is 1…n without a gap, a final record only last;
* the ``last_seq`` the controllers persisted for a worker never goes backwards and never runs
  ahead of its journal, and each adoption re-attached exactly after the persisted ``last_seq``
  (``after_seq`` in the adopting controller's log): nothing relayed twice, nothing skipped;
* every killed worker's outcome follows docs/runs.md's table: killed before its final record →
  ``gone`` → a failure retry (``worker_gone``); killed after it → settled from that record.

``LORENZ_CHAOS_SEED`` replays a round (the seed is printed, and named in any failure).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.workers.journal import JOURNAL_NAME
from lorenz.workers.runner import COLLECTED_NAME
from lorenz.workers.states import list_handles, worker_pid
from tests.daemon.harness import (
    DaemonProcess,
    kill_marked,
    paired_runs,
    pid_alive,
    read_agent_log,
    write_daemon_workflow,
)
from tests.waiting import wait_until

DAEMON = ("--feature", "daemon", "--feature", "durable_claims")
BOUND_S = 120.0
"""Hang protection for one wait (a loaded 2-core machine is slow); never asserted as a speed."""

AGENT = r"""
import fcntl, json, os, random, signal, sys, time

LOG = os.environ["AGENT_LOG"]
SLOT = os.environ["LORENZ_ISSUE_ID"] + "#" + os.environ["LORENZ_SLOT"]
ATTEMPT = os.environ.get("LORENZ_ATTEMPT") or None


def record(**fields):
    line = dict(slot=SLOT, issue=os.environ.get("LORENZ_ISSUE_IDENTIFIER"),
                attempt=None if ATTEMPT is None else int(ATTEMPT),
                handle=os.environ.get("LORENZ_WORKER_HANDLE"), pid=os.getpid(), t=time.time(),
                **fields)
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


sys.stdin.read()
lock = os.open(os.path.join(os.environ["AGENT_LOCKS"], SLOT.replace("#", "_") + ".lock"),
               os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    dup = False
except BlockingIOError:
    dup = True
record(event="start", dup=dup)
if dup:
    sys.exit(3)
ticks = 0


def on_term(signum, frame):
    record(event="end", rc=-signum, ticks=ticks)
    os._exit(143)


signal.signal(signal.SIGTERM, on_term)
rng = random.Random()
deadline = time.time() + rng.uniform(float(os.environ["AGENT_MIN_S"]),
                                     float(os.environ["AGENT_MAX_S"]))
silent = rng.random() < float(os.environ["AGENT_SILENT_RATE"])
try:
    while time.time() < deadline:
        ticks += 1
        print(f"tick {ticks}", flush=True)
        time.sleep(rng.uniform(1.5, 3.0) if silent else
                   rng.uniform(0.02, float(os.environ["AGENT_TICK_S"])))
    rc = 1 if rng.random() < float(os.environ["AGENT_FAIL_RATE"]) else 0
    print("done", flush=True)
except BrokenPipeError:
    # Its worker is gone: like a real agent at the end of its output, it stops.
    record(event="end", rc="broken_pipe", ticks=ticks)
    os._exit(141)
record(event="end", rc=rc, ticks=ticks)
sys.exit(rc)
"""

AGENT_ENV = {
    "AGENT_MIN_S": "1.0",
    "AGENT_MAX_S": "3.0",
    "AGENT_TICK_S": "0.3",
    # NB: some agents are silent for seconds (a long tool call): killed with their worker, they
    # notice nothing until their next write, unless the controller kills them first.
    "AGENT_SILENT_RATE": "0.3",
    "AGENT_FAIL_RATE": "0.1",
}
MOMENTS = ("leadership", "hydrated", "ready", "mid_turn", "mid_turn", "anytime", "anytime")
ADOPTED = re.compile(r"adopting the worker of a lost controller handle=(\S+) after_seq=(\d+)")
FAILED_AS_GONE = re.compile(r"run_failed worker_gone: the worker of (\S+) ")
GONE_ERROR = re.compile(r"the worker of (\S+) ended without a final record")
ADOPTED_BY_SCAN = re.compile(r"adopting the worker of an earlier controller handle=(\S+)")


def journal_records(state_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of a worker's journal (a line being written, or torn, is not one)."""
    try:
        data = (state_dir / JOURNAL_NAME).read_bytes()
    except FileNotFoundError:
        return []
    complete, _, _ = data.rpartition(b"\n")
    return [json.loads(line) for line in complete.splitlines() if line]


def read_store(store: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql``; none while the store or its schema does not exist yet.

    NB: a plain connection, not ``mode=ro``: a read-only one cannot open a WAL store whose
    ``-shm`` file is missing ("attempt to write a readonly database"), as it is right after the
    daemon that created it or a daemon that closed it cleanly. Reading takes no write lock.
    """
    if not store.exists():
        return []
    conn = sqlite3.connect(store, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        # NB: a daemon killed right after its lease may not have created the schema yet.
        if "no such table" not in str(exc):
            raise
        return []
    finally:
        conn.close()


def failures_of_gone_workers(store: Path) -> set[str]:
    """Handles named by a failure retry's error in the store: settled as ``gone``."""
    rows = read_store(store, "SELECT last_error FROM claims WHERE last_error IS NOT NULL")
    return {h for (error,) in rows for h in GONE_ERROR.findall(str(error))}


def intent_rows(store: Path) -> dict[str, tuple[str, str, int]]:
    """handle → (slot, spawn phase, last_seq) of every claim that names a worker."""
    rows = read_store(
        store,
        "SELECT handle, slot_key, spawn_phase, last_seq FROM claims WHERE handle IS NOT NULL",
    )
    return {str(h): (str(slot), str(phase), int(seq)) for h, slot, phase, seq in rows}


@dataclasses.dataclass
class WorkerChaos:
    """One round: the daemons it started, and what it saw at each kill."""

    root: Path
    env: dict[str, str]
    state: Path
    started: list[DaemonProcess]
    rng: random.Random
    workflow: Path
    store: Path
    serial: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    persisted: dict[str, int] = dataclasses.field(default_factory=dict)
    """handle → the newest ``last_seq`` seen in the store."""
    at_start: dict[Path, dict[str, int]] = dataclasses.field(default_factory=dict)
    """daemon log → handle → ``last_seq`` in the store when that daemon started."""
    adoptable: set[str] = dataclasses.field(default_factory=set)
    """Handles whose worker was alive, without a final record, at a controller's kill."""
    killed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Handles of workers this round SIGKILLed → ``gone`` (before its final) or ``final``."""
    compensated: set[str] = dataclasses.field(default_factory=set)
    """Handles a controller settled as gone in the store: phase ``compensated``, or a failure
    retry whose error names the worker (written before the log line, so a kill may fall
    between the two)."""
    moments: list[str] = dataclasses.field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    def start(self) -> DaemonProcess:
        output = self.root / f"{next(self.serial):03}-daemon.log"
        daemon = DaemonProcess(
            self.workflow, env=self.env, args=DAEMON, output=output, session=True
        )
        # NB: nobody writes the store between a kill and this start: what it holds now is
        # exactly what the new daemon hydrates.
        self.at_start[output] = {h: seq for h, (_, _, seq) in intent_rows(self.store).items()}
        self.started.append(daemon.start())
        return daemon

    def live_workers(self) -> dict[str, int]:
        """handle → pid of every worker process that runs now."""
        found = {}
        for handle in list_handles(self.state):
            pid = worker_pid(self.state / handle)
            if pid is not None:
                found[handle] = pid
        return found

    def observe_store(self) -> None:
        """``last_seq`` per worker never goes backwards nor runs ahead of the journal."""
        rows = intent_rows(self.store)
        for handle, (slot, phase, seq) in rows.items():
            # NB: the journal is read *after* the row: it only grows, so a row that was true
            # when written is still covered now.
            written = len(journal_records(self.state / handle))
            assert seq <= written, (
                f"{slot}: the store says {seq} records of {handle} were collected; its journal "
                f"has {written} (phase {phase})"
            )
            assert seq >= self.persisted.get(handle, 0), (
                f"{slot}: last_seq of {handle} went back from {self.persisted[handle]} to {seq}"
            )
            self.persisted[handle] = seq
            if phase == "compensated":
                self.compensated.add(handle)
        self.compensated |= failures_of_gone_workers(self.store)

    def kill_a_worker(self) -> None:
        live = self.live_workers()
        if not live:
            return
        handle = self.rng.choice(sorted(live))
        os.kill(live[handle], signal.SIGKILL)
        wait_until(
            lambda: not pid_alive(live[handle]),
            timeout=BOUND_S,
            what=f"worker {handle} to die",
        )
        # NB: classified once it is dead: its journal cannot change any more.
        records = journal_records(self.state / handle)
        self.killed[handle] = "final" if records and records[-1]["kind"] == "final" else "gone"

    def wait_for_moment(self, daemon: DaemonProcess) -> None:
        moment = self.rng.choice(MOMENTS)
        self.moments.append(moment)

        def alive_or(predicate: Callable[[], bool]) -> Callable[[], bool]:
            return lambda: predicate() or not daemon.alive()

        if moment == "leadership":
            wait_until(
                alive_or(lambda: "leadership acquired" in daemon.log()),
                timeout=BOUND_S,
                what=moment,
            )
        elif moment == "hydrated":
            wait_until(
                alive_or(lambda: "claims hydrated" in daemon.log()),
                timeout=BOUND_S,
                what=moment,
            )
        else:
            daemon.wait_ready()
            if moment == "mid_turn":
                deadline = time.monotonic() + 10  # nothing may be running: kill anyway
                while time.monotonic() < deadline and not self.agents_mid_turn():
                    self.observe_store()
                    time.sleep(0.02)
                time.sleep(self.rng.uniform(0.0, 0.6))
            elif moment == "anytime":
                until = time.monotonic() + self.rng.uniform(0.0, 2.5)
                while time.monotonic() < until:
                    self.observe_store()
                    time.sleep(0.05)
        assert daemon.alive(), f"died on its own:\n{daemon.log()[-3000:]}"

    def agents_mid_turn(self) -> list[int]:
        return [
            start["pid"]
            for start, end in paired_runs(read_agent_log(self.log))
            if end is None and pid_alive(start["pid"])
        ]

    def kill_controller(self, daemon: DaemonProcess) -> None:
        daemon.kill9_group()
        self.observe_store()
        for handle in self.live_workers():
            records = journal_records(self.state / handle)
            if not (records and records[-1]["kind"] == "final"):
                self.adoptable.add(handle)


def check_marks(marks: list[dict[str, Any]]) -> None:
    """No slot ran twice at once: no ``dup`` lock finding, no overlap of closed runs."""
    assert [m for m in marks if m["event"] == "start" and m["dup"]] == []
    by_slot: dict[str, list[tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    for start, end in paired_runs(marks):
        by_slot.setdefault(start["slot"], []).append((start, end))
    for slot, runs in by_slot.items():
        runs.sort(key=lambda run: run[0]["t"])
        for (earlier, end), (later, _) in itertools.pairwise(runs):
            if end is not None:
                assert later["t"] >= end["t"], f"{slot}: runs {earlier} and {later} overlap"


def check_journals(state: Path) -> int:
    """Every journal counts 1…n without a gap; a final record only last. Returns the count."""
    handles = list_handles(state)
    for handle in handles:
        records = journal_records(state / handle)
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1)), handle
        finals = [i for i, r in enumerate(records) if r["kind"] == "final"]
        assert finals in ([], [len(records) - 1]), f"{handle}: final records at {finals}"
    return len(handles)


def worker_chaos_round(
    root: Path,
    env: dict[str, str],
    started: list[DaemonProcess],
    *,
    state: Path,
    kills: int,
    issues: int,
    worker_kill_rate: float,
    seed: int,
) -> dict[str, int]:
    names = tuple(f"W-{i}" for i in range(issues))
    store = root / "claims.db"
    agent = root / "chaos_agent.py"
    workflow = write_daemon_workflow(
        root,
        issues=names,
        agent_env=AGENT_ENV,
        agent_command=f"{sys.executable} {agent}",
        front_matter={
            "worker": {"detached": True},
            # NB: a slot per issue: no adoption waits for a slot another run holds.
            "agent": {"max_concurrent_agents": issues, "max_retry_backoff_ms": 300},
            # NB: a tenth of the runs fail, and killed workers fail theirs: the default budget
            # (3 in a row) would block a slot now and then; every issue must keep being worked.
            "retry": {"max_attempts": 100},
            "flags": {
                "claim_store.path": str(store),
                "daemon.heartbeat_ms": 200,
                "claim_store.owner_stale_ms": 600000,
                "claim_store.recovery_interval_ms": 200,
            },
        },
    )
    agent.write_text(AGENT, encoding="utf-8")
    chaos = WorkerChaos(
        root=root,
        env={**env, "LORENZ_WORKER_STATE": str(state)},
        state=state,
        started=started,
        rng=random.Random(seed),
        workflow=workflow,
        store=store,
    )
    for _ in range(kills):
        daemon = chaos.start()
        chaos.wait_for_moment(daemon)
        if chaos.rng.random() < worker_kill_rate / 2:
            chaos.kill_a_worker()  # while a controller follows it
        chaos.kill_controller(daemon)
        if chaos.rng.random() < worker_kill_rate / 2:
            chaos.kill_a_worker()  # while nobody does

    survivor = chaos.start()
    survivor.wait_ready()
    # Every adoptable run is collected by some controller: it ran to its end under one. So is
    # every run whose worker was killed after its final record (settled from that record);
    # one killed before it is failed as gone (and retried).
    awaited = chaos.adoptable - set(chaos.killed)
    settled = {h for h, outcome in chaos.killed.items() if outcome == "final"}
    gone = {h for h, outcome in chaos.killed.items() if outcome == "gone"}

    def logs() -> dict[Path, str]:
        return {p: p.read_text(encoding="utf-8", errors="replace") for p in chaos.at_start}

    def failed_as_gone() -> set[str]:
        """Settled as gone: its controller logged the failure, or (killed before it could)
        left the claim ``compensated`` — which its successor retries as a failure."""
        logged = {h for text in logs().values() for h in FAILED_AS_GONE.findall(text)}
        return logged | chaos.compensated

    def uncollected() -> set[str]:
        chaos.observe_store()
        return {h for h in awaited | settled if not (state / h / COLLECTED_NAME).exists()}

    wait_until(
        lambda: not uncollected(),
        timeout=BOUND_S,
        what=lambda: f"collected: {sorted(uncollected())}",
    )
    wait_until(
        lambda: failed_as_gone() >= gone,
        timeout=BOUND_S,
        what=lambda: f"worker_gone failures of {sorted(gone - failed_as_gone())}",
    )
    marks = read_agent_log(chaos.log)
    texts = logs()
    # (journals are read while the survivor's runs go on: only complete lines count)
    journals = check_journals(state)
    survivor.kill9_group()

    check_marks(marks)
    for handle in awaited:
        starts = [m for m in marks if m["handle"] == handle and m["event"] == "start"]
        ends = [m for m in marks if m["handle"] == handle and m["event"] == "end"]
        assert len(starts) == 1, f"the agent of {handle} ran {len(starts)} times: {starts}"
        assert [end["rc"] in (0, 1) for end in ends] == [True], f"{handle} was stopped: {ends}"
    assert not (failed_as_gone() & (awaited | settled)), "a run with a final record failed as gone"
    # Besides the workers killed here, only a launch in flight at a kill may be found gone (no
    # worker yet): its launch command is killed, and the run retried as a failure.
    spawn_races = failed_as_gone() - set(chaos.killed)
    assert not (spawn_races & chaos.adoptable), "an adoptable run failed as gone"
    adoptions = 0
    for path, text in texts.items():
        for handle, after in ADOPTED.findall(text):
            adoptions += 1
            expected = chaos.at_start[path].get(handle)
            assert expected == int(after), (
                f"{path.name} re-attached to {handle} after seq {after}; the store said "
                f"{expected}"
            )
        scanned = ADOPTED_BY_SCAN.findall(text)
        assert scanned == [], f"{path.name} adopted {scanned} by a scan (replayed from seq 1)"
    stats = {
        "kills": kills,
        "adoptable": len(awaited),
        "adoptions": adoptions,
        "workers_killed": len(chaos.killed),
        "killed_gone": len(gone),
        "spawn_races": len(spawn_races),
        "moments": len(set(chaos.moments)),
        "journals": journals,
        "runs": len([m for m in marks if m["event"] == "start"]),
    }
    assert adoptions >= 1, f"nothing was ever adopted: {stats}"
    assert awaited, f"no worker was alive at any kill: {stats}"
    return stats


def chaos_seed() -> int:
    return int(os.environ.get("LORENZ_CHAOS_SEED") or random.SystemRandom().randrange(2**32))


@pytest.fixture
def worker_state(runtime_dir: Path) -> Iterator[Path]:
    path = runtime_dir / "w"
    yield path
    # Workers outlive daemons by design: the test stops the ones its daemons started.
    kill_marked("LORENZ_WORKER_STATE", str(path))


def run_round(
    root: Path,
    env: dict[str, str],
    started: list[DaemonProcess],
    state: Path,
    *,
    kills: int,
    worker_kill_rate: float,
) -> None:
    seed = chaos_seed()
    print(f"worker chaos round: LORENZ_CHAOS_SEED={seed}")
    try:
        stats = worker_chaos_round(
            root,
            env,
            started,
            state=state,
            kills=kills,
            issues=4,
            worker_kill_rate=worker_kill_rate,
            seed=seed,
        )
    except AssertionError as exc:
        raise AssertionError(f"worker chaos failed with LORENZ_CHAOS_SEED={seed}: {exc}") from exc
    print(f"worker chaos round LORENZ_CHAOS_SEED={seed}: {stats}")


@pytest.mark.timeout(1800)
def test_kill_9_of_the_controller_at_50_random_points(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], worker_state: Path
) -> None:
    run_round(root, daemon_env, daemons, worker_state, kills=50, worker_kill_rate=0.0)


@pytest.mark.timeout(1800)
def test_kill_9_of_controllers_and_workers_at_random_points(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], worker_state: Path
) -> None:
    run_round(root, daemon_env, daemons, worker_state, kills=20, worker_kill_rate=0.6)


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_kill_9_of_the_controller_at_200_random_points(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], worker_state: Path
) -> None:
    run_round(root, daemon_env, daemons, worker_state, kills=200, worker_kill_rate=0.2)
