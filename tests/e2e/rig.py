"""What every end-to-end test needs: a seeded board, a WORKFLOW.md, and one host run.

The end-to-end tests drive Lorenz the way a user does — a WORKFLOW.md on disk, the single-host
composition root (:func:`lorenz.daemon.host.run_host`, or the ``lorenz`` console script), real
agent subprocesses (the scripted fakes in ``tests/fakes``) and a real HTTP tracker (the fake
Linear or GitHub server on 127.0.0.1). Nothing is patched: what the tests assert is what the
fakes saw on the wire, what the agents wrote down, and what the runtime reports.

Per-issue behaviour comes from per-issue scenario files: an agent command picks
``<tmp>/scenarios/<issue identifier>.json``, so one workflow can run a succeeding and a failing
agent side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from lorenz.daemon.host import HostOptions, run_host
from lorenz.model import RuntimeEvent
from lorenz.runtime import LorenzRuntime
from tests.fakes.linear_server import FakeIssue, FakeLinearServer

FAKES = Path(__file__).resolve().parent.parent / "fakes"
SCENARIOS = FAKES / "scenarios"

PROMPT_TEMPLATE = """\
Work on {{ issue.identifier }}: {{ issue.title }}
State: {{ issue.state }}
Priority: {{ issue.priority }}
Labels: {{ issue.labels | join: ", " }}
{% if issue.description %}{{ issue.description }}{% else %}No description.{% endif %}
{% if attempt %}Retry attempt {{ attempt }}{% else %}First attempt{% endif %}"""
"""A strict Liquid template over several issue fields (an unknown field would fail the run)."""


def expected_prompt(
    *,
    identifier: str,
    title: str,
    state: str,
    priority: int | None,
    labels: list[str],
    description: str | None,
    attempt: int | None = None,
) -> str:
    """What :data:`PROMPT_TEMPLATE` renders to, written out by hand (no Liquid here)."""
    return (
        f"Work on {identifier}: {title}\n"
        f"State: {state}\n"
        f"Priority: {'' if priority is None else priority}\n"
        f"Labels: {', '.join(labels)}\n"
        f"{description if description else 'No description.'}\n"
        + (f"Retry attempt {attempt}" if attempt else "First attempt")
    )


def python_command(script: Path | str, *args: str) -> str:
    """A shell command running ``script`` with this interpreter (login shells reset PATH)."""
    return " ".join(shlex.quote(str(part)) for part in (sys.executable, script, *args))


def per_issue_scenario_arg(tmp_path: Path) -> str:
    """The shell word naming this issue's scenario file (expanded by the agent's shell)."""
    return f'{shlex.quote(str(tmp_path / "scenarios"))}/"$LORENZ_ISSUE_IDENTIFIER".json'


def install_scenarios(tmp_path: Path, by_identifier: Mapping[str, str | dict[str, Any]]) -> None:
    """Copy a scenario (a file name in ``tests/fakes/scenarios``, or a dict) per issue."""
    folder = tmp_path / "scenarios"
    folder.mkdir(exist_ok=True)
    for identifier, scenario in by_identifier.items():
        target = folder / f"{identifier}.json"
        if isinstance(scenario, str):
            shutil.copyfile(SCENARIOS / scenario, target)
        else:
            target.write_text(json.dumps(scenario), encoding="utf-8")


def agent_environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The controller's whole environment for one host run: small and explicit.

    NB: agents run under ``bash -lc``, which reads ``$HOME/.profile``; an empty HOME of our own
    keeps the machine's profile out of the test (and HOME must be set at all, or the login
    shell silently runs nothing on this machine).
    """
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        # NB: runs execute in workers; the suite's short state root (tests/conftest.py), not
        # one under this long temporary HOME (unix socket paths are limited to 107 bytes).
        "LORENZ_WORKER_STATE": os.environ["LORENZ_WORKER_STATE"],
        **extra,
    }


