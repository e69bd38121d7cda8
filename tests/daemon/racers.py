"""Start N daemons of one workflow at the same instant: ``python -m tests.daemon.racers``.

Usage: ``python -m tests.daemon.racers WORKFLOW.md N OUT_DIR [lorenz args...]``.

The parent pays the imports once, then forks N children that each block on a shared pipe;
closing it releases all of them together, and each runs the real CLI entry point
(``lorenz.cli.main``) with its output in ``OUT_DIR/<i>.out`` and its exit code in
``OUT_DIR/<i>.rc``. Forked children are distinct processes (own pid, own start time, hence own
owner and holder ids), so this is the real race with the import noise taken out of it. The
parent prints the children's pids as one JSON line, then one JSON line ``{pid: exit code}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path


def main() -> None:
    workflow, count, out_dir, *args = sys.argv[1:]
    n = int(count)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    import lorenz.cli
    import lorenz.cli.run
    import lorenz.daemon.host
    import lorenz.server

    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    sys.stdout.flush()
    pids: list[int] = []
    for index in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            os.write(ready_w, b"x")
            os.read(go_r, 1)  # returns at EOF: when the parent closes its end
            fd = os.open(out / f"{index}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                code = lorenz.cli.main([workflow, *args])
            except BaseException:
                traceback.print_exc()
                code = 99
            sys.stdout.flush()
            sys.stderr.flush()
            # NB: written then renamed: the test globs *.rc while racers are still exiting,
            # and must never read a file that exists but is still empty.
            partial = out / f"{index}.rc.partial"
            partial.write_text(f"{os.getpid()} {code}\n")
            os.replace(partial, out / f"{index}.rc")
            os._exit(code)
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    ready = 0
    while ready < n:
        chunk = os.read(ready_r, n)
        if not chunk:
            break
        ready += len(chunk)
    print(json.dumps(pids), flush=True)
    os.close(go_w)
    results: dict[int, int] = {}
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        results[pid] = os.waitstatus_to_exitcode(status)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
