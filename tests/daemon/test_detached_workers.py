"""``worker.detached``: a run in flight survives ``kill -9`` of its daemon and is adopted.

A real daemon on a files tracker runs one slow agent in a detached ``lorenz worker``; the test
SIGKILLs the daemon mid-run and starts the next one. From the agent's own append-only log: the
agent that was running when its daemon died ran to its normal end (it was neither killed by the
next daemon's orphan sweep nor started a second time beside itself), and the next daemon says
it adopted the worker. The same holds without a daemon (memory store, no lease), where only the
worker's state directory says the run goes on. With a durable store, the next daemon adopts
from the claim's spawn intent at hydration (an ``adoption`` retry, due at once), never through
a failure retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from lorenz.workers.runner import PAUSE_AT_SPAWN_PHASE_ENV
from lorenz.workers.states import worker_pid
from tests.daemon.harness import (
    DaemonProcess,
    kill_marked,
    pid_alive,
    read_agent_log,
    write_daemon_workflow,
    write_issues,
)
from tests.waiting import wait_until

SLOW = {"AGENT_MIN_S": "6", "AGENT_MAX_S": "6", "AGENT_FAIL_RATE": "0"}


@pytest.fixture
def worker_state(runtime_dir: Path) -> Iterator[Path]:
    path = runtime_dir / "w"
    yield path
    # Workers outlive daemons by design: the test stops the ones it started.
    kill_marked("LORENZ_WORKER_STATE", str(path))


@pytest.mark.parametrize(
    "mode_args",
    [["--feature", "daemon"], []],
    ids=["daemon", "no-daemon"],
)
def test_a_run_in_flight_survives_kill_9_of_its_controller_and_is_adopted(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
    mode_args: list[str],
) -> None:
    # NB: "no-daemon" is the default mode (memory store, no lease): nothing but the worker's
    # state directory tells the next start that the issue's run is still going.
    workflow = write_daemon_workflow(
        root, issues=("A-1",), agent_env=SLOW
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    log = root / "agent.log"

    first = DaemonProcess(workflow, env=env, args=mode_args, output=root / "daemon-0.log")
    daemons.append(first.start())
    if mode_args:
        first.wait_ready()
    wait_until(
        lambda: any(r["event"] == "start" for r in read_agent_log(log)),
        timeout=120.0,
        what="the agent to start",
    )
    [started] = [r for r in read_agent_log(log) if r["event"] == "start"]
    first.kill9()
    assert pid_alive(started["pid"]), "the agent died with its daemon: it was not detached"

    second = DaemonProcess(workflow, env=env, args=mode_args, output=root / "daemon-1.log")
    daemons.append(second.start())
    if mode_args:
        second.wait_ready()

    def first_run_ended() -> bool:
        return any(r["event"] == "end" and r["pid"] == started["pid"] for r in read_agent_log(log))

    wait_until(first_run_ended, timeout=120.0, what="the first agent to end")
    records = read_agent_log(log)
    [ended] = [r for r in records if r["event"] == "end" and r["pid"] == started["pid"]]
    assert ended["rc"] == 0, "the adopted agent was stopped instead of finishing"
    # Nothing else started on the slot while the first agent ran, and nothing found it locked.
    overlapping = [
        r
        for r in records
        if r["event"] == "start" and r["pid"] != started["pid"] and r["t"] < ended["t"]
    ]
    assert overlapping == []
    assert not any(r.get("dup") for r in records)
    # Adopted through the claim the worker stands for (a durable store's, or — memory store —
    # one made from the worker's state directory at start-up), never started a second time.
    wait_until(
        lambda: "adopting the worker of a lost controller" in second.log(),
        timeout=120.0,
        what="adoption",
    )
    assert "interrupted=0 adopting=1" in second.log()


def _claim_rows(store: Path) -> list[tuple[str, str | None, str | None, int]]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        return [
            (str(row[0]), row[1], row[2], int(row[3]))
            for row in conn.execute("SELECT slot_key, spawn_phase, handle, last_seq FROM claims")
        ]


def _event_bodies(store: Path) -> list[dict[str, object]]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT body FROM events WHERE body IS NOT NULL ORDER BY id")
        return [json.loads(row[0]) for row in rows]


@dataclasses.dataclass(frozen=True)
class RunningWorker:
    """A first daemon (detached workers, SQLite) whose one agent runs, as the store records it."""

    workflow: Path
    env: dict[str, str]
    args: list[str]
    store: Path
    log: Path
    handle: str
    started: dict[str, Any]
    first: DaemonProcess


def _a_daemon_with_a_running_worker(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
    *,
    agent_s: int,
    extra_args: Sequence[str],
    front_matter: dict[str, Any] | None = None,
) -> RunningWorker:
    store = root / "claims.db"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env={**SLOW, "AGENT_MIN_S": str(agent_s), "AGENT_MAX_S": str(agent_s)},
        front_matter={
            "flags": {"claim_store.path": str(store), "daemon.heartbeat_ms": 200},
            **(front_matter or {}),
        },
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    args = ["--feature", "daemon", "--feature", "durable_claims"]
    log = root / "agent.log"
    first = DaemonProcess(
        workflow, env=env, args=[*args, *extra_args], output=root / "daemon-0.log"
    )
    daemons.append(first.start())
    first.wait_ready()
    wait_until(
        lambda: any(r["event"] == "start" for r in read_agent_log(log)),
        timeout=120.0,
        what="the agent to start",
    )
    wait_until(
        lambda: any(phase == "running" for _, phase, _, _ in _claim_rows(store)),
        timeout=120.0,
        what="the claim to record the running worker",
    )
    [(_, _, handle, _)] = _claim_rows(store)
    assert handle is not None
    [started] = [r for r in read_agent_log(log) if r["event"] == "start"]
    return RunningWorker(
        workflow=workflow,
        env=env,
        args=args,
        store=store,
        log=log,
        handle=handle,
        started=started,
        first=first,
    )


def test_with_a_durable_store_the_next_daemon_adopts_from_the_claims_intent_at_once(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    run = _a_daemon_with_a_running_worker(
        root, daemon_env, daemons, worker_state, agent_s=12, extra_args=()
    )
    workflow, env, args, store, log = run.workflow, run.env, run.args, run.store, run.log
    handle, started = run.handle, run.started
    run.first.kill9()

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(second.start())
    second.wait_ready()
    wait_until(
        lambda: f"adopting the worker of a lost controller handle={handle}" in second.log(),
        timeout=120.0,
        what="adoption from the claim's intent",
    )
    assert "interrupted=0 adopting=1" in second.log()

    def first_run_ended() -> bool:
        return any(r["event"] == "end" and r["pid"] == started["pid"] for r in read_agent_log(log))

    wait_until(first_run_ended, timeout=120.0, what="the adopted agent to end")
    records = read_agent_log(log)
    [ended] = [r for r in records if r["event"] == "end" and r["pid"] == started["pid"]]
    assert ended["rc"] == 0
    assert [r for r in records if r["event"] == "start" and r["t"] < ended["t"]] == [started]
    # Adopted, not failed over: no failure retry was ever written for the slot.
    assert not [b for b in _event_bodies(store) if b.get("retry_kind") == "failure"]


def test_a_graceful_stop_whose_window_ends_hands_the_worker_to_the_next_daemon(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    run = _a_daemon_with_a_running_worker(
        root, daemon_env, daemons, worker_state, agent_s=20, extra_args=("--grace-seconds", "1")
    )
    workflow, env, args, store, log = run.workflow, run.env, run.args, run.store, run.log
    handle, started, first = run.handle, run.started, run.first
    first.terminate()
    assert first.wait() == 0, first.log()[-3000:]
    assert "grace ended with runs in flight; leaving their workers to the next" in first.log()
    # Handed over, not settled: the row still names the live worker, nothing was cancelled.
    assert [(phase, h) for _, phase, h, _ in _claim_rows(store)] == [("running", handle)]
    assert not [r for r in read_agent_log(log) if r["event"] == "end"], "the agent goes on"
    assert not [b for b in _event_bodies(store) if b.get("retry_kind")], "no retry written"

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(second.start())
    second.wait_ready()
    wait_until(
        lambda: f"adopting the worker of a lost controller handle={handle}" in second.log(),
        timeout=120.0,
        what="adoption from the claim's intent",
    )
    wait_until(
        lambda: any(r["event"] == "end" for r in read_agent_log(log)),
        timeout=120.0,
        what="the adopted agent to end",
    )
    records = read_agent_log(log)
    [ended] = [r for r in records if r["event"] == "end"]
    assert ended["pid"] == started["pid"]
    assert ended["rc"] == 0
    assert [r for r in records if r["event"] == "start" and r["t"] < ended["t"]] == [started]
    assert not [b for b in _event_bodies(store) if b.get("retry_kind") == "failure"]


def _set_phase(store: Path, handle: str, phase: str) -> None:
    """Rewrite the claim as a controller killed before its next intent write leaves it.

    NB: the first daemon is dead (SIGKILL) when this runs, so nobody else writes the row. The
    phases before ``running`` have collected nothing yet: ``last_seq`` goes back to 0.
    """
    with sqlite3.connect(store) as conn:
        conn.execute(
            "UPDATE claims SET spawn_phase = ?, last_seq = CASE WHEN ? = 'running' "
            "THEN last_seq ELSE 0 END WHERE handle = ?",
            (phase, phase, handle),
        )


def _stop_worker(worker_state: Path, handle: str, agent_pid: int) -> None:
    """SIGKILL the worker and its agent: the run died while no controller watched it."""
    from lorenz.workers.states import worker_pid

    pid = worker_pid(worker_state / handle)
    assert pid is not None
    for victim in (pid, agent_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: not pid_alive(pid) and not pid_alive(agent_pid),
        timeout=120.0,
        what="the worker to die",
    )


@pytest.mark.parametrize(
    ("phase", "worker"),
    [
        ("spawn_requested", "alive"),
        ("probing", "alive"),
        ("spawn_requested", "final"),
        ("running", "final"),
        ("provisioning", "gone"),
        ("spawn_requested", "gone"),
        ("running", "gone"),
    ],
)
def test_a_controller_killed_in_each_spawn_phase_is_followed_as_the_phase_table_says(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
    phase: str,
    worker: str,
) -> None:
    """docs/runs.md's table, end to end: alive → adopt, final → settle, gone → failure retry,
    never started (no journal, the launch never answered) → the same attempt again."""
    run = _a_daemon_with_a_running_worker(
        root, daemon_env, daemons, worker_state, agent_s=4, extra_args=()
    )
    workflow, env, args, store, log = run.workflow, run.env, run.args, run.store, run.log
    handle, started = run.handle, run.started
    run.first.kill9()
    _set_phase(store, handle, phase)
    if worker == "final":
        from lorenz.workers.states import worker_pid

        pid = worker_pid(worker_state / handle)
        assert pid is not None
        wait_until(lambda: not pid_alive(pid), timeout=120.0, what="the unwatched worker to finish")
    elif worker == "gone":
        _stop_worker(worker_state, handle, started["pid"])
        if phase == "provisioning":
            # Never started: the handle was computed, no process work happened.
            shutil.rmtree(worker_state / handle)

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(second.start())
    second.wait_ready()
    wait_until(
        lambda: f"adopting the worker of a lost controller handle={handle}" in second.log(),
        timeout=120.0,
        what="the successor to probe the recorded handle",
    )
    assert "interrupted=0 adopting=1" in second.log()

    def failure_retries() -> list[dict[str, object]]:
        return [b for b in _event_bodies(store) if b.get("retry_kind") == "failure"]

    if worker == "gone" and phase == "provisioning":
        # Nothing to find (the launch never answered, no journal): it never started, so the
        # same attempt runs again, not counted as a failure (compensated).
        wait_until(
            lambda: bool(failure_retries()),
            timeout=120.0,
            what="the retry of a worker that never started",
        )
        assert "worker_never_started" in json.dumps(failure_retries()[0])
        assert failure_retries()[0].get("attempt") == 0, "the first run again, not attempt 1"
        return
    if worker == "gone":
        wait_until(
            lambda: bool(failure_retries()),
            timeout=120.0,
            what="the failure retry of a gone worker",
        )
        assert "worker_gone" in json.dumps(failure_retries()[0])
        assert failure_retries()[0].get("attempt") == 1
        assert [r for r in read_agent_log(log) if r["event"] == "start"] == [started], (
            "nothing may start before the failure retry is due"
        )
        return
    wait_until(
        lambda: any(r["event"] == "end" and r["pid"] == started["pid"]
                    for r in read_agent_log(log)),
        timeout=120.0,
        what="the first agent to end",
    )
    later_start = min(
        (r["t"] for r in read_agent_log(log) if r["event"] == "start" and r != started),
        default=None,
    )
    records = read_agent_log(log)
    [ended] = [r for r in records if r["event"] == "end" and r["pid"] == started["pid"]]
    assert ended["rc"] == 0, "the adopted agent was stopped instead of finishing"
    # No second agent beside the first: anything that starts later starts after its end.
    assert later_start is None or later_start > ended["t"]
    assert not any(r.get("dup") for r in records)
    assert not failure_retries(), "an adoptable or finished run was failed over"


@pytest.mark.parametrize("phase", ["provisioning", "spawn_requested"])
def test_a_controller_killed_before_its_worker_started_costs_the_run_no_attempt(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
    phase: str,
) -> None:
    """``kill -9`` of the daemon in a spawn phase before the launch (held there by the
    test-only pause): the successor finds the intent with no worker — it never started — and
    runs the same attempt again, the failure not counted (compensated). With
    ``retry.max_attempts: 1`` a counted failure would block the issue instead."""
    store = root / "claims.db"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env={**SLOW, "AGENT_MIN_S": "1", "AGENT_MAX_S": "1"},
        front_matter={
            "flags": {"claim_store.path": str(store), "daemon.heartbeat_ms": 200},
            "retry": {"max_attempts": 1},
        },
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    args = ["--feature", "daemon", "--feature", "durable_claims"]
    log = root / "agent.log"
    first = DaemonProcess(
        workflow, env={**env, PAUSE_AT_SPAWN_PHASE_ENV: phase}, args=args,
        output=root / "daemon-0.log",
    )
    daemons.append(first.start())
    first.wait_ready()
    wait_until(
        lambda: f"test pause at spawn phase={phase}" in first.log(),
        timeout=120.0,
        what=f"the pause at {phase}",
    )
    [(_, recorded, handle, _)] = _claim_rows(store)
    assert (recorded, handle is not None) == (phase, True)
    first.kill9()
    assert read_agent_log(log) == []
    assert not (worker_state / str(handle) / "journal.jsonl").exists(), "no worker ever ran"

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(second.start())
    second.wait_ready()
    wait_until(
        lambda: any(r["event"] == "end" for r in read_agent_log(log)),
        timeout=120.0,
        what="the run to end",
    )
    assert "interrupted=0 adopting=1" in second.log()
    [start] = [r for r in read_agent_log(log) if r["event"] == "start"][:1]
    assert start["attempt"] is None, "the run is still the first attempt"
    retries = [b for b in _event_bodies(store) if b.get("retry_kind") == "failure"]
    assert "worker_never_started" in json.dumps(retries[0])
    assert "blocked" not in json.dumps(_event_bodies(store)), "the budget of 1 was not used"


def _journal(worker_state: Path, handle: str) -> list[dict[str, Any]]:
    path = worker_state / handle / "journal.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_a_worker_whose_issue_was_closed_while_no_controller_ran_is_cancelled_not_adopted(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    """The adoption retry of a run whose issue went Done while its controller was down is
    dropped; the successor cancels that run's worker (reason journaled, final record
    collected), runs after_run, releases the claim and starts no second agent."""
    after_run = root / "after_run.log"
    run = _a_daemon_with_a_running_worker(
        root,
        daemon_env,
        daemons,
        worker_state,
        agent_s=120,
        extra_args=(),
        front_matter={"hooks": {"after_run": f'echo "$LORENZ_ISSUE_IDENTIFIER" >> {after_run}'}},
    )
    workflow, env, args, store, log = run.workflow, run.env, run.args, run.store, run.log
    handle, started = run.handle, run.started
    run.first.kill9()
    assert pid_alive(started["pid"]), "the agent died with its daemon: it was not detached"
    assert not after_run.exists()
    # The issue is closed while no controller runs.
    write_issues(root / "issues", ["A-1"], state="Done")

    second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
    daemons.append(second.start())
    second.wait_ready()
    assert "interrupted=0 adopting=1" in second.log()
    wait_until(
        lambda: not pid_alive(started["pid"]),
        timeout=120.0,
        what="the agent of the dropped adoption to stop",
    )
    wait_until(
        lambda: _journal(worker_state, handle)[-1]["kind"] == "final",
        timeout=120.0,
        what="its final record",
    )
    wait_until(lambda: _claim_rows(store) == [], timeout=120.0, what="the claim to be released")
    final = _journal(worker_state, handle)[-1]
    assert final["data"]["outcome"] == "canceled"
    assert final["data"]["reason"].startswith("terminal: ")
    wait_until(
        (worker_state / handle / "collected").exists,
        timeout=120.0,
        what="the final record to be collected",
    )
    wait_until(after_run.exists, timeout=120.0, what="after_run of the cancelled run")
    assert after_run.read_text(encoding="utf-8").split() == ["A-1"]
    records = read_agent_log(log)
    assert [r for r in records if r["event"] == "start"] == [started], "a second agent started"
    [ended] = [r for r in records if r["event"] == "end"]
    assert ended["pid"] == started["pid"]
    assert ended["rc"] == -signal.SIGTERM, "the agent was not stopped by the cancellation"
    assert f"adopting the worker of a lost controller handle={handle}" not in second.log()
    assert not [b for b in _event_bodies(store) if b.get("retry_kind") == "failure"]


def test_a_frozen_worker_whose_issue_was_closed_meanwhile_is_killed_not_left_running(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    """The dropped adoption's worker is frozen (SIGSTOP): it answers no cancel. Its slot is
    released all the same, so its agent must not go on working on the issue unwatched: the
    successor kills the run where it runs (#32 point 3)."""
    run = _a_daemon_with_a_running_worker(
        root, daemon_env, daemons, worker_state, agent_s=900, extra_args=()
    )
    workflow, env, args, store = run.workflow, run.env, run.args, run.store
    started = run.started
    worker = worker_pid(worker_state / run.handle)
    assert worker is not None
    run.first.kill9()
    os.kill(worker, signal.SIGSTOP)
    try:
        write_issues(root / "issues", ["A-1"], state="Done")
        second = DaemonProcess(workflow, env=env, args=args, output=root / "daemon-1.log")
        daemons.append(second.start())
        second.wait_ready()
        wait_until(
            lambda: not pid_alive(started["pid"]),
            timeout=300.0,
            what="the agent of the frozen, dropped adoption to be killed",
        )
        wait_until(
            lambda: not pid_alive(worker), timeout=60.0, what="the frozen worker to be killed"
        )
        wait_until(lambda: _claim_rows(store) == [], timeout=120.0, what="the claim released")
        wait_until(
            lambda: f"killed handle={run.handle}" in second.log(),
            timeout=60.0,
            what="the log to say the unanswering worker was killed",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)


def test_without_a_durable_store_a_worker_whose_issue_was_closed_meanwhile_is_cancelled(
    root: Path,
    daemon_env: dict[str, str],
    daemons: list[DaemonProcess],
    worker_state: Path,
) -> None:
    """The default mode (memory store, no daemon): ``kill -9`` of ``lorenz``, the issue closed
    while nothing ran, a restart — found by its state directory, the worker is cancelled, its
    workspace is not swept from under it, after_run runs once and no agent starts."""
    after_run = root / "after_run.log"
    workflow = write_daemon_workflow(
        root,
        issues=("A-1",),
        agent_env={**SLOW, "AGENT_MIN_S": "120", "AGENT_MAX_S": "120"},
        front_matter={
            "hooks": {"after_run": f'echo "$LORENZ_ISSUE_IDENTIFIER $PWD" >> {after_run}'}
        },
    )
    env = {**daemon_env, "LORENZ_WORKER_STATE": str(worker_state)}
    log = root / "agent.log"
    first = DaemonProcess(workflow, env=env, args=[], output=root / "lorenz-0.log")
    daemons.append(first.start())
    wait_until(
        lambda: any(r["event"] == "start" for r in read_agent_log(log)),
        timeout=120.0,
        what="the agent to start",
    )
    [started] = [r for r in read_agent_log(log) if r["event"] == "start"]
    first.kill9()
    assert pid_alive(started["pid"])
    [handle] = [p.name for p in worker_state.iterdir() if p.name.startswith("lzw-")]
    write_issues(root / "issues", ["A-1"], state="Done")

    second = DaemonProcess(workflow, env=env, args=[], output=root / "lorenz-1.log")
    daemons.append(second.start())
    wait_until(
        lambda: "interrupted=0 adopting=1" in second.log(),
        timeout=120.0,
        what="the worker to be found",
    )
    wait_until(lambda: not pid_alive(started["pid"]), timeout=120.0, what="the agent to stop")
    wait_until(
        (worker_state / handle / "collected").exists,
        timeout=120.0,
        what="the final record to be collected",
    )
    final = _journal(worker_state, handle)[-1]
    assert final["data"]["outcome"] == "canceled"
    assert final["data"]["reason"].startswith("terminal: ")
    wait_until(
        lambda: "workspace_cleanup removed 1 workspace" in second.log(),
        timeout=120.0,
        what="the cleanup",
    )
    # after_run ran in the workspace, before the workspace went.
    assert after_run.read_text(encoding="utf-8").split() == [
        "A-1", str(root / "workspaces" / "A-1")
    ]
    records = read_agent_log(log)
    assert [r for r in records if r["event"] == "start"] == [started], "a second agent started"
    [ended] = [r for r in records if r["event"] == "end"]
    assert ended["rc"] == -signal.SIGTERM
