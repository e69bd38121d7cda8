"""Operator figures on the real control plane: sharded scale, idle cost, first poll, failover.

    .venv/bin/python bench/operator_bench.py [--sections scale,idle,latency,failover,handover,nsdel]
        [--replicas 3] [--scale-workflows 1000] [--steady-seconds 600] [--shards 16]
        [--workflows 5] [--idle-seconds 30] [--applies 5] [--failovers 10] [--handovers 5]
        [--deleted-workflows 20]

Starts the envtest-style control plane of the test suite (tests/cluster), installs the CRDs and
runs ``lorenz operator`` as separate processes, exactly as the end-to-end tests do. Every
operator gets ``--shards`` and keeps its Leases in a namespace of its own (``--lease-namespace``,
as the chart's release namespace), never beside the Workflows.

0. **Sharded scale** (``scale``; the figures of issue #15): ``--replicas`` operators with the
   default Lease timings (15 s / 10 s / 3 s), ``--scale-workflows`` idle Workflows (no issues,
   ``polling.intervalMs`` 30000) created at once by 16 client threads.

   * *created → all polling*: from the first create until every Workflow's ``Ready`` condition
     is True (the runtime completed its first poll and the leader wrote that status);
   * *steady window* (``--steady-seconds``, after 30 s of settling): total API writes/s — the
     operators' own request counters (their ``/metrics``, every create/update/patch/delete,
     Lease renewals included) and, for comparison, ``apiserver_request_total`` of every client
     (the controller-manager's own writes included); Lease writes/s counted by **watching the
     Lease namespace** (every watch event is one successful write, a new resourceVersion; a
     refused compare-and-swap writes nothing and is not counted); Lease transitions = holder
     changes seen in that watch;
   * *RSS per idle Workflow*: ``(sum of the replicas' RSS with N Workflows - with 0) / N``;
   * *takeover after kill -9* of the replica holding the most shards: until every Workflow is
     led again (the survivors' ``/api/v1/workflows``), and until its shard Leases name a
     survivor;
   * *namespace deletion*: ``kubectl delete namespace`` of the N Workflows and N Claims (one
     held Claim per Workflow, created once all poll, as a leader writes them; ``--no-claims``
     leaves them out; the ``nsdel`` section has runs in flight) until the namespace is gone.

   While Workflows start and while the namespace goes, it prints the CPU seconds of each part
   (operators, API server, etcd, controller-manager, the bench, the whole machine) and the
   operators' own requests per Workflow with their mean time and mean wait for a client thread.
0b. **Where an idle Workflow's memory goes** (``profile``): one replica under tracemalloc (8
   frames), a snapshot with 0 and with ``--profile-workflows`` idle Workflows; prints the growth
   by file and the top allocation tracebacks (RSS there includes tracemalloc's own overhead).
0c. **Where a replica's CPU goes while Workflows start** (``cpu``): one replica under cProfile
   while ``--profile-workflows`` Workflows are created at once until all poll; prints its CPU
   per Workflow and the top functions by own and cumulative time.
1. **API requests per idle tick per Workflow** (``idle``, target O(1)): ``--workflows`` idle
   Workflows (``polling.intervalMs`` 1000) under one operator with the default Lease timings.
   Over ``--idle-seconds`` the operator's own request counter and the API server's
   ``apiserver_request_total`` are diffed and divided by the ticks the Workflows ran.
2. **Workflow apply → first poll** (``latency``, target ≤ 2 s): time from ``kubectl apply`` of a
   new Workflow to the runtime's first completed tick (``status.poll.lastPollAt``), and to that
   tick becoming visible in the status.
3. **Failover after kill -9** (``failover``): two operators with 3 s / 2 s / 0.5 s Leases; the
   leader of one Workflow is SIGKILLed ``--failovers`` times; time until its shard Lease names
   the survivor.
4. **Graceful handover after SIGTERM** (``handover``): the same, but the leader is stopped with
   SIGTERM while a run is in flight (``--handovers`` times); it releases its shards, so the
   follower should not wait out the lease duration.
5. **Namespace deletion** (``nsdel``): ``--deleted-workflows`` Workflows, each with a run in
   flight; time from ``kubectl delete namespace`` until the namespace is gone.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.cluster import Cluster, wait_until  # noqa: E402
from tests.cluster.controlplane import Binaries, ControlPlane  # noqa: E402
from tests.kube.operators import Kube, OperatorProcess, Rig, write_issue  # noqa: E402

from lorenz.kube.api import resources  # noqa: E402
from lorenz.kube.api.resources import WorkflowRef  # noqa: E402
from lorenz.kube.settings import OperatorSettings  # noqa: E402

SECTIONS = ("scale", "profile", "cpu", "idle", "latency", "failover", "handover", "nsdel")
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection", "post", "put", "apply")
"""Write verbs: the operator's counter says create/update, apiserver_request_total POST/PUT."""
_FIELDS = OperatorSettings.model_fields
DEFAULT_LEASE = (
    int(_FIELDS["lease_duration_seconds"].default),
    float(_FIELDS["renew_deadline_seconds"].default),
    float(_FIELDS["retry_period_seconds"].default),
)
"""The operator's default Lease timings (duration, renew deadline, retry period)."""


