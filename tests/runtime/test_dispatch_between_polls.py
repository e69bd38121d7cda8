"""Between polls the runtime works from the last candidate list and reads issues by id only.

A freed slot or a clean exit does not start a candidate scan: one dispatch pass reads, in one
by-id request, the issues whose runs just exited (still active: continuation; otherwise the
slot is released) and the candidates it is about to start (the stale-dispatch check: an issue
closed since the last poll does not start). The tracker is the in-memory one wrapped to count
what the runtime asked; the agents are real subprocesses.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorenz.model import Issue
from lorenz.trackers.memory import MemoryTracker
from lorenz.workflow import load_workflow
from tests.runtime.harness import RuntimeRig, build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

WAITS_FOR_GO = """
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
note("started", "yes")
while not (ws / "go").exists():
    time.sleep(0.02)
"""


class CountingTracker(MemoryTracker):
    """The memory tracker, remembering every read the runtime made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: list[tuple[str, tuple[str, ...]]] = []

    async def fetch_candidate_issues(self) -> list[Issue]:
        self.reads.append(("candidates", ()))
        return await super().fetch_candidate_issues()

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        self.reads.append(("by_id", tuple(ids)))
        return await super().fetch_issues_by_ids(ids)

    def scans(self) -> int:
        return sum(1 for kind, _ in self.reads if kind == "candidates")

    def by_id(self) -> list[tuple[str, ...]]:
        return [ids for kind, ids in self.reads if kind == "by_id"]


def issue(n: int, *, state: str = "Todo") -> Issue:
    return Issue(id=f"id-{n}", identifier=f"T-{n}", title=f"Issue {n}", state=state, priority=2,
                 created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                 + datetime.timedelta(minutes=n))


def _rig(tmp_path: Path, issues: list[Issue], *, slots: int = 1) -> tuple[RuntimeRig, Path]:
    agent = write_agent(tmp_path, "waits", WAITS_FOR_GO)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": "memory", "active_states": ["Todo"], "terminal_states": ["Done"]},
        "polling": {"interval_ms": 600000, "dispatch_batch_ms": 50},
        "agent": {"max_concurrent_agents": slots, "max_turns": 1},
    })
    tracker = CountingTracker(issues, settings=load_workflow(wf, environ={}).settings)
    return build_rig(wf, reload=False, tracker=tracker), tmp_path / "workspaces"


async def test_a_freed_slot_is_filled_from_the_last_list_after_one_by_id_read(
    tmp_path: Path,
) -> None:
    rig, workspaces = _rig(tmp_path, [issue(1), issue(2)])
    tracker: CountingTracker = rig.tracker
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        (workspaces / "T-1" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-1" / "started").exists',
    )
    assert tracker.scans() == 1

    (workspaces / "T-1" / "go").write_text("go")
    await wait_until_async(
        (workspaces / "T-2" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-2" / "started").exists',
    )

    # No second scan: T-1's exit and T-2's revalidation shared one by-id read.
    assert tracker.scans() == 1
    assert tracker.by_id() == [("id-1", "id-2")]
    assert [e["identifier"] for e in rig.of_type("run_started")] == ["T-1", "T-2"]
    # T-1 is still active: its clean exit keeps a continuation, as always.
    [retry] = rig.of_type("retry_scheduled")
    assert (retry["identifier"], retry["retry_kind"]) == ("T-1", "continuation")
    assert len(rig.of_type("poll_completed")) == 1
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)


