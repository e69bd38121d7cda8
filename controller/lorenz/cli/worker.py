"""``lorenz worker``: execute one run (started by a controller, not by hand).

Shapes::

    lorenz worker --spec FILE|- --state-root DIR [--detach]   # create the state dir, run
    lorenz worker --state-dir DIR [--detach]                  # run the spec already in DIR
    lorenz worker --state-dir DIR --probe                     # print what DIR proves (JSON)
    lorenz worker --state-dir DIR --journal-after N           # print records after seq N
    lorenz worker --state-dir DIR --kill                      # kill the run's processes
    lorenz worker --state-dir DIR --bridge                    # stdio <-> the control socket
    lorenz worker --launcher --state-root DIR --parent PID    # fork workers per request line

With ``--detach`` the command returns as soon as the worker (in a session of its own) serves
its control socket, printing one JSON line; that is how controllers start workers, locally and
over ssh. Exit codes: 0 success (or started, with ``--detach``), 1 the run failed, 2 bad spec
or state directory, 3 canceled. ``--kill`` (how a controller stops a frozen or gone worker's
run on an SSH host, :mod:`lorenz.workers.leftovers`) prints ``{"alive": [pids]}`` and exits 0
only when none of the run's processes survived.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", metavar="FILE", help="the run spec (JSON); - for stdin")
    parser.add_argument("--state-root", metavar="DIR", help="where state directories live")
    parser.add_argument("--state-dir", metavar="DIR", help="the run's state directory")
    parser.add_argument(
        "--detach", action="store_true", help="run in a new session; return once it serves"
    )
    parser.add_argument("--probe", action="store_true", help="print the worker's state")
    parser.add_argument(
        "--journal-after", type=int, metavar="SEQ", help="print journal records after SEQ"
    )
    parser.add_argument(
        "--kill",
        action="store_true",
        help="kill the run's worker, agent and hooks; exit 0 once they are gone",
    )
    parser.add_argument(
        "--bridge", action="store_true", help="connect stdin/stdout to the control socket"
    )
    parser.add_argument(
        "--launcher",
        action="store_true",
        help="fork a worker per launch request on stdin (started by a controller)",
    )
    parser.add_argument("--parent", type=int, metavar="PID", help="the controller (--launcher)")
    parser.add_argument(
        "--preload",
        metavar="PROTOCOLS",
        help="comma-separated agent protocols whose runners the launcher imports before its "
        "first fork (default: every protocol's)",
    )


def run(args: argparse.Namespace) -> int:
    if args.launcher:
        from lorenz.workers.image_limits import keep_out

        # NB: first, before anything imports asyncio or hashlib (the launcher's preload lifts
        # the marks once it is done; lorenz.workers.image_limits says why).
        keep_out()
    import asyncio
    import json
    from pathlib import Path

    from lorenz.model import LorenzError
    from lorenz.workers.journal import JOURNAL_NAME, read_journal
    from lorenz.workers.launch import answer, read_spec, serve, start_from_spec
    from lorenz.workers.states import default_state_root, probe_local

    try:
        if args.launcher:
            from lorenz.workers.forkserver import serve_launches

            if args.state_root is None or args.parent is None:
                print("lorenz worker: --launcher needs --state-root and --parent", file=sys.stderr)
                return 2
            return serve_launches(
                state_root=Path(args.state_root).expanduser(),
                parent=args.parent,
                preload=args.preload.split(",") if args.preload is not None else None,
            )
        if args.spec is not None:
            if args.spec == "-":
                spec = read_spec(sys.stdin.buffer)
            else:
                with open(args.spec, "rb") as stream:
                    spec = read_spec(stream)
            root = Path(args.state_root) if args.state_root else default_state_root()
            return start_from_spec(spec, state_root=root.expanduser(), detach=args.detach)
        if args.state_dir is None:
            print("lorenz worker: give --spec or --state-dir", file=sys.stderr)
            return 2
        state_dir = Path(args.state_dir).expanduser()
        if args.probe:
            probe = asyncio.run(probe_local(state_dir))
            socket_path = (state_dir / "control.sock").absolute()
            print(json.dumps({**probe.to_json(), "socket": str(socket_path)}))
            return 0
        if args.kill:
            from lorenz.workers.leftovers import end_run

            alive = end_run(state_dir.absolute())
            print(json.dumps({"alive": alive}))
            return 0 if not alive else 1
        if args.bridge:
            from lorenz.workers.bridge import bridge

            return bridge(state_dir / "control.sock")
        if args.journal_after is not None:
            for record in read_journal(state_dir / JOURNAL_NAME, after_seq=args.journal_after):
                sys.stdout.write(json.dumps(record.to_json()) + "\n")
            return 0
        return serve(state_dir, detach=args.detach)
    except LorenzError as exc:
        if args.detach:
            answer({"ok": False, "code": exc.code, "message": exc.message})
        print(f"lorenz worker: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from lorenz.cli import main

    sys.exit(main(["worker", *sys.argv[1:]]))
