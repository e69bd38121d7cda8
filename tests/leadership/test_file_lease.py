"""The file leadership lease: every outcome of acquire, and heartbeat/endpoint/release rules."""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.leadership import (
    DaemonAlreadyRunning,
    DaemonLockBusy,
    DaemonLockStale,
    DaemonLockUnreadable,
    FileLeaseProvider,
    LeadershipLost,
    LeaseRecord,
    LeaseStoreKind,
    ProcessIdentity,
    lease_path,
    read_lease_file,
)

HOST = socket.gethostname()


@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    path = tmp_path / "repo" / "WORKFLOW.md"
    path.parent.mkdir()
    path.write_text("---\n---\nprompt\n")
    return path


@pytest.fixture
def sleeper() -> Iterator[psutil.Process]:
    """A live process that is not us."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield psutil.Process(child.pid)
    finally:
        child.kill()
        child.wait()


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_lock(workflow: Path, **fields: Any) -> Path:
    """Put a lease file in place as some other holder would have written it."""
    record: dict[str, Any] = {
        "format": 1,
        "holder": "someone",
        "pid": 1,
        "process_started_at": 1.0,
        "host": HOST,
        "endpoint": "http://127.0.0.1:8123",
        "heartbeat_at": now().isoformat(),
        "acquired_at": now().isoformat(),
        "workflow_path": str(workflow.resolve()),
        "store": "file",
        "transitions": 4,
    }
    record.update(fields)
    path = lease_path(workflow)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_lease_path_layout(workflow: Path, tmp_path: Path) -> None:
    digest = hashlib.sha256(str(workflow.resolve()).encode()).hexdigest()
    assert lease_path(workflow) == workflow.parent / ".lorenz" / "daemon" / f"{digest}.lock.json"
    link = tmp_path / "elsewhere.md"
    link.symlink_to(workflow)
    assert lease_path(link) == lease_path(workflow)


def test_free_lease_is_taken_with_a_full_record(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow, endpoint="/run/user/1/lorenz.sock")
    assert asyncio.run(provider.read()) is None
    record = asyncio.run(provider.acquire())
    me = psutil.Process()
    assert record.pid == os.getpid()
    assert record.process_started_at == pytest.approx(me.create_time(), abs=0.01)
    assert record.host == HOST
    assert record.endpoint == "/run/user/1/lorenz.sock"
    assert record.workflow_path == str(workflow.resolve())
    assert record.store is LeaseStoreKind.FILE
    assert record.transitions == 0
    assert record.holder == provider.holder
    assert asyncio.run(provider.read()) == record
    assert read_lease_file(provider.path) == record  # the sync reader agrees


def test_reacquire_by_the_same_process_renews(workflow: Path) -> None:
    first = asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    time.sleep(0.01)
    again = asyncio.run(FileLeaseProvider(workflow_path=workflow, endpoint="http://x:1").acquire())
    assert again.heartbeat_at > first.heartbeat_at
    assert (again.acquired_at, again.transitions, again.endpoint) == (
        first.acquired_at,
        0,
        "http://x:1",
    )


def test_dead_owner_is_replaced_at_once(workflow: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    # Its heartbeat is brand new: no waiting for staleness when the pid is verifiably gone.
    write_lock(workflow, pid=child.pid, process_started_at=started, holder="dead")
    record = asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert record.pid == os.getpid()
    assert record.transitions == 5


def test_reused_pid_with_another_start_time_is_replaced(workflow: Path) -> None:
    started = psutil.Process().create_time()
    write_lock(workflow, pid=os.getpid(), process_started_at=started - 100, holder="previous")
    record = asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert record.holder != "previous"
    assert record.transitions == 5


def test_live_owner_means_already_running(workflow: Path, sleeper: psutil.Process) -> None:
    path = write_lock(
        workflow,
        pid=sleeper.pid,
        process_started_at=sleeper.create_time(),
        endpoint="http://127.0.0.1:8123",
    )
    before = path.read_bytes()
    with pytest.raises(DaemonAlreadyRunning) as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    error = caught.value
    assert error.code == "daemon_already_running"
    assert (error.pid, error.endpoint) == (sleeper.pid, "http://127.0.0.1:8123")
    assert str(sleeper.pid) in error.message
    assert "http://127.0.0.1:8123" in error.message
    assert path.read_bytes() == before


def test_live_owner_with_stale_heartbeat_is_still_running(
    workflow: Path, sleeper: psutil.Process
) -> None:
    path = write_lock(
        workflow,
        pid=sleeper.pid,
        process_started_at=sleeper.create_time(),
        heartbeat_at=(now() - datetime.timedelta(hours=1)).isoformat(),
    )
    before = path.read_bytes()
    with pytest.raises(DaemonAlreadyRunning, match="heartbeat is 3600 s old") as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow, stale_ms=30_000).acquire())
    assert caught.value.pid == sleeper.pid
    assert path.read_bytes() == before


def test_other_host_with_fresh_heartbeat_is_running(workflow: Path) -> None:
    write_lock(workflow, host="build-7.example", pid=os.getpid())
    with pytest.raises(DaemonAlreadyRunning) as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert "build-7.example" in caught.value.message


def test_other_host_with_stale_heartbeat_names_the_file(workflow: Path) -> None:
    old = now() - datetime.timedelta(seconds=45)
    path = write_lock(workflow, host="build-7.example", heartbeat_at=old.isoformat())
    before = path.read_bytes()
    with pytest.raises(DaemonLockStale) as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow, stale_ms=30_000).acquire())
    error = caught.value
    assert error.code == "daemon_lock_stale"
    assert error.path == path
    assert f"remove {path}" in error.message
    assert error.age_s == pytest.approx(45, abs=2)
    assert path.read_bytes() == before
    # Removing the file, as the message says, lets the next start take over.
    path.unlink()
    assert (asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())).transitions == 0


def _garbage_lock(workflow: Path, *, age_s: float) -> Path:
    path = lease_path(workflow)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"format": 1, "holder": "half-writ')
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_unreadable_fresh_lock_counts_as_running(workflow: Path) -> None:
    _garbage_lock(workflow, age_s=1)
    with pytest.raises(DaemonAlreadyRunning) as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert caught.value.pid is None


def test_unreadable_old_lock_is_stale(workflow: Path) -> None:
    path = _garbage_lock(workflow, age_s=120)
    with pytest.raises(DaemonLockStale, match="unreadable lock") as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow, stale_ms=30_000).acquire())
    assert caught.value.path == path


def test_read_refuses_garbage_with_a_code(workflow: Path) -> None:
    path = _garbage_lock(workflow, age_s=0)
    with pytest.raises(DaemonLockUnreadable) as caught:
        asyncio.run(FileLeaseProvider(workflow_path=workflow).read())
    assert caught.value.code == "daemon_lock_unreadable"
    assert str(path) in caught.value.message


def test_heartbeat_and_endpoint_rewrite_our_record(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow)
    first = asyncio.run(provider.acquire())
    assert first.endpoint is None
    time.sleep(0.01)
    asyncio.run(provider.set_endpoint("http://127.0.0.1:4321"))
    asyncio.run(provider.heartbeat())
    current = asyncio.run(provider.read())
    assert current is not None
    assert current.endpoint == "http://127.0.0.1:4321"
    assert current.heartbeat_at > first.heartbeat_at
    assert current.acquired_at == first.acquired_at
    assert provider.record == current


def test_heartbeat_after_someone_else_took_over_is_lost(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow)
    asyncio.run(provider.acquire())
    write_lock(workflow, holder="usurper", host="elsewhere.example")
    with pytest.raises(LeadershipLost, match="usurper") as caught:
        asyncio.run(provider.heartbeat())
    assert caught.value.code == "leadership_lost"
    assert provider.record is None


def test_heartbeat_after_the_file_was_removed_is_lost(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow)
    asyncio.run(provider.acquire())
    provider.path.unlink()
    with pytest.raises(LeadershipLost, match="removed"):
        asyncio.run(provider.heartbeat())
    with pytest.raises(LeadershipLost):
        asyncio.run(provider.set_endpoint("http://x:1"))


def test_release_deletes_only_our_own_lock(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow)
    asyncio.run(provider.acquire())
    asyncio.run(provider.release())
    assert not provider.path.exists()
    asyncio.run(provider.release())  # nothing there: no-op
    asyncio.run(provider.acquire())
    path = write_lock(workflow, holder="successor", host="elsewhere.example")
    asyncio.run(provider.release())
    assert json.loads(path.read_text())["holder"] == "successor"


def test_is_stale_uses_the_threshold(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow, stale_ms=10_000)
    at = now()
    record = LeaseRecord(
        holder="h",
        pid=1,
        process_started_at=1.0,
        host=HOST,
        endpoint=None,
        heartbeat_at=at,
        acquired_at=at,
        workflow_path=str(workflow),
        store=LeaseStoreKind.FILE,
    )
    assert not provider.is_stale(record, now=at + datetime.timedelta(seconds=10))
    assert provider.is_stale(record, now=at + datetime.timedelta(seconds=10.001))


def test_stray_temp_files_are_swept_on_acquire(workflow: Path) -> None:
    path = lease_path(workflow)
    path.parent.mkdir(parents=True)
    stray = path.with_name(f"{path.name}.99999.tmp")
    stray.write_text("{half")
    asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire())
    assert not stray.exists()
    assert path.exists()


def test_held_guard_gives_a_coded_busy_error(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow, guard_wait_s=0.2)
    guard = provider.path.with_name(provider.path.name.removesuffix(".json") + ".guard")
    guard.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(guard)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DaemonLockBusy) as caught:
            asyncio.run(provider.acquire())
        assert caught.value.code == "daemon_lock_busy"
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's flock: the guard is free again.
    assert (asyncio.run(provider.acquire())).pid == os.getpid()
    fd = os.open(guard, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_identity_can_be_given(workflow: Path) -> None:
    identity = ProcessIdentity(host="h1", pid=os.getpid(), started_at=12.5)
    record = asyncio.run(FileLeaseProvider(workflow_path=workflow, identity=identity).acquire())
    assert (record.holder, record.host, record.process_started_at) == (
        f"h1:{os.getpid()}:12.50",
        "h1",
        12.5,
    )


# -- generations -------------------------------------------------------------------------------


def _dead_identity() -> ProcessIdentity:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return ProcessIdentity(host=HOST, pid=child.pid, started_at=1.0)


def test_generation_rotates_on_every_acquisition_and_only_then(workflow: Path) -> None:
    first = FileLeaseProvider(workflow_path=workflow)
    assert first.generation is None  # not leading yet
    record = asyncio.run(first.acquire())
    assert record.generation == first.generation == 1
    asyncio.run(first.heartbeat())
    asyncio.run(first.set_endpoint("http://x:1"))
    assert asyncio.run(first.acquire()).generation == 1  # our own holding, renewed
    assert read_lease_file(first.path).generation == 1  # type: ignore[union-attr]
    asyncio.run(first.release())
    assert first.generation is None

    # Released (the file is gone): the next holding still gets a higher generation.
    second = FileLeaseProvider(workflow_path=workflow)
    assert asyncio.run(second.acquire()).generation == 2
    # Removed by hand, as a daemon_lock_stale message suggests: higher still.
    second.path.unlink()
    assert asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire()).generation == 3


def test_a_dead_holder_is_replaced_by_a_higher_generation(workflow: Path) -> None:
    dead = FileLeaseProvider(workflow_path=workflow, identity=_dead_identity())
    assert asyncio.run(dead.acquire()).generation == 1
    successor = FileLeaseProvider(workflow_path=workflow)
    record = asyncio.run(successor.acquire())
    assert (record.generation, record.transitions) == (2, 1)
    # A lock written with a generation beyond the counter (another copy of the counter lost)
    # is still exceeded: the next generation is above both.
    write_lock(workflow, holder="dead", pid=_dead_identity().pid, generation=40)
    assert asyncio.run(FileLeaseProvider(workflow_path=workflow).acquire()).generation == 41


def test_a_lost_lease_has_no_generation(workflow: Path) -> None:
    provider = FileLeaseProvider(workflow_path=workflow)
    asyncio.run(provider.acquire())
    provider.path.unlink()
    with pytest.raises(LeadershipLost):
        asyncio.run(provider.heartbeat())
    assert provider.generation is None


def test_a_lease_without_a_generation_reads_as_zero(workflow: Path) -> None:
    path = write_lock(workflow)  # as written before generations existed
    record = read_lease_file(path)
    assert record is not None
    assert record.generation == 0