async def test_an_issue_closed_since_the_last_poll_does_not_start(tmp_path: Path) -> None:
    rig, workspaces = _rig(tmp_path, [issue(1), issue(2)])
    tracker: CountingTracker = rig.tracker
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        (workspaces / "T-1" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-1" / "started").exists',
    )

    tracker.set_state("id-2", "Done")  # someone closes T-2; the cached list still has it
    (workspaces / "T-1" / "go").write_text("go")
    await wait_until_async(
        lambda: bool(rig.of_type("dispatch_skipped")),
        timeout=30.0,
        what='bool(rig.of_type("dispatch_skipped"))',
    )

    [skipped] = rig.of_type("dispatch_skipped")
    assert (skipped["identifier"], skipped["reason"]) == ("T-2", "issue_changed")
    assert "terminal" in skipped["message"]
    assert [e["identifier"] for e in rig.of_type("run_started")] == ["T-1"]
    assert not (workspaces / "T-2").exists()
    assert tracker.scans() == 1
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)


async def test_a_clean_exit_of_a_done_issue_releases_it_without_a_continuation(
    tmp_path: Path,
) -> None:
    rig, workspaces = _rig(tmp_path, [issue(1)])
    tracker: CountingTracker = rig.tracker
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        (workspaces / "T-1" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-1" / "started").exists',
    )

    # The agent marks its issue Done as its last act, then exits 0 (no poll in between).
    tracker.set_state("id-1", "Done")
    (workspaces / "T-1" / "go").write_text("go")
    await wait_until_async(
        lambda: bool(rig.of_type("workspace_cleanup")),
        timeout=30.0,
        what='bool(rig.of_type("workspace_cleanup"))',
    )

    assert tracker.by_id() == [("id-1",)]  # the one read that decided the exit
    [finished] = rig.of_type("run_finished")
    assert (finished["identifier"], finished["reason"]) == ("T-1", "terminal")
    assert rig.of_type("retry_scheduled") == []
    snapshot = rig.runtime.snapshot().to_dict()
    assert (snapshot["running"], snapshot["retrying"]) == ([], [])
    assert [h["outcome"] for h in snapshot["run_history"]] == ["success"]
    assert dict(rig.store.claims) == {}  # type: ignore[attr-defined]
    assert not (workspaces / "T-1").exists()
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)


async def test_a_clean_exit_of_an_issue_moved_out_of_the_active_states_keeps_its_workspace(
    tmp_path: Path,
) -> None:
    rig, workspaces = _rig(tmp_path, [issue(1)])
    tracker: CountingTracker = rig.tracker
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        (workspaces / "T-1" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-1" / "started").exists',
    )

    tracker.set_state("id-1", "In Review")  # handed to a person: not active, not terminal
    (workspaces / "T-1" / "go").write_text("go")
    await wait_until_async(
        lambda: bool(rig.of_type("run_reconciled")),
        timeout=30.0,
        what='bool(rig.of_type("run_reconciled"))',
    )

    [released] = rig.of_type("run_reconciled")
    assert (released["identifier"], released["reason"]) == ("T-1", "inactive")
    assert rig.of_type("retry_scheduled") == []
    assert rig.runtime.snapshot().to_dict()["retrying"] == []
    assert (workspaces / "T-1").is_dir()
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)


async def test_an_unreadable_tracker_after_a_clean_exit_keeps_the_continuation(
    tmp_path: Path,
) -> None:
    rig, workspaces = _rig(tmp_path, [issue(1)])
    tracker: CountingTracker = rig.tracker
    loop = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        (workspaces / "T-1" / "started").exists,
        timeout=30.0,
        what='(workspaces / "T-1" / "started").exists',
    )

    tracker.fail_next(methods=["fetch_issues_by_ids"])
    (workspaces / "T-1" / "go").write_text("go")
    await wait_until_async(
        lambda: bool(rig.of_type("retry_scheduled")),
        timeout=30.0,
        what='bool(rig.of_type("retry_scheduled"))',
    )

    [retry] = rig.of_type("retry_scheduled")
    assert (retry["identifier"], retry["retry_kind"]) == ("T-1", "continuation")
    assert [e["type"] for e in rig.of_type("reconcile_refresh_failed")] == [
        "reconcile_refresh_failed"
    ]
    rig.runtime.stop()
    await asyncio.wait_for(loop, 30)
