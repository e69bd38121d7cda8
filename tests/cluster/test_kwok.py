"""The kwok fixture: 100 fake nodes Ready, and a run's Pod placed on one of them.

The Pod is the one the operator makes for a ``worker.kind: pod`` run (``pod_manifest``, with
its spec Secret), tolerating and selecting the fake nodes: the scheduler binds it to a fake
node, kwok reports it Running (no container runs), and a delete removes it at once. This is
what bench/kwok_bench.py builds its 1,000 runs on.
"""

from __future__ import annotations

import base64

import pytest

from lorenz.config import AgentLaunch, AgentProtocol, WorkerSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.pods.manifests import SPEC_KEY, pod_manifest, pod_name
from lorenz.workers.spec import IssueSpec, RunSpec, encode_spec
from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.kwok import (
    FAKE_NODE_SELECTOR,
    FAKE_TOLERATION,
    NODE_CAPACITY,
    FakeNodes,
    ready_fake_nodes,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def test_a_hundred_fake_nodes_are_ready_and_take_a_run_pod(
    kube_control_plane: Cluster, kwok_nodes: FakeNodes, kube_namespace: str
) -> None:
    cluster = kube_control_plane
    assert ready_fake_nodes(cluster) == sorted(kwok_nodes.names)
    assert len(kwok_nodes.names) == 100
    node = cluster.kubectl_json("get", "node", kwok_nodes.names[0])
    assert node["status"]["allocatable"]["pods"] == NODE_CAPACITY["pods"]
    assert {t["key"] for t in node["spec"]["taints"]} == {FAKE_TOLERATION["key"]}

    spec = RunSpec(
        workflow="/var/lib/lorenz/workflows/kwok/WORKFLOW.md",
        issue=IssueSpec(id="id-1", identifier="KWOK-1", title="Place me", state="Todo"),
        prompt="Nothing to do.",
        agent=AgentLaunch(command="true", protocol=AgentProtocol.COMMAND),
        max_turns=1,
        workspace="/var/lib/lorenz/workspaces/KWOK-1",
        create_workspace=True,
    )
    worker = WorkerSettings.model_validate(
        {
            "kind": "pod",
            "pod_template": {
                "node_selector": FAKE_NODE_SELECTOR,
                "tolerations": [
                    {"key": FAKE_TOLERATION["key"], "operator": "Exists", "effect": "NoSchedule"}
                ],
            },
        }
    )
    workflow = WorkflowRef(namespace=kube_namespace, name="kwok", uid=None)
    name = pod_name(spec.handle)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-spec"},
            "data": {SPEC_KEY: base64.b64encode(encode_spec(spec)).decode()},
        },
        namespace=kube_namespace,
    )
    pod = pod_manifest(spec=spec, workflow=workflow, worker=worker, image="localhost/lorenz:kwok")
    # The run's ServiceAccount (the operator makes the per-namespace one before a run).
    account = pod["spec"].get("serviceAccountName")
    if account and account != "default":
        cluster.create_service_account(namespace=kube_namespace, name=account)
    cluster.apply(pod, namespace=kube_namespace)

    def running() -> dict[str, str] | None:
        pod = cluster.kubectl_json("get", "pod", name, "-n", kube_namespace)
        status = pod.get("status") or {}
        if status.get("phase") != "Running":
            return None
        return {"node": pod["spec"]["nodeName"], "ip": status.get("podIP") or ""}

    placed = wait_until(running, timeout=120, interval=0.5, message=f"Pod {name} Running")
    assert placed["node"] in kwok_nodes.names
    assert placed["ip"].startswith("10.78.")

    # Deleting it needs no kubelet: kwok's pod-delete Stage removes it.
    cluster.kubectl("delete", "pod", name, "-n", kube_namespace, "--wait=false")
    wait_until(
        lambda: cluster.kubectl(
            "get", "pod", name, "-n", kube_namespace, "--ignore-not-found", "-o", "name"
        ).stdout.strip() == "",
        timeout=120, interval=0.5, message=f"Pod {name} deleted",
    )
