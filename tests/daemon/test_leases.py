"""What a starting daemon does with the lease it finds: the outcomes, end to end."""

from __future__ import annotations

import datetime
import json
import os
import socket
from pathlib import Path

import psutil
import pytest

from lorenz.daemon.discovery import lease_file_for, read_lease
from tests.daemon.harness import DaemonProcess, write_daemon_workflow


def planted_lease(workflow: Path, **fields: object) -> Path:
    now = datetime.datetime.now(datetime.UTC)
    record = {
        "format": 1,
        "holder": "elsewhere:4242:1767225600.00",
        "pid": 4242,
        "process_started_at": 1767225600.0,
        "host": "elsewhere",
        "endpoint": "http://10.0.0.9:8080",
        "heartbeat_at": now.isoformat(),
        "acquired_at": now.isoformat(),
        "workflow_path": str(workflow.resolve()),
        "store": "file",
        "transitions": 3,
    }
    record.update(fields)
    path = lease_file_for(workflow)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def start(workflow: Path, env: dict[str, str], name: str) -> DaemonProcess:
    return DaemonProcess(
        workflow, env=env, args=["--feature", "daemon"], output=workflow.parent / name
    ).start()


def test_another_hosts_stale_lease_is_daemon_lock_stale_naming_the_file(
    root: Path, daemon_env: dict[str, str]
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    old = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)).isoformat()
    path = planted_lease(workflow, heartbeat_at=old)
    daemon = start(workflow, daemon_env, "stale.log")
    assert daemon.wait() == 1
    assert "daemon_lock_stale" in daemon.log()
    assert str(path) in daemon.log()
    assert "claims hydrated" not in daemon.log()  # nothing else was opened
    assert read_lease(path)["holder"] == "elsewhere:4242:1767225600.00"  # type: ignore[index]


def test_another_hosts_fresh_lease_is_daemon_already_running(
    root: Path, daemon_env: dict[str, str]
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    planted_lease(workflow)
    daemon = start(workflow, daemon_env, "fresh.log")
    assert daemon.wait() == 1
    assert "daemon_already_running" in daemon.log()
    assert "pid 4242 on elsewhere" in daemon.log()
    assert "http://10.0.0.9:8080" in daemon.log()


@pytest.mark.parametrize("how", ["pid gone", "pid reused"])
def test_a_dead_same_host_owner_is_replaced_at_once(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], how: str
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    if how == "pid gone":
        child = psutil.Popen(["true"])
        pid, started = child.pid, child.create_time()
        child.wait()
    else:  # a live pid (ours) with another start time
        pid, started = os.getpid(), psutil.Process().create_time() - 1000
    host = socket.gethostname()
    planted_lease(
        workflow,
        holder=f"{host}:{pid}:{started:.2f}",
        pid=pid,
        process_started_at=started,
        host=host,
        endpoint=None,
    )
    daemon = start(workflow, daemon_env, "dead.log")
    daemons.append(daemon)
    lease = daemon.wait_ready()
    assert lease["pid"] == daemon.pid
    assert lease["transitions"] == 4
    daemon.terminate()
    assert daemon.wait() == 0


def test_a_live_same_host_owner_is_daemon_already_running(
    root: Path, daemon_env: dict[str, str]
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    me = psutil.Process()
    host = socket.gethostname()
    old = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)).isoformat()
    planted_lease(
        workflow,
        holder=f"{host}:{me.pid}:{me.create_time():.2f}",
        pid=me.pid,
        process_started_at=me.create_time(),
        host=host,
        heartbeat_at=old,
    )
    daemon = start(workflow, daemon_env, "live.log")
    assert daemon.wait() == 1
    log = daemon.log()
    assert "daemon_already_running" in log
    assert f"pid {me.pid}" in log
    assert "stop it if it hangs" in log  # a stale heartbeat of a live process: hung, not dead
