"""The ``lorenz`` command: run mode by default, plus subcommands found in a registry.

Usage shapes::

    lorenz [WORKFLOW.md] [--flag k=v]... [--feature f]...   # run mode (no subcommand)
    lorenz validate [WORKFLOW.md] [--flag/--feature ...]
    lorenz config [WORKFLOW.md] [--json] [--flag/--feature ...]
    lorenz status|refresh|stop|operator|crds ...             # as their modules arrive

A first argument that is not a known subcommand means run mode, so ``lorenz WORKFLOW.md`` and
``lorenz --feature daemon WORKFLOW.md`` both run. (A workflow file literally named like a
subcommand is reached as ``lorenz ./validate``.)

Each subcommand is one module with ``add_arguments(parser)`` and ``run(args) -> int``, listed in
:data:`SUBCOMMANDS` by module *name*: adding one is a new module plus one registry line, and
nothing is imported until it is chosen. NB: keep this module free of heavy imports (pydantic,
aiohttp, kopf): ``lorenz status`` must start in well under 300 ms, so every subcommand imports
what it needs inside ``run``. A registered module that does not exist yet reports "not available"
instead of being mistaken for a workflow path.

Exit codes: 0 ok, 1 runtime failure, 2 configuration or usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import gc
import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import lorenz

EXIT_OK = 0
EXIT_FAILURE = 1
"""A runtime failure: the service could not start or died."""
EXIT_USAGE = 2
"""A configuration or usage error: fix the workflow file, a flag or the command line."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C / SIGINT)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Subcommand:
    """Where a subcommand's code lives, and its one-line help (shown without importing it)."""

    module: str
    summary: str
    one_shot: bool = False
    """A bounded amount of work on a size-bounded input, then exit (``validate``, ``config``):
    run from the console script, it runs without the cyclic garbage collector and exits
    without tearing the interpreter down (see :func:`_exit_at_once`)."""


RUN_MODE = Subcommand(
    "lorenz.cli.run", "Run the workflow: poll the tracker and dispatch agent runs."
)
"""What ``lorenz [WORKFLOW.md] [options]`` runs (no subcommand)."""

SUBCOMMANDS: dict[str, Subcommand] = {
    "validate": Subcommand(
        "lorenz.cli.validate",
        "Check WORKFLOW.md, flags and features; print each error.",
        one_shot=True,
    ),
    "config": Subcommand(
        "lorenz.cli.config",
        "Print the effective configuration and each flag's source.",
        one_shot=True,
    ),
    "status": Subcommand("lorenz.cli.status", "Show the running daemon's state."),
    "refresh": Subcommand("lorenz.cli.refresh", "Ask the running daemon to poll now."),
    "stop": Subcommand("lorenz.cli.stop", "Ask the running daemon to shut down gracefully."),
    "answer": Subcommand(
        "lorenz.cli.answer", "Answer the question a waiting issue's agent asked."
    ),
    "operator": Subcommand("lorenz.cli.operator", "Run the Kubernetes operator."),
    "teardown": Subcommand(
        "lorenz.cli.teardown",
        "Stop an operator release: Leases, run Pods, finalizers (Helm's pre-delete hook).",
    ),
    "crds": Subcommand("lorenz.cli.crds", "Print the Kubernetes CustomResourceDefinitions."),
    "worker": Subcommand("lorenz.cli.worker", "Execute one run (started by a controller)."),
}
"""Subcommand name → module. A module may be listed before it exists (the name is reserved)."""


