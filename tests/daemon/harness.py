"""Real daemons for tests: the ``lorenz`` CLI as a subprocess, a files tracker, a recording agent.

The agent is a small Python script speaking the ``command`` protocol. It appends one JSON line
per event to an append-only log (``O_APPEND``, one ``write`` per line, so lines of concurrent
agents never interleave) and holds an ``flock`` on a per-slot file while it runs: if it cannot
take the lock, another agent of the same slot is alive *right now*, and it logs ``dup: true``.
The kernel drops the lock when its holder dies — SIGKILL included — so this detects exactly
what matters: two live processes working on one slot, across daemon incarnations.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import yaml

from lorenz.assembly import IN_PROCESS_RUNS_ENV
from lorenz.daemon.client import Reply, Unreachable, request
from lorenz.daemon.discovery import lease_file_for, parse_endpoint, read_lease
from tests.waiting import wait_until

READY_TIMEOUT_S = 60.0
"""Hang protection only (a loaded 2-core machine can be slow to start Python); never asserted."""

AGENT_SOURCE = r"""
import fcntl, json, os, random, signal, sys, time

LOG = os.environ["AGENT_LOG"]
LOCKS = os.environ["AGENT_LOCKS"]
SLOT = os.environ["LORENZ_ISSUE_ID"] + "#" + os.environ["LORENZ_SLOT"]
ATTEMPT = os.environ.get("LORENZ_ATTEMPT") or None


def record(**fields):
    line = dict(slot=SLOT, attempt=None if ATTEMPT is None else int(ATTEMPT), pid=os.getpid(),
                owner=os.environ.get("LORENZ_OWNER"), t=time.time(), **fields)
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


sys.stdin.read()
lock = os.open(os.path.join(LOCKS, SLOT.replace("#", "_") + ".lock"), os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    dup = False
except BlockingIOError:
    dup = True
record(event="start", dup=dup)
if dup:
    sys.exit(3)


def on_term(signum, frame):
    record(event="end", rc=-signum)
    os._exit(143)


if os.environ.get("AGENT_IGNORE_TERM"):
    record(event="ignoring_term")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)
HOLD = os.environ.get("AGENT_HOLD_FILE")
if HOLD:
    # Runs until the test creates the file: an event, not a duration a loaded machine outlasts.
    while not os.path.exists(HOLD):
        time.sleep(0.05)
rng = random.Random()
if rng.random() < float(os.environ.get("AGENT_LONG_RATE", "0")):
    time.sleep(rng.uniform(float(os.environ.get("AGENT_LONG_MIN_S", "3")),
                           float(os.environ.get("AGENT_LONG_MAX_S", "5"))))
else:
    time.sleep(rng.uniform(float(os.environ.get("AGENT_MIN_S", "0.2")),
                           float(os.environ.get("AGENT_MAX_S", "1.0"))))
rc = 1 if rng.random() < float(os.environ.get("AGENT_FAIL_RATE", "0.2")) else 0
print("done", flush=True)
record(event="end", rc=rc)
sys.exit(rc)
"""


def short_runtime_dir() -> Path:
    """A short private directory for ``XDG_RUNTIME_DIR`` (unix socket paths max 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="lzd-", dir="/tmp"))


def write_issues(folder: Path, identifiers: Sequence[str], *, state: str = "Todo") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for identifier in identifiers:
        (folder / f"{identifier}.md").write_text(
            f"---\ntitle: Work on {identifier}\nstate: {state}\n---\nDo it.\n", encoding="utf-8"
        )


def write_daemon_workflow(
    root: Path,
    *,
    issues: Sequence[str] = ("A-1", "A-2", "A-3"),
    agent_env: Mapping[str, str] | None = None,
    front_matter: Mapping[str, Any] | None = None,
    agent_command: str | None = None,
) -> Path:
    """A workflow on a files tracker whose agent records every run to ``root/agent.log``."""
    root.mkdir(parents=True, exist_ok=True)
    write_issues(root / "issues", issues)
    agent = root / "agent.py"
    agent.write_text(AGENT_SOURCE, encoding="utf-8")
    (root / "locks").mkdir(exist_ok=True)
    env = {
        "AGENT_LOG": str(root / "agent.log"),
        "AGENT_LOCKS": str(root / "locks"),
        **(agent_env or {}),
    }
    config: dict[str, Any] = {
        "tracker": {
            "kind": "files",
            "path": "issues",
            "active_states": ["Todo"],
            "terminal_states": ["Done"],
        },
        "polling": {"interval_ms": 100},
        "workspace": {"root": str(root / "workspaces")},
        "agent": {
            "kind": "recorder",
            "max_concurrent_agents": 4,
            "max_retry_backoff_ms": 300,
        },
        "agents": {
            "recorder": {
                "protocol": "command",
                "command": agent_command or f"{sys.executable} {agent}",
                "stall_timeout_ms": 60000,
                "turn_timeout_ms": 60000,
                "env": env,
            }
        },
    }
    for section, values in (front_matter or {}).items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    path = root / "WORKFLOW.md"
    path.write_text(
        f"---\n{yaml.safe_dump(config)}---\nWork on {{{{ issue.identifier }}}}\n", encoding="utf-8"
    )
    return path


def daemon_environ(runtime_dir: Path, home: Path) -> dict[str, str]:
    # NB: the test's own temporary directory: a lorenz killed -9 with a command agent in
    # process leaves its prompt file there (hundreds a run in /tmp otherwise).
    scratch = runtime_dir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LORENZ_", "PYTEST_", "XDG_RUNTIME_DIR"))
    }
    env.update(
        {
            "XDG_RUNTIME_DIR": str(runtime_dir),
            "HOME": str(home),
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(scratch),
            # NB: runs execute in workers, whose sockets live under the state root: a short one.
            "LORENZ_WORKER_STATE": str(runtime_dir / "w"),
        }
    )
    return env


