"""``lorenz [WORKFLOW.md]``: run a workflow on this host (the default command).

Only argument parsing lives here; the composition (which store, tracker, runner, server) is
:mod:`lorenz.daemon.host`. Exit codes: 0 after a graceful stop or a finished ``--once``,
2 for a configuration error (nothing started), 1 when the service failed, 130 on Ctrl-C
before the runtime took over signal handling.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from lorenz.cli.options import add_workflow_arguments, print_problems, workflow_overrides


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workflow_arguments(parser)
    parser.add_argument(
        "--once",
        action="store_true",
        help="run one tick, wait for the runs it dispatched, then exit",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run one tick that logs dry_run events for what would be dispatched, dispatch "
        "nothing, take no daemon lease, then exit",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="serve the API/dashboard on this port (overrides server.port; 0 = ephemeral)",
    )
    parser.add_argument(
        "--no-tui", action="store_true", help="no terminal view (also off when stdout is not a TTY)"
    )


def run(args: argparse.Namespace) -> int:
    from lorenz import server, tui
    from lorenz.config import LoggingSettings
    from lorenz.daemon import logs
    from lorenz.daemon.host import ATTACHMENTS, HostOptions, run_host
    from lorenz.workflow import WorkflowError

    # Defaults until the workflow is loaded; the logs attachment then applies its `logging`
    # section and secrets (first in the list, so it is in force before the others start).
    logs.configure_logging(LoggingSettings())
    if logs.attachment_factory not in ATTACHMENTS:
        ATTACHMENTS.insert(0, logs.attachment_factory)
    if tui.attachment_factory not in ATTACHMENTS:
        ATTACHMENTS.append(tui.attachment_factory)
    # NB: registered by identity: daemon mode swaps this very factory for its own transport.
    if server.attachment_factory not in ATTACHMENTS:
        ATTACHMENTS.append(server.attachment_factory)
    flags, features = workflow_overrides(args)
    options = HostOptions(
        workflow_path=args.workflow,
        cli_flags=flags,
        cli_features=features,
        # NB: a dry run is one tick like --once: it must neither poll forever nor take the
        # daemon lease from (or contend with) a real daemon of the same workflow.
        once=args.once or args.dry_run,
        dry_run=args.dry_run,
        port=args.port,
        tui=not args.no_tui and sys.stdout.isatty(),
    )
    try:
        return asyncio.run(run_host(options))
    except WorkflowError as exc:
        print_problems([exc])
        return 2
