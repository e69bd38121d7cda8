"""``lorenz validate``: everything that would stop a run, found before starting one.

It runs the whole load pipeline (file, YAML, schema, flags, features), then the dispatch
preflight (tracker kind, token, project) and a static check of the prompt template (syntax,
unknown variables and filters), and reports every problem it can find at once — one line each,
``<code> <key path>: <message>`` — so a CI job or an editor can show them all. Exit 0 with a
one-line summary when there is nothing to fix, 2 otherwise.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from lorenz.cli import EXIT_OK, EXIT_USAGE
from lorenz.cli.options import add_workflow_arguments, load_from_args, print_problems

if TYPE_CHECKING:
    from lorenz.workflow import LoadedWorkflow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workflow_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from lorenz.workflow import WorkflowError, dispatch_problems

    try:
        loaded = load_from_args(args)
    except WorkflowError as exc:
        print_problems([exc])
        return EXIT_USAGE
    for warning in loaded.warnings:
        print(f"warning: {warning}")
    problems: list[WorkflowError] = [
        *dispatch_problems(loaded.settings),
        *loaded.prompt.problems(),
    ]
    if problems:
        print_problems(problems)
        return EXIT_USAGE
    print(summary_line(loaded))
    return EXIT_OK


def summary_line(loaded: LoadedWorkflow) -> str:
    """``ok <path>: tracker=... agent=... caps ... claim_store=...`` for a loaded workflow."""
    settings = loaded.settings
    agent = settings.agent
    kind = settings.agent_kind()
    tracker = settings.tracker.kind.value if settings.tracker.kind is not None else "none"
    per_state = ",".join(f"{s}={n}" for s, n in agent.max_concurrent_agents_by_state.items())
    per_host = settings.worker.max_concurrent_agents_per_host
    parts = [
        f"tracker={tracker}",
        f"agent={agent.kind}({kind.protocol.value})",
        f"max_concurrent_agents={agent.max_concurrent_agents}",
        *([f"by_state={per_state}"] if per_state else []),
        *([f"per_host={per_host}"] if per_host is not None else []),
        f"ensemble_size={agent.ensemble_size}",
        f"max_turns={agent.max_turns}",
        f"claim_store={settings.claim_store.backend.value}",
        f"daemon={'on' if settings.daemon.enabled else 'off'}",
        f"prompt={'default' if loaded.prompt.is_default else 'custom'}",
    ]
    return f"ok {loaded.path}: {' '.join(parts)}"
