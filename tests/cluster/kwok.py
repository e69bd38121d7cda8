"""Fake nodes for scale: the kwok controller (sigs.k8s.io/kwok) on the test control plane.

The test node (tests/cluster/node.py) runs real containers, one node's worth. To place a
thousand runs on a hundred nodes (bench/kwok_bench.py) the nodes are fakes: Node objects that
the kwok controller keeps Ready (node leases) and whose Pods it moves through the Stages that
tests/cluster/build.sh copies from kwok's own module next to its binary:

- ``node-initialize``: a new Node gets its conditions (Ready), addresses (127.0.0.1, where the
  controller serves the kubelet API) and its capacity;
- ``pod-ready`` (the "fast" Pod Stage): a Pod the scheduler bound to a fake node is ``Running``
  at once, every container ``running``, with a Pod IP from ``POD_CIDR``; no container runs;
- ``pod-delete``: a Pod with a deletionTimestamp is deleted at once (there is no kubelet to
  confirm it).

The fake nodes carry the taint ``FAKE_TAINT`` and the label ``FAKE_LABEL``, so only Pods that
tolerate them and select them land there (every other test's Pods stay where they were); the
controller manages only Nodes with the annotation ``FAKE_ANNOTATION``, never the real node.
Scheduling is the control plane's one kube-scheduler (tests/cluster/scheduler.py) on envtest,
the cluster's own on kind.

NB: a fake Pod runs no process, so nothing answers an exec into it: the controller's kubelet
API answers exec only from an ``Exec``/``ClusterExec`` resource (a local command per exec),
and none is configured here. What the fakes measure is placement — Pod created, scheduled,
Running — and what the operator spends meanwhile (bench/kwok_bench.py says why).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.controlplane import Binaries, ControlPlaneError, _free_port, _Process

KWOK = "kwok"
STAGE_FILES = ("node-initialize.yaml", "pod-ready.yaml", "pod-delete.yaml")
FAKE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_LABEL = "lorenz.test/kwok"
FAKE_TAINT = {"key": FAKE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
FAKE_TOLERATION = {"key": FAKE_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}
FAKE_NODE_SELECTOR = {FAKE_LABEL: "true"}
POD_CIDR = "10.78.0.0/16"
NODE_PREFIX = "kwok-node-"
# What a fake node offers the scheduler: a large VM's worth, at most 110 Pods (the kubelet's
# default), so 1,000 runs need at least ten nodes and the scheduler spreads them.
NODE_CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}


class KwokError(ControlPlaneError):
    """The kwok controller or its fake nodes could not be started."""


def stages_dir(binaries: Binaries) -> Path:
    return binaries.directory / "kwok-stages"


def node_manifest(name: str) -> dict[str, Any]:
    """One fake Node: annotated for the controller, labelled and tainted for the tests."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                FAKE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {"taints": [dict(FAKE_TAINT)]},
        # NB: a Node's status is kept on create (kubelets register that way); node-initialize
        # keeps a capacity it finds and only fills in its own (1k CPUs, 1M Pods) otherwise.
        "status": {"capacity": dict(NODE_CAPACITY), "allocatable": dict(NODE_CAPACITY)},
    }


def ready_fake_nodes(cluster: Cluster) -> list[str]:
    """Names of the fake nodes whose Ready condition is True."""
    body = cluster.kubectl_json("get", "nodes", "-l", f"{FAKE_LABEL}=true")
    ready = []
    for node in body["items"]:
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready.append(node["metadata"]["name"])
    return sorted(ready)


@dataclass
class FakeNodes:
    """The kwok controller and `count` fake nodes. `start()`, then `stop()` (idempotent).

    `tls` is the certificate and key the controller serves its kubelet API with (the API
    server does not verify a kubelet's certificate here; exec, logs and port-forward go over
    it); without one it serves plain HTTP, which the API server cannot use, placement can.
    """

    cluster: Cluster
    binaries: Binaries
    directory: Path
    log_dir: Path
    count: int = 100
    tls: tuple[Path, Path] | None = None
    start_timeout: float = 180.0
    timings: dict[str, float] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    _process: _Process | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None or process.popen is None else process.popen.pid

    @property
    def log(self) -> Path:
        """The controller's log (every exec it refuses is one line there)."""
        return self.log_dir / "kwok.log"

    def start(self) -> FakeNodes:
        began = time.monotonic()
        reason = self.binaries.missing_reason((KWOK,))
        missing_stages = [f for f in STAGE_FILES if not (stages_dir(self.binaries) / f).is_file()]
        if reason is None and missing_stages:
            reason = (
                f"kwok Stage files missing from {stages_dir(self.binaries)}: "
                f"{', '.join(missing_stages)}; run tests/cluster/build.sh"
            )
        if reason is not None:
            raise KwokError(reason)
        try:
            self._start_controller()
            self._create_nodes()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - began
        (self.log_dir / "kwok-timings.json").write_text(json.dumps(self.timings, indent=2))
        return self

    def stop(self) -> None:
        """Delete the fake nodes (their Pods are then orphans the pod GC removes), then stop
        the controller."""
        if self.names:
            self.cluster.kubectl(
                "delete", "nodes", "-l", f"{FAKE_LABEL}=true", "--wait=false",
                "--ignore-not-found", check=False, timeout=120.0,
            )
            self.names = []
        process, self._process = self._process, None
        if process is not None:
            process.stop(grace=5.0)

    def _config(self) -> Path:
        """The controller's --config: the Stages (no CRDs: nothing is installed in the API)."""
        documents = [
            (stages_dir(self.binaries) / name).read_text().strip() for name in STAGE_FILES
        ]
        path = self.directory / "kwok.yaml"
        path.write_text("\n---\n".join(documents) + "\n")
        return path

    def _start_controller(self) -> None:
        began = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        argv = [
            str(self.binaries.path(KWOK)),
            f"--config={self._config()}",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={FAKE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            f"--node-port={port}",
            f"--server-address=127.0.0.1:{port}",
        ]
        if self.tls is not None:
            argv += [f"--tls-cert-file={self.tls[0]}", f"--tls-private-key-file={self.tls[1]}"]
        process = _Process(name=KWOK, argv=argv, log=self.log)
        process.start()
        self._process = process
        self.timings["controller spawned"] = time.monotonic() - began

    def _create_nodes(self) -> None:
        began = time.monotonic()
        names = [f"{NODE_PREFIX}{i:03d}" for i in range(self.count)]
        self.names = names
        body = {"apiVersion": "v1", "kind": "List", "items": [node_manifest(n) for n in names]}
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(body), timeout=120.0)
        self.timings["nodes created"] = time.monotonic() - began

    def _wait_ready(self) -> None:
        began = time.monotonic()
        process = self._process
        assert process is not None

        def all_ready() -> bool:
            code = process.exited()
            if code is not None:
                raise KwokError(f"kwok exited with {code}; log {process.log}:\n{process.tail()}")
            return len(ready_fake_nodes(self.cluster)) == self.count

        try:
            wait_until(
                all_ready, timeout=self.start_timeout, interval=0.5,
                message=f"{self.count} fake nodes Ready",
            )
        except TimeoutError as err:
            raise KwokError(f"{err}; kwok log {process.log}:\n{process.tail()}") from err
        self.timings["ready"] = time.monotonic() - began
