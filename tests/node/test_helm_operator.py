"""End to end as a user: the Helm chart's operator running as a Pod on the test node.

`helm install` with the locally built image → the operator Pod is Ready (its probes pass),
non-root, with a read-only root filesystem, in a namespace that enforces the `restricted` Pod
Security Standard. A Workflow (Linear tracker: the fake Linear server on the host, reached from
the Pod through a forwarder into the node's network namespace) gets its issue worked to Done by
a command agent inside the operator Pod (`worker.kind: local`, chosen explicitly). `helm
upgrade` rolls the Deployment and the new Pod takes the Workflow over; with two replicas,
deleting the leader's Pod hands the Workflow over with no double run; `helm uninstall` leaves
only what docs/install.md says stays (the CRDs).

The agent reports each run to a recorder on the host (`start`, `done` — which moves the issue
to Done in the fake — and `end`, with its own run id and Pod name), so runs are told apart by
run id, not by a PID (PIDs repeat across Pods).
"""

from __future__ import annotations

import http.server
import itertools
import json
import textwrap
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorenz.kube.leaderelection.sharding import shard_lease_name, shard_of
from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.images import agent_image
from tests.cluster.node import NODE_TOLERATION, Node
from tests.fakes.linear_server import FakeLinearServer
from tests.node.pods import RESTRICTED_LABELS

# NB: the first run builds the images (minutes on 2 busy cores) inside a fixture, which the
# suite's 300 s per-test timeout would cut short.
pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lorenz"
RELEASE = "lorenz"
WORKFLOW = "pods"
AGENT_PATH = "/opt/lorenz-test/agent.py"

# The command agent inside the operator's image: marks its run, works for AGENT_SECONDS
# (printing, so it never looks stalled), has its issue moved to Done, marks the end. NB: it
# talks to the test's recorder, not to Linear: the operator keeps the tracker's API key out of
# agents' environments, by value as well as by name.
AGENT = textwrap.dedent(
    """\
    import json, os, signal, socket, sys, time, urllib.request, uuid

    env = os.environ
    sys.stdin.read()
    run = uuid.uuid4().hex[:12]

    def post(what):
        body = {"what": what, "run": run, "pod": socket.gethostname(),
                "issue": env["LORENZ_ISSUE_ID"]}
        request = urllib.request.Request(
            env["AGENT_RECORDER_URL"], data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()

    def on_term(signum, frame):
        # The operator stops a run with SIGTERM: say when, so overlap is judged by the mark.
        try:
            post("stopped")
        finally:
            os._exit(143)

    signal.signal(signal.SIGTERM, on_term)
    post("start")
    deadline = time.monotonic() + float(env.get("AGENT_SECONDS", "1"))
    while time.monotonic() < deadline:
        print("working", flush=True)
        time.sleep(0.2)
    post("done")
    post("end")
    """
)


@dataclass
class Run:
    run: str
    pod: str
    started: bool
    ended: bool
    started_at: float = 0.0  # host clock, when the recorder got the mark
    ended_at: float | None = None
    stopped_at: float | None = None  # host clock, when a SIGTERMed agent said it stops


class Recorder:
    """What the agents report, served on the host's loopback: `start`/`end` marks per run, and
    `done`, which moves the issue to Done in the fake Linear server."""

    def __init__(self, linear: FakeLinearServer) -> None:
        self.linear = linear
        self.marks: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                # NB: up to 1 MiB: a hostile agent reports all it saw (test_pod_security.py).
                length = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
                body = json.loads(self.rfile.read(length))
                with recorder._lock:
                    recorder.marks.append({**body, "at": time.time()})
                if body["what"] == "done":
                    recorder.linear.set_state(body["issue"], "Done")
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def runs_of(self, issue: str) -> list[Run]:
        """The agent's runs on `issue`, in start order."""
        found: dict[str, Run] = {}
        with self._lock:
            marks = list(self.marks)
        for mark in marks:
            if mark["issue"] != issue or mark["what"] not in ("start", "end", "stopped"):
                continue
            entry = found.setdefault(
                mark["run"], Run(run=mark["run"], pod=mark["pod"], started=False, ended=False)
            )
            if mark["what"] == "start":
                entry.started = True
                entry.started_at = mark["at"]
            elif mark["what"] == "stopped":
                entry.stopped_at = mark["at"]
            else:
                entry.ended = True
                entry.ended_at = mark["at"]
        return list(found.values())