@dataclasses.dataclass
class Bench:
    """What every section shares: the cluster, a work folder, the operators' shard count."""

    cluster: Cluster
    control_plane: ControlPlane
    work: Path
    shards: int

    def setup(self, section: str) -> tuple[str, Kube, Rig]:
        """A Workflow namespace and a Lease namespace of the section's own."""
        namespace = self.cluster.create_namespace()
        lease_namespace = self.cluster.create_namespace()
        kube = Kube(self.cluster, namespace, lease_namespace=lease_namespace, shards=self.shards)
        rig = Rig(root=self.work / section, volume=self.work / f"{section}-ops" / "volume",
                  namespace=namespace)
        return namespace, kube, rig

    def operator(
        self, section: str, identity: str, kube: Kube, *,
        lease: tuple[int, float, float] = DEFAULT_LEASE, wait: bool = True,
    ) -> OperatorProcess:
        return OperatorProcess(
            self.cluster, identity=identity, workdir=self.work / f"{section}-ops",
            namespaces=(kube.namespace,), lease=lease, lease_namespace=kube.lease_namespace,
            shards=self.shards, extra_args=("--log-level", "info"),
        ).start(wait=wait)


def parse_metrics(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``{labels: value}`` of one counter family in Prometheus text format."""
    values: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        labels: tuple[tuple[str, str], ...] = ()
        if "{" in head:
            inner = head[head.index("{") + 1 : head.rindex("}")]
            pairs = [p for p in inner.split('",') if p]
            labels = tuple(
                (k.strip(), v.strip().strip('"')) for k, v in (p.split("=", 1) for p in pairs)
            )
        values[labels] = float(value)
    return values


def apiserver_requests(
    cluster: Cluster, *, kinds: tuple[str, ...] | None = ("workflows", "claims", "leases",
                                                             "events", "secrets"),
) -> dict[tuple[str, str], float]:
    """``(verb, resource) -> count`` of apiserver_request_total (``kinds=None``: all)."""
    text = cluster.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    for labels, value in parse_metrics(text, "apiserver_request_total").items():
        info = dict(labels)
        resource = info.get("resource", "")
        if kinds is not None and resource not in kinds:
            continue
        sub = info.get("subresource")
        key = (info.get("verb", "").lower(), f"{resource}/{sub}" if sub else resource)
        totals[key] += value
    return dict(totals)


def operator_requests(operator: OperatorProcess) -> dict[tuple[str, str], float]:
    text = operator.get("/metrics")
    found = {}
    for labels, value in parse_metrics(text, "lorenz_operator_api_requests_total").items():
        info = dict(labels)
        found[(info["verb"], info["resource"])] = value
    return found


def operator_request_times(
    operator: OperatorProcess,
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """``(verb, resource) -> (requests, seconds, of them queued for a thread)`` so far."""
    text = operator.get("/metrics")
    families = [parse_metrics(text, f"lorenz_operator_api_{name}_total")
                for name in ("requests", "request_seconds", "queued_seconds")]
    found: dict[tuple[str, str], tuple[float, float, float]] = {}
    for labels, count in families[0].items():
        info = dict(labels)
        found[(info["verb"], info["resource"])] = (
            count, families[1].get(labels, 0.0), families[2].get(labels, 0.0))
    return found


def print_request_times(
    before: list[dict[tuple[str, str], tuple[float, float, float]]],
    after: list[dict[tuple[str, str], tuple[float, float, float]]],
    *, workflows: int,
) -> None:
    """The operators' own requests meanwhile: per Workflow, mean time, mean wait for a thread."""
    totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0] * 3)
    for b, a in zip(before, after, strict=True):
        for key, values in a.items():
            old = b.get(key, (0.0, 0.0, 0.0))
            for i in range(3):
                totals[key][i] += values[i] - old[i]
    print("   the operators' requests meanwhile (per Workflow; mean time; of it, mean wait for a "
          "free client thread):")
    for (verb, resource), (count, seconds, queued) in sorted(totals.items()):
        if count < 1:
            continue
        print(f"     {verb:7} {resource:18} {count / workflows:6.2f}  {seconds / count:6.3f} s  "
              f"{queued / count:6.3f} s")


def delta(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def writes(counts: dict[tuple[str, str], float]) -> float:
    return sum(v for (verb, _), v in counts.items() if verb in WRITE_VERBS)


def rss_mib(operators: list[OperatorProcess]) -> float:
    return sum(replica_rss_mib(operators))


def replica_rss_mib(operators: list[OperatorProcess]) -> list[float]:
    rss = []
    for operator in operators:
        assert operator.process is not None
        rss.append(psutil.Process(operator.process.pid).memory_info().rss / 2**20)
    return rss


def machine() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} / {five:.1f} / {fifteen:.1f}"


def ticks(operator: OperatorProcess, namespace: str, names: list[str]) -> int:
    """Poll ticks so far, from the leader's API (the status has them at most once a minute)."""
    return sum(
        int(operator.get(f"/api/v1/workflows/{namespace}/{n}/state")["poll"]["count"])
        for n in names
    )


# -- 0. sharded scale -------------------------------------------------------------------------