def in_process(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the suite's test-only switch that runs agents inside ``lorenz`` (no worker
    per run): for tests about something else than where runs execute."""
    return {**env, IN_PROCESS_RUNS_ENV: "1"}


CLI = [sys.executable, "-c", "import sys; from lorenz.cli import main; sys.exit(main())"]


class DaemonProcess:
    """One ``lorenz WORKFLOW.md --feature daemon ...`` process."""

    def __init__(
        self,
        workflow: Path,
        *,
        env: Mapping[str, str],
        args: Sequence[str] = ("--feature", "daemon", "--feature", "durable_claims"),
        output: Path,
        session: bool = False,
    ) -> None:
        self.workflow = workflow
        self.session = session
        """Start the daemon in a session (and process group) of its own, for :meth:`kill9_group`."""
        self.env = dict(env)
        # NB: these tests stop daemons with runs in flight and mean "stop now": without a grace
        # window of their own they get none (the drain is tested in test_drain.py).
        self.args = list(args) if "--grace-seconds" in args else [*args, "--grace-seconds", "0"]
        self.output = output
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> DaemonProcess:
        with self.output.open("ab") as out:
            self.process = subprocess.Popen(
                [*CLI, str(self.workflow), "--no-tui", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.workflow.parent,
                start_new_session=self.session,
            )
        return self

    def log(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, *, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Until our lease names us with an endpoint that answers; returns the lease."""
        lease_path = lease_file_for(self.workflow)

        def answering_lease() -> dict[str, Any] | None:
            if not self.alive():
                raise AssertionError(f"daemon exited early:\n{self.log()[-4000:]}")
            with contextlib.suppress(Exception):
                lease = read_lease(lease_path)
                if lease and lease.get("pid") == self.pid and lease.get("endpoint"):
                    reply = request(parse_endpoint(lease["endpoint"]), "GET", "/api/v1/daemon")
                    if reply.ok:
                        return lease
            return None

        return wait_until(
            answering_lease,
            timeout=timeout_s,
            what=lambda: f"the daemon to be ready:\n{self.log()[-4000:]}",
        )

    def kill9(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def kill9_group(self) -> None:
        """SIGKILL the daemon's whole process group (it must have been started with ``session``).

        Everything the daemon started in its own group dies with it; what it detached (the
        workers, in sessions of their own) must not.
        """
        assert self.process is not None
        assert self.session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)

    def wait(self, *, timeout_s: float = READY_TIMEOUT_S) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)


def call(
    endpoint: str, method: str, path: str, body: Mapping[str, Any] | None = None
) -> Reply:
    return request(parse_endpoint(endpoint), method, path, body=body)


def get_state(endpoint: str) -> dict[str, Any]:
    reply = call(endpoint, "GET", "/api/v1/state")
    assert reply.ok, reply
    return reply.body


def try_state(endpoint: str) -> dict[str, Any] | None:
    try:
        reply = call(endpoint, "GET", "/api/v1/state")
    except Unreachable:
        return None
    return reply.body if reply.ok else None


def read_agent_log(path: Path) -> list[dict[str, Any]]:
    """The agents' marks so far.

    NB: read while agents append: the last line may be half written (a reader can see part of
    another process's write), so only newline-terminated lines count.
    """
    if not path.exists():
        return []
    complete, _, _partial = path.read_text(encoding="utf-8").rpartition("\n")
    return [json.loads(line) for line in complete.splitlines() if line]


class AgentLogTail:
    """The agents' marks so far, read incrementally: each :meth:`read` parses only new lines.

    NB: a loop that waits on the log re-reads it often; over a soak the log grows to thousands
    of lines, and parsing all of them at every check turns the waiting test into a busy loop
    that starves the daemons it waits for on a loaded 2-core machine.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._entries: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        if not self._path.exists():
            return self._entries
        with self._path.open("rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        complete, newline, _partial = chunk.rpartition(b"\n")
        if newline:
            self._offset += len(complete) + 1
            self._entries.extend(
                json.loads(line) for line in complete.decode("utf-8").splitlines() if line
            )
        return self._entries


def paired_runs(
    entries: list[dict[str, Any]],
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each start mark with its own end mark (``None`` while running, or if it was killed).

    NB: by pid *and* log order: over a long round the OS reuses pids, so a later agent's end
    must never be taken for an earlier one's.
    """
    runs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    open_by_pid: dict[int, int] = {}
    for entry in entries:
        if entry["event"] == "start":
            open_by_pid[entry["pid"]] = len(runs)
            runs.append((entry, None))
        elif entry["event"] == "end" and entry["pid"] in open_by_pid:
            index = open_by_pid.pop(entry["pid"])
            runs[index] = (runs[index][0], entry)
    return runs


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_marked(key: str, value: str) -> None:
    """SIGKILL every process whose environment has ``key=value`` (test cleanup of agents)."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if process.environ().get(key) == value:
                process.kill()


@contextlib.contextmanager
def daemons_cleaned(root: Path) -> Iterator[list[DaemonProcess]]:
    """Collect daemons started in the block; SIGKILL leftovers and their agents afterwards."""
    started: list[DaemonProcess] = []
    try:
        yield started
    finally:
        for daemon in started:
            if daemon.alive():
                daemon.kill9()
        kill_marked("AGENT_LOG", str(root / "agent.log"))
        # Workers outlive their daemons by design; so do the agents they run.
        for state_root in {d.env.get("LORENZ_WORKER_STATE") for d in started} - {None}:
            assert state_root is not None
            kill_marked("LORENZ_WORKER_STATE", state_root)
