"""Worktree mode through the runtime: a kept worktree is reported, never a failed tick.

Real git repository, real worktrees, real agent subprocesses: the agent leaves uncommitted work
in its worktree, so when its issue is done Lorenz keeps the worktree (``worktree_dirty``) and
says so, and the tick goes on with everything else.
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from pathlib import Path

from lorenz.model import Issue
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

LEAVES_WORK = """
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
(ws / "unsaved.txt").write_text("work in progress")
note("started", "yes")
time.sleep(60)
"""


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={
        "PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"})


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "README.md").write_text("hello\n")
    _git("add", "README.md", cwd=repo)
    _git("commit", "-q", "-m", "initial", cwd=repo)
    return repo


def issue(n: int, *, state: str = "Todo") -> Issue:
    return Issue(id=f"id-{n}", identifier=f"T-{n}", title=f"Issue {n}", state=state, priority=2,
                 created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                 + datetime.timedelta(minutes=n))


def _workflow(tmp_path: Path, repo: Path) -> Path:
    agent = write_agent(tmp_path, "leaves_work", LEAVES_WORK)
    return write_workflow(tmp_path, agent_script=agent, front_matter={
        "workspace": {"root": str(tmp_path / "workspaces"), "kind": "worktree",
                      "repo": str(repo)},
        "tracker": {"kind": "memory", "active_states": ["Todo"], "terminal_states": ["Done"]},
        "agent": {"max_concurrent_agents": 4, "max_turns": 1, "terminal_grace_ms": 0},
    })


async def test_a_dirty_worktree_of_a_done_issue_is_reported_and_the_tick_goes_on(
    tmp_path: Path,
) -> None:
    rig = build_rig(_workflow(tmp_path, _repo(tmp_path)), issues=[issue(1)])
    await rig.runtime.poll_once()
    worktree = tmp_path / "workspaces" / "T-1"
    await wait_until_async(
        (worktree / "started").exists,
        timeout=30.0,
        what='(worktree / "started").exists',
    )

    rig.tracker.set_state("id-1", "Done")
    rig.tracker.add(issue(2))
    await rig.runtime.poll_once()

    assert rig.of_type("poll_error") == []
    assert len(rig.of_type("poll_completed")) == 2
    [preserved] = rig.of_type("workspace_preserved")
    assert (preserved["identifier"], preserved["code"]) == ("T-1", "worktree_dirty")
    assert preserved["kept"] == [str(worktree)]
    assert (worktree / "unsaved.txt").read_text() == "work in progress"
    # The same tick went on to dispatch the next issue.
    assert [e["identifier"] for e in rig.of_type("run_started")] == ["T-1", "T-2"]
    assert rig.runtime.snapshot().to_dict()["retrying"] == []


async def test_the_start_up_sweep_goes_on_past_a_preserved_worktree(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    wf = _workflow(tmp_path, repo)
    first = build_rig(wf, issues=[issue(1), issue(2)])
    await first.runtime.poll_once()
    await wait_until_async(
        (tmp_path / "workspaces" / "T-1" / "started").exists,
        timeout=30.0,
        what='(tmp_path / "workspaces" / "T-1" / "started").exists',
    )
    await wait_until_async(
        (tmp_path / "workspaces" / "T-2" / "started").exists,
        timeout=30.0,
        what='(tmp_path / "workspaces" / "T-2" / "started").exists',
    )
    first.runtime.stop()
    await asyncio.wait_for(first.runtime.wait_for_runs(), 30)
    # T-1 has uncommitted work; T-2's was committed away, so it is clean.
    t2 = tmp_path / "workspaces" / "T-2"
    (t2 / "unsaved.txt").unlink()
    for name in ("started",):
        (t2 / name).unlink(missing_ok=True)
    (t2 / "started").write_text("")  # untracked again: commit it
    _git("add", "-A", cwd=t2)
    _git("commit", "-q", "-m", "work", cwd=t2)

    second = build_rig(wf, issues=[issue(1, state="Done"), issue(2, state="Done")])
    await second.runtime.poll_once()

    assert second.of_type("startup_workspace_cleanup_failed") == []
    [preserved] = second.of_type("workspace_preserved")
    assert preserved["identifier"] == "T-1"
    [sweep] = second.of_type("startup_workspace_cleanup")
    assert sweep["removed"] == ["T-2"]
    assert (tmp_path / "workspaces" / "T-1" / "unsaved.txt").exists()
    assert not t2.exists()