@dataclass
class Install:
    cluster: Cluster
    namespace: str
    linear: FakeLinearServer
    recorder: Recorder
    recorder_url: str  # as the Pods reach it
    image: str
    values: Path
    endpoint: str  # the fake Linear server, as the Pods reach it
    node_name: str

    def helm(self, *args: str) -> str:
        done = self.cluster.helm(*args, "-n", self.namespace, timeout=600.0)
        return done.stdout

    def pods(self) -> list[dict[str, Any]]:
        body = self.cluster.kubectl_json(
            "get", "pods", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={RELEASE}"
        )
        return list(body["items"])

    def ready_pods(self) -> list[str]:
        names = []
        for pod in self.pods():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                names.append(pod["metadata"]["name"])
        return sorted(names)

    def wait_ready_pods(
        self, count: int, *, exclude: Collection[str] = (), timeout: float = 240.0
    ) -> list[str]:
        def enough() -> list[str] | None:
            pods = self.pods()
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            ready = [n for n in self.ready_pods() if n not in exclude]
            others = [p["metadata"]["name"] for p in live if p["metadata"]["name"] in exclude]
            return ready if len(ready) == count and len(live) == count and not others else None

        try:
            return wait_until(enough, timeout=timeout, interval=0.5, message=f"{count} Ready pods")
        except TimeoutError as err:
            described = self.cluster.kubectl("describe", "pods", "-n", self.namespace, check=False)
            raise AssertionError(f"{err}\n{described.stdout[-6000:]}") from err

    def shards_split_between(self, pods: Collection[str]) -> bool:
        """Every shard Lease is held, and each of ``pods`` holds its fair share (16 / len)."""
        holders = []
        for shard in range(16):
            done = self.cluster.kubectl(
                "get",
                "lease",
                shard_lease_name(RELEASE, shard),
                "-n",
                self.namespace,
                "-o",
                "jsonpath={.spec.holderIdentity}",
                check=False,
            )
            holders.append(done.stdout.strip() if done.returncode == 0 else "")
        counts = {pod: sum(h.startswith(pod) for h in holders) for pod in pods}
        return all(counts[pod] == 16 // len(pods) for pod in pods) and sum(counts.values()) == 16

    def holder(self) -> str | None:
        done = self.cluster.kubectl(
            "get",
            "lease",
            # The Workflow's shard Lease: the chart names Leases after the release's full name
            # ("lorenz" for this release) and keeps them in the release namespace (16 shards).
            shard_lease_name(RELEASE, shard_of(self.namespace, WORKFLOW, shards=16)),
            "-n",
            self.namespace,
            "-o",
            "jsonpath={.spec.holderIdentity}",
            check=False,
        )
        if done.returncode != 0:
            return None
        return done.stdout.strip() or None

    def wait_done(self, issue: str, *, timeout: float = 180.0) -> None:
        def done() -> bool:
            # NB: the agent moves the issue to Done, then posts its end mark: wait for both.
            return self.linear.state_of(issue) == "Done" and any(
                run.ended for run in self.recorder.runs_of(issue)
            )

        try:
            wait_until(done, timeout=timeout, interval=0.5, message=f"{issue} Done")
        except TimeoutError as err:
            logs = self.cluster.kubectl(
                "logs",
                "-n",
                self.namespace,
                "-l",
                f"app.kubernetes.io/instance={RELEASE}",
                "--tail=80",
                "--prefix",
                check=False,
            )
            raise AssertionError(f"{err}\n{logs.stdout}{logs.stderr}") from err


@pytest.fixture(scope="module")
def install(
    kube_control_plane: Cluster,
    kube_node: Node,
    linear: FakeLinearServer,
    recorder: Recorder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    image = agent_image(AGENT)
    kube_node.import_image(image.archive)
    kube_control_plane.install_crds(REPO / "crds")
    namespace = kube_control_plane.create_namespace(labels=RESTRICTED_LABELS)
    port = int(linear.url.rsplit(":", 1)[1].split("/", 1)[0])
    host, node_port = kube_node.forward_to_host(port=port)
    recorder_host, recorder_port = kube_node.forward_to_host(port=recorder.port)
    repository, tag = image.ref.rsplit(":", 1)
    values = tmp_path_factory.mktemp("helm") / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "watchNamespace": namespace,
                "tolerations": [NODE_TOLERATION],
                # Small requests: the test node shares 2 cores with everything else.
                "resources": {
                    "requests": {"cpu": "50m", "memory": "128Mi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                },
                "probes": {
                    "readiness": {"initialDelaySeconds": 1, "periodSeconds": 2},
                    "liveness": {"initialDelaySeconds": 10, "periodSeconds": 5},
                },
                "operator": {
                    "lease": {
                        "durationSeconds": 6,
                        "renewDeadlineSeconds": 4,
                        "retryPeriodSeconds": 1,
                    },
                    # NB: this install's Workflows run their agent in the operator's Pod
                    # (worker.kind: local, off by default since #37), in its one namespace.
                    "localRuns": {"enabled": True, "namespaces": [namespace]},
                },
            }
        )
    )
    kube_control_plane.kubectl(
        "create",
        "secret",
        "generic",
        "linear",
        "-n",
        namespace,
        f"--from-literal=token={linear.api_key}",
    )
    yield Install(
        cluster=kube_control_plane,
        namespace=namespace,
        linear=linear,
        recorder=recorder,
        recorder_url=f"http://{recorder_host}:{recorder_port}/",
        image=image.ref,
        values=values,
        endpoint=f"http://{host}:{node_port}/graphql",
        node_name=kube_node.name,
    )
    kube_control_plane.helm("uninstall", RELEASE, "-n", namespace, "--wait=false", check=False)
    kube_control_plane.delete_namespace(namespace, wait=False)


def workflow(rig: Install, *, seconds: float) -> dict[str, Any]:
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": WORKFLOW},
        "spec": {
            "tracker": {
                "kind": "linear",
                "endpoint": rig.endpoint,
                "projectSlug": rig.linear.project_slug,
                "apiKeySecretRef": {"name": "linear", "key": "token"},
            },
            "polling": {"intervalMs": 500},
            # NB: the agent inside the operator Pod (unisolated), chosen explicitly: the
            # operator's default is a Pod per run (tests/node/test_pod_runs.py).
            "worker": {"kind": "local"},
            "agent": {"kind": "script", "maxConcurrentAgents": 2},
            "agents": {
                "script": {
                    "protocol": "command",
                    "command": f"python3 {AGENT_PATH}",
                    "stallTimeoutMs": 60000,
                    "turnTimeoutMs": 120000,
                    "env": {
                        "AGENT_RECORDER_URL": rig.recorder_url,
                        "AGENT_SECONDS": str(seconds),
                    },
                }
            },
            "prompt": "Work on {{ issue.identifier }}",
        },
    }


