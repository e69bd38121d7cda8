"""Agents of a dead Lorenz are found by their owner mark and killed; a live owner's never."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from lorenz.claims.owners import default_owner_id
from lorenz.daemon.orphans import (
    OWNER_ENV,
    OwnerId,
    find_orphans,
    kill_orphans,
    marked_environment,
    owner_is_dead,
)
from tests.daemon.harness import pid_alive


def dead_owner_id() -> str:
    """The owner id of a process that existed and exited (its pid is gone or reused)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    child.wait()
    return f"{os.uname().nodename}:{child.pid}:{started:.2f}"


def spawn_marked(owner: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A session leader with a child, both marked — like ``bash -lc <agent>``."""
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        env=marked_environment(dict(os.environ), owner=owner),
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while len(psutil.Process(process.pid).children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return process


def test_owner_ids_parse_and_only_same_host_dead_owners_are_dead() -> None:
    parsed = OwnerId.parse("my-host.example:1234:1767225600.12")
    assert parsed == OwnerId(host="my-host.example", pid=1234, started_at=1767225600.12)
    assert OwnerId.parse("garbage") is None
    assert not owner_is_dead(default_owner_id())
    dead = dead_owner_id()
    assert owner_is_dead(dead)
    other_host = "elsewhere:" + dead.split(":", 1)[1]
    assert not owner_is_dead(other_host)  # not verifiable from here
    # our own pid with another start time: the pid was reused, that owner is dead
    me = psutil.Process()
    assert owner_is_dead(f"{os.uname().nodename}:{me.pid}:{me.create_time() - 100:.2f}")


def test_kills_the_marked_processes_of_a_dead_owner(tmp_path: Path) -> None:
    dead = dead_owner_id()
    orphan = spawn_marked(dead, tmp_path)
    grandchild = psutil.Process(orphan.pid).children()[0].pid
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live = spawn_marked(default_owner_id(), tmp_path)
    try:
        assert {p.pid for p in find_orphans({dead})} == {orphan.pid, grandchild}
        killed = kill_orphans([dead, default_owner_id()])
        assert set(killed) >= {orphan.pid}
        orphan.wait(timeout=10)
        assert not pid_alive(grandchild)
        assert bystander.poll() is None
        assert pid_alive(bystander.pid)
        assert live.poll() is None  # a live owner's processes are never touched
        assert kill_orphans([dead]) == []
    finally:
        for process in (bystander, live, orphan):
            process.kill()
            process.wait()
        for leftover in psutil.process_iter():
            try:
                if leftover.environ().get(OWNER_ENV) == default_owner_id():
                    leftover.kill()
            except psutil.Error:
                pass
