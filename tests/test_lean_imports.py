"""A process imports only what its run uses (issue #35, memory).

Each test runs a fresh interpreter and reads its ``sys.modules`` at exit: the controller as
a user starts it (``lorenz WORKFLOW.md --once`` polling Linear, memory claims, a ``command``
agent, one run dispatched), and the launcher's preload that every worker shares. A module
named here would be held by every such process although nothing of the run calls it.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import lorenz.claims
import lorenz.config
import lorenz.leadership
import lorenz.trackers
from lorenz.trackers import DEFAULT_SECRET_ENV
from lorenz.trackers.github import GITHUB_TOKEN_ENV
from lorenz.trackers.gitlab import GITLAB_TOKEN_ENV
from lorenz.trackers.jira import JIRA_API_TOKEN_ENV
from lorenz.trackers.linear import LINEAR_API_KEY_ENV
from tests.e2e.rig import agent_environ, linear_tracker, write_workflow
from tests.fakes.linear_server import FakeLinearServer

# NB: as the console script runs it (``main()`` with the command line in ``sys.argv``); the
# report is printed by an atexit callback, after the run and its shutdown.
CONTROLLER = (
    "import atexit, json, sys\n"
    "atexit.register(lambda: print(json.dumps(sorted(sys.modules))))\n"
    "from lorenz.cli import main\n"
    "sys.argv = ['lorenz', *sys.argv[1:]]\n"
    "sys.exit(main())\n"
)

LAUNCHER = (
    "import json, sys\n"
    "from lorenz.workers import forkserver\n"
    "forkserver._preload(protocols=sys.argv[1:] or ['command'])\n"
    "print(json.dumps(sorted(sys.modules)))\n"
)

UNUSED_TRACKERS = (
    "lorenz.trackers.files",
    "lorenz.trackers.github",
    "lorenz.trackers.gitlab",
    "lorenz.trackers.gitlab_payloads",
    "lorenz.trackers.jira",
    "lorenz.trackers.jira_adf",
    "lorenz.trackers.jira_payloads",
    "lorenz.trackers.memory",
)

UNUSED_BY_THE_CONTROLLER = (
    # the worker's own side: the launcher runs it, the controller only launches and attaches
    "lorenz.workers.control_socket",
    "lorenz.workers.worker",
    # SSH placement, for workflows without worker.ssh_hosts
    "lorenz.workers.ssh",
    # the profiler, for LORENZ_PROFILE_CPROFILE only
    "cProfile",
    # the error codes' docs table: read by the docs generator only
    "lorenz.codes.catalog",
    "lorenz.codes.services",
)

UNUSED_CLAIM_STORES = (
    "_sqlite3",
    "lorenz.claims.sql",
    "lorenz.claims.sqlite",
    "lorenz.claims.turso",
    "sqlite3",
)

UNUSED_BY_WORKERS = (
    # the file lease and its retries: a worker only tells a live pid from a reused one
    "lorenz.leadership.base",
    "lorenz.leadership.files",
    "tenacity",
    # the shipped price table's parser: prices are the controller's
    "yaml",
    # the error codes' docs table: read by the docs generator only
    "lorenz.codes.catalog",
    "lorenz.codes.services",
)

SETTINGS_SCHEMA = (
    # a worker parses its spec and holds its agent's launch values without them (~10 MiB of
    # the launcher's image, which every worker shares)
    "annotated_types",
    "lorenz.config.settings",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
)


def _modules_at_exit(done: subprocess.CompletedProcess[str]) -> set[str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_controller_holds_no_tracker_or_claim_store_it_does_not_use(tmp_path: Path) -> None:
    with FakeLinearServer().running_in_thread() as linear:
        linear.add_issue("ENG-1", title="one run", state="Todo")
        workflow = write_workflow(
            tmp_path,
            tracker=linear_tracker(linear),
            agent_kind="plain",
            agent={"protocol": "command", "command": "true"},
        )
        done = subprocess.run(
            [sys.executable, "-c", CONTROLLER, str(workflow), "--once", "--no-tui"],
            cwd=tmp_path,
            env=agent_environ(tmp_path, LINEAR_API_KEY=linear.api_key),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    modules = _modules_at_exit(done)
    assert "run_started" in (tmp_path / "events.jsonl").read_text(), "one run must dispatch"
    assert {"lorenz.trackers.linear", "lorenz.claims.memory"} <= modules
    unused = {*UNUSED_TRACKERS, *UNUSED_CLAIM_STORES, *UNUSED_BY_THE_CONTROLLER}
    assert modules.isdisjoint(unused), sorted(modules & unused)


def test_the_launcher_preloads_nothing_a_worker_does_not_run() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER], capture_output=True, text=True, timeout=120, check=False
    )
    modules = _modules_at_exit(done)
    assert {"lorenz.workers.worker", "lorenz.agents.command"} <= modules
    assert modules.isdisjoint(UNUSED_BY_WORKERS), sorted(modules & set(UNUSED_BY_WORKERS))


@pytest.mark.parametrize("protocol", ["command", "codex-app-server", "claude-stream-json"])
def test_the_launcher_preloads_no_pydantic_and_no_settings(protocol: str) -> None:
    """NB: ``acp`` is not here: the ACP SDK's schema is pydantic models (docs/agents.md)."""
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, protocol],
        capture_output=True, text=True, timeout=120, check=False,
    )
    modules = _modules_at_exit(done)
    assert {"lorenz.workers.worker", "lorenz.config.kinds"} <= modules
    assert modules.isdisjoint(SETTINGS_SCHEMA), sorted(modules & set(SETTINGS_SCHEMA))


def test_the_default_secret_variables_are_the_adapters_own() -> None:
    """``DEFAULT_SECRET_ENV`` names the variables without importing the adapters."""
    assert list(DEFAULT_SECRET_ENV.values()) == [
        LINEAR_API_KEY_ENV,
        GITHUB_TOKEN_ENV,
        GITLAB_TOKEN_ENV,
        JIRA_API_TOKEN_ENV,
    ]


@pytest.mark.parametrize(
    "package",
    [lorenz.claims, lorenz.config, lorenz.leadership, lorenz.trackers],
    ids=lambda package: package.__name__,
)
def test_a_lazy_name_is_its_modules_own_object(package: ModuleType) -> None:
    """The names a package loads on first use: each resolves to its module's object, is in
    ``__all__``, and is what the imports under ``TYPE_CHECKING`` (read by type checkers) say."""
    lazy: dict[str, str] = package._LAZY
    name = package.__name__
    source = Path(str(package.__file__)).read_text(encoding="utf-8")
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imported: dict[str, str] = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        assert node.module is not None
        for alias in node.names:
            assert alias.asname == alias.name, node.module
            imported[alias.name] = node.module.removeprefix(f"{name}.")
    assert imported == lazy
    for attribute, module in lazy.items():
        assert attribute in package.__all__
        own = getattr(importlib.import_module(f"{name}.{module}"), attribute)
        assert getattr(package, attribute) is own, attribute
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = package.NoSuchThing
