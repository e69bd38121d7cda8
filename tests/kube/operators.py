"""Operator processes and Workflow fixtures for the end-to-end tests.

The operator under test is always a separate process (``lorenz operator`` with the test
cluster's kubeconfig), exactly as it runs in a pod; tests talk to it only through the API
server (kubectl) and its HTTP API, and kill it with real signals.

The agent is a real ``command``-protocol script. It appends ``start``/``beat``/``end`` lines
with wall-clock times to a shared log, so a test can reconstruct every run's interval and
prove that no slot ever ran twice at once; when it succeeds it moves its issue to ``Done`` in
the files tracker (the issue's Markdown file), like the demo agent.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from lorenz.kube.leaderelection.sharding import shard_lease_name, shard_of
from tests.cluster.cluster import Cluster, WaitAborted, wait_until

AGENT = textwrap.dedent(
    """\
    import os, sys, time, pathlib, re
    env = os.environ
    sys.stdin.read()
    log = pathlib.Path(env["AGENT_LOG"])
    slot = env["LORENZ_ISSUE_ID"] + "#" + env["LORENZ_SLOT"]
    attempt = env.get("LORENZ_ATTEMPT") or "0"
    def note(kind):
        line = f"{kind} {slot} {os.getpid()} {attempt} {time.time():.6f}\\n"
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    note("start")
    if env.get("AGENT_ENV_DUMP"):
        pathlib.Path(env["AGENT_ENV_DUMP"]).write_text("\\n".join(sorted(env)))
        pathlib.Path(env["AGENT_ENV_DUMP"] + ".workflow").write_text(
            env.get("LORENZ_WORKFLOW", ""))
    seconds = float(env.get("AGENT_SECONDS", "1"))
    if attempt == "0" and env.get("AGENT_FIRST_SECONDS"):
        seconds = float(env["AGENT_FIRST_SECONDS"])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # NB: printing is what keeps the run from stalling, and what kills an orphaned agent
        # (its operator died): the write to a pipe nobody reads raises.
        print("working", flush=True)
        note("beat")
        time.sleep(0.2)
    if env.get("AGENT_NOOP") == "1":
        note("end")
        sys.exit(0)  # a clean exit that leaves the issue where it was
    if env.get("AGENT_FAIL") == "1":
        note("end")
        print("failing on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    issue = pathlib.Path(env["LORENZ_TRACKER_PATH"], env["LORENZ_ISSUE_IDENTIFIER"] + ".md")
    text = issue.read_text()
    tmp = issue.with_name("." + issue.name + ".tmp")
    # NB: the state and who completed it change in one atomic rename, so "which run completed
    # the issue" never depends on whether the agent lived long enough to log it.
    done = f"state: Done\\ndone_by: {os.getpid()}"
    tmp.write_text(re.sub(r"(?m)^state: .*$", done, text, count=1))
    os.replace(tmp, issue)
    note("end")
    """
)


def write_issue(folder: Path, identifier: str, *, state: str = "Todo") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{identifier}.md"
    path.write_text(
        f"---\nid: {identifier}\nidentifier: {identifier}\ntitle: Task {identifier}\n"
        f"state: {state}\ncreated_at: 2026-01-01T00:00:00Z\n---\nDo {identifier}.\n",
        encoding="utf-8",
    )
    return path


def completed_by(folder: Path, identifier: str) -> int | None:
    """The pid of the agent run that moved the issue to Done (``None`` if none did)."""
    text = (folder / f"{identifier}.md").read_text(encoding="utf-8")
    match = re.search(r"(?m)^done_by: (\d+)$", text)
    return int(match.group(1)) if match else None


def issue_state(folder: Path, identifier: str) -> str:
    text = (folder / f"{identifier}.md").read_text(encoding="utf-8")
    match = re.search(r"(?m)^state: (.*)$", text)
    assert match is not None
    return match.group(1).strip()


@dataclasses.dataclass
class Rig:
    """One test's files: the agent script and its log, and the issues of each Workflow.

    A Workflow's ``tracker.path`` must stay inside its own folder on the operator's volume
    (``<volume>/<namespace>/<name>/``), so each Workflow's issues live there, in ``issues/``;
    every operator of a test shares that volume, as replicas share one ReadWriteMany volume.
    """

    root: Path
    volume: Path
    namespace: str

    def issues_of(self, name: str, *, namespace: str | None = None) -> Path:
        """The issues folder of Workflow ``name`` (``tracker.path: issues``)."""
        return self.volume / (namespace or self.namespace) / name / "issues"

    @property
    def agent(self) -> Path:
        path = self.root / "agent.py"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            path.write_text(AGENT, encoding="utf-8")
        return path

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    def workflow(
        self,
        name: str,
        *,
        seconds: float = 1.0,
        first_seconds: float | None = None,
        fail: bool = False,
        interval_ms: int = 500,
        max_backoff_ms: int = 300000,
        concurrency: int = 4,
        prompt: str = "Work on {{ issue.identifier }}",
        extra: dict[str, Any] | None = None,
        namespace: str | None = None,
        agent_env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A Workflow manifest: files tracker on its :meth:`issues_of`, the logging agent.

        Its runs are ``worker: {kind: local}`` (the operator's default is ``pod``): the agent
        script is on this machine, and the operators under test are processes here too.
        ``extra`` replaces whole sections, ``worker`` included.

        ``first_seconds`` is how long a first attempt (attempt 0) works instead of
        ``seconds``: a long first attempt is still running whenever a test interrupts it,
        however slow the machine, and the retries after it finish quickly.
        """
        self.issues_of(name, namespace=namespace).mkdir(parents=True, exist_ok=True)
        spec: dict[str, Any] = {
            "tracker": {"kind": "files", "path": "issues"},
            "polling": {"intervalMs": interval_ms},
            "worker": {"kind": "local"},
            "agent": {
                "kind": "script",
                "maxConcurrentAgents": concurrency,
                "maxRetryBackoffMs": max_backoff_ms,
            },
            "agents": {
                "script": {
                    "protocol": "command",
                    "command": f"{sys.executable} {self.agent}",
                    "stallTimeoutMs": 60000,
                    "turnTimeoutMs": max(120000, int((first_seconds or 0) * 1000) + 60000),
                    "env": {
                        "AGENT_LOG": str(self.agent_log),
                        "AGENT_SECONDS": str(seconds),
                        "AGENT_FAIL": "1" if fail else "0",
                        **(
                            {"AGENT_FIRST_SECONDS": str(first_seconds)}
                            if first_seconds is not None
                            else {}
                        ),
                        **(agent_env or {}),
                    },
                }
            },
            "prompt": prompt,
        }
        for key, value in (extra or {}).items():
            spec[key] = value
        return {
            "apiVersion": "lorenz.dev/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name},
            "spec": spec,
        }

    def runs(self) -> list[AgentRun]:
        return agent_runs(self.agent_log)


@dataclasses.dataclass
class AgentRun:
    slot: str
    pid: int
    attempt: int
    started: float
    last_seen: float
    ended: bool


def agent_runs(log: Path) -> list[AgentRun]:
    """Every agent run the log shows, with its interval (end, or its last beat)."""
    runs: dict[int, AgentRun] = {}
    if not log.exists():
        return []
    for line in log.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        kind, slot, pid_text, attempt, at_text = parts
        pid, at = int(pid_text), float(at_text)
        run = runs.get(pid)
        if kind == "start" or run is None:
            run = AgentRun(slot=slot, pid=pid, attempt=int(attempt), started=at, last_seen=at,
                           ended=False)
            runs[pid] = run
        run.last_seen = max(run.last_seen, at)
        if kind == "end":
            run.ended = True
    return sorted(runs.values(), key=lambda r: r.started)


def overlapping_runs(runs: list[AgentRun]) -> list[tuple[AgentRun, AgentRun]]:
    """Pairs of runs of the same slot whose intervals intersect."""
    found = []
    by_slot: dict[str, list[AgentRun]] = {}
    for run in runs:
        by_slot.setdefault(run.slot, []).append(run)
    for slot_runs in by_slot.values():
        ordered = sorted(slot_runs, key=lambda r: r.started)
        for earlier, later in itertools.pairwise(ordered):
            if later.started <= earlier.last_seen:
                found.append((earlier, later))
    return found


class OperatorProcess:
    """``lorenz operator`` as a child process, with its log in a file."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        identity: str,
        workdir: Path,
        namespaces: tuple[str, ...] = (),
        lease: tuple[int, float, float] = (3, 2.0, 0.5),
        kubeconfig: Path | None = None,
        extra_args: tuple[str, ...] = (),
        volume: Path | None = None,
        env: dict[str, str] | None = None,
        lease_namespace: str | None = None,
        shards: int | None = None,
        new_session: bool = False,
        prelude: str = "",
        local_runs: bool = True,
    ) -> None:
        """``prelude``: Python run in the operator process before lorenz starts (a test's
        instrumentation, e.g. a counter around a method). ``local_runs``: ``--local-runs``
        (on here, unlike the operator's default: :meth:`Rig.workflow`'s runs are local, the
        agent script being on this machine)."""
        self.cluster = cluster
        self.new_session = new_session
        """Start the operator as a process group (and session) of its own, so a test can kill
        the whole group as a pod's death would (:meth:`kill_group`)."""
        self.identity = identity
        self.workdir = workdir
        self.log_path = workdir / f"operator-{identity}.log"
        self.volume = volume or workdir / "volume"
        """The workspace volume (``--workspace-root``), shared by the operators of a test."""
        duration, deadline, period = lease
        self.argv = [
            sys.executable,
            "-c",
            prelude + "\nimport sys; from lorenz.cli import main; sys.exit(main())",
            "operator",
            "--identity", identity,
            "--workspace-root", str(self.volume),
            "--lease-duration-seconds", str(duration),
            "--renew-deadline-seconds", str(deadline),
            "--retry-period-seconds", str(period),
            "--status-interval-seconds", "0.2",
            "--drain-timeout-seconds", "10",
            "--api-host", "127.0.0.1",
            "--api-port", "0",
            # NB: the tests read the API and metrics of their own operators on 127.0.0.1;
            # tests/kube/test_api_auth.py turns authentication on.
            "--api-auth", "none",
            "--liveness-endpoint", "",
            "--log-level", "debug",
            "--local-runs", "true" if local_runs else "false",
            *extra_args,
        ]
        if namespaces:
            self.argv += ["--namespaces", ",".join(namespaces)]
        if lease_namespace is not None:
            self.argv += ["--lease-namespace", lease_namespace]
        if shards is not None:
            self.argv += ["--shards", str(shards)]
        self.lease_namespace = lease_namespace
        self.env = cluster.environ(kubeconfig=kubeconfig)
        self.env.setdefault("HOME", str(workdir))
        self.env.update(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None

    def start(self, *, wait: bool = True) -> OperatorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
            start_new_session=self.new_session,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, *, timeout: float = 180.0) -> None:
        def ready() -> str | None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise WaitAborted(f"operator exited early:\n{self.log()}")
            pattern = r"Operator running identity=\S+ namespaces=\S+ api=(\S+)"
            found = re.findall(pattern, self.log())
            return found[-1] if found else None

        self.url = wait_until(ready, timeout=timeout, interval=0.1, message="operator ready")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str, *, token: str | None = None) -> Any:
        assert self.url is not None
        request = urllib.request.Request(f"{self.url}{path}")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if path.startswith("/api") else body.decode()

    def leads(self, namespace: str, name: str) -> bool:
        rows = self.get("/api/v1/workflows")["workflows"]
        return any(r["namespace"] == namespace and r["name"] == name and r["leading"]
                   for r in rows)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """``kill -<sig> -<pgid>``: the operator and every process still in its group."""
        assert self.new_session, "only an operator started with new_session has a group"
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.process.wait(timeout=10)


