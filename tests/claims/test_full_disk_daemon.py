"""A daemon whose SQLite claim store fills up: coded warnings, never a traceback; a clean exit.

The claim store is on a real, small tmpfs (see :mod:`tests.claims.test_full_disk`); the daemon
is a real ``lorenz --feature daemon --feature durable_claims`` process. Before, every poll logged
an uncoded ``OperationalError`` with an ERROR traceback, and SIGTERM exited 1 with a traceback
from ``store.close()``.
"""

from __future__ import annotations

import time
from pathlib import Path

from lorenz.claims import SqliteClaimStore
from tests.claims.test_full_disk import fill, small_fs
from tests.daemon.conftest import daemon_env, daemons, root, runtime_dir
from tests.daemon.harness import DaemonProcess, write_daemon_workflow

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
