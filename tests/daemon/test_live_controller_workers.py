"""A worker followed by a live controller is never adopted, nor cancelled, by another one.

Two plain ``lorenz WORKFLOW.md`` runs (no daemon, memory store: nothing refuses the second)
share one worker state root. The first runs ``A-1`` in a detached worker whose agent is held
until the test lets it go. Then ``lorenz --once`` starts beside it. Before, it took the live
worker for a lost controller's ("worker of a lost controller found"), followed it — and would
have cancelled it on stop. Now the worker's ``controller`` mark names the first run, which is
provably alive: the second leaves the worker alone, starts no agent beside it (the run fails
with ``worker_controlled_elsewhere``) and exits; the first run's agent ends normally.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lorenz.claims.owners import default_owner_id
from lorenz.workers.runner import CONTROLLER_NAME, live_controller_of, record_controller
from tests.daemon.harness import CLI, DaemonProcess, read_agent_log, write_daemon_workflow
from tests.waiting import wait_until

HELD = {"AGENT_MIN_S": "0", "AGENT_MAX_S": "0", "AGENT_FAIL_RATE": "0"}
SECOND_RUN_BOUND_S = 90.0
"""Hang protection only: the second run exits after one tick (an adopter waits for the run)."""


def test_a_second_controller_neither_adopts_nor_cancels_a_live_controllers_worker(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess], runtime_dir: Path
) -> None:
    hold = root / "release"
    workflow = write_daemon_workflow(
        root, issues=("A-1",), agent_env={**HELD, "AGENT_HOLD_FILE": str(hold)}
    )
    log = root / "agent.log"
    first = DaemonProcess(workflow, env=daemon_env, args=[], output=root / "first.log")
    daemons.append(first.start())
    wait_until(
        lambda: any(e["event"] == "start" for e in read_agent_log(log)),
        timeout=120.0,
        what="the agent",
    )
    state_root = runtime_dir / "w"
    wait_until(
        lambda: any((d / CONTROLLER_NAME).exists() for d in state_root.iterdir() if d.is_dir()),
        timeout=120.0,
        what="the worker's controller mark",
    )

    try:
        second = subprocess.run(
            [*CLI, str(workflow), "--no-tui", "--once"],
            env=daemon_env,
            cwd=workflow.parent,
            capture_output=True,
            text=True,
            timeout=SECOND_RUN_BOUND_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the second lorenz adopted the live worker and waited on it") from exc

    output = second.stdout + second.stderr
    assert "worker of a lost controller" not in output
    assert "worker of a live controller left alone" in output
    assert "worker_controlled_elsewhere" in output
    starts = [e for e in read_agent_log(log) if e["event"] == "start"]
    assert len(starts) == 1
    assert not any(e.get("dup") for e in read_agent_log(log))
    assert not any(e["event"] == "end" for e in read_agent_log(log)), "the worker was cancelled"
    assert first.alive()

    hold.touch()
    wait_until(
        lambda: any(e["event"] == "end" for e in read_agent_log(log)),
        timeout=120.0,
        what="the run to end",
    )
    (end,) = [e for e in read_agent_log(log) if e["event"] == "end"]
    assert end["rc"] == 0


def test_the_controller_mark_names_only_a_live_other_controller(tmp_path: Path) -> None:
    me = default_owner_id()
    assert live_controller_of(tmp_path, me=me) is None  # unmarked: a run of earlier versions
    record_controller(tmp_path, owner=me)
    assert live_controller_of(tmp_path, me=me) is None  # ours
    assert live_controller_of(tmp_path, me="someone-else") == me  # alive, and not theirs
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = me.split(":", 1)[0]
    record_controller(tmp_path, owner=f"{host}:{gone.pid}:1.0")
    assert live_controller_of(tmp_path, me=me) is None  # dead
    record_controller(tmp_path, owner="elsewhere:1:1.0")
    assert live_controller_of(tmp_path, me=me) is None  # not provable from here
    assert [p.name for p in tmp_path.iterdir()] == [CONTROLLER_NAME]  # no temp file left
