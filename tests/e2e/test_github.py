"""GitHub end to end: labels as states, an agent that finishes its own issue, reconciliation.

The ``command`` agent (``github_agent.py``) relabels its issue from ``todo`` to ``done`` through
the fake GitHub server's write endpoints, with a token of its own that the workflow hands it in
``agents.<kind>.env``; the tracker's token is stripped from its environment. On the next tick
(nudged by the finished run) reconciliation reads the issue by number, finds it terminal,
releases its slot and removes its workspace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorenz.runtime import LorenzRuntime
from tests.e2e.rig import (
    agent_environ,
    expected_prompt,
    python_command,
    run_host_once,
    write_workflow,
)
from tests.fakes.github_server import FakeGitHubServer

E2E = Path(__file__).resolve().parent
AGENT_TOKEN = "ghp_agentOwnToken000000000000000000000"


async def test_the_agent_labels_its_issue_done_and_its_exit_cleans_up(
    tmp_path: Path,
) -> None:
    async with FakeGitHubServer(tokens=[AGENT_TOKEN]) as github:
        issue = github.add_issue(
            "Add a greeting", labels=["todo", "backend"], body="Print a friendly greeting."
        )
        pull = github.add_pull_request("Draft greeting", labels=["todo"])
        old = github.add_issue("Ship the old thing", labels=["done"], state="closed")
        out = tmp_path / "agent-out"
        workflow = write_workflow(
            tmp_path,
            tracker={
                "kind": "github",
                "endpoint": github.url,
                "api_key": "$GITHUB_TOKEN",
                "repository": github.repository,
                "active_states": ["todo", "in progress"],
                "terminal_states": ["done", "wontfix"],
            },
            agent_kind="e2e",
            agent={
                "protocol": "command",
                "command": python_command(E2E / "github_agent.py"),
                "env": {
                    "E2E_GITHUB_API": github.url,
                    "E2E_GITHUB_REPOSITORY": github.repository,
                    "E2E_AGENT_GITHUB_TOKEN": AGENT_TOKEN,
                    "E2E_FROM_LABELS": "todo,in progress",
                    "E2E_TO_LABEL": "done",
                    "E2E_OUT_DIR": str(out),
                    "LEAKED_GITHUB_TOKEN": github.token,
                },
            },
        )
        ticks: list[dict[str, Any]] = []

        def stop_once_cleaned_up(runtime: LorenzRuntime, event: dict[str, Any]) -> None:
            if event["type"] in ("poll_completed", "poll_error"):
                ticks.append(event)
            if event["type"] in ("workspace_cleanup", "poll_error"):
                runtime.stop()

        run = await run_host_once(
            workflow,
            environ=agent_environ(tmp_path, GITHUB_TOKEN=github.token),
            once=False,
            on_event=stop_once_cleaned_up,
        )

    # One tick dispatched; the clean exit's own by-id read did the rest (no second tick).
    assert [t["type"] for t in ticks] == ["poll_completed"]
    identifier = f"{github.repository}#{issue.number}"
    assert [e["identifier"] for e in run.of_type("run_started")] == [identifier]
    assert [h["outcome"] for h in run.history(identifier)] == ["success"]

    # The agent saw its issue, rendered with GitHub's fields, and none of the tracker's token.
    agent_dir = out / str(issue.number)
    assert (agent_dir / "prompt.txt").read_text(encoding="utf-8") == expected_prompt(
        identifier=identifier,
        title="Add a greeting",
        state="todo",
        priority=None,
        labels=["todo", "backend"],
        description="Print a friendly greeting.",
    ) + "\n"
    env = json.loads((agent_dir / "agent_env.json").read_text(encoding="utf-8"))
    assert env["E2E_AGENT_GITHUB_TOKEN"] == AGENT_TOKEN
    assert "GITHUB_TOKEN" not in env
    assert "LEAKED_GITHUB_TOKEN" not in env
    assert github.token not in env.values()

    # It moved the issue by label, with its own token.
    writes = [r for r in github.requests if r.method != "GET"]
    assert [(r.method, r.path) for r in writes] == [
        ("DELETE", f"/repos/{github.repository}/issues/{issue.number}/labels/todo"),
        ("DELETE", f"/repos/{github.repository}/issues/{issue.number}/labels/in progress"),
        ("POST", f"/repos/{github.repository}/issues/{issue.number}/labels"),
    ]
    assert [r.status for r in writes] == [200, 404, 200]
    assert writes[-1].body == {"labels": ["done"]}
    assert {r.authorization for r in writes} == {f"Bearer {AGENT_TOKEN}"}
    assert github.issue(issue.number).labels == ["backend", "done"]
    # Lorenz itself only read, always with the tracker's token.
    reads = [r for r in github.requests if r.method == "GET"]
    assert {r.authorization for r in reads} == {f"Bearer {github.token}"}

    # After the agent exited, Lorenz read the issue by number, saw it terminal, and cleaned
    # up: released without a continuation retry, workspace gone.
    after = github.requests[github.requests.index(writes[-1]) + 1 :]
    single = f"/repos/{github.repository}/issues/{issue.number}"
    assert single in [r.path for r in after]
    cleanups = run.of_type("workspace_cleanup")
    assert [(c["identifier"], c["reason"]) for c in cleanups] == [(identifier, "terminal")]
    workspace = tmp_path / "workspaces" / Path(env["LORENZ_WORKSPACE"]).name
    assert workspace == Path(env["LORENZ_WORKSPACE"])
    assert not workspace.exists()
    assert run.snapshot["retrying"] == []
    assert run.snapshot["running"] == []
    assert run.of_type("retry_scheduled") == []  # no "continuation retry #1" for a done issue
    [finished] = run.of_type("run_finished")
    assert finished["reason"] == "terminal"

    # The pull request and the closed issue were never candidates for a run.
    for number in (pull.number, old.number):
        assert f"{github.repository}#{number}" not in {e.get("identifier") for e in run.events}
