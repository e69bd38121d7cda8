"""Both ways a run is stopped from outside end it the same way.

Reconciliation stops every slot of an issue that left the active states; a deleted ``Claim``
stops one slot (``cancel_slot``). Either way the run's process goes, the run records exactly
one history row (``canceled``, ``stopped: <reason>``) and one ``run_canceled`` event, and no
retry is armed for it — nothing of it is recorded twice or by the run itself.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import psutil

from lorenz.model import Issue, SlotKey
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

WAITS_FOREVER = """
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
(ws / "pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def _issue(n: int) -> Issue:
    return Issue(
        id=f"id-{n}", identifier=f"T-{n}", title=f"Issue {n}", state="Todo", priority=2,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )


async def _two_running(tmp_path: Path) -> tuple[RuntimeRig, list[int]]:
    agent = write_agent(tmp_path, "waits", WAITS_FOREVER)
    # NB: the agents wait for ever: no turn or stall timeout may end them on a loaded machine
    # before the test stops them (a 60 s turn timeout did, under a full-suite load of 20).
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "polling": {"interval_ms": 600000}, "agent": {"terminal_grace_ms": 0},
        "agents": {"test": {
            "protocol": "command", "command": f"{sys.executable} {agent}",
            "stall_timeout_ms": 3600000, "turn_timeout_ms": 3600000,
        }},
    })
    rig = build_rig(wf, issues=[_issue(1), _issue(2)])
    await rig.runtime.poll_once()
    pids = []
    for n in (1, 2):
        marker = tmp_path / "workspaces" / f"T-{n}" / "pid"
        await wait_until_async(marker.exists, timeout=30.0, what="marker.exists")

        def written(marker: Path = marker) -> bool:
            return marker.read_text().strip() != ""

        await wait_until_async(written, timeout=30.0, what=f"a pid in {marker}")
        pids.append(int(marker.read_text()))
    return rig, pids


def _ended(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_reconciled_issue_and_a_deleted_claim_stop_their_runs_alike(
    tmp_path: Path,
) -> None:
    rig, (pid_1, pid_2) = await _two_running(tmp_path)

    rig.tracker.set_state("id-1", "Backlog")  # left the active states
    await rig.runtime.poll_once()
    assert await rig.runtime.cancel_slot(SlotKey("id-2#0"), reason="claim_deleted")
    await rig.runtime.wait_for_runs()

    canceled = {e["identifier"]: e for e in rig.of_type("run_canceled")}
    assert {k: (e["reason"], e["message"]) for k, e in canceled.items()} == {
        "T-1": ("inactive", "run stopped: issue inactive"),
        "T-2": ("claim_deleted", "run stopped: claim_deleted"),
    }
    assert len(rig.of_type("run_canceled")) == 2
    history = rig.runtime.snapshot().run_history
    assert sorted((r.identifier, r.outcome.value, r.error) for r in history) == [
        ("T-1", "canceled", "stopped: inactive"),
        ("T-2", "canceled", "stopped: claim_deleted"),
    ]
    # The runs recorded nothing themselves and nothing waits to run them again.
    assert not rig.of_type("run_finished")
    assert not rig.of_type("run_failed")
    assert not rig.of_type("retry_scheduled")
    assert not rig.orchestrator.state.running
    assert not rig.orchestrator.state.retry_attempts
    assert not list(rig.runtime._timers.armed())
    await wait_until_async(
        lambda: _ended(pid_1) and _ended(pid_2),
        timeout=30.0,
        what="_ended(pid_1) and _ended(pid_2)",
    )
    # The reconciled issue is released; the slot whose Claim went may run again at once.
    assert [e["identifier"] for e in rig.of_type("run_reconciled")] == ["T-1"]


async def test_cancelling_a_slot_nobody_holds_changes_nothing(tmp_path: Path) -> None:
    rig, _ = await _two_running(tmp_path)

    assert not await rig.runtime.cancel_slot(SlotKey("id-9#0"))

    assert not rig.of_type("run_canceled")
    assert len(rig.orchestrator.state.running) == 2
