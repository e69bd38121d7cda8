"""Chaos: ``kill -9`` Lorenz processes at their worst moments; every issue is still worked.

Real ``lorenz`` processes (daemons with ``--feature daemon --feature durable_claims``, and plain
``--feature durable_claims`` runs) share one SQLite claim store and a files tracker whose issues
never leave ``Todo``; the recording agent of :mod:`tests.daemon.harness` appends a start and an
end mark per run to an append-only log and holds a per-slot ``flock`` while it runs. Processes
are SIGKILLed while agents run, right after ``leadership acquired``, right after ``claims
hydrated``, at a random instant, or — for a plain run beside a daemon — while the daemon keeps
running. ``claim_store.owner_stale_ms`` is 10 minutes everywhere, so only the proof of death by
pid and start time can explain a recovery within a test's lifetime.

Checked, by waiting on events (log lines, store rows, agent marks; the bounds are hang
protection only):

* the process that survives works every issue: it starts a run of each, and none stays
  ``Running`` under a dead owner or ``claimed_elsewhere`` in its snapshot;
* no agent ever found its slot's lock held (no slot ran twice at once, across incarnations),
  and closed runs of one slot never overlap by their own start and end marks;
* a slot whose run was interrupted comes back as a failure retry (attempt 1), not as new work.

``LORENZ_CHAOS_SEED`` replays a round; the seed is printed on failure.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.claims import store_path
from lorenz.config.settings import ClaimStoreSettings
from lorenz.daemon.discovery import read_lease
from lorenz.daemon.orphans import WORKFLOW_ENV, dead_owners_of, kill_orphans, marked_environment
from lorenz.leadership import FileLeaseProvider, ProcessIdentity, current_process
from tests.daemon.harness import (
    DaemonProcess,
    get_state,
    in_process,
    paired_runs,
    pid_alive,
    read_agent_log,
    try_state,
    write_daemon_workflow,
)
from tests.waiting import wait_until


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    """In-process runs (the suite's test-only switch): these tests are about the orphan sweep
    of agents that outlive a killed daemon (worker chaos: test_worker_chaos*.py)."""
    return in_process(daemon_env)

DAEMON = ("--feature", "daemon", "--feature", "durable_claims")
PLAIN = ("--feature", "durable_claims")
SLOW = {"AGENT_MIN_S": "60", "AGENT_MAX_S": "60", "AGENT_FAIL_RATE": "0"}
MIXED = {
    "AGENT_MIN_S": "0.1",
    "AGENT_MAX_S": "0.6",
    "AGENT_FAIL_RATE": "0.25",
    # NB: some runs must outlive their process, or no orphan would ever need sweeping.
    "AGENT_LONG_RATE": "0.3",
    "AGENT_LONG_MIN_S": "2",
    "AGENT_LONG_MAX_S": "4",
}
FLAGS = {"flags": {"claim_store.owner_stale_ms": 600000, "claim_store.recovery_interval_ms": 200}}
BOUND_S = 120.0
"""Hang protection for one wait (a loaded 2-core machine is slow); never asserted as a speed."""


def owner_of(process: DaemonProcess) -> str:
    """The claim owner id the process gives itself (``<host>:<pid>:<start time>``)."""
    started = psutil.Process(process.pid).create_time()
    return ProcessIdentity(host=socket.gethostname(), pid=process.pid, started_at=started).holder


def claim_rows(db: Path) -> dict[str, tuple[str, str, int | None]]:
    """slot → (owner, phase, attempt), read-only."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT slot_key, owner, phase, attempt FROM claims").fetchall()
    finally:
        conn.close()
    return {str(slot): (str(owner), str(phase), attempt) for slot, owner, phase, attempt in rows}


def db_of(root: Path, workflow: Path) -> Path:
    return store_path(
        ClaimStoreSettings(), workspace_root=root / "workspaces", workflow_path=workflow.resolve()
    )


def starts_by(log: Path, owner: str) -> list[dict[str, Any]]:
    return [e for e in read_agent_log(log) if e["event"] == "start" and e["owner"] == owner]


Mark = dict[str, Any]
"""One line of the agents' log."""


def running_agents(log: Path, owner: str, *, count: int | None = None) -> list[int]:
    """Pids of ``owner``'s agents that started, did not end, and still run.

    With ``count``: that many, or an empty list (so that a wait holds out for all of them).
    """
    pids = [
        start["pid"]
        for start, end in paired_runs(read_agent_log(log))
        if end is None and start["owner"] == owner and pid_alive(start["pid"])
    ]
    return pids if count is None or len(pids) == count else []


