"""A restarted daemon recovers its dead predecessor at once: orphans killed, claims retried."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from lorenz.claims import SqliteClaimStore, TursoClaimStore, store_path
from lorenz.claims.sql import EventKind
from lorenz.config.settings import ClaimStoreSettings
from lorenz.model import ClaimPhase, ClaimRecord, slot_key
from tests.daemon.harness import (
    DaemonProcess,
    get_state,
    in_process,
    pid_alive,
    read_agent_log,
    write_daemon_workflow,
)

SLOW = {"AGENT_MIN_S": "60", "AGENT_MAX_S": "60", "AGENT_FAIL_RATE": "0"}


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    """In-process runs (the suite's test-only switch): these tests are about the recovery of a
    dead predecessor's claims and orphans (workers: test_detached_workers.py)."""
    return in_process(daemon_env)


@pytest.mark.parametrize("backend", [SqliteClaimStore, TursoClaimStore])
async def test_mark_owners_dead_makes_a_fresh_owner_stale_at_once(
    tmp_path: Path, backend: type[SqliteClaimStore]
) -> None:

    path = tmp_path / "claims.db"
    old = await backend.open(path, owner="host:1:1.00", owner_stale_ms=600000)
    record = ClaimRecord(
        slot_key=slot_key("I-1", 0),
        issue_id="I-1",
        identifier="I-1",
        slot_index=0,
        phase=ClaimPhase.RUNNING,
        owner="",
    )
    assert await old.acquire(record)
    heir = await backend.open(path, owner="host:2:2.00", owner_stale_ms=600000)
    try:
        assert "host:1:1.00" not in (await heir.load()).stale_owners  # fresh heartbeat
        assert await heir.take_over(from_owners=["host:1:1.00"]) == []
        assert await heir.mark_owners_dead(["host:1:1.00", "host:2:2.00", "nobody"]) == [
            "host:1:1.00"
        ]
        assert await heir.mark_owners_dead(["host:1:1.00"]) == []  # already marked
        assert "host:1:1.00" in (await heir.load()).stale_owners
        taken = await heir.take_over(from_owners=["host:1:1.00"])
        assert [r.slot_key for r in taken] == ["I-1#0"]
        kinds = [event.kind for event in await heir.recent_events(limit=10)]
        assert EventKind.OWNER_DEAD in kinds
    finally:
        await heir.close()
        await old.close()


def test_kill_9_then_restart_kills_the_orphan_and_retries_at_once(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    # NB: owner_stale_ms of 10 minutes: only the lease's proof of death can explain a recovery
    # within this test's lifetime.
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env=SLOW,
        front_matter={"flags": {"claim_store.owner_stale_ms": 600000}},
    )
    agent_log = root / "agent.log"
    first = DaemonProcess(workflow, env=daemon_env, output=root / "first.log")
    daemons.append(first.start())
    first.wait_ready()
    deadline = time.monotonic() + 60
    while not read_agent_log(agent_log) and time.monotonic() < deadline:
        time.sleep(0.02)
    (started,) = read_agent_log(agent_log)
    assert started["attempt"] is None
    assert started["owner"].split(":")[1] == str(first.pid)
    first.kill9()
    assert pid_alive(started["pid"])  # kill -9 of the daemon leaves its agent running

    db = store_path(
        ClaimStoreSettings(), workspace_root=root / "workspaces", workflow_path=workflow.resolve()
    )
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT slot_key, owner, phase, attempt FROM claims").fetchall()
    assert rows == [("A-1#0", started["owner"], "Running", None)]

    second = DaemonProcess(workflow, env=daemon_env, output=root / "second.log")
    daemons.append(second.start())
    lease = second.wait_ready()
    assert lease["transitions"] == 1
    assert not pid_alive(started["pid"])  # the orphan was killed before anything dispatched
    deadline = time.monotonic() + 60
    while len(read_agent_log(agent_log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    entries = read_agent_log(agent_log)
    retry = entries[-1]
    assert retry["event"] == "start"
    assert retry["dup"] is False
    assert retry["attempt"] == 1  # a failure retry of the interrupted run, not new work
    assert retry["owner"] == lease["holder"]

    state = get_state(lease["endpoint"])
    assert [(row["slot_key"], row["attempt"]) for row in state["running"]] == [("A-1#0", 1)]
    assert state["daemon"]["transitions"] == 1
    with sqlite3.connect(db) as conn:
        owners = {row[0] for row in conn.execute("SELECT owner FROM claims")}
        kinds = [row[0] for row in conn.execute("SELECT kind FROM events ORDER BY id")]
    assert owners == {lease["holder"]}
    assert kinds.index("owner_dead") < kinds.index("take_over")
    second.terminate()
    assert second.wait() == 0