class Kube:
    """kubectl shortcuts for one namespace.

    ``lease_namespace`` and ``shards`` say where the operators under test keep their shard
    Leases and how many there are (what ``--lease-namespace`` and ``--shards`` say), so
    :meth:`lease` finds the Lease that governs a Workflow.
    """

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        *,
        lease_namespace: str | None = None,
        shards: int = 16,
        lease_prefix: str = "lorenz",
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.lease_namespace = lease_namespace or namespace
        self.shards = shards
        self.lease_prefix = lease_prefix

    def apply(self, manifest: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(manifest)
        )

    def get(self, kind: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.cluster.kubectl_json("get", kind, name, "-n", self.namespace)
        return result

    def items(self, kind: str, *selector: str) -> list[dict[str, Any]]:
        result = self.cluster.kubectl_json("get", kind, "-n", self.namespace, *selector)
        return list(result["items"])

    def table(self, kind: str, *args: str) -> list[dict[str, str]]:
        """``kubectl get`` as printed: one dict per row, keyed by column header."""
        text = self.cluster.kubectl("get", kind, "-n", self.namespace, *args).stdout
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return []
        header = lines[0]
        starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
        names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows = []
        for line in lines[1:]:
            cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
            rows.append(dict(zip(names, cells, strict=True)))
        return rows

    def shard_of(self, workflow: str) -> int:
        return shard_of(self.namespace, workflow, shards=self.shards)

    def lease(self, workflow: str) -> dict[str, Any]:
        """The shard Lease that governs ``workflow``."""
        name = shard_lease_name(self.lease_prefix, self.shard_of(workflow))
        result: dict[str, Any] = self.cluster.kubectl_json(
            "get", "lease", name, "-n", self.lease_namespace
        )
        return result

    def leases(self) -> list[dict[str, Any]]:
        """Every Lease of the operators' set (shards and replicas)."""
        result = self.cluster.kubectl_json(
            "get", "leases", "-n", self.lease_namespace,
            f"--selector=lorenz.dev/lease-set={self.lease_prefix}",
        )
        return list(result["items"])

    def holder(self, workflow: str) -> str | None:
        try:
            spec = self.lease(workflow)["spec"]
        except Exception:
            return None
        return spec.get("holderIdentity") or None

    def claim_owners(self) -> dict[str, str | None]:
        """``{slot: status.owner}`` of every Claim in the namespace."""
        return {
            str(c["metadata"]["name"]): (c.get("status") or {}).get("owner")
            for c in self.items("claims")
        }

    def events(self, workflow: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={workflow},involvedObject.kind=Workflow"
        return self.items("events", f"--field-selector={selector}")

    def reasons(self, workflow: str) -> set[str]:
        return {e["reason"] for e in self.events(workflow)}


def stop_all(operators: Iterator[OperatorProcess] | list[OperatorProcess]) -> None:
    for operator in operators:
        operator.stop()


def now() -> float:
    return time.time()
