"""A daemon whose SQLite claim store fills up: coded warnings, never a traceback; a clean exit.

The claim store is on a real, small tmpfs (see :mod:`tests.claims.test_full_disk`); the daemon
is a real ``lorenz --feature daemon --feature durable_claims`` process. Before, every poll logged
an uncoded ``OperationalError`` with an ERROR traceback, and SIGTERM exited 1 with a traceback
from ``store.close()``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lorenz.claims import SqliteClaimStore
from tests.claims.test_full_disk import fill, small_fs
from tests.daemon.conftest import daemon_env, daemons, root, runtime_dir
from tests.daemon.harness import (
    DaemonProcess,
    get_state,
    read_agent_log,
    write_daemon_workflow,
    write_issues,
)

__all__ = ["daemon_env", "daemons", "root", "runtime_dir", "small_fs"]  # fixtures used here


def wait_for_log(daemon: DaemonProcess, text: str, *, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in daemon.log():
        assert daemon.alive(), daemon.log()[-4000:]
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{daemon.log()[-4000:]}"
        time.sleep(0.05)


async def test_a_daemon_on_a_full_claim_store_disk_warns_with_a_code_and_stops_cleanly(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], small_fs: Path
) -> None:
    store_file = small_fs / "claims.db"
    workflow = write_daemon_workflow(
        root, issues=(), front_matter={"flags": {"claim_store.path": str(store_file)}}
    )
    daemon = DaemonProcess(
        workflow,
        env=daemon_env,
        args=["--feature", "daemon", "--feature", "durable_claims"],
        output=root / "daemon.log",
    )
    daemons.append(daemon.start())
    daemon.wait_ready()
    assert store_file.exists()

    filler = fill(small_fs)
    wait_for_log(daemon, "claim_store_write_failed")
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]
    log = daemon.log()
    assert "Traceback" not in log, log[-4000:]
    assert "OperationalError" not in log
    assert " ERROR " not in log, log[-4000:]
    assert "closed without marking its owner closed" in log

    filler.unlink()
    reopened = await SqliteClaimStore.open(store_file, owner="after")
    try:
        assert await reopened.integrity_check() == "ok"
    finally:
        await reopened.close()


def poll_block(endpoint: str) -> dict[str, Any]:
    poll: dict[str, Any] = get_state(endpoint)["poll"]
    return poll


def test_a_full_claim_store_disk_pauses_dispatch_until_space_returns(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], small_fs: Path
) -> None:
    store_file = small_fs / "claims.db"
    workflow = write_daemon_workflow(
        root, issues=(), front_matter={"flags": {"claim_store.path": str(store_file)}}
    )
    daemon = DaemonProcess(
        workflow,
        env=daemon_env,
        args=["--feature", "daemon", "--feature", "durable_claims"],
        output=root / "daemon.log",
    )
    daemons.append(daemon.start())
    endpoint = daemon.wait_ready()["endpoint"]

    filler = fill(small_fs)
    wait_for_log(daemon, "dispatch paused")
    write_issues(root / "issues", ["B-1"])
    # Several whole ticks see the new issue while the store refuses writes: none starts it.
    deadline = time.monotonic() + 60.0
    seen = poll_block(endpoint)["count"]
    while poll_block(endpoint)["count"] < seen + 5:
        assert time.monotonic() < deadline, daemon.log()[-4000:]
        time.sleep(0.05)
    poll = poll_block(endpoint)
    assert poll["candidates"] == 1
    assert "claim_store_write_failed" in poll["last_error"]
    assert poll["dispatch_paused"]["code"] == "claim_store_write_failed", poll
    assert read_agent_log(root / "agent.log") == []
    log = daemon.log()
    assert log.count("dispatch paused") == 1, log[-4000:]
    assert " ERROR " not in log, log[-4000:]

    filler.unlink()
    wait_for_log(daemon, "dispatch resumed")
    deadline = time.monotonic() + 60.0
    while not read_agent_log(root / "agent.log"):
        assert daemon.alive(), daemon.log()[-4000:]
        assert time.monotonic() < deadline, daemon.log()[-4000:]
        time.sleep(0.05)
    assert poll_block(endpoint)["last_error"] is None
    assert poll_block(endpoint)["dispatch_paused"] is None
    daemon.terminate()
    assert daemon.wait() == 0, daemon.log()[-4000:]
    assert "Traceback" not in daemon.log()