def check_runs(entries: list[dict[str, Any]]) -> None:
    """No slot ran twice at once: no ``dup`` lock finding, no overlap of closed runs."""
    starts = [e for e in entries if e["event"] == "start"]
    assert starts, "no agent ever ran"
    duplicates = [e for e in starts if e["dup"]]
    assert duplicates == [], f"a slot ran twice at once: {duplicates}"
    by_slot: dict[str, list[tuple[Mark, Mark | None]]] = {}
    for start, end in paired_runs(entries):
        by_slot.setdefault(start["slot"], []).append((start, end))
    for slot, runs in by_slot.items():
        runs.sort(key=lambda run: run[0]["t"])
        for (earlier, end), (later, _) in itertools.pairwise(runs):
            if end is not None:
                assert later["t"] >= end["t"], f"{slot}: runs {earlier} and {later} overlap"


def works_every_issue(
    survivor: DaemonProcess, *, issues: Sequence[str], root: Path, db: Path, lease: dict[str, Any]
) -> list[dict[str, Any]]:
    """Wait until ``survivor`` ran every issue and holds every claim; return its first runs."""
    owner = lease["holder"]
    log = root / "agent.log"
    slots = {f"{issue}#0" for issue in issues}

    def first_runs() -> dict[str, dict[str, Any]] | None:
        runs: dict[str, dict[str, Any]] = {}
        for entry in starts_by(log, owner):
            runs.setdefault(entry["slot"], entry)
        return runs if set(runs) >= slots else None

    runs = wait_until(
        first_runs,
        timeout=BOUND_S,
        what=lambda: (
            f"{owner} to run every issue (alive: {survivor.alive()}); it ran "
            f"{sorted({e['slot'] for e in starts_by(log, owner)})}:\n{survivor.log()[-3000:]}"
        ),
    )
    # No claim stays under a dead owner: every row is the survivor's.
    wait_until(
        lambda: {o for o, _, _ in claim_rows(db).values()} <= {owner},
        timeout=BOUND_S,
        what=f"every claim row to be {owner}'s: {claim_rows(db)}",
    )
    # And nothing is left "claimed elsewhere" (it would be, forever, if a row were stranded).
    wait_until(
        lambda: get_state(lease["endpoint"])["claimed_elsewhere"] == [],
        timeout=BOUND_S,
        what="claimed_elsewhere to be empty",
    )
    return [runs[slot] for slot in sorted(slots)]


# -- the two repros, one by one -------------------------------------------------------------


def test_a_third_daemon_recovers_both_dead_predecessors(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    issues = ("A-1", "A-2", "A-3")
    workflow = write_daemon_workflow(root, issues=issues, agent_env=SLOW, front_matter=FLAGS)
    db, log = db_of(root, workflow), root / "agent.log"
    first = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "first.log")
    daemons.append(first.start())
    holder = first.wait_ready()["holder"]
    orphans = wait_until(
        lambda: running_agents(log, holder, count=3),
        timeout=BOUND_S,
        what="three slow agents",
    )
    first.kill9()

    second = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "second.log")
    daemons.append(second.start())
    wait_until(
        lambda: "leadership acquired" in second.log(),
        timeout=BOUND_S,
        what="leadership acquired",
    )
    second.kill9()

    third = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "third.log")
    daemons.append(third.start())
    lease = third.wait_ready()
    assert lease["transitions"] == 2
    assert [pid for pid in orphans if pid_alive(pid)] == []  # swept before anything dispatched
    runs = works_every_issue(third, issues=issues, root=root, db=db, lease=lease)
    assert [run["attempt"] for run in runs] == [1, 1, 1]  # failure retries of the interrupted
    check_runs(read_agent_log(log))
    third.terminate()
    assert third.wait() == 0, third.log()[-3000:]


