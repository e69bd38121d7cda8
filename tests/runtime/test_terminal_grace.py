"""An agent that moves its own issue to Done and keeps working is not killed mid-turn.

The tracker is a real ``files`` board; the agent is a real subprocess that edits its issue's
file to ``state: Done`` (as an agent marking its work done does), then keeps going — a push, a
comment — until the test tells it to stop by writing ``go`` into its workspace. A poll that sees
Done meanwhile lets the turn finish within ``agent.terminal_grace_ms``; after the grace, the run
is cancelled as any terminal stop is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorenz.trackers.files import FilesTracker
from lorenz.workflow import load_workflow
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

MARKS_DONE_THEN_PUSHES = """
from lorenz.trackers.files import set_issue_state
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
set_issue_state(env["LORENZ_ISSUE_ID"], "Done", folder=pathlib.Path(env["LORENZ_TRACKER_PATH"]))
note("marked_done", "yes")
while not (ws / "go").exists():
    time.sleep(0.02)
note("pushed", "yes")
"""


def _board(tmp_path: Path) -> Path:
    folder = tmp_path / "board"
    folder.mkdir()
    (folder / "G-1.md").write_text(
        "---\nid: G-1\ntitle: Greet\nstate: Todo\n---\nSay hello.\n", encoding="utf-8"
    )
    return folder


def _rig(tmp_path: Path, *, grace_ms: int | None = None) -> RuntimeRig:
    folder = _board(tmp_path)
    agent = write_agent(tmp_path, "marks_done", MARKS_DONE_THEN_PUSHES)
    agent_section: dict[str, Any] = {"max_concurrent_agents": 4, "max_turns": 1}
    if grace_ms is not None:
        agent_section["terminal_grace_ms"] = grace_ms
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": "files", "path": str(folder),
                    "active_states": ["Todo"], "terminal_states": ["Done"]},
        "polling": {"interval_ms": 600000},
        "agent": agent_section,
    })
    tracker = FilesTracker(settings=load_workflow(wf, environ={}).settings, folder=folder)
    return build_rig(wf, reload=False, tracker=tracker)


async def test_the_turn_in_progress_finishes_after_the_agent_marked_its_issue_done(
    tmp_path: Path,
) -> None:
    rig = _rig(tmp_path)
    workspace = tmp_path / "workspaces" / "G-1"
    await rig.runtime.poll_once()
    await wait_until_async(
        (workspace / "marked_done").exists,
        timeout=30.0,
        what='(workspace / "marked_done").exists',
    )

    # A poll sees Done while the agent is still pushing: the run is left to finish its turn.
    await rig.runtime.poll_once()
    [finishing] = rig.of_type("run_finishing")
    assert (finishing["identifier"], finishing["grace_ms"]) == ("G-1", 60000)
    assert rig.of_type("run_canceled") == []
    assert rig.runtime.snapshot().to_dict()["running"], "the run must still be going"
    await rig.runtime.poll_once()  # and the next poll leaves it alone too
    assert rig.of_type("run_canceled") == []
    assert len(rig.of_type("run_finishing")) == 1

    (workspace / "go").write_text("go", encoding="utf-8")
    await wait_until_async(
        lambda: bool(rig.of_type("workspace_cleanup")),
        timeout=30.0,
        what='bool(rig.of_type("workspace_cleanup"))',
    )
    await rig.runtime.wait_for_runs()

    [history] = rig.runtime.snapshot().to_dict()["run_history"]
    assert history["outcome"] == "success"
    [finished] = rig.of_type("run_finished")
    assert finished["message"] == "run finished; issue terminal"
    assert rig.of_type("run_canceled") == []
    # Done is done: no continuation retry, no claim left, the workspace is gone.
    assert rig.of_type("retry_scheduled") == []
    snapshot = rig.runtime.snapshot().to_dict()
    assert (snapshot["running"], snapshot["retrying"]) == ([], [])
    assert dict(rig.store.claims) == {}  # type: ignore[attr-defined]
    assert not workspace.exists()


async def test_after_the_grace_a_turn_that_does_not_end_is_cancelled(tmp_path: Path) -> None:
    rig = _rig(tmp_path, grace_ms=300)
    workspace = tmp_path / "workspaces" / "G-1"
    await rig.runtime.poll_once()
    await wait_until_async(
        (workspace / "marked_done").exists,
        timeout=30.0,
        what='(workspace / "marked_done").exists',
    )
    await rig.runtime.poll_once()
    assert len(rig.of_type("run_finishing")) == 1

    await wait_until_async(
        lambda: bool(rig.of_type("run_canceled")),
        timeout=30.0,
        what='bool(rig.of_type("run_canceled"))',
    )
    await rig.runtime.wait_for_runs()
    [canceled] = rig.of_type("run_canceled")
    assert canceled["reason"] == "terminal"
    assert not (workspace / "pushed").exists()
    [history] = rig.runtime.snapshot().to_dict()["run_history"]
    assert history["outcome"] == "canceled"
    assert rig.of_type("retry_scheduled") == []
    assert not workspace.exists()


async def test_a_zero_grace_cancels_at_once(tmp_path: Path) -> None:
    rig = _rig(tmp_path, grace_ms=0)
    workspace = tmp_path / "workspaces" / "G-1"
    await rig.runtime.poll_once()
    await wait_until_async(
        (workspace / "marked_done").exists,
        timeout=30.0,
        what='(workspace / "marked_done").exists',
    )
    await rig.runtime.poll_once()
    assert rig.of_type("run_finishing") == []
    assert [e["reason"] for e in rig.of_type("run_canceled")] == ["terminal"]
    await rig.runtime.wait_for_runs()