def write_workflow(
    tmp_path: Path,
    *,
    tracker: dict[str, Any],
    agent_kind: str,
    agent: dict[str, Any],
    max_turns: int = 1,
    prompt: str = PROMPT_TEMPLATE,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """A WORKFLOW.md with ``tracker``, one agent kind ``agent_kind`` and the prompt."""
    config: dict[str, Any] = {
        "tracker": tracker,
        "polling": {"interval_ms": 600000},
        "workspace": {"root": str(tmp_path / "workspaces")},
        "agent": {"kind": agent_kind, "max_turns": max_turns, "max_concurrent_agents": 4},
        "agents": {
            # NB: generous handshake bound: each run starts a worker and then the agent, and
            # on a loaded machine the fake agents can take seconds to answer ``initialize``.
            agent_kind: {
                "stall_timeout_ms": 60000,
                "turn_timeout_ms": 60000,
                "read_timeout_ms": 30000,
                **agent,
            },
        },
        "logging": {"log_file": str(tmp_path / "events.jsonl")},
        **(extra or {}),
    }
    path = tmp_path / "WORKFLOW.md"
    path.write_text(f"---\n{yaml.safe_dump(config, sort_keys=False)}---\n{prompt}\n", "utf-8")
    return path


# -- the Linear board ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinearBoard:
    """Two active issues, one terminal, and one (active) blocked by an active one."""

    todo: FakeIssue
    in_progress: FakeIssue
    done: FakeIssue
    blocked: FakeIssue

    @property
    def dispatchable(self) -> list[FakeIssue]:
        return [self.in_progress, self.todo]


def seed_linear_board(linear: FakeLinearServer) -> LinearBoard:
    todo = linear.add_issue(
        "ENG-1",
        title="Add a greeting",
        state="Todo",
        priority=2,
        labels=["Backend", "good first issue"],
        description="Print a friendly greeting on start-up.",
    )
    in_progress = linear.add_issue("ENG-2", title="Fix the parser", state="In Progress", priority=1)
    done = linear.add_issue("ENG-3", title="Ship the old thing", state="Done", priority=3)
    blocked = linear.add_issue(
        "ENG-4", title="Build on the greeting", state="Todo", priority=1, blocked_by=["ENG-1"]
    )
    return LinearBoard(todo=todo, in_progress=in_progress, done=done, blocked=blocked)


def linear_tracker(linear: FakeLinearServer, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "linear",
        "endpoint": linear.url,
        "api_key": "$LINEAR_API_KEY",
        "project_slug": linear.project_slug,
        "active_states": ["Todo", "In Progress"],
        "terminal_states": ["Done", "Canceled", "Duplicate"],
        **extra,
    }


# -- running the host ---------------------------------------------------------------------------


@dataclasses.dataclass
class HostRun:
    """One finished host run, as the runtime left it."""

    exit_code: int
    runtime: LorenzRuntime
    snapshot: dict[str, Any]
    events: list[dict[str, Any]]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def retry(self, identifier: str) -> dict[str, Any]:
        rows: list[dict[str, Any]] = [
            r for r in self.snapshot["retrying"] if r["identifier"] == identifier
        ]
        assert len(rows) == 1, f"expected one retry row for {identifier}: {rows}"
        return rows[0]

    def history(self, identifier: str) -> list[dict[str, Any]]:
        return [h for h in self.snapshot["run_history"] if h["identifier"] == identifier]


async def run_host_once(
    workflow: Path,
    *,
    environ: Mapping[str, str],
    once: bool = True,
    on_event: Callable[[LorenzRuntime, dict[str, Any]], None] | None = None,
    timeout_s: float = 30.0,
) -> HostRun:
    """Run the single-host composition root on ``workflow`` until it returns.

    With ``once=False`` the host runs its poll loop; ``on_event`` must then stop the runtime
    (``runtime.stop()``) when the test has seen enough.
    """
    events: list[dict[str, Any]] = []
    holder: list[LorenzRuntime] = []

    def ready(runtime: LorenzRuntime) -> None:
        holder.append(runtime)

        def listen(event: RuntimeEvent) -> None:
            document = event.to_dict()
            events.append(document)
            if on_event is not None:
                on_event(runtime, document)

        runtime.add_event_listener(listen)

    options = HostOptions(workflow_path=str(workflow), once=once, tui=False, environ=dict(environ))
    with _restoring_signal_handlers():
        try:
            code = await asyncio.wait_for(run_host(options, ready=ready), timeout=timeout_s)
        except TimeoutError:
            if holder:
                holder[0].stop()
            raise
    assert holder, "run_host returned without building a runtime"
    snapshot = holder[0].snapshot().to_dict()
    return HostRun(exit_code=code, runtime=holder[0], snapshot=snapshot, events=events)


@contextlib.contextmanager
def _restoring_signal_handlers() -> Iterator[None]:
    """run_host installs SIGINT/SIGTERM handlers on the loop; take them off afterwards."""
    loop = asyncio.get_running_loop()
    try:
        yield
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