def is_available(subcommand: Subcommand) -> bool:
    """Whether the subcommand's module exists in this installation."""
    try:
        return importlib.util.find_spec(subcommand.module) is not None
    except ModuleNotFoundError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lorenz`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    # NB: without a handler, warnings logged by library layers would reach stderr through
    # logging's last-resort handler *and* be printed by the commands; run mode installs real
    # handlers on the root logger, which this does not block.
    lorenz_logger = logging.getLogger("lorenz")
    if not lorenz_logger.handlers:
        lorenz_logger.addHandler(logging.NullHandler())

    if args and args[0] in ("-h", "--help"):
        print(_top_level_help())
        return EXIT_OK
    if args and args[0] == "--version":
        print(f"lorenz {lorenz.__version__}")
        return EXIT_OK
    if args and args[0] in SUBCOMMANDS:
        name = args[0]
        subcommand = SUBCOMMANDS[name]
        # NB: only as the console script (``argv`` unset): a caller of ``main([...])`` — the
        # tests, ``lorenz worker`` — keeps its interpreter, its collector and its exit.
        one_shot = argv is None and subcommand.one_shot
        if one_shot:
            gc.disable()
        code = _dispatch(f"lorenz {name}", subcommand, args[1:])
        if one_shot:
            _exit_at_once(code)
        return code
    return _dispatch("lorenz", RUN_MODE, args)


def _exit_at_once(code: int) -> None:
    """End the process now with ``code``, as a normal exit would but without its teardown.

    Why: ``lorenz validate`` has a 300 ms budget, and after it printed its last line the
    interpreter would spend a sizeable part of that (tens of ms) tearing down the ~450
    modules and ~40,000 objects that pydantic, python-liquid and PyYAML brought in — work
    nobody sees. What a normal exit does that anyone can see is kept, in its order: the
    ``atexit`` callbacks (``logging.shutdown`` among them) and flushing stdout and stderr.
    Returns (and the caller exits normally) if another thread is alive, which a normal exit
    would wait for, or if the flush fails (a closed pipe), so that the interpreter reports it
    and sets the exit status exactly as it always has.
    """
    if threading.active_count() > 1 or not _flushed():
        return
    atexit._run_exitfuncs()
    atexit._clear()  # NB: they ran; a normal exit after a failed flush must not run them again
    if _flushed():
        os._exit(code)


def _flushed() -> bool:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return False
    return True


def _dispatch(prog: str, subcommand: Subcommand, rest: list[str]) -> int:
    if not is_available(subcommand):
        what = "run mode" if subcommand is RUN_MODE else f"{prog!r}"
        print(
            f"{prog}: {what} is not available in this build yet; see `lorenz --help`",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    module: Any = importlib.import_module(subcommand.module)
    parser = argparse.ArgumentParser(prog=prog, description=subcommand.summary)
    module.add_arguments(parser)
    try:
        namespace = parser.parse_args(rest)
    except SystemExit as exc:  # argparse: 0 after --help, 2 on a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(module.run(namespace))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        code = _coded_exit(exc)
        if code is None:
            raise
        print(f"{prog}: {exc}", file=sys.stderr)
        return code


def _coded_exit(exc: BaseException) -> int | None:
    """Exit code for a coded error that a subcommand let escape; ``None`` if not coded."""
    from lorenz.model import LorenzError

    if not isinstance(exc, LorenzError):
        return None
    from lorenz.workflow import WorkflowError

    return EXIT_USAGE if isinstance(exc, WorkflowError) else EXIT_FAILURE


def _run_mode_help() -> list[str]:
    """The run mode's arguments and options as argparse words them (usage line dropped)."""
    if not is_available(RUN_MODE):
        return []
    module: Any = importlib.import_module(RUN_MODE.module)
    parser = argparse.ArgumentParser(prog="lorenz", add_help=False)
    module.add_arguments(parser)
    sections = parser.format_help().split("\n\n", 1)
    body = sections[1] if len(sections) > 1 else ""
    body = body.replace("positional arguments:", "run arguments:").replace(
        "options:", "run options:"
    )
    return [*body.rstrip().splitlines(), ""]


def _top_level_help() -> str:
    lines = [
        "usage: lorenz [WORKFLOW.md] [--flag KEY=VALUE]... [--feature NAME]... [options]",
        "       lorenz <command> [args]",
        "",
        "Turns issue-tracker work into coding-agent runs.",
        "",
        "Without a command, lorenz runs the workflow (default ./WORKFLOW.md).",
        "",
        *_run_mode_help(),
        "commands (`lorenz <command> --help` for each):",
    ]
    width = max(len(name) for name in SUBCOMMANDS)
    for name, subcommand in SUBCOMMANDS.items():
        if is_available(subcommand):
            lines.append(f"  {name.ljust(width)}  {subcommand.summary}")
    lines += [
        "",
        "exit codes: 0 ok, 1 runtime failure, 2 configuration or usage error, 130 interrupted",
    ]
    return "\n".join(lines)