class LeaseWatch:
    """``kubectl get leases --watch-only`` on the Lease namespace: one line per write."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._lines: list[tuple[float, str, str, str]] = []
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [str(Binaries.locate().path("kubectl")), "get", "leases", "-n", namespace,
             "--watch-only", "--no-headers",
             "-o", "custom-columns=NAME:.metadata.name,RV:.metadata.resourceVersion,"
             "HOLDER:.spec.holderIdentity"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=cluster.environ(),
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            parts = line.split()
            if len(parts) >= 3:
                with self._lock:
                    self._lines.append((time.monotonic(), parts[0], parts[1], parts[2]))

    def between(self, start: float, end: float) -> list[tuple[float, str, str, str]]:
        with self._lock:
            return [e for e in self._lines if start <= e[0] < end]

    def holders_before(self, start: float) -> dict[str, str]:
        last: dict[str, str] = {}
        with self._lock:
            for at, name, _, holder in self._lines:
                if at < start:
                    last[name] = holder
        return last

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


def shard_holders(kube: Kube) -> dict[str, str]:
    return {
        lease["metadata"]["name"]: str((lease.get("spec") or {}).get("holderIdentity") or "")
        for lease in kube.leases()
        if lease["metadata"]["name"].startswith(f"{kube.lease_prefix}-shard-")
    }


class ReadyWatch:
    """``kubectl get workflows --watch``: each Workflow's ``Ready`` status, as events arrive.

    NB: one watch, not a ``kubectl get workflows -o json`` every 2 s: listing 1,000 Workflows
    (~4 MB of JSON, decoded by kubectl and again here) cost the bench itself about a core on
    the shared 2 cores while it measured how fast the operators start them.
    """

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._ready: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._argv = [
            str(Binaries.locate().path("kubectl")), "get", "workflows", "-n", namespace,
            "--watch", "--no-headers", "-o",
            'custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")]'
            ".status",
        ]
        self._env = cluster.environ()
        self._stopped = False
        self._process = self._start()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self._argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self._env)

    def _read(self) -> None:
        while True:
            assert self._process.stdout is not None
            for line in self._process.stdout:
                parts = line.split()
                if len(parts) >= 2:
                    with self._lock:
                        self._ready[parts[0]] = (time.monotonic(), parts[1])
            self._process.wait()
            if self._stopped:
                return
            # NB: a watch the server (or kubectl) ended: start again, it lists what it missed.
            assert self._process.stderr is not None
            print(f"   (the Workflow watch ended, rc {self._process.returncode}: "
                  f"{self._process.stderr.read().strip()[:300]}; watching again)", flush=True)
            time.sleep(1.0)
            self._process = self._start()

    def count(self) -> int:
        """Workflows whose last seen ``Ready`` was ``True``."""
        with self._lock:
            return sum(1 for _, status in self._ready.values() if status == "True")

    def times(self) -> list[float]:
        """When each Workflow was last seen ``Ready=True`` (monotonic)."""
        with self._lock:
            return sorted(at for at, status in self._ready.values() if status == "True")

    def stop(self) -> None:
        self._stopped = True
        self._process.terminate()
        self._process.wait(timeout=10)


def led_count(operators: list[OperatorProcess], namespace: str) -> int:
    total = 0
    for operator in operators:
        rows = operator.get("/api/v1/workflows")["workflows"]
        total += sum(1 for r in rows if r["namespace"] == namespace and r["leading"])
    return total


class CpuMeter:
    """CPU seconds (user + system) spent by each part since the meter was made."""

    def __init__(self, control_plane: ControlPlane, operators: list[OperatorProcess]) -> None:
        self._parts: dict[str, list[psutil.Process]] = {
            name: [psutil.Process(pid)] for name, pid in control_plane.pids().items()
        }
        self._parts["operators"] = [
            psutil.Process(o.process.pid) for o in operators if o.process is not None
        ]
        self._parts["bench"] = [psutil.Process()]
        self._before = self._now()
        self._machine = _busy()

    def _now(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for name, processes in self._parts.items():
            total = 0.0
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    total += times.user + times.system
            spent[name] = total
        return spent

    def spent(self) -> dict[str, float]:
        now = self._now()
        found = {name: now[name] - self._before[name] for name in now}
        found["whole machine (other sessions too)"] = _busy() - self._machine
        return found


def _busy() -> float:
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


def single_replica(bench: Bench, kube: Kube, namespace: str, *, identity: str) -> OperatorProcess:
    """One replica (not started) that will hold every shard, for the profiling sections."""
    return OperatorProcess(
        bench.cluster, identity=identity, workdir=bench.work / f"{identity}-ops",
        namespaces=(namespace,), lease=DEFAULT_LEASE, lease_namespace=kube.lease_namespace,
        shards=bench.shards, extra_args=("--log-level", "info"),
    )


def create_until_polling(
    bench: Bench, rig: Rig, namespace: str, *, prefix: str, workflows: int
) -> None:
    """Create ``workflows`` idle Workflows (30 s polls) at once and wait until every one is
    polling (``Ready=True``)."""
    ready = ReadyWatch(bench.cluster, namespace)
    try:
        create_all(bench.cluster, [rig.workflow(f"{prefix}-{i}", interval_ms=30000)
                                   for i in range(workflows)], namespace)
        wait_until(lambda: ready.count() >= workflows or None, timeout=1800, interval=0.5,
                   message="every Workflow polling")
    finally:
        ready.stop()


def create_all(
    cluster: Cluster, manifests: list[dict[str, Any]], namespace: str, *,
    plural: str = "workflows",
) -> list[dict[str, Any]]:
    """Create every object at once (16 client threads, one POST each); the created objects."""
    import kubernetes.client

    client = cluster.api_client()
    try:
        custom = kubernetes.client.CustomObjectsApi(client)

        def create(manifest: dict[str, Any]) -> dict[str, Any]:
            created: dict[str, Any] = custom.create_namespaced_custom_object(
                "lorenz.dev", "v1alpha1", namespace, plural, manifest
            )
            return created

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            return list(pool.map(create, manifests))
    finally:
        client.close()


def held_claims(namespace: str, workflows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Claim per Workflow as its leader would write it, held (``lorenz.dev/hold``): the
    idle operators leave it alone (no run to resume, no retry), the cleanup must delete it."""
    manifests = []
    for workflow in workflows:
        name, uid = workflow["metadata"]["name"], workflow["metadata"]["uid"]
        slot = "bench-1#0"
        manifests.append({
            "apiVersion": resources.API_VERSION,
            "kind": resources.CLAIM_KIND,
            "metadata": {
                "name": resources.claim_name(name, slot),
                "namespace": namespace,
                "labels": {resources.WORKFLOW_LABEL: resources.workflow_label(name),
                           resources.SLOT_LABEL: resources.label_value(slot)},
                "annotations": {resources.HOLD_ANNOTATION: "bench"},
                "ownerReferences": [resources.owner_reference(
                    WorkflowRef(namespace=namespace, name=name, uid=uid))],
            },
            "spec": {"workflow": name, "slotKey": slot, "issueId": "bench-1",
                     "identifier": "BENCH-1", "slotIndex": 0},
        })
    return manifests