def test_a_daemon_recovers_the_owner_behind_a_lease_taken_by_a_process_that_died(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    """The first repro with the second daemon's death placed exactly: lease taken, nothing else.

    A daemon killed right after ``leadership acquired`` may or may not have hydrated; here the
    lease is taken by a process that does nothing else and dies, so the first daemon's claims
    are certainly untouched and only the proof of its death can bring them back.
    """
    issues = ("A-1", "A-2", "A-3")
    workflow = write_daemon_workflow(root, issues=issues, agent_env=SLOW, front_matter=FLAGS)
    db, log = db_of(root, workflow), root / "agent.log"
    first = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "first.log")
    daemons.append(first.start())
    holder = first.wait_ready()["holder"]
    wait_until(
        lambda: running_agents(log, holder, count=3),
        timeout=BOUND_S,
        what="three slow agents",
    )
    first.kill9()

    code = (
        "import asyncio, os, signal, sys\n"
        "from pathlib import Path\n"
        "from lorenz.leadership import FileLeaseProvider\n"
        f"asyncio.run(FileLeaseProvider(workflow_path=Path({str(workflow)!r})).acquire())\n"
        "print('leadership acquired', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    died = subprocess.run([sys.executable, "-c", code], env=daemon_env, capture_output=True)
    assert died.returncode == -9, died.stderr
    assert b"leadership acquired" in died.stdout
    taken = read_lease(FileLeaseProvider(workflow_path=workflow).path)
    assert taken is not None
    assert (taken["pid"], taken["transitions"]) != (first.pid, 0)  # the lease moved on...
    assert {o for o, _, _ in claim_rows(db).values()} == {holder}  # ...the claims did not

    third = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "third.log")
    daemons.append(third.start())
    lease = third.wait_ready()
    assert lease["transitions"] == 2
    runs = works_every_issue(third, issues=issues, root=root, db=db, lease=lease)
    assert [run["attempt"] for run in runs] == [1, 1, 1]
    check_runs(read_agent_log(log))
    third.terminate()
    assert third.wait() == 0, third.log()[-3000:]


def test_a_daemon_after_a_killed_plain_run_works_every_issue(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    issues = ("A-1", "A-2", "A-3")
    workflow = write_daemon_workflow(root, issues=issues, agent_env=SLOW, front_matter=FLAGS)
    db, log = db_of(root, workflow), root / "agent.log"
    plain = DaemonProcess(workflow, env=daemon_env, args=PLAIN, output=root / "plain.log")
    daemons.append(plain.start())
    owner = owner_of(plain)
    orphans = wait_until(
        lambda: running_agents(log, owner, count=3),
        timeout=BOUND_S,
        what=f"three slow agents of the plain run:\n{plain.log()[-3000:]}",
    )
    plain.kill9()
    assert all(pid_alive(pid) for pid in orphans)  # kill -9 leaves its agents running

    daemon = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "daemon.log")
    daemons.append(daemon.start())
    lease = daemon.wait_ready()
    assert lease["transitions"] == 0  # the plain run never held the lease
    assert [pid for pid in orphans if pid_alive(pid)] == []
    runs = works_every_issue(daemon, issues=issues, root=root, db=db, lease=lease)
    assert [run["attempt"] for run in runs] == [1, 1, 1]
    check_runs(read_agent_log(log))
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-3000:]


def test_a_running_daemon_recovers_a_plain_run_that_dies_beside_it(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    """The periodic recovery pass: no restart, the daemon just keeps running."""
    issues = ("A-1", "A-2", "A-3")
    workflow = write_daemon_workflow(root, issues=issues, agent_env=SLOW, front_matter=FLAGS)
    db, log = db_of(root, workflow), root / "agent.log"
    plain = DaemonProcess(workflow, env=daemon_env, args=PLAIN, output=root / "plain.log")
    daemons.append(plain.start())
    owner = owner_of(plain)
    orphans = wait_until(
        lambda: running_agents(log, owner, count=3),
        timeout=BOUND_S,
        what=f"three slow agents of the plain run:\n{plain.log()[-3000:]}",
    )
    daemon = DaemonProcess(workflow, env=daemon_env, args=DAEMON, output=root / "daemon.log")
    daemons.append(daemon.start())
    lease = daemon.wait_ready()
    # The plain run is alive: its slots are refused to the daemon, however often it asks.
    wait_until(
        lambda: len(get_state(lease["endpoint"])["claimed_elsewhere"]) == 3,
        timeout=BOUND_S,
        what="the daemon to find every slot claimed elsewhere",
    )
    assert starts_by(log, lease["holder"]) == []

    plain.kill9()
    runs = works_every_issue(daemon, issues=issues, root=root, db=db, lease=lease)
    assert [run["attempt"] for run in runs] == [1, 1, 1]
    assert [pid for pid in orphans if pid_alive(pid)] == []
    assert "claims recovered" in daemon.log()
    check_runs(read_agent_log(log))
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-3000:]


# -- chaos rounds -----------------------------------------------------------------------------

MOMENTS = ("startup_line", "agent_running", "anytime")


