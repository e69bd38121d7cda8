"""Builds a real runtime for tests: memory or files tracker, real workspaces, real agents.

Agents are real subprocesses speaking the ``command`` protocol: small Python scripts written
into the test's temp dir, so every test exercises spawning, stdin prompts, exit codes and
process-group kills exactly as production does.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from lorenz.agents import build_runner
from lorenz.claims import MemoryClaimStore
from lorenz.model import ClaimStore, Clock, Issue, SystemClock
from lorenz.orchestrator import Orchestrator
from lorenz.runtime import LorenzRuntime
from lorenz.trackers.memory import MemoryTracker
from lorenz.workflow import LoadedWorkflow, load_workflow
from lorenz.workspaces import WorkspaceManager


def write_agent(tmp_path: Path, name: str, body: str) -> Path:
    """A command-protocol agent script; ``body`` runs with ``prompt`` and ``env`` defined."""
    script = tmp_path / f"{name}.py"
    script.write_text(
        "import os, sys, time, json, pathlib\n"
        "prompt = sys.stdin.read()\n"
        "env = os.environ\n"
        "def note(name, text):\n"
        "    path = pathlib.Path(env['LORENZ_WORKSPACE'], name)\n"
        "    tmp = path.with_name(name + '.tmp')\n"
        "    tmp.write_text(text)\n"
        "    os.replace(tmp, path)\n" + textwrap.dedent(body),
        encoding="utf-8",
    )
    return script


def write_workflow(
    tmp_path: Path,
    *,
    agent_script: Path,
    front_matter: dict[str, Any] | None = None,
    prompt: str = "Work on {{ issue.identifier }} attempt={{ attempt }}",
    name: str = "WORKFLOW.md",
) -> Path:
    config: dict[str, Any] = {
        "tracker": {"kind": "memory"},
        "polling": {"interval_ms": 50},
        "workspace": {"root": str(tmp_path / "workspaces")},
        "agent": {"kind": "test", "max_concurrent_agents": 4, "max_turns": 1},
        "agents": {
            "test": {
                "protocol": "command",
                "command": f"{sys.executable} {agent_script}",
                "stall_timeout_ms": 60000,
                "turn_timeout_ms": 60000,
            }
        },
    }
    for section, values in (front_matter or {}).items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    path = tmp_path / name
    path.write_text(f"---\n{yaml.safe_dump(config)}---\n{prompt}\n", encoding="utf-8")
    return path


LIVE_RUNTIMES: list[LorenzRuntime] = []
"""Runtimes built by this harness; the folder's conftest stops them after each test."""


@dataclasses.dataclass
class RuntimeRig:
    runtime: LorenzRuntime
    orchestrator: Orchestrator
    tracker: Any
    store: ClaimStore
    workspaces: WorkspaceManager
    workflow: LoadedWorkflow
    events: list[dict[str, Any]]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


def build_rig(
    workflow_path: Path,
    *,
    issues: list[Issue] | None = None,
    tracker: Any = None,
    clock: Clock | None = None,
    store: ClaimStore | None = None,
    reload: bool = True,
    pool: Any = None,
    capacity: Any = None,
    runner_factory: Any = None,
) -> RuntimeRig:
    workflow = load_workflow(workflow_path, environ={})
    settings = workflow.settings
    if tracker is None:
        tracker = MemoryTracker(issues or [], settings=settings)
    store = store or MemoryClaimStore(owner="test")
    clock = clock or SystemClock()
    orchestrator = Orchestrator(settings=settings, store=store, capacity=capacity, clock=clock)
    workspaces = WorkspaceManager(settings=settings, base_env={"PATH": "/usr/bin:/bin"})
    runtime = LorenzRuntime(
        workflow=workflow,
        orchestrator=orchestrator,
        tracker=tracker,
        workspaces=workspaces,
        runner_factory=runner_factory or build_runner,
        tracker_factory=lambda s: tracker.with_settings(s) if hasattr(tracker, "with_settings")
        else tracker,
        reload_workflow=(lambda: load_workflow(workflow_path, environ={})) if reload else None,
        pool=pool,
        base_env={"PATH": "/usr/bin:/bin", "HOME": str(workflow_path.parent)},
        clock=clock,
    )
    events: list[dict[str, Any]] = []
    # NB: the tests read events in their wire form (what the log file and the API carry).
    runtime.add_event_listener(lambda event: events.append(event.to_dict()))
    LIVE_RUNTIMES.append(runtime)
    return RuntimeRig(runtime=runtime, orchestrator=orchestrator, tracker=tracker, store=store,
                      workspaces=workspaces, workflow=workflow, events=events)
