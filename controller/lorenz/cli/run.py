"""``lorenz [WORKFLOW.md]``: run a workflow on this host (the default command).

Only argument parsing lives here; the composition (which store, tracker, runner, server) is
:mod:`lorenz.daemon.host`. Exit codes: 0 after a graceful stop or a finished ``--once``,
2 for a configuration error or ``daemon_running`` (nothing started), 1 when the service
failed, 130 on Ctrl-C before the runtime took over signal handling.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from lorenz.cli.options import add_workflow_arguments, print_problems, workflow_overrides

if TYPE_CHECKING:
    from lorenz.daemon.host import Attachment, HostOptions
    from lorenz.workflow import LoadedWorkflow


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
    parser.add_argument(
        "--grace-seconds",
        type=_grace_seconds,
        default=120.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT/`lorenz stop`: start no new runs and let runs in flight go on "
        "this long before stopping (default 120; a second signal is ignored, `lorenz stop "
        "--force` ends it at once); detached workers still running then are left to the next "
        "controller",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with the daemon feature: take over a lease whose holder cannot be verified dead "
        "(a daemon on another host), generation-fenced, instead of refusing with "
        "daemon_lock_stale; a live daemon on this host is never replaced",
    )
    parser.add_argument(
        "--force-kill",
        action="store_true",
        help="at the end of the grace window cancel detached workers instead of leaving them "
        "to the next controller to adopt",
    )


def _grace_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 86_400:
        raise argparse.ArgumentTypeError("must be between 0 and 86400 seconds")
    return value


def run(args: argparse.Namespace) -> int:
    from lorenz.secrets import hide_process_environment

    # NB: first: agents run as this uid, and could otherwise read this process's environment
    # (the tracker key a `$VAR` names) and memory through /proc.
    hide_process_environment()
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from lorenz.config import LoggingSettings
    from lorenz.daemon import logs
    from lorenz.daemon.errors import DaemonRunning
    from lorenz.daemon.host import ATTACHMENTS, HostOptions, run_host
    from lorenz.workflow import WorkflowError

    # Defaults until the workflow is loaded; the logs attachment then applies its `logging`
    # section and secrets (first in the list, so it is in force before the others start).
    logs.configure_logging(LoggingSettings())
    if logs.attachment_factory not in ATTACHMENTS:
        ATTACHMENTS.insert(0, logs.attachment_factory)
    for factory in (terminal_view_when_wanted, http_server_when_configured):
        if factory not in ATTACHMENTS:
            ATTACHMENTS.append(factory)
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
        grace_seconds=args.grace_seconds,
        force_kill=args.force_kill,
        force=args.force,
    )
    try:
        return asyncio.run(run_host(options))
    except WorkflowError as exc:
        print_problems([exc])
        return 2
    except DaemonRunning as exc:
        # NB: a usage error, like a bad workflow: nothing started, and the way on is another
        # command (``lorenz refresh``), not a retry of this one.
        print(str(exc), file=sys.stderr)  # NB: a coded error's text starts with its code
        return 2


# NB: the terminal view and the HTTP server are imported only when this run uses them: the
# server's stack (aiohttp, prometheus-client) is a fifth of the CPU a plain run spends before
# its first tracker request.


def terminal_view_when_wanted(loaded: LoadedWorkflow, options: HostOptions) -> Attachment | None:
    """For ``ATTACHMENTS``: the terminal view, when stdout is a TTY and ``--no-tui`` is absent."""
    if not options.tui:
        return None
    from lorenz import tui

    return tui.attachment_factory(loaded, options)


def http_server_when_configured(
    loaded: LoadedWorkflow, options: HostOptions
) -> Attachment | None:
    """For ``ATTACHMENTS``: the plain HTTP server, when ``--port`` or ``server.port`` is set.

    NB: not in daemon mode, where the daemon's control transport serves the same app with the
    control routes (:func:`lorenz.daemon.daemons.with_control_transport` adds it); the test is
    the one the host itself makes.
    """
    from lorenz.daemon.daemons import wants_daemon

    if wants_daemon(loaded.settings, once=options.once):
        return None
    if options.port is None and loaded.settings.server.port is None:
        return None
    from lorenz import server

    return server.attachment_factory(loaded, options)