@dataclasses.dataclass
class Round:
    root: Path
    env: dict[str, str]
    started: list[DaemonProcess]
    workflow: Path
    rng: random.Random
    serial: itertools.count[int] = dataclasses.field(default_factory=itertools.count)
    owners: dict[int, str] = dataclasses.field(default_factory=dict)
    """pid → claim owner id, noted while the process is alive."""

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    def start(self, args: Sequence[str]) -> DaemonProcess:
        name = f"{next(self.serial):03}-{'daemon' if 'daemon' in args else 'plain'}.log"
        process = DaemonProcess(self.workflow, env=self.env, args=args, output=self.root / name)
        self.started.append(process.start())
        self.owners[process.pid] = owner_of(process)
        return process

    def kill_at_a_bad_moment(
        self, process: DaemonProcess, *, daemon: bool, moment: str | None = None
    ) -> None:
        moment = moment or MOMENTS[self.rng.randrange(len(MOMENTS))]
        if moment == "agents_of_its_own":
            owner = self.owners[process.pid]
            wait_until(
                lambda: running_agents(self.log, owner),
                timeout=BOUND_S,
                what=f"an agent of {owner}",
            )
        elif moment == "startup_line":
            line = "leadership acquired" if daemon else "claims hydrated"
            wait_until(
                lambda: line in process.log() or not process.alive(),
                timeout=BOUND_S,
                what=line,
            )
        elif moment == "agent_running":
            owner = self.owners[process.pid]
            deadline = time.monotonic() + 10  # a run may find nothing to dispatch: kill anyway
            while time.monotonic() < deadline and process.alive():
                if running_agents(self.log, owner):
                    break
                time.sleep(0.02)
            time.sleep(self.rng.uniform(0.0, 0.2))
        else:
            time.sleep(self.rng.uniform(0.0, 2.0))
        assert process.alive(), f"died on its own:\n{process.log()[-3000:]}"
        process.kill9()