def _pod(rig: Install, name: str) -> dict[str, Any]:
    body: dict[str, Any] = rig.cluster.kubectl_json("get", "pod", name, "-n", rig.namespace)
    return body


def test_install_upgrade_failover_uninstall(install: Install) -> None:
    rig = install
    cluster = rig.cluster

    # -- helm install: the operator Pod becomes Ready, restricted, non-root, read-only root.
    began = time.monotonic()
    rig.helm("install", RELEASE, str(CHART), "-f", str(rig.values))
    (first,) = rig.wait_ready_pods(1)
    print(f"\nhelm install -> operator Pod Ready: {time.monotonic() - began:.1f} s")
    pod = _pod(rig, first)
    assert pod["spec"]["nodeName"] == rig.node_name
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["imagePullPolicy"] == "Never"
    assert container["image"] == rig.image
    whoami = cluster.kubectl(
        "exec",
        "-n",
        rig.namespace,
        first,
        "-c",
        "operator",
        "--",
        "python3",
        "-c",
        "import os\ntry:\n open('/x','w'); print(os.getuid(), 'rw')\n"
        "except OSError:\n print(os.getuid(), 'ro')",
    ).stdout.split()
    assert whoami == ["10001", "ro"]
    # The restricted standard is enforced there: a root Pod is refused.
    refused = cluster.kubectl(
        "run",
        "root-shell",
        "-n",
        rig.namespace,
        f"--image={rig.image}",
        "--image-pull-policy=Never",
        "--overrides",
        json.dumps({"spec": {"securityContext": {"runAsUser": 0}}}),
        "--",
        "true",
        check=False,
    )
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr, refused.stderr

    # -- a Workflow: its issue worked to Done by the agent inside the operator Pod.
    cluster.apply(workflow(rig, seconds=1.0), namespace=rig.namespace)
    one = rig.linear.add_issue(title="first")
    print(f"issue {one.identifier} in the tracker; the Workflow applied")
    rig.wait_done(one.id)
    runs = rig.recorder.runs_of(one.id)
    assert [(r.pod, r.started, r.ended) for r in runs] == [(first, True, True)]
    wait_until(
        lambda: (rig.holder() or "").startswith(first) or None,
        timeout=60,
        message="the first Pod holds the Workflow's Lease",
    )

    # -- helm upgrade with a changed value rolls the Deployment; the new Pod takes over.
    rig.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-f",
        str(rig.values),
        "--reuse-values",
        "--set",
        "operator.logLevel=debug",
    )
    (second,) = rig.wait_ready_pods(1, exclude={first})
    assert second != first
    env = {e["name"]: e.get("value") for e in _pod(rig, second)["spec"]["containers"][0]["env"]}
    assert env["LORENZ_OPERATOR_LOG_LEVEL"] == "debug"
    two = rig.linear.add_issue(title="second")
    rig.wait_done(two.id)
    assert [(r.pod, r.ended) for r in rig.recorder.runs_of(two.id)] == [(second, True)]
    assert len(rig.recorder.runs_of(one.id)) == 1  # the finished issue was not redone

    # -- two replicas: deleting the leader's Pod hands over, with no double run.
    rig.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-f",
        str(rig.values),
        "--reuse-values",
        "--set",
        "replicaCount=2",
        "--set",
        "updateStrategy.type=RollingUpdate",
    )
    pair = rig.wait_ready_pods(2, exclude={first})
    leader = wait_until(
        lambda: next((p for p in pair if (rig.holder() or "").startswith(p)), None),
        timeout=60,
        message="one of the two Pods leads the Workflow",
    )
    # A longer run, so the leader's Pod is deleted while its agent works.
    cluster.apply(workflow(rig, seconds=4.0), namespace=rig.namespace)
    three = rig.linear.add_issue(title="third")
    wait_until(
        lambda: rig.recorder.runs_of(three.id) or None,
        timeout=120,
        message="the leader starts the third issue",
    )
    cluster.kubectl("delete", "pod", leader, "-n", rig.namespace, "--wait=false")
    follower = next(p for p in pair if p != leader)
    wait_until(
        lambda: (rig.holder() or "").startswith(follower) or None,
        timeout=120,
        message="the follower takes the Workflow's Lease over",
    )
    wait_until(
        lambda: (
            rig.cluster.kubectl("get", "pod", leader, "-n", rig.namespace, check=False).returncode
            != 0
            or None
        ),
        timeout=120,
        message="the leader's Pod to be gone",
    )
    leader_gone = time.time()
    rig.wait_done(three.id)
    runs = sorted(rig.recorder.runs_of(three.id), key=lambda r: r.started_at)
    finished = [r for r in runs if r.ended]
    assert len(finished) == 1, runs  # done once, never twice
    # No two runs at once: a run the deleted Pod never finished ends when its agent said it was
    # stopped (SIGTERM), or — killed without a word — at the latest with its Pod.
    for earlier, later in itertools.pairwise(runs):
        end = next(t for t in (earlier.ended_at, earlier.stopped_at, leader_gone) if t is not None)
        assert later.started_at >= end, (earlier, later)
    print(f"leader deletion: runs of the in-flight issue {[(r.pod, r.ended) for r in runs]}")
    # The Deployment replaces the deleted Pod; the newcomer takes its fair share of the shards
    # (8 of 16), which may include this Workflow's. Only once the split has settled is the
    # Workflow's holder known for the fourth issue (a share moving mid-run aborts that run).
    newcomer_pair = rig.wait_ready_pods(2, exclude={first, leader})
    assert follower in newcomer_pair
    wait_until(
        lambda: rig.shards_split_between(newcomer_pair) or None,
        timeout=180,
        message="the 16 shards split 8/8 between the follower and the replacement Pod",
    )
    owner = next(p for p in newcomer_pair if (rig.holder() or "").startswith(p))
    four = rig.linear.add_issue(title="fourth")
    rig.wait_done(four.id)
    assert [(r.pod, r.ended) for r in rig.recorder.runs_of(four.id)] == [(owner, True)]
    for issue in (one, two):
        assert len(rig.recorder.runs_of(issue.id)) == 1

    # -- helm uninstall leaves the CRDs (and the user's own Workflow and Secret), nothing else.
    cluster.kubectl(
        "delete", "workflow", WORKFLOW, "-n", rig.namespace, "--wait=true", timeout=120.0
    )
    rig.helm("uninstall", RELEASE, "--wait", "--timeout=180s")
    wait_until(lambda: rig.pods() == [] or None, timeout=120, message="the operator Pods gone")
    left = cluster.kubectl(
        "get",
        "deployments,replicasets,services,serviceaccounts,roles,rolebindings,"
        "configmaps,persistentvolumeclaims",
        "-n",
        rig.namespace,
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "name",
    ).stdout.split()
    assert left == []
    cluster_wide = cluster.kubectl(
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
        "-o",
        "json",
    )
    leftovers = [
        i["metadata"]["name"]
        for i in json.loads(cluster_wide.stdout)["items"]
        if i["metadata"].get("annotations", {}).get("meta.helm.sh/release-namespace")
        == rig.namespace
    ]
    assert leftovers == []
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/workflows.lorenz.dev" in crds
