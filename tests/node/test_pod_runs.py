"""Runs in Pods on the real node, end to end from `helm install` and `kubectl apply`.

The chart's operator runs in a namespace that enforces the `restricted` Pod Security Standard.
A Workflow that names no `worker.kind` (`pod`, the operator's default; the agent image: `FROM`
the project image plus a scripted command agent, as docs/install.md says to build one) gets its
issue's run as a Pod of its own: named after the run's handle, labelled, restricted, without a
ServiceAccount token. The agent inside it reports to a recorder on the host (its run id and its
Pod's name, which is its host name) and has the issue moved to Done; the Pod is deleted
afterwards. Then the run's Pod is deleted mid-run (a failure retry with the reason, the retry
in a new Pod) and a Pod that cannot be scheduled is given up after `startTimeoutMs`: its
reservation is given back with a `PlacementFailed` Event naming why, no attempt counted. With a
ResourceQuota of one run Pod and three issues, one run Pod runs at a time, the others wait,
none fails, all end Done.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.images import agent_image
from tests.cluster.node import NODE_TOLERATION, Node
from tests.fakes.linear_server import FakeLinearServer
from tests.node.pods import RESTRICTED_LABELS, recorder_egress
from tests.node.test_helm_operator import (
    AGENT,
    CHART,
    RELEASE,
    REPO,
    WORKFLOW,
    Install,
    Recorder,
    workflow,
)

pytestmark = [pytest.mark.node, pytest.mark.cluster, pytest.mark.timeout(1800)]

RUN_POD_LABEL = f"lorenz.dev/workflow={WORKFLOW},!lorenz.dev/probe"
"""The Workflow's run Pods (not the operator's NetworkPolicy probe, which has their labels)."""


@pytest.fixture(scope="module")
def pod_install(
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
                "resources": {
                    "requests": {"cpu": "50m", "memory": "128Mi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                },
                "probes": {
                    "readiness": {"initialDelaySeconds": 1, "periodSeconds": 2},
                    "liveness": {"initialDelaySeconds": 10, "periodSeconds": 5},
                },
            }
        )
    )
    kube_control_plane.kubectl(
        "create", "secret", "generic", "linear", "-n", namespace,
        f"--from-literal=token={linear.api_key}",
    )
    rig = Install(
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
    rig.helm("install", RELEASE, str(CHART), "-f", str(values))
    rig.wait_ready_pods(1)
    yield rig
    kube_control_plane.helm("uninstall", RELEASE, "-n", namespace, "--wait=false", check=False)
    kube_control_plane.delete_namespace(namespace, wait=False)


def pod_workflow(rig: Install, *, seconds: float, **worker: Any) -> dict[str, Any]:
    body = workflow(rig, seconds=seconds)
    body["spec"]["retry"] = {"backoff": {"initialMs": 1000}}
    body["spec"]["worker"] = {  # no kind: pod is the operator's default
        "podTemplate": {
            "image": rig.image,
            "imagePullPolicy": "Never",
            "tolerations": [NODE_TOLERATION],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                          "limits": {"memory": "512Mi"}},
        },
        "startTimeoutMs": 120000,
        "egress": recorder_egress(rig.recorder_url),
        **worker,
    }
    return body


def run_pods(rig: Install) -> list[dict[str, Any]]:
    body = rig.cluster.kubectl_json("get", "pods", "-n", rig.namespace, "-l", RUN_POD_LABEL)
    return list(body["items"])


def events_of(rig: Install, reason: str) -> list[str]:
    body = rig.cluster.kubectl_json(
        "get", "events", "-n", rig.namespace, "--field-selector",
        f"involvedObject.name={WORKFLOW},reason={reason}",
    )
    return [str(item.get("message") or "") for item in body["items"]]


def applied(rig: Install, body: dict[str, Any]) -> None:
    """``kubectl apply`` the Workflow and wait until the operator runs with that spec.

    NB: an issue added right after an apply can be polled before the operator saw the new
    spec (a watch event behind a 500 ms poll on a loaded machine): it then runs with the old
    one, and a test of the new one waits for what never comes.
    """
    rig.cluster.apply(body, namespace=rig.namespace)

    def in_effect() -> bool | None:
        found = rig.cluster.kubectl_json("get", "workflow", WORKFLOW, "-n", rig.namespace)
        observed = (found.get("status") or {}).get("observedGeneration")
        return observed == found["metadata"]["generation"] or None

    wait_until(in_effect, timeout=120, interval=0.25, message="the new spec in effect")


def diagnose(rig: Install) -> str:
    # NB: the operator's log without its poll lines (one every 500 ms here, they hid the rest).
    logs = rig.cluster.kubectl(
        "logs", "-n", rig.namespace, "-l", f"app.kubernetes.io/instance={RELEASE}",
        "--tail=5000", check=False,
    )
    kept = [line for line in logs.stdout.splitlines() if "poll_completed" not in line]
    claims = rig.cluster.kubectl("get", "claims", "-n", rig.namespace, "-o", "yaml", check=False)
    pods = rig.cluster.kubectl("describe", "pods", "-n", rig.namespace, check=False)
    return (
        "\n".join(kept[-150:]) + f"\n{logs.stderr}\n{claims.stdout[-4000:]}\n"
        + pods.stdout[-5000:]
    )


def test_an_issue_runs_in_a_pod_of_its_own_to_done(pod_install: Install) -> None:
    rig = pod_install
    cluster = rig.cluster

    # -- kubectl apply: the issue's run is a Pod, the agent inside it does the work.
    cluster.apply(pod_workflow(rig, seconds=4.0), namespace=rig.namespace)
    one = rig.linear.add_issue(title="in a pod")
    began = time.monotonic()
    try:
        (pod,) = wait_until(
            lambda: [p for p in run_pods(rig) if p["status"].get("phase") == "Running"] or None,
            timeout=240, interval=0.5, message="the run's Pod running",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    print(f"\nissue -> run Pod Running: {time.monotonic() - began:.1f} s")
    name = pod["metadata"]["name"]
    assert name.startswith("lzw-")
    labels = pod["metadata"]["labels"]
    assert labels["lorenz.dev/workflow"] == WORKFLOW
    assert labels["lorenz.dev/issue"] == one.identifier
    handle = pod["metadata"]["annotations"]["lorenz.dev/handle"]
    assert labels["lorenz.dev/handle"] == handle
    assert name == handle.lower()
    spec = pod["spec"]
    assert spec["nodeName"] == rig.node_name
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "lorenz-agent"
    assert all(
        "serviceAccountToken" not in json.dumps(v) and "hostPath" not in v
        for v in spec["volumes"]
    )
    (container,) = spec["containers"]
    assert container["image"] == rig.image
    assert container["command"][:2] == ["lorenz", "worker"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # No token in the run's Pod: neither the ServiceAccount's nor the tracker's.
    assert "linear" not in json.dumps(container.get("envFrom", []))
    try:
        rig.wait_done(one.id, timeout=240)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    print(f"issue -> Done through the run Pod: {time.monotonic() - began:.1f} s")
    runs = rig.recorder.runs_of(one.id)
    assert [(r.pod, r.started, r.ended) for r in runs] == [(name, True, True)]
    # The operator's own Pod ran no agent.
    assert all(not r.pod.startswith(RELEASE) for r in runs)
    # Settled: the run's Pod and its spec Secret are deleted.
    wait_until(lambda: run_pods(rig) == [] or None, timeout=120, message="run Pod deleted")
    secret = cluster.kubectl("get", "secret", f"{name}-spec", "-n", rig.namespace, check=False)
    assert secret.returncode != 0, secret.stdout
    assert "NotFound" in secret.stderr, secret.stderr

    # -- the run's Pod deleted mid-run: a failure retry with the reason, in a new Pod.
    applied(rig, pod_workflow(rig, seconds=600.0))
    two = rig.linear.add_issue(title="pod deleted")
    wait_until(
        lambda: any(r.started for r in rig.recorder.runs_of(two.id)) or None,
        timeout=240, interval=0.5, message="the second issue's agent started",
    )
    (first_run,) = rig.recorder.runs_of(two.id)
    # The retry should finish quickly: the spec change reaches new runs only, and it is in
    # effect before the Pod goes (the retry must not start with the old one).
    applied(rig, pod_workflow(rig, seconds=1.0))
    cluster.kubectl("delete", "pod", first_run.pod, "-n", rig.namespace, "--wait=false")
    try:
        rig.wait_done(two.id, timeout=300)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    runs = rig.recorder.runs_of(two.id)
    assert len(runs) == 2, runs
    assert runs[0].pod == first_run.pod
    assert not runs[0].ended
    assert runs[1].pod != first_run.pod
    assert runs[1].ended
    failed = [m for m in events_of(rig, "RunFailed") if two.identifier in m]
    assert failed, events_of(rig, "RunFailed")
    wait_until(lambda: run_pods(rig) == [] or None, timeout=120, message="run Pods deleted")

    # -- a Pod that cannot be scheduled: given up after startTimeoutMs, with the reason.
    applied(
        rig,
        pod_workflow(
            rig,
            seconds=1.0,
            podTemplate={
                "image": rig.image,
                "imagePullPolicy": "Never",
                "tolerations": [NODE_TOLERATION],
                "nodeSelector": {"lorenz.test/no-such-node": "true"},
            },
            startTimeoutMs=8000,
        ),
    )
    three = rig.linear.add_issue(title="unschedulable")

    def given_back() -> list[str] | None:
        found = [
            m for m in events_of(rig, "PlacementFailed")
            if three.identifier in m and "worker.start_timeout_ms" in m
        ]
        return found or None

    try:
        messages = wait_until(given_back, timeout=180, interval=1.0,
                              message="PlacementFailed Event")
    except TimeoutError as err:
        raise AssertionError(
            f"{err}\n{events_of(rig, 'PlacementFailed')}\n{diagnose(rig)}"
        ) from err
    assert any("Unschedulable" in m or "node affinity/selector" in m for m in messages), messages
    # Given back, not failed: no RunFailed, and the Claim waits for placement as a first run
    # with the reason, its attempt not counted — however often the Pod is tried again.
    def claim_of_three() -> dict[str, Any] | None:
        claims = cluster.kubectl_json("get", "claims", "-n", rig.namespace)["items"]
        status = next(
            (c.get("status") or {} for c in claims
             if c["spec"]["identifier"] == three.identifier),
            {},
        )
        return status if status.get("phase") == "RetryPending" else None

    status = wait_until(claim_of_three, timeout=60, interval=0.5, message="Claim RetryPending")
    assert status["retryKind"] == "placement", status
    assert not status.get("attempt"), status
    assert "Unschedulable" in status["lastError"] or "selector" in status["lastError"], status
    # Tried again after the placement wait (Reserved, a new Pod), still not counted.
    wait_until(lambda: any(p["metadata"]["labels"].get("lorenz.dev/issue") == three.identifier
                           for p in run_pods(rig)) or None,
               timeout=120, interval=0.5, message="the unschedulable run's Pod tried again")
    status = wait_until(claim_of_three, timeout=120, interval=0.5, message="RetryPending again")
    assert status["retryKind"] == "placement", status
    assert not status.get("attempt"), status
    assert [m for m in events_of(rig, "RunFailed") if three.identifier in m] == []
    assert rig.recorder.runs_of(three.id) == []
    # -- deleting the Workflow leaves no run Pod behind (the retry's Pending one included).
    cluster.kubectl("delete", "workflow", WORKFLOW, "-n", rig.namespace, "--wait=true",
                    "--timeout=120s")
    wait_until(lambda: run_pods(rig) == [] or None, timeout=120, message="no run Pods left")


def test_helm_upgrade_mid_run_leaves_the_run_pod_to_the_new_operator(pod_install: Install) -> None:
    """`helm upgrade` replaces the operator Pod while a run's agent works in its own Pod: the
    old operator leaves the run Pod running, the new one adopts it, and the run completes
    with one agent start (the agent's own marks), its Pod deleted afterwards."""
    rig = pod_install
    cluster = rig.cluster
    (old,) = rig.wait_ready_pods(1)
    # NB: long enough to be mid-run across the upgrade, however slow the machine.
    cluster.apply(pod_workflow(rig, seconds=60.0), namespace=rig.namespace)
    issue = rig.linear.add_issue(title="across an upgrade")
    try:
        wait_until(
            lambda: any(r.started for r in rig.recorder.runs_of(issue.id)) or None,
            timeout=240, interval=0.5, message="the agent in the run Pod started",
        )
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{diagnose(rig)}") from err
    (agent,) = rig.recorder.runs_of(issue.id)
    (pod,) = [p for p in run_pods(rig) if p["metadata"]["name"] == agent.pod]
    uid = pod["metadata"]["uid"]

    # NB: the old operator's log goes with its Pod: followed to a file, for a failure to show.
    old_log = rig.values.parent / f"{old}.log"
    with old_log.open("w") as sink:
        follower = subprocess.Popen(
            [str(cluster.kubectl_bin), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
             old, "-n", rig.namespace], stdout=sink, stderr=subprocess.STDOUT,
        )
    try:
        rig.helm("upgrade", RELEASE, str(CHART), "-f", str(rig.values), "--reuse-values",
                 "--set", "operator.logLevel=debug")
        (new,) = rig.wait_ready_pods(1, exclude={old})
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            follower.wait(timeout=30)  # NB: ends when the old Pod's container does
        if follower.poll() is None:
            follower.kill()
            follower.wait()

    def both_logs() -> str:
        kept = [line for line in old_log.read_text().splitlines() if "poll_completed" not in line]
        return "--- the old operator\n" + "\n".join(kept[-150:]) + "\n" + diagnose(rig)

    assert new != old
    assert not any(r.ended for r in rig.recorder.runs_of(issue.id)), (
        "the run ended before the upgrade: nothing was left to adopt"
    )
    try:
        rig.wait_done(issue.id, timeout=300)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{both_logs()}") from err
    runs = rig.recorder.runs_of(issue.id)
    assert [(r.run, r.pod, r.ended, r.stopped_at) for r in runs] == [
        (agent.run, agent.pod, True, None)
    ], both_logs()
    logs = cluster.kubectl("logs", new, "-n", rig.namespace, check=False).stdout
    assert "adopting the worker of a lost controller" in logs, logs[-3000:]

    def pod_gone() -> bool:
        return all(p["metadata"]["uid"] != uid for p in run_pods(rig))

    wait_until(lambda: pod_gone() or None, timeout=120, message="the adopted run's Pod deleted")
    cluster.kubectl("delete", "workflow", WORKFLOW, "-n", rig.namespace, "--wait=true",
                    "--timeout=120s")


def test_a_quota_of_one_pod_runs_one_issue_at_a_time_and_fails_none(
    pod_install: Install,
) -> None:
    rig = pod_install
    cluster = rig.cluster
    wait_until(lambda: run_pods(rig) == [] or None, timeout=120, message="no run Pods left")
    # NB: a quota counts every Pod of the namespace: the operator's own plus one run Pod.
    others = [
        p for p in cluster.kubectl_json("get", "pods", "-n", rig.namespace)["items"]
        if p["status"].get("phase") not in ("Succeeded", "Failed")
    ]
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "one-run-pod"},
            "spec": {"hard": {"pods": str(len(others) + 1)}},
        },
        namespace=rig.namespace,
    )
    wait_until(
        lambda: cluster.kubectl_json("get", "resourcequota", "one-run-pod", "-n", rig.namespace)
        .get("status", {}).get("hard") or None,
        timeout=60, interval=0.5, message="the quota counted",
    )
    body = pod_workflow(rig, seconds=2.0)
    body["spec"]["agent"]["maxConcurrentAgents"] = 3
    cluster.apply(body, namespace=rig.namespace)
    issues = [rig.linear.add_issue(title=f"quota {n}") for n in range(3)]
    most = 0

    def all_done() -> bool | None:
        nonlocal most
        live = [p for p in run_pods(rig) if not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") in ("Pending", "Running")]
        most = max(most, len(live))
        return all(rig.linear.state_of(i.id) == "Done" and any(
            r.ended for r in rig.recorder.runs_of(i.id)) for i in issues) or None

    try:
        wait_until(all_done, timeout=600, interval=0.5, message="three issues Done")
    except TimeoutError as err:
        raise AssertionError(
            f"{err}\n{events_of(rig, 'PlacementFailed')}\n{diagnose(rig)}"
        ) from err
    assert most <= 1, most
    # Each issue ran exactly once, and the runs did not overlap.
    spans = []
    for one in issues:
        runs = rig.recorder.runs_of(one.id)
        assert len(runs) == 1, runs
        assert runs[0].ended
        marks = [m for m in rig.recorder.marks if m["issue"] == one.id]
        spans.append((min(m["at"] for m in marks if m["what"] == "start"),
                      max(m["at"] for m in marks if m["what"] == "end")))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    # The others waited: given back with the quota's reason, never failed.
    refused = events_of(rig, "PlacementFailed")
    assert any("exceeded quota" in m for m in refused), refused
    identifiers = {one.identifier for one in issues}
    assert [m for m in events_of(rig, "RunFailed") if any(i in m for i in identifiers)] == []
    cluster.kubectl("delete", "resourcequota", "one-run-pod", "-n", rig.namespace)
