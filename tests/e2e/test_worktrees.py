"""Worktree mode end to end: each issue runs in a git worktree; a kept one never fails a tick.

The user's own repository is a real git repository; Lorenz is the single-host composition root
on the fake Linear board; the agent is the scripted ``command`` agent, which leaves files in its
workspace (so the worktree has uncommitted work). Once the issue is Done, the next start-up's
sweep keeps that worktree, says so, and goes on.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.rig import (
    agent_environ,
    install_scenarios,
    linear_tracker,
    per_issue_scenario_arg,
    python_command,
    run_host_once,
    write_workflow,
)
from tests.fakes.linear_server import FakeLinearServer

E2E = Path(__file__).resolve().parent


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd),
                               "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
                               "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@example.com"}).stdout


async def test_an_issue_runs_in_a_worktree_and_a_dirty_one_is_kept_when_done(
    tmp_path: Path, linear_server: FakeLinearServer
) -> None:
    linear = linear_server
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "README.md").write_text("hello\n")
    _git("add", "README.md", cwd=repo)
    _git("commit", "-q", "-m", "initial", cwd=repo)
    linear.add_issue("ENG-1", title="Add a greeting", state="Todo", priority=2)
    install_scenarios(tmp_path, {"ENG-1": {"exit": 0}})
    command = f"{python_command(E2E / 'command_agent.py')} {per_issue_scenario_arg(tmp_path)}"
    workflow = write_workflow(
        tmp_path,
        tracker=linear_tracker(linear),
        agent_kind="e2e",
        agent={"protocol": "command", "command": command},
        extra={"workspace": {"root": str(tmp_path / "workspaces"), "kind": "worktree",
                             "repo": str(repo)}},
    )
    environ = agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key)

    first = await run_host_once(workflow, environ=environ)

    [history] = first.history("ENG-1")
    assert history["outcome"] == "success"
    worktree = tmp_path / "workspaces" / "ENG-1"
    assert (worktree / ".git").is_file()  # a linked worktree of the user's repository
    assert str(worktree) in _git("worktree", "list", cwd=repo)
    assert (worktree / "README.md").read_text() == "hello\n"
    assert (worktree / "prompt.txt").exists()  # the agent's uncommitted output

    linear.set_state("ENG-1", "Done")
    second = await run_host_once(workflow, environ=environ)

    assert second.of_type("poll_error") == []
    assert second.of_type("startup_workspace_cleanup_failed") == []
    [preserved] = second.of_type("workspace_preserved")
    assert (preserved["identifier"], preserved["code"]) == ("ENG-1", "worktree_dirty")
    assert (worktree / "prompt.txt").exists()
    assert len(second.of_type("poll_completed")) == 1