def scale(
    bench: Bench, *, replicas: int, workflows: int, steady_s: float, delete_timeout_s: float,
    claims: bool,
) -> None:
    namespace, kube, rig = bench.setup("scale")
    watch = LeaseWatch(bench.cluster, kube.lease_namespace)
    operators = [bench.operator("scale", f"scale-{i}", kube, wait=False) for i in range(replicas)]
    for operator in operators:
        operator.wait_ready()
    try:
        share = -(-bench.shards // replicas)

        def balanced() -> bool | None:
            counts = collections.Counter(shard_holders(kube).values())
            held = sum(counts[o.identity] for o in operators)
            fair = all(counts[o.identity] <= share for o in operators)
            return (held == bench.shards and fair) or None

        wait_until(balanced, timeout=300, interval=1.0, message="shards balanced")
        time.sleep(5.0)
        each_empty = replica_rss_mib(operators)
        rss_empty = sum(each_empty)
        print(f"\n0. sharded scale: {workflows} idle Workflows (poll every 30 s), {replicas} "
              f"replicas, {bench.shards} shards, Lease {DEFAULT_LEASE[0]} s / "
              f"{DEFAULT_LEASE[1]:.0f} s / {DEFAULT_LEASE[2]:.0f} s; machine: {machine()}")
        names = [f"scale-{i}" for i in range(workflows)]
        manifests = [rig.workflow(name, interval_ms=30000) for name in names]
        ready = ReadyWatch(bench.cluster, namespace)
        meter = CpuMeter(bench.control_plane, operators)
        times_before = [operator_request_times(o) for o in operators]
        started = time.monotonic()
        try:
            made = create_all(bench.cluster, manifests, namespace)
            created = time.monotonic() - started
            wait_until(lambda: ready.count() >= workflows or None, timeout=1800, interval=0.5,
                       message="every Workflow polling")
            polling = time.monotonic() - started
            spent = meter.spent()
            times_after = [operator_request_times(o) for o in operators]
            times = [t - started for t in ready.times()]
        finally:
            ready.stop()
        print(f"   created at once → all polling (Ready=True): {polling:.1f} s "
              f"(the {workflows} creates themselves took {created:.1f} s; half polling after "
              f"{times[len(times) // 2]:.1f} s, 90 % after {times[int(len(times) * 0.9)]:.1f} s)"
              f"; machine: {machine()}")
        print(f"   CPU seconds spent meanwhile ({2 * polling:.0f} core-seconds on 2 cores): "
              + ", ".join(f"{name} {value:.1f}" for name, value in spent.items()))
        print_request_times(times_before, times_after, workflows=workflows)

        if claims:
            began = time.monotonic()
            create_all(bench.cluster, held_claims(namespace, made), namespace, plural="claims")
            print(f"   {len(made)} held Claims created (one per Workflow) in "
                  f"{time.monotonic() - began:.1f} s")
        time.sleep(30.0)
        own_before = [operator_requests(o) for o in operators]
        server_before = apiserver_requests(bench.cluster, kinds=None)
        holders_start = shard_holders(kube)
        window_start = time.monotonic()
        time.sleep(steady_s)
        window_end = time.monotonic()
        own_after = [operator_requests(o) for o in operators]
        server_after = apiserver_requests(bench.cluster, kinds=None)
        holders_end = shard_holders(kube)
        each_full = replica_rss_mib(operators)
        rss_full = sum(each_full)
        seconds = window_end - window_start
        own = [delta(a, b) for a, b in zip(own_after, own_before, strict=True)]
        own_writes = sum(writes(o) for o in own)
        server = delta(server_after, server_before)
        events = watch.between(window_start, window_end)
        last = watch.holders_before(window_start)
        changes = 0
        for _, name, _, holder in events:
            if name in last and last[name] != holder:
                changes += 1
            last[name] = holder
        moved = sum(1 for n, h in holders_end.items() if holders_start.get(n) != h)
        print(f"   steady window {seconds:.0f} s; machine: {machine()}")
        print(f"     API writes/s, operators' own counters (all {replicas}): "
              f"{own_writes / seconds:.2f}")
        per_kind: dict[str, float] = collections.defaultdict(float)
        for counts in own:
            for (verb, resource), value in counts.items():
                if verb in WRITE_VERBS:
                    per_kind[f"{verb} {resource}"] += value
        for kind, value in sorted(per_kind.items()):
            print(f"       {kind:28} {value / seconds:6.2f}/s")
        print(f"     API writes/s, apiserver_request_total (every client, the controller-"
              f"manager's included): {writes(server) / seconds:.2f}")
        print(f"     Lease writes/s (watch events on the Lease namespace): "
              f"{len(events) / seconds:.2f}")
        print(f"     Lease transitions (holder changes in the watch): {changes}; shard Leases "
              f"whose holder differs end vs start: {moved}")
        per_wf = (rss_full - rss_empty) / workflows
        print(f"   RSS, all replicas: {rss_empty:.0f} MiB with 0 Workflows, {rss_full:.0f} MiB "
              f"with {workflows}: {per_wf:.3f} MiB per idle Workflow")
        for operator, empty, full in zip(operators, each_empty, each_full, strict=True):
            leading = led_count([operator], namespace)
            print(f"     {operator.identity}: {empty:.0f} → {full:.0f} MiB, leading {leading} "
                  f"of {workflows}")

        holding = collections.Counter(shard_holders(kube).values())
        victim = max(operators, key=lambda o: holding[o.identity])
        survivors = [o for o in operators if o is not victim]
        its_shards = {n for n, h in shard_holders(kube).items() if h == victim.identity}
        victim.kill(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(timeout=30)
        survivor_ids = {o.identity for o in survivors}
        wait_until(
            lambda: all(shard_holders(kube).get(n) in survivor_ids for n in its_shards) or None,
            timeout=600, interval=0.5, message="the killed replica's shards taken over",
        )
        shards_taken = time.monotonic() - killed
        wait_until(lambda: led_count(survivors, namespace) >= workflows or None, timeout=600,
                   interval=0.5, message="every Workflow led again")
        all_led = time.monotonic() - killed
        print(f"   kill -9 of the replica holding {len(its_shards)} shards: its shard Leases "
              f"held by survivors after {shards_taken:.1f} s, all {workflows} Workflows led "
              f"after {all_led:.1f} s (lease duration {DEFAULT_LEASE[0]} s); machine: "
              f"{machine()}")

        times_before = [operator_request_times(o) for o in survivors]
        meter = CpuMeter(bench.control_plane, survivors)
        started = time.monotonic()
        bench.cluster.delete_namespace(namespace, wait=False)

        def gone() -> bool | None:
            found = bench.cluster.kubectl("get", "namespace", namespace, "--ignore-not-found",
                                          "-o", "name").stdout.strip()
            return not found or None

        try:
            wait_until(gone, timeout=delete_timeout_s, interval=1.0, message="namespace gone")
            took = time.monotonic() - started
            spent = meter.spent()
            times_after = [operator_request_times(o) for o in survivors]
            print(f"   kubectl delete namespace with {workflows} Workflows"
                  + (f" and {workflows} Claims" if claims else "")
                  + f": gone after {took:.1f} s; machine: {machine()}")
            print(f"   CPU seconds spent meanwhile ({2 * took:.0f} core-seconds on 2 cores): "
                  + ", ".join(f"{name} {value:.1f}" for name, value in spent.items()))
            print_request_times(times_before, times_after, workflows=workflows)
        except TimeoutError:
            left = len(kube.items("workflows"))
            print(f"   kubectl delete namespace with {workflows} Workflows: NOT gone after "
                  f"{delete_timeout_s:.0f} s, {left} Workflows left; machine: {machine()}")
    finally:
        for operator in operators:
            operator.stop()
        watch.stop()


# -- 0b. where an idle Workflow's memory goes ------------------------------------------------

PROFILED = """\
import os, signal, sys, tracemalloc
frames, prefix = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:3]
tracemalloc.start(frames)
count = 0
def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
def dump(signum, frame):
    import gc
    global count
    count += 1
    path = f"{prefix}.{count}"
    before, traced = rss(), tracemalloc.get_traced_memory()[0]
    found = gc.collect()
    with open(path + ".gc", "w") as note:
        note.write(f"{found} {before:.1f} {rss():.1f} {traced / 2**20:.1f} "
                   f"{tracemalloc.get_traced_memory()[0] / 2**20:.1f}")
    tracemalloc.take_snapshot().dump(path + ".tmp")
    os.replace(path + ".tmp", path)
signal.signal(signal.SIGUSR1, dump)
from lorenz.cli import main
sys.exit(main())
"""
"""``lorenz operator`` under tracemalloc: SIGUSR1 writes a snapshot to ``<prefix>.<n>``."""


CPU_PROFILED = """\
import cProfile, os, signal, sys
prefix = sys.argv[1]
del sys.argv[1:2]
profiler = cProfile.Profile()
count = 0
def dump(signum, frame):
    global count
    count += 1
    profiler.disable()
    if count > 1:
        path = f"{prefix}.{count}"
        profiler.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)
    profiler.clear()
    profiler.enable()
signal.signal(signal.SIGUSR1, dump)
from lorenz.cli import main
sys.exit(main())
"""
"""``lorenz operator`` under cProfile (its event loop's thread): the first SIGUSR1 starts
afresh, each later one writes the stats since the previous to ``<prefix>.<n>``."""


def cpu_profile(bench: Bench, *, workflows: int) -> None:
    """One replica under cProfile while ``workflows`` Workflows are created at once and start
    (``--cpu-profile``): where its event loop's CPU goes per started Workflow."""
    import pstats

    namespace, kube, rig = bench.setup("cpu")
    prefix = bench.work / "cpu-profile"
    operator = single_replica(bench, kube, namespace, identity="cpu")
    operator.argv[2:3] = [CPU_PROFILED, str(prefix)]
    operator.start()
    try:
        wait_until(lambda: len([h for h in shard_holders(kube).values() if h == "cpu"])
                   == bench.shards or None, timeout=300, interval=1.0, message="all shards held")
        time.sleep(5.0)
        operator.kill(signal.SIGUSR1)
        time.sleep(1.0)
        assert operator.process is not None
        cpu_before = psutil.Process(operator.process.pid).cpu_times()
        started = time.monotonic()
        create_until_polling(bench, rig, namespace, prefix="cpu", workflows=workflows)
        took = time.monotonic() - started
        cpu_after = psutil.Process(operator.process.pid).cpu_times()
        operator.kill(signal.SIGUSR1)
        path = Path(f"{prefix}.2")
        wait_until(lambda: path.exists() or None, timeout=300, interval=0.5,
                   message="cProfile stats")
    finally:
        operator.stop()
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    print(f"\n0c. where a replica's CPU goes while {workflows} Workflows start (one replica, all "
          f"{bench.shards} shards, cProfile): all polling after {took:.1f} s, {cpu:.1f} CPU s "
          f"({cpu / workflows * 1000:.1f} ms per Workflow, cProfile's overhead included)")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(60)


def snapshot(operator: OperatorProcess, prefix: Path, serial: int) -> Any:
    import tracemalloc

    operator.kill(signal.SIGUSR1)
    path = Path(f"{prefix}.{serial}")
    wait_until(lambda: path.exists() or None, timeout=300, interval=0.5,
               message="tracemalloc snapshot")
    found, rss_before, rss_after, traced_before, traced_after = Path(
        f"{path}.gc").read_text().split()
    print(f"   snapshot {serial}: gc.collect() found {found} unreachable objects; traced "
          f"{traced_before} → {traced_after} MiB, RSS {rss_before} → {rss_after} MiB")
    return tracemalloc.Snapshot.load(str(path))


def profile(bench: Bench, *, workflows: int) -> None:
    """One replica under tracemalloc: the Python allocations ``workflows`` idle Workflows add."""
    namespace, kube, rig = bench.setup("profile")
    prefix = bench.work / "profile-snapshot"
    operator = single_replica(bench, kube, namespace, identity="profile")
    operator.argv[2:3] = [PROFILED, "12", str(prefix)]
    operator.start()
    try:
        wait_until(lambda: len([h for h in shard_holders(kube).values() if h == "profile"])
                   == bench.shards or None, timeout=300, interval=1.0, message="all shards held")
        time.sleep(5.0)
        rss_empty = rss_mib([operator])
        empty = snapshot(operator, prefix, 1)
        create_until_polling(bench, rig, namespace, prefix="prof", workflows=workflows)
        time.sleep(30.0)
        rss_full = rss_mib([operator])
        full = snapshot(operator, prefix, 2)
    finally:
        operator.stop()
    traced = sum(s.size for s in full.statistics("filename")) - sum(
        s.size for s in empty.statistics("filename"))
    print(f"\n0b. where the memory of {workflows} idle Workflows goes (one replica, all "
          f"{bench.shards} shards, tracemalloc 12 frames): RSS {rss_empty:.0f} → {rss_full:.0f} "
          f"MiB ({(rss_full - rss_empty) / workflows:.3f} MiB per Workflow, tracemalloc's own "
          f"overhead included); Python allocations +{traced / 2**20:.1f} MiB "
          f"({traced / workflows / 1024:.1f} KiB per Workflow)")
    root = str(REPO)
    print("   top files (allocated where, growth):")
    for stat in full.compare_to(empty, "filename")[:15]:
        name = stat.traceback[0].filename.replace(root + "/", "")
        name = name.split("site-packages/")[-1]
        print(f"     {stat.size_diff / 2**20:7.2f} MiB {stat.count_diff:+8d} blocks  {name}")
    print("   top tracebacks (the innermost frames of lorenz code):")
    for stat in full.compare_to(empty, "traceback")[:20]:
        where = " <- ".join(
            f"{f.filename.replace(root + '/', '').split('site-packages/')[-1]}:{f.lineno}"
            for f in reversed(stat.traceback)
        )
        print(f"     {stat.size_diff / 2**20:7.2f} MiB {stat.count_diff:+8d} blocks  {where}")


# -- 1. idle cost -----------------------------------------------------------------------------


def idle_cost(bench: Bench, *, workflows: int, seconds: float) -> None:
    namespace, kube, rig = bench.setup("idle")
    operator = bench.operator("idle", "idle", kube)
    try:
        names = [f"idle-{i}" for i in range(workflows)]
        for name in names:
            kube.apply(rig.workflow(name, interval_ms=1000))
        for name in names:
            wait_until(
                lambda n=name: ticks(operator, namespace, [n]) >= 3 or None,
                timeout=120, message="idle workflows polling",
            )
        time.sleep(2.0)
        ticks_before, own_before = ticks(operator, namespace, names), operator_requests(operator)
        server_before = apiserver_requests(bench.cluster)
        time.sleep(seconds)
        ticks_after, own_after = ticks(operator, namespace, names), operator_requests(operator)
        server_after = apiserver_requests(bench.cluster)
        assert operator.process is not None
        rss = psutil.Process(operator.process.pid).memory_info().rss / 2**20
    finally:
        operator.stop()
    tick_count = ticks_after - ticks_before
    own = delta(own_after, own_before)
    server = delta(server_after, server_before)
    per_wf_tick = tick_count / workflows
    print(f"\n1. idle cost: {workflows} Workflows, {seconds:.0f} s, {tick_count} ticks "
          f"({per_wf_tick:.1f} per Workflow), Lease 15/10/2 s, poll every 1 s")
    print("   operator's own requests per tick per Workflow (client counter):")
    for (verb, resource), count in sorted(own.items()):
        print(f"     {verb:7} {resource:18} {count / tick_count:6.3f}")
    print(f"     total                      {sum(own.values()) / tick_count:6.3f}")
    print("   apiserver_request_total per tick per Workflow (operator's kinds, all clients, "
          "incl. this bench's own status reads):")
    for (verb, resource), count in sorted(server.items()):
        print(f"     {verb:7} {resource:18} {count / tick_count:6.3f}")
    print(f"     total                      {sum(server.values()) / tick_count:6.3f}")
    claims = sum(v for (verb, resource), v in own.items() if resource.startswith("claims"))
    print(f"   Claim requests while idle: {claims:.0f}")
    patches = own.get(("patch", "workflows/status"), 0.0)
    writes = sum(v for (verb, _), v in own.items() if verb in ("create", "update", "patch",
                                                              "delete"))
    print(f"   status patches per idle tick: {patches / tick_count:.3f}; API writes/s (all "
          f"Workflows): {writes / seconds:.1f}, of them Lease updates/s: "
          f"{own.get(('update', 'leases'), 0.0) / seconds:.1f}")
    print(f"   operator RSS: {rss:.0f} MiB, {rss / workflows:.2f} MiB per idle Workflow "
          f"(process total divided by {workflows})")


def first_poll(bench: Bench, *, applies: int) -> None:
    _, kube, rig = bench.setup("latency")
    write_issue(rig.issues_of("lat-0"), "TASK-1", state="Backlog")
    operator = bench.operator("latency", "latency", kube)
    polled: list[float] = []
    visible: list[float] = []
    try:
        time.sleep(1.0)
        for i in range(applies):
            name = f"lat-{i}"
            started = time.time()
            kube.apply(rig.workflow(name, interval_ms=30000))

            def seen(n: str = name) -> str | None:
                status = kube.get("workflow", n).get("status") or {}
                value = (status.get("poll") or {}).get("lastPollAt")
                return str(value) if value else None

            last_poll = wait_until(seen, timeout=30, interval=0.02, message="first poll")
            visible.append(time.time() - started)
            at = datetime.datetime.fromisoformat(last_poll.replace("Z", "+00:00")).timestamp()
            polled.append(at - started)
    finally:
        operator.stop()
    print(f"\n2. kubectl apply → first poll ({applies} new Workflows):")
    print(f"   first tick done:   median {statistics.median(polled):.3f} s, "
          f"max {max(polled):.3f} s")
    print(f"   visible in status: median {statistics.median(visible):.3f} s, "
          f"max {max(visible):.3f} s (includes kubectl's own start-up per read)")


def failover(bench: Bench, *, failovers: int) -> None:
    _, kube, rig = bench.setup("failover")
    lease = (3, 2.0, 0.5)
    serial = iter(range(1000))

    def start() -> OperatorProcess:
        return bench.operator("failover", f"fo-{next(serial)}", kube, lease=lease)

    live = [start(), start()]
    times: list[float] = []
    try:
        kube.apply(rig.workflow("failover", interval_ms=1000))
        for _ in range(failovers):
            leader = wait_until(
                lambda: next((o for o in live if o.identity == kube.holder("failover")), None),
                timeout=30, interval=0.05, message="a leader",
            )
            time.sleep(1.0)
            leader.kill(signal.SIGKILL)
            killed = time.monotonic()
            leader.wait()
            live.remove(leader)
            survivor = live[0]
            wait_until(lambda s=survivor: kube.holder("failover") == s.identity or None,
                       timeout=30, interval=0.02, message="takeover")
            times.append(time.monotonic() - killed)
            live.append(start())
    finally:
        for operator in live:
            operator.stop()
    ordered = sorted(times)
    p90 = ordered[max(0, round(0.9 * len(ordered)) - 1)]
    print(f"\n3. failover after kill -9 ({failovers}x, Lease {lease[0]} s / {lease[1]} s / "
          f"{lease[2]} s):")
    print(f"   min {ordered[0]:.2f} s, median {statistics.median(ordered):.2f} s, "
          f"p90 {p90:.2f} s, max {ordered[-1]:.2f} s")
    print("   all: " + ", ".join(f"{t:.2f}" for t in times))


def graceful_handover(bench: Bench, *, handovers: int) -> None:
    """SIGTERM of the leader with a run in flight → the follower holds the Lease."""
    _, kube, rig = bench.setup("handover")
    lease = (3, 2.0, 0.5)
    serial = iter(range(1000))

    def start() -> OperatorProcess:
        return bench.operator("handover", f"ho-{next(serial)}", kube, lease=lease)

    live = [start(), start()]
    times: list[float] = []
    try:
        for i in range(handovers):
            write_issue(rig.issues_of("handover"), f"TASK-{i}")
        kube.apply(rig.workflow("handover", seconds=600.0, interval_ms=1000))
        for _ in range(handovers):
            leader = wait_until(
                lambda: next((o for o in live if o.identity == kube.holder("handover")), None),
                timeout=60, interval=0.05, message="a leader",
            )
            wait_until(lambda: rig.runs() or None, timeout=60, message="a run in flight")
            leader.kill(signal.SIGTERM)
            stopped = time.monotonic()
            live.remove(leader)
            survivor = live[0]
            wait_until(lambda s=survivor: kube.holder("handover") == s.identity or None,
                       timeout=60, interval=0.02, message="takeover")
            times.append(time.monotonic() - stopped)
            leader.wait(timeout=60)
            live.append(start())
    finally:
        for operator in live:
            operator.stop()
    print(f"\n4. graceful handover after SIGTERM with a run in flight ({handovers}x, Lease "
          f"{lease[0]} s; without the release a follower would wait the lease duration):")
    print(f"   min {min(times):.2f} s, median {statistics.median(times):.2f} s, "
          f"max {max(times):.2f} s")


def namespace_deletion(bench: Bench, *, workflows: int) -> None:
    """``kubectl delete namespace`` holding Workflows with Claims → the namespace is gone."""
    namespace, kube, rig = bench.setup("nsdel")
    operator = bench.operator("nsdel", "nsdel", kube)
    try:
        names = [f"del-{i}" for i in range(workflows)]
        for name in names:
            write_issue(rig.issues_of(name), "TASK-1")
            kube.apply(rig.workflow(name, seconds=600.0, interval_ms=30000))
        wait_until(lambda: len(kube.items("claims")) >= workflows or None, timeout=600,
                   interval=1.0, message="a Claim per Workflow")
        started = time.monotonic()
        bench.cluster.delete_namespace(namespace, wait=True, timeout=900)
        took = time.monotonic() - started
    finally:
        operator.stop()
    print(f"\n5. kubectl delete namespace with {workflows} Workflows and {workflows} Claims "
          f"(runs in flight): gone after {took:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--scale-workflows", type=int, default=1000)
    parser.add_argument("--steady-seconds", type=float, default=600.0)
    parser.add_argument("--delete-timeout", type=float, default=1800.0,
                        help="how long the scale section waits for its namespace to go")
    parser.add_argument("--no-claims", action="store_true",
                        help="scale: no held Claim per Workflow (namespace deletion without them)")
    parser.add_argument("--profile-workflows", type=int, default=300)
    parser.add_argument("--workflows", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--applies", type=int, default=5)
    parser.add_argument("--failovers", type=int, default=10)
    parser.add_argument("--handovers", type=int, default=5)
    parser.add_argument("--deleted-workflows", type=int, default=20)
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {', '.join(unknown)}")
    control_plane = ControlPlane(binaries=Binaries.locate())
    cluster = control_plane.start()
    try:
        cluster.install_crds(REPO / "crds")
        with tempfile.TemporaryDirectory(prefix="lorenz-operator-bench-") as tmp:
            bench = Bench(cluster=cluster, control_plane=control_plane, work=Path(tmp),
                          shards=args.shards)
            print(f"shards {args.shards}; machine: {machine()}")
            if "scale" in sections:
                scale(bench, replicas=args.replicas, workflows=args.scale_workflows,
                      steady_s=args.steady_seconds, delete_timeout_s=args.delete_timeout,
                      claims=not args.no_claims)
            if "profile" in sections:
                profile(bench, workflows=args.profile_workflows)
            if "cpu" in sections:
                cpu_profile(bench, workflows=args.profile_workflows)
            if "idle" in sections:
                idle_cost(bench, workflows=args.workflows, seconds=args.idle_seconds)
            if "latency" in sections:
                first_poll(bench, applies=args.applies)
            if "failover" in sections:
                failover(bench, failovers=args.failovers)
            if "handover" in sections:
                graceful_handover(bench, handovers=args.handovers)
            if "nsdel" in sections:
                namespace_deletion(bench, workflows=args.deleted_workflows)
    finally:
        control_plane.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
