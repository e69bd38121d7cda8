"""``--force``: a generation-fenced takeover of a lease whose holder cannot be verified dead.

A lease held by another host's daemon cannot be proven dead from here. Without ``--force`` the
start refuses (``daemon_lock_stale`` when it stopped renewing, ``daemon_already_running`` when it
did not); with it the daemon takes the lease with a generation above the old holder's — the
fence its claim store then holds against every later write of that holder — and says so in the
log. A holder on this host that is verifiably alive is never replaced, ``--force`` or not.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from lorenz.daemon.discovery import lease_file_for, read_lease
from tests.daemon.harness import DaemonProcess, write_daemon_workflow
from tests.daemon.test_leases import planted_lease

ARGS = ["--feature", "daemon", "--feature", "durable_claims"]


@pytest.mark.parametrize("heartbeat", ["stale", "fresh"])
def test_force_takes_over_another_hosts_lease_with_the_next_generation(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], heartbeat: str
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    age = datetime.timedelta(hours=1 if heartbeat == "stale" else 0)
    beat = (datetime.datetime.now(datetime.UTC) - age).isoformat()
    path = planted_lease(workflow, heartbeat_at=beat, generation=7)

    refused = DaemonProcess(workflow, env=daemon_env, args=ARGS, output=root / "refused.log")
    assert refused.start().wait() == 1
    expected = "daemon_lock_stale" if heartbeat == "stale" else "daemon_already_running"
    assert expected in refused.log()
    if heartbeat == "stale":
        assert "start with `--force`" in refused.log()
    assert read_lease(path)["holder"] == "elsewhere:4242:1767225600.00"  # type: ignore[index]

    daemon = DaemonProcess(
        workflow, env=daemon_env, args=[*ARGS, "--force"], output=root / "forced.log"
    )
    daemons.append(daemon.start())
    lease = daemon.wait_ready()

    assert lease["pid"] == daemon.pid
    assert lease["generation"] == 8
    assert lease["transitions"] == 4
    assert "leadership taken over by force" in daemon.log()
    assert "from holder=elsewhere:4242:1767225600.00" in daemon.log()
    assert "claim store fenced generation=8" in daemon.log()


def test_force_never_replaces_a_live_daemon_on_this_host(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    workflow = write_daemon_workflow(root, issues=())
    first = DaemonProcess(workflow, env=daemon_env, args=ARGS, output=root / "first.log")
    daemons.append(first.start())
    lease = first.wait_ready()

    second = DaemonProcess(
        workflow, env=daemon_env, args=[*ARGS, "--force"], output=root / "second.log"
    )
    daemons.append(second.start())

    assert second.wait() == 1
    assert "daemon_already_running" in second.log()
    assert f"pid {first.pid}" in second.log()
    assert first.alive()
    now = read_lease(lease_file_for(workflow))
    assert now is not None
    assert (now["holder"], now["generation"]) == (lease["holder"], lease["generation"])
