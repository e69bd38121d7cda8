"""The arguments every workflow-reading command shares: the path, ``--flag`` and ``--feature``.

Run mode, ``validate`` and ``config`` (and later ``status``, ``refresh``, ``stop``) all name a
workflow and may override flags; declaring the arguments once keeps their spelling and help
identical. There are deliberately no bespoke options for what a flag covers (no ``--sqlite``,
no ``--daemon``): ``--flag claim_store.backend=sqlite`` or ``--feature daemon``.

Heavy imports (the workflow layer pulls in pydantic) happen inside the functions, not at import.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from lorenz.workflow import ConfigProblem, LoadedWorkflow, WorkflowError


def add_workflow_arguments(parser: argparse.ArgumentParser) -> None:
    """``[WORKFLOW.md] [--flag KEY=VALUE]... [--feature NAME]...``."""
    parser.add_argument(
        "workflow",
        nargs="?",
        default=None,
        metavar="WORKFLOW.md",
        help="the workflow file (default: ./WORKFLOW.md)",
    )
    parser.add_argument(
        "--flag",
        dest="flags",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a flag, e.g. claim_store.backend=sqlite (repeatable; the last one wins)",
    )
    parser.add_argument(
        "--feature",
        dest="features",
        action="append",
        default=[],
        metavar="NAME",
        help="turn a feature on: durable_claims, daemon (repeatable)",
    )


def workflow_overrides(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The CLI flags (key → value) and features from parsed arguments; bad syntax raises."""
    from lorenz.workflow import parse_flag_assignment

    flags: dict[str, str] = {}
    for text in args.flags:
        key, value = parse_flag_assignment(text)
        flags[key] = value
    return flags, [name.strip() for name in args.features]


def load_from_args(
    args: argparse.Namespace, *, environ: Mapping[str, str] | None = None
) -> LoadedWorkflow:
    """Load the workflow the arguments name, with their flags and features applied."""
    from lorenz.workflow import load_workflow

    flags, features = workflow_overrides(args)
    return load_workflow(args.workflow, cli_flags=flags, cli_features=features, environ=environ)


def problem_lines(errors: Iterable[WorkflowError]) -> list[str]:
    """Each problem of each error as ``<code> <key path>: <message>``."""
    problems: list[ConfigProblem] = []
    for error in errors:
        problems.extend(error.problems())
    return [problem.format() for problem in problems]


def print_problems(errors: Iterable[WorkflowError], *, stream: TextIO | None = None) -> None:
    """Print :func:`problem_lines`, one per line."""
    out = stream if stream is not None else sys.stdout
    for line in problem_lines(errors):
        print(line, file=out)
