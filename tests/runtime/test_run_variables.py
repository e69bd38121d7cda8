"""A run's hooks and its agent are told the same ``LORENZ_*`` variables (one block builds both).

The workspace manager (hooks) and the runtime (agents) used to write the block each; this test
runs a real hook and a real agent for the same run and compares what each process saw."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from lorenz.model import ManualClock
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.runtime.test_runtime_loop import RECORDING_AGENT, issue

DUMP_ENV = "import json, os; open('hook-env.json', 'w').write(json.dumps(dict(os.environ)))"
ONLY_HOOKS = {"LORENZ_HOOK"}
ONLY_AGENTS = {"LORENZ_WORKFLOW", "LORENZ_PROMPT_FILE", "LORENZ_USAGE_FILE"}


def _lorenz(env: dict[str, str], *, minus: set[str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("LORENZ_") and k not in minus}


async def test_the_before_run_hook_and_the_agent_see_the_same_run_variables(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    hook = f"{shlex.quote(sys.executable)} -c {shlex.quote(DUMP_ENV)}"
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "hooks": {"before_run": hook}})
    clock = ManualClock()
    rig = build_rig(wf, issues=[issue(1)], clock=clock)
    workspace = tmp_path / "workspaces" / "T-1"

    for attempt in ("", "1"):  # the first run, then its continuation
        await rig.runtime.poll_once(wait_for_runs=True)
        hook_env = json.loads((workspace / "hook-env.json").read_text())
        agent_env = json.loads((workspace / "env.json").read_text())
        shared = _lorenz(hook_env, minus=ONLY_HOOKS)
        assert shared == {
            "LORENZ_ISSUE_ID": "id-1",
            "LORENZ_ISSUE_IDENTIFIER": "T-1",
            "LORENZ_ISSUE_TITLE": "Issue 1",
            "LORENZ_ISSUE_STATE": "Todo",
            "LORENZ_ATTEMPT": attempt,
            "LORENZ_SLOT": "0",
            "LORENZ_WORKSPACE": str(workspace.resolve()),
        }
        assert _lorenz(agent_env, minus=ONLY_AGENTS) == shared
        assert hook_env["LORENZ_HOOK"] == "before_run"
        assert agent_env["LORENZ_WORKFLOW"] == str(wf)
        clock.advance(1000)  # the continuation retry comes due
    assert len(rig.of_type("run_finished")) == 2
