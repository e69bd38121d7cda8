"""Scale by simulation: 1,000 concurrent ``worker.kind: pod`` runs placed on 100 kwok nodes.

    .venv/bin/python bench/kwok_bench.py [--runs 1000] [--nodes 100] [--steady-seconds 60]
        [--place-timeout 1800]

Starts the test suite's control plane (tests/cluster: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) and the kwok controller with ``--nodes`` fake nodes
(tests/cluster/kwok.py), installs the CRDs and runs one ``lorenz operator`` process, as the
end-to-end tests do. One Workflow (files tracker, ``--runs`` Todo issues,
``maxConcurrentAgents`` = ``--runs``) places every run in a Pod (``worker.kind: pod``) that
tolerates and selects the fake nodes.

**What it measures, and why only that.** A fake Pod runs no container: kwok reports it
``Running`` at once, but no ``lorenz worker`` is inside, so the operator's exec probe (the
channel of lorenz.kube.pods: the API's exec subresource, answered by kwok's kubelet API) never
finds a worker, and no run gets past its launch. kwok's ``ClusterExec`` can run a *local*
command for an exec; that would reach a worker only if something started 1,000 real
``lorenz worker`` processes on this host (each a Python process of tens of MiB, plus its agent)
under the absolute paths the Pod's command names — not a simulation any more, and more than
2 cores and 24 GiB hold. So the bench measures what the fakes make real:

* **placement latency** per run, from watch events as they reach the bench (monotonic clock):
  *reserve* (the run's Claim created) → *Pod created* → *scheduled* (``spec.nodeName`` set) →
  *Running* (kwok's status); percentiles over all runs, and the wall time until all are
  Running;
* **the operator's cost** while the runs are placed and then while all ``--runs`` Pods are
  Running and every launch is still waiting for its worker (``--steady-seconds``): CPU seconds
  (psutil), RSS, and its own API requests (``lorenz_operator_api_requests_total`` from its
  ``/metrics``), per run. The steady window is the launch's start wait (since the shared Pod
  watch of lorenz.kube.pods.watch: no Pod GET, and an exec probe per run backing off to one per
  8 s while the Running Pod does not serve), the most a launch costs; it ends when
  ``startTimeoutMs`` is reached, which the bench sets past the measurement.

Figures go in bench/README.md with the load average printed here; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.cluster import Cluster  # noqa: E402
from tests.cluster.controlplane import Binaries, ControlPlane, cache_root  # noqa: E402
from tests.cluster.kwok import (  # noqa: E402
    FAKE_NODE_SELECTOR,
    FAKE_TOLERATION,
    FakeNodes,
)
from tests.cluster.scheduler import ensure_scheduler  # noqa: E402
from tests.kube.operators import OperatorProcess, Rig, write_issue  # noqa: E402

WORKFLOW = "scale"


def machine() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} / {five:.1f} / {fifteen:.1f}"


def parse_counter(text: str, name: str) -> dict[tuple[str, str], float]:
    """``(verb, resource) -> value`` of one counter family in Prometheus text format."""
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, _, value = line.rpartition(" ")
        inner = head[head.index("{") + 1 : head.rindex("}")]
        labels = dict(
            (k.strip(), v.strip().strip('"'))
            for k, v in (p.split("=", 1) for p in inner.split('",') if p)
        )
        key = (labels.get("verb", ""), labels.get("resource", ""))
        found[key] = found.get(key, 0.0) + float(value)
    return found


def operator_requests(operator: OperatorProcess) -> dict[tuple[str, str], float]:
    return parse_counter(operator.get("/metrics"), "lorenz_operator_api_requests_total")


def operator_waits(operator: OperatorProcess) -> tuple[float, float, float]:
    """(requests, seconds in them, of which queued for one of the client's threads) so far."""
    text = operator.get("/metrics")
    return tuple(  # type: ignore[return-value]
        sum(parse_counter(text, f"lorenz_operator_api_{name}_total").values())
        for name in ("requests", "request_seconds", "queued_seconds")
    )


def print_waits(after: tuple[float, float, float], before: tuple[float, float, float]) -> None:
    count, seconds, queued = (a - b for a, b in zip(after, before, strict=True))
    if count >= 1:
        print(f"   a request of the operator's took {seconds / count:.3f} s on average, of which "
              f"{queued / count:.3f} s waiting for one of its client's threads")


def diff(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


class Firsts:
    """When each run first reached each step, as watch events arrived (monotonic)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at: dict[str, dict[str, float]] = {}
        self.nodes: dict[str, str] = {}

    def mark(self, identifier: str, step: str, *, node: str | None = None) -> None:
        now = time.monotonic()
        with self.lock:
            steps = self.at.setdefault(identifier, {})
            steps.setdefault(step, now)
            if node:
                self.nodes.setdefault(identifier, node)

    def count(self, step: str) -> int:
        with self.lock:
            return sum(1 for steps in self.at.values() if step in steps)

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self.lock:
            return {k: dict(v) for k, v in self.at.items()}


def watch(cluster: Cluster, namespace: str, firsts: Firsts, stop: threading.Event,
          kind: str) -> None:
    """Watch Claims (``kind='claims'``) or Pods of the namespace until ``stop``; restarts a
    watch the server ends (first times are kept, so a replay changes nothing)."""
    import kubernetes.client
    import kubernetes.watch

    client = cluster.api_client()
    core = kubernetes.client.CoreV1Api(client)
    custom = kubernetes.client.CustomObjectsApi(client)
    try:
        while not stop.is_set():
            w = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
            if kind == "claims":
                stream = w.stream(  # type: ignore[no-untyped-call]
                    custom.list_namespaced_custom_object, "lorenz.dev", "v1alpha1", namespace,
                    "claims", timeout_seconds=30)
            else:
                stream = w.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, namespace, timeout_seconds=30)
            with contextlib.suppress(Exception):
                for event in stream:
                    if stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
                        break
                    obj = event["object"]
                    if kind == "claims":
                        identifier = str((obj.get("spec") or {}).get("identifier") or "")
                        if identifier and event["type"] == "ADDED":
                            firsts.mark(identifier, "reserved")
                        continue
                    labels = obj.metadata.labels or {}
                    label = labels.get("lorenz.dev/issue")
                    if not label or event["type"] == "DELETED":
                        continue
                    firsts.mark(label, "created")
                    if obj.spec.node_name:
                        firsts.mark(label, "scheduled", node=obj.spec.node_name)
                    if obj.status and obj.status.phase == "Running":
                        firsts.mark(label, "running")
    finally:
        client.close()  # type: ignore[no-untyped-call]


def percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return (f"p50 {at(0.5):6.2f} s  p90 {at(0.9):6.2f} s  p99 {at(0.99):6.2f} s  "
            f"max {ordered[-1]:6.2f} s  (n={len(ordered)})")


class Meter:
    """CPU seconds and RSS of one process (the operator) and the parts of the cluster."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.before = self.cpu()
        self.machine_before = _busy()
        self.began = time.monotonic()

    def cpu(self) -> dict[str, float]:
        found = {}
        for name, process in self.processes.items():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                found[name] = times.user + times.system + times.children_user + \
                    times.children_system
        return found

    def report(self, label: str) -> dict[str, float]:
        now = self.cpu()
        seconds = time.monotonic() - self.began
        spent = {name: now.get(name, 0.0) - self.before.get(name, 0.0) for name in now}
        print(f"   CPU seconds over {label} ({seconds:.1f} s wall): " + ", ".join(
            f"{name} {value:.1f}" for name, value in spent.items()
        ) + f", whole machine {_busy() - self.machine_before:.1f}")
        return spent


def _busy() -> float:
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def print_requests(counts: dict[tuple[str, str], float], *, runs: int, per: str) -> None:
    total = sum(counts.values())
    print(f"   the operator's API requests: {total:.0f} in all, {total / runs:.2f} {per}")
    for (verb, resource), value in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"     {verb:7} {resource:22} {value:8.0f}  {value / runs:7.2f} {per}")


REFUSED_EXEC = "no exec found for container"


def refused_execs(nodes: FakeNodes) -> int:
    """Execs kwok answered with "no exec found" so far (the operator's probes; its own
    request counter does not count exec streams)."""
    try:
        text = nodes.log.read_text(errors="replace")
    except OSError:
        return 0
    return text.count(REFUSED_EXEC)


def leadership_losses(operator: OperatorProcess) -> str:
    """How often the operator lost its own shard Leases (a renewal past the renew deadline)
    and how often a Workflow's runtime was abandoned for it, from its log."""
    log = operator.log()
    return (f"{log.count('Lease lost lease=')} shard Leases lost, "
            f"{log.count('Runtime abandoned')} runtime(s) abandoned")


def kwok_build_time() -> str:
    versions = Binaries.locate().versions
    times = cache_root() / versions["K8S_VERSION"] / "build-times.txt"
    last = ""
    if times.exists():
        for line in times.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "kwok":
                last = parts[2]
    return last or "not recorded"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--place-timeout", type=float, default=1800.0)
    args = parser.parse_args()
    runs: int = args.runs

    print(f"kwok scale bench: {runs} runs on {args.nodes} fake nodes; {machine()}")
    print(f"   kwok's last build (tests/cluster/build.sh, build-times.txt): {kwok_build_time()}")
    binaries = Binaries.locate()
    control_plane = ControlPlane(binaries=binaries)
    nodes: FakeNodes | None = None
    operator: OperatorProcess | None = None
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="lorenz-kwok-bench-") as scratch:
        work = Path(scratch)
        try:
            cluster = control_plane.start()
            ensure_scheduler(control_plane, binaries)
            pki = control_plane.pki
            assert pki is not None
            began = time.monotonic()
            nodes = FakeNodes(
                cluster=cluster, binaries=binaries, directory=work / "kwok",
                log_dir=control_plane.log_dir, count=args.nodes,
                tls=(pki.serving.cert, pki.serving.key),
            ).start()
            print(f"1. {args.nodes} fake nodes Ready in {time.monotonic() - began:.1f} s "
                  f"(created in {nodes.timings['nodes created']:.1f} s)")
            cluster.install_crds(REPO / "crds")
            namespace = cluster.create_namespace()
            lease_namespace = cluster.create_namespace()
            rig = Rig(root=work / "rig", volume=work / "ops" / "volume", namespace=namespace)
            issues = rig.issues_of(WORKFLOW)
            for i in range(runs):
                write_issue(issues, f"S-{i + 1:04d}")
            body = rig.workflow(
                WORKFLOW, seconds=1.0, concurrency=runs, interval_ms=5000,
                extra={
                    "worker": {
                        "kind": "pod",
                        "podTemplate": {
                            "image": "localhost/lorenz:kwok",
                            "nodeSelector": dict(FAKE_NODE_SELECTOR),
                            "tolerations": [dict(FAKE_TOLERATION)],
                            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                        },
                        # NB: past the measurement: a launch waits this long for its worker.
                        "startTimeoutMs": int((args.place_timeout + args.steady_seconds
                                               + 600) * 1000),
                    }
                },
            )

            operator = OperatorProcess(
                cluster, identity="kwok-bench", workdir=work / "ops", namespaces=(namespace,),
                lease=(15, 10.0, 3.0), lease_namespace=lease_namespace,
                extra_args=("--log-level", "info"),
            ).start()
            assert operator.process is not None
            pid = operator.process.pid
            time.sleep(5.0)
            idle_rss = rss_mib(pid)
            print(f"2. operator idle (no Workflow): RSS {idle_rss:.0f} MiB")

            firsts = Firsts()
            watchers = [
                threading.Thread(target=watch, args=(cluster, namespace, firsts, stop, kind),
                                 daemon=True)
                for kind in ("claims", "pods")
            ]
            for thread in watchers:
                thread.start()
            time.sleep(2.0)  # the watches are open before anything happens
            parts = {"operator": pid, **control_plane.pids()}
            if nodes.pid is not None:
                parts["kwok"] = nodes.pid
            meter = Meter(parts)
            requests_before = operator_requests(operator)
            waits_before = operator_waits(operator)
            execs_applied = refused_execs(nodes)
            applied = time.monotonic()
            cluster.apply(body, namespace=namespace)
            peak_rss = 0.0
            last_print = applied
            last_waits = waits_before
            while firsts.count("running") < runs:
                peak_rss = max(peak_rss, rss_mib(pid))
                now = time.monotonic()
                if now - last_print >= 30:
                    window, last_print = now - last_print, now
                    waits = operator_waits(operator)
                    count, _, queued = (a - b for a, b in zip(waits, last_waits, strict=True))
                    last_waits = waits
                    print(f"   … {now - applied:5.0f} s: reserved {firsts.count('reserved')}, "
                          f"created {firsts.count('created')}, scheduled "
                          f"{firsts.count('scheduled')}, Running {firsts.count('running')}; "
                          f"operator RSS {rss_mib(pid):.0f} MiB, {count / window:.0f} requests/s, "
                          f"{queued / max(count, 1):.2f} s queued each; {machine()}", flush=True)
                if now - applied > args.place_timeout:
                    print(f"   placement did not finish within {args.place_timeout:.0f} s")
                    break
                if operator.process.poll() is not None:
                    print("   the operator exited:\n" + operator.log()[-3000:])
                    return 1
                time.sleep(1.0)
            placed_in = time.monotonic() - applied
            running = max(1, firsts.count("running"))
            print(f"3. placement: kubectl apply → {firsts.count('running')} of {runs} Pods "
                  f"Running in {placed_in:.1f} s; {machine()}")
            steps = firsts.snapshot()
            for label, a, b in (
                ("apply → reserved", None, "reserved"),
                ("reserved → Pod created", "reserved", "created"),
                ("Pod created → scheduled", "created", "scheduled"),
                ("scheduled → Running", "scheduled", "running"),
                ("reserved → Running", "reserved", "running"),
            ):
                values = [
                    s[b] - (s[a] if a is not None else applied)
                    for s in steps.values() if b in s and (a is None or a in s)
                ]
                print(f"   {label:26} {percentiles(values)}")
            per_node: dict[str, int] = {}
            for node in firsts.nodes.values():
                per_node[node] = per_node.get(node, 0) + 1
            if per_node:
                print(f"   Pods per fake node: min {min(per_node.values())}, max "
                      f"{max(per_node.values())}, on {len(per_node)} nodes")
            meter.report("placement")
            print(f"   operator RSS: peak {peak_rss:.0f} MiB during placement "
                  f"(idle {idle_rss:.0f} MiB)")
            placed = diff(operator_requests(operator), requests_before)
            placed[("exec", "pods/exec (kwok's log)")] = refused_execs(nodes) - execs_applied
            print_requests(placed, runs=running, per="per run placed")
            print_waits(operator_waits(operator), waits_before)
            print(f"   the operator's own leadership meanwhile: {leadership_losses(operator)}")

            print(f"4. steady: {running} Pods Running, every launch waiting for its worker, "
                  f"{args.steady_seconds:.0f} s; {machine()}")
            steady_meter = Meter(parts)
            steady_before = operator_requests(operator)
            steady_waits = operator_waits(operator)
            execs_before = refused_execs(nodes)
            steady_began = time.monotonic()
            samples = []
            while time.monotonic() - steady_began < args.steady_seconds:
                samples.append(rss_mib(pid))
                time.sleep(2.0)
            seconds = time.monotonic() - steady_began
            spent = steady_meter.report("the steady window")
            print(f"   operator: {spent.get('operator', 0.0) / seconds:.2f} CPU s/s; RSS "
                  f"{statistics.mean(samples):.0f} MiB mean, {max(samples):.0f} MiB max; "
                  f"{(statistics.mean(samples) - idle_rss) / running * 1024:.0f} KiB per run "
                  f"over idle")
            counts = diff(operator_requests(operator), steady_before)
            counts[("exec", "pods/exec (kwok's log)")] = refused_execs(nodes) - execs_before
            print_requests({k: v / seconds for k, v in counts.items()}, runs=running,
                           per="per run per s")
            print_waits(operator_waits(operator), steady_waits)
            print(f"   the operator's own leadership so far: {leadership_losses(operator)}")
            print(f"   done; {machine()}")
            return 0
        finally:
            stop.set()
            if operator is not None:
                operator.stop()
            if nodes is not None:
                nodes.stop()
            control_plane.stop()


if __name__ == "__main__":
    sys.exit(main())
