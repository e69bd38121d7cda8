"""A deposed daemon, stopped with SIGSTOP and resumed after a takeover, writes nothing.

Daemon A runs a slow agent in a detached worker on a SQLite store; the test stops A with
SIGSTOP, removes its lease file (the manual takeover a ``daemon_lock_stale`` message names)
and starts daemon B, which takes the lease with the next generation and fences the store.
Then A is resumed. Checked in the store's own contents, not by timing: after A's resume not
one event, claim row or heartbeat of A's owner changed, A exits on its own, and its worker —
which a deposed controller must never kill — is still running the agent, which the test then
lets end (it waits for a file, not for a time) with rc 0.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.daemon.discovery import lease_file_for
from tests.daemon.harness import (
    DaemonProcess,
    kill_marked,
    pid_alive,
    read_agent_log,
    short_runtime_dir,
    write_daemon_workflow,
)
from tests.waiting import wait_until

HOLD = "agent-may-end"
"""The file (under the test's root) whose creation lets the held agent end."""


def held_agent(root: Path) -> dict[str, str]:
    """An agent that runs until the test creates ``root/HOLD``, then ends with rc 0.

    NB: not a fixed duration: the takeover (a second daemon's start on a loaded machine) and
    the deposed daemon's exit can outlast any, and an agent that ended on its own would then
    read as "the deposed daemon killed its worker's agent".
    """
    return {
        "AGENT_HOLD_FILE": str(root / HOLD),
        "AGENT_MIN_S": "0",
        "AGENT_MAX_S": "0",
        "AGENT_FAIL_RATE": "0",
    }
ARGS = ["--feature", "daemon", "--feature", "durable_claims"]


@pytest.fixture
def worker_state(runtime_dir: Path) -> Iterator[Path]:
    path = runtime_dir / "w"
    yield path
    kill_marked("LORENZ_WORKER_STATE", str(path))


def owner_of(store: Path, pid: int) -> str:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT owner FROM owners WHERE pid = ?", (pid,)).fetchall()
    assert len(rows) == 1, rows
    return str(rows[0][0])


def written_by(store: Path, owner: str) -> dict[str, Any]:
    """Every trace of ``owner`` in the store: its events, its claim rows, its owner row."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        return {
            "events": conn.execute(
                "SELECT id, kind, slot_key, body FROM events WHERE owner = ? ORDER BY id",
                (owner,),
            ).fetchall(),
            "claims": conn.execute(
                "SELECT * FROM claims WHERE owner = ? ORDER BY slot_key", (owner,)
            ).fetchall(),
            "owner": conn.execute("SELECT * FROM owners WHERE owner = ?", (owner,)).fetchall(),
        }


def fence_of(store: Path) -> tuple[int, str] | None:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT generation, holder FROM fence").fetchone()
    return (int(row[0]), str(row[1])) if row else None


def stop_outside_the_guard(pid: int, lease_file: Path) -> None:
    """SIGSTOP the daemon at a moment it does not hold its lease's guard flock.

    NB: a daemon renews under the guard every heartbeat; stopped inside that window it keeps
    the guard, and the new daemon then fails (correctly) with ``daemon_lock_busy`` — not the
    paused-leader case this test is about. Stopped, the daemon cannot take the guard again, so
    a free guard after the stop stays free.
    """
    guard = lease_file.with_name(lease_file.name.removesuffix(".json") + ".guard")
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
            continue
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return
        finally:
            os.close(fd)
    raise AssertionError("the daemon held its lease guard at each of 200 stops")


def test_a_sigstopped_daemon_resumed_after_a_takeover_writes_nothing(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    store = root / "claims.db"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env=held_agent(root),
        front_matter={
            "flags": {
                "claim_store.path": str(store),
                "claim_store.owner_stale_ms": 600000,
                "claim_store.recovery_interval_ms": 200,
                "daemon.heartbeat_ms": 200,
            },
        },
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    log = root / "agent.log"

    old = DaemonProcess(workflow, env=env, args=ARGS, output=root / "daemon-old.log")
    daemons.append(old.start())
    lease = old.wait_ready()
    assert lease["generation"] >= 1
    wait_until(
        lambda: any(r["event"] == "start" for r in read_agent_log(log)),
        timeout=120.0,
        what="the agent",
    )
    [started] = [r for r in read_agent_log(log) if r["event"] == "start"]
    old_owner = owner_of(store, old.pid)
    assert fence_of(store) == (lease["generation"], old_owner)

    stop_outside_the_guard(old.pid, lease_file_for(workflow))
    try:
        lease_file_for(workflow).unlink()  # the manual takeover
        # NB: its own runtime directory: the stopped daemon still listens on its socket.
        other_runtime = short_runtime_dir()
        new_env = {**env, "XDG_RUNTIME_DIR": str(other_runtime)}
        new = DaemonProcess(workflow, env=new_env, args=ARGS, output=root / "daemon-new.log")
        daemons.append(new.start())
        new_lease = new.wait_ready()
        assert new_lease["generation"] > lease["generation"]
        wait_until(
            lambda: (fence_of(store) or (0,))[0] == new_lease["generation"],
            timeout=120.0,
            what="the fence",
        )
        before = written_by(store, old_owner)
        assert before["claims"], "the old daemon's claim should still be in the store"
    finally:
        os.kill(old.pid, signal.SIGCONT)

    # The resumed daemon notices, stops on its own, and leaves its worker running.
    assert old.wait(timeout_s=120) != 0
    after = written_by(store, old_owner)
    # NB: once the old daemon is dead, the new one's recovery pass may take its claims over
    # (its rows then change owner and its owner row goes): those are the new daemon's writes.
    assert after["events"] == before["events"], "the deposed daemon wrote events"
    assert set(after["claims"]) <= set(before["claims"]), "the deposed daemon wrote claims"
    assert after["owner"] in ([], before["owner"]), "the deposed daemon wrote its heartbeat"
    assert "claim_generation_stale" in old.log() or "leadership_lost" in old.log()
    assert pid_alive(started["pid"]), "the deposed daemon killed its worker's agent"
    (root / HOLD).touch()

    def ended() -> bool:
        return any(r["event"] == "end" and r["pid"] == started["pid"] for r in read_agent_log(log))

    wait_until(ended, timeout=120.0, what="the first agent to end")
    records = read_agent_log(log)
    [end] = [r for r in records if r["event"] == "end" and r["pid"] == started["pid"]]
    assert end["rc"] == 0, "the agent was stopped instead of finishing"
    assert not any(r.get("dup") for r in records)
    overlapping = [
        r
        for r in records
        if r["event"] == "start" and r["pid"] != started["pid"] and r["t"] < end["t"]
    ]
    assert overlapping == []
    assert json.loads(lease_file_for(workflow).read_text())["holder"] != lease["holder"]


def test_a_detached_run_records_its_workers_intent_under_the_daemons_generation(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    """The real daemon wires its claim store and generation into every detached run."""
    store = root / "claims.db"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env=held_agent(root),
        front_matter={"flags": {"claim_store.path": str(store)}},
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    daemon = DaemonProcess(workflow, env=env, args=ARGS, output=root / "daemon.log")
    daemons.append(daemon.start())
    lease = daemon.wait_ready()

    def running_intent() -> tuple[str, str, int, int | None] | None:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
            row = conn.execute(
                "SELECT handle, spawn_phase, intent_generation, generation FROM claims "
                "WHERE slot_key = 'A-1#0'"
            ).fetchone()
        return row if row is not None and row[1] == "running" else None

    wait_until(running_intent, timeout=120.0, what="the claim to say its worker is running")
    found = running_intent()
    assert found is not None
    handle, _phase, intent_generation, claim_generation = found
    assert intent_generation == lease["generation"]
    assert claim_generation == lease["generation"]
    assert f"-g{lease['generation']}-" in handle  # the handle is deterministic per generation
    assert (worker_state / handle).is_dir(), "the intent names the worker's state directory"
