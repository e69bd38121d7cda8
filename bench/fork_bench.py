"""What a forked worker's own Python costs in memory: the pages a fork of the launcher copies.

Issue #35's last open goal (the whole tree's peak PSS) is set by the pages each live run's
worker owns: everything it writes of what it shares with the launcher is copied. This bench
forks the launcher's image as it is before its first fork (``forkserver._preload``: the
imports, the rehearsal, ``gc.freeze()``) and measures, in each fork, the private dirty pages
after it has done:

* *nothing* — the fork itself (the interpreter's after-fork work, the parent's writes);
* *a worker run* — one whole :class:`~lorenz.workers.worker.Worker` run on the workers' own
  runner (``tasks.run_on_fresh_loop``): a ``command`` agent running ``true``, its socket
  served, its journal written; the client that attaches, reads to the final record and acks
  is this bench's own process, as the controller is another process than the worker;
* *the same without asyncio* — the same system work done with plain calls: state files, a
  unix socket and the client's connection, the agent spawned (``posix_spawn``) and its pipe
  read through ``select``, four journal records written, synced and sent, the ack awaited.

The difference between the last two is what the worker's Python beyond its system calls costs
a live run. Run: ``.venv/bin/python bench/fork_bench.py [--rounds 3] [--protocols command]``
(Linux: ``/proc/<pid>/smaps_rollup``).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lorenz.workers import image_limits

# NB: as `lorenz worker --launcher` starts: TLS kept out before asyncio loads (image_limits).
image_limits.keep_out()

from lorenz.tasks import run_on_fresh_loop  # noqa: E402
from lorenz.workers import forkserver  # noqa: E402
from lorenz.workers.protocol import SOCKET_NAME  # noqa: E402

CLIENT_WAIT_S = 30.0
"""How long the client waits for the fork's socket, and for each line (a generous bound)."""


def nothing(root: Path) -> None:
    del root


def worker_run(root: Path) -> None:
    run_on_fresh_loop(_worker(root))


async def _worker(root: Path) -> None:
    from lorenz.config.kinds import AgentLaunch, AgentProtocol
    from lorenz.workers.spec import IssueSpec, RunSpec
    from lorenz.workers.worker import Worker

    spec = RunSpec(
        workflow=str(root / "WORKFLOW.md"),
        issue=IssueSpec(id="bench", identifier="BENCH-1", title="", state="Todo"),
        run=1,
        prompt="",
        agent=AgentLaunch(protocol=AgentProtocol.COMMAND, command="true", login_shell=False),
        workspace=str(root / "w"),
        max_turns=1,
        linger_ms=int(CLIENT_WAIT_S * 1000),
    )
    worker = Worker(spec=spec, state_dir=root / "s")
    await worker.bind()
    await worker.run()


def plain_run(root: Path) -> None:
    state = root / "s"
    (state / "spec.json").write_text(json.dumps({"run": 1, "workspace": str(root / "w")}))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(state / SOCKET_NAME))
    server.listen(4)
    (state / "status.json").write_text(json.dumps({"state": "serving", "pid": os.getpid()}))
    connection, _ = server.accept()
    json.loads(connection.recv(4096))
    out_read, out_write = os.pipe()
    pid = os.posix_spawnp(
        "bash", ["bash", "-c", "true"], dict(os.environ),
        file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_CLOSE, out_read)],
        setsid=True,
    )
    os.close(out_write)
    while True:
        select.select([out_read], [], [], 10.0)
        if not os.read(out_read, 1 << 16):
            break
    os.close(out_read)
    os.waitpid(pid, 0)
    journal = os.open(state / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for seq, kind in enumerate(("run_started", "session_started", "turn_completed", "final"), 1):
        record = {"seq": seq, "kind": kind, "at": time.time(), "data": {"outcome": "success"}}
        line = json.dumps(record)
        os.write(journal, line.encode() + b"\n")
        connection.sendall(b'{"op": "record", "record": ' + line.encode() + b"}\n")
    os.fdatasync(journal)
    os.close(journal)
    connection.recv(4096)  # the ack
    for open_socket in (connection, server):
        open_socket.close()


def attach_and_ack(root: Path) -> None:
    """The controller's part, in this process: attach, read to the final record, ack it."""
    path = str(root / "s" / SOCKET_NAME)
    deadline = time.monotonic() + CLIENT_WAIT_S
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect(path)
            break
        except OSError:
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    with client:
        client.settimeout(CLIENT_WAIT_S)
        client.sendall(b'{"op":"attach","after_seq":0}\n')
        pending = b""
        while True:
            data = client.recv(1 << 16)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                message = json.loads(line)
                record = message.get("record") if message.get("op") == "record" else None
                if isinstance(record, dict) and record.get("kind") == "final":
                    client.sendall(json.dumps({"op": "ack", "seq": record["seq"]}).encode()
                                   + b"\n")
                    return


def private_dirty_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise RuntimeError("no Private_Dirty in smaps_rollup")


def in_a_fork(work: Callable[[Path], None]) -> int:
    """Private dirty KiB of a fork of this process once ``work`` is done (the fork waits); a
    run's client is this process (:func:`attach_and_ack`)."""
    # NB: a short name: the worker's socket path must fit a unix socket's 107 bytes.
    with tempfile.TemporaryDirectory(prefix="lzf-") as scratch:
        root = Path(scratch) / "r"
        (root / "s").mkdir(parents=True)
        (root / "w").mkdir()
        go_read, go_write = os.pipe()
        done_read, done_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                work(root)
                os.write(done_write, b"d")
                os.read(go_read, 1)
                status = 0
            finally:
                os._exit(status)
        try:
            if work is not nothing:
                attach_and_ack(root)
            if not os.read(done_read, 1):
                raise RuntimeError(f"the fork for {work.__name__} failed")
            return private_dirty_kib(pid)
        finally:
            os.write(go_write, b"g")
            os.waitpid(pid, 0)
            for fd in (go_read, go_write, done_read, done_write):
                os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocols", default="command",
                        help="the agent protocols the launcher preloads (comma-separated)")
    args = parser.parse_args()
    forkserver._preload(protocols=args.protocols.split(","))
    figures: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for work in (nothing, worker_run, plain_run):
            figures.setdefault(work.__name__, []).append(in_a_fork(work))
    base = statistics.median(figures["nothing"])
    for name, label in (("nothing", "a fork that does nothing"),
                        ("worker_run", "a whole worker run (client apart)"),
                        ("plain_run", "the same system work, no asyncio")):
        median = statistics.median(figures[name])
        print(f"{label:36s} {median / 1024:5.2f} MiB private "
              f"(+{(median - base) / 1024:4.2f} over the fork; rounds {figures[name]} KiB)")


if __name__ == "__main__":
    main()