def chaos_round(
    root: Path,
    env: dict[str, str],
    started: list[DaemonProcess],
    *,
    kills: int,
    issues: int,
    seed: int,
) -> None:
    names = tuple(f"C-{i}" for i in range(issues))

    def workflow_with(slots: int) -> Path:
        agent = {"max_concurrent_agents": slots, "max_retry_backoff_ms": 300}
        return write_daemon_workflow(
            root,
            issues=names,
            agent_env=MIXED,
            # NB: a quarter of MIXED runs fail; the default budget (3 in a row) would block a
            # slot now and then, and this round needs every issue to keep being worked.
            front_matter={**FLAGS, "agent": agent, "retry": {"max_attempts": 100}},
        )

    # NB: fewer slots than issues, so a plain run beside a daemon gets issues of its own.
    workflow = workflow_with(max(3, issues // 3))
    db = db_of(root, workflow)
    chaos = Round(root=root, env=env, started=started, workflow=workflow, rng=random.Random(seed))
    done = 0
    recovered_beside = 0
    while done < kills:
        # NB: the first step is always a plain run dying beside a daemon while its own agents
        # run, so every round exercises the recovery pass of a process that keeps running.
        kind = chaos.rng.choice(("daemon", "plain", "beside")) if done else "beside"
        if kind == "beside" and kills - done >= 2:
            # NB: the plain run starts first: a daemon started first may well rotate through
            # every issue (continuation retries keep its rows) and leave the plain run none.
            plain = chaos.start(PLAIN)
            # NB: started first means past its start-up check: a plain run that reaches it
            # after the daemon took the lease refuses (daemon_running) and runs nothing.

            def past_start_up(plain: DaemonProcess = plain) -> bool:
                return "claims hydrated" in plain.log() or not plain.alive()

            wait_until(
                past_start_up,
                timeout=BOUND_S,
                what="the plain run past its start-up",
            )
            if not done:
                owner = chaos.owners[plain.pid]

                def agents_of(owner: str = owner) -> list[int]:
                    return running_agents(chaos.log, owner)

                wait_until(
                    agents_of,
                    timeout=BOUND_S,
                    what=f"an agent of {owner}",
                )
            daemon = chaos.start(DAEMON)
            lease = daemon.wait_ready()
            chaos.kill_at_a_bad_moment(
                plain, daemon=False, moment=None if done else "agents_of_its_own"
            )
            dead = chaos.owners[plain.pid]
            if dead in {o for o, _, _ in claim_rows(db).values()}:
                recovered_beside += 1

            def taken_over(dead: str = dead) -> bool:
                return dead not in {o for o, _, _ in claim_rows(db).values()}

            wait_until(
                taken_over,
                timeout=BOUND_S,
                what=f"the running daemon to take over the dead plain run {dead}",
            )
            assert try_state(lease["endpoint"]) is not None, daemon.log()[-3000:]
            chaos.kill_at_a_bad_moment(daemon, daemon=True)
            done += 2
        else:
            is_daemon = kind != "plain"
            chaos.kill_at_a_bad_moment(
                chaos.start(DAEMON if is_daemon else PLAIN), daemon=is_daemon
            )
            done += 1

    assert recovered_beside >= 1, "no plain run ever died holding claims beside a daemon"
    # NB: the survivor gets a slot per issue. With fewer, issues first in dispatch order would
    # rightly keep their slots through continuation retries (they never leave Todo here), and
    # "every issue is worked" would test the sort order instead of the recovery.
    workflow_with(issues)
    survivor = chaos.start(DAEMON)
    lease = survivor.wait_ready()
    works_every_issue(survivor, issues=names, root=root, db=db, lease=lease)
    # Each issue is *worked*: a run of the survivor's reaches its end mark.
    wait_until(
        lambda: (
            {
                e["slot"]
                for e in read_agent_log(chaos.log)
                if e["event"] == "end" and e["owner"] == lease["holder"]
            }
            >= {f"{name}#0" for name in names}
        ),
        timeout=BOUND_S,
        what="a finished run of every issue",
    )
    survivor.terminate()
    # NB: a graceful stop settles every run first — up to one per issue here, on a loaded
    # machine; the bound is hang protection only.
    try:
        code = survivor.wait(timeout_s=2 * BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the survivor did not stop:\n{survivor.log()[-3000:]}") from None
    assert code == 0, survivor.log()[-3000:]
    check_runs(read_agent_log(chaos.log))


def chaos_seed() -> int:
    return int(os.environ.get("LORENZ_CHAOS_SEED") or random.SystemRandom().randrange(2**32))


def test_chaos_round(root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]) -> None:
    seed = chaos_seed()
    try:
        chaos_round(root, daemon_env, daemons, kills=10, issues=6, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"chaos round failed with LORENZ_CHAOS_SEED={seed}: {exc}") from exc


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_chaos_round_soak(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    seed = chaos_seed()
    try:
        chaos_round(root, daemon_env, daemons, kills=100, issues=30, seed=seed)
    except AssertionError as exc:
        raise AssertionError(f"chaos round failed with LORENZ_CHAOS_SEED={seed}: {exc}") from exc


# -- the sweep that does not depend on the store ----------------------------------------------


def test_the_start_up_sweep_finds_agents_whose_owner_the_store_forgot(tmp_path: Path) -> None:
    """Seen in the soak: a process took a dead owner's claims over and died before sweeping.

    The store then names only the second (dead) owner, while the agents still running carry
    the first one's mark. The start-up sweep reads the marks themselves: every agent of this
    workflow whose owner is dead goes, whatever the store remembers; a live owner's agents and
    another workflow's stay.
    """
    me = current_process()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = ProcessIdentity(host=me.host, pid=gone.pid, started_at=me.started_at - 50).holder
    # NB: an owner is one process, of one workflow: another workflow's dead owner is another id.
    elsewhere = ProcessIdentity(host=me.host, pid=gone.pid, started_at=me.started_at - 60).holder
    ours, theirs = "a" * 64, "b" * 64
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]

    def spawn(owner: str, key: str) -> subprocess.Popen[bytes]:
        env = marked_environment(dict(os.environ), owner=owner, workflow_key=key)
        return subprocess.Popen(sleep, env=env, start_new_session=True)

    forgotten, alive, other = spawn(dead, ours), spawn(me.holder, ours), spawn(elsewhere, theirs)
    try:
        wait_until(
            lambda: all(
                psutil.Process(p.pid).environ().get(WORKFLOW_ENV) for p in (forgotten, other)
            ),
            timeout=BOUND_S,
            what="the marked processes to start",
        )
        assert dead_owners_of(ours) == {dead}
        assert kill_orphans(dead_owners_of(ours)) == [forgotten.pid]
        assert not pid_alive(forgotten.pid)  # (reaped by the sweep: no exit code to read)
        assert alive.poll() is None
        assert other.poll() is None
    finally:
        for process in (forgotten, alive, other):
            process.kill()
            process.wait()
