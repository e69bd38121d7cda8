"""The NetworkPolicy of a Workflow's run Pods (#37): what it admits, `worker.egress`, and the
transport making sure of it before any run Pod exists — against the real API server. That a
node enforces it is tests/node/test_network_policy.py."""

from __future__ import annotations

from collections.abc import Iterator

import pydantic
import pytest

from lorenz.agents import PlacementFailed
from lorenz.codes import ErrorCode
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi
from lorenz.kube.pods.execs import PodExec
from lorenz.kube.pods.manifests import (
    LABEL_MANAGED,
    LABEL_WORKFLOW,
    network_policies_path,
    pod_manifest,
    pods_path,
    run_network_policy_manifest,
    run_network_policy_name,
)
from lorenz.kube.pods.transport import (
    POLICY_DIGEST_ANNOTATION,
    PodTransport,
    RunNetworkPolicies,
)
from lorenz.kube.rbac import OPERATOR_RULES
from lorenz.workers.launch import WorkerLaunchError
from tests.cluster.cluster import Cluster
from tests.kube.test_pods import RESTRICTED, WORKFLOW, pod_worker, run_spec

pytestmark = pytest.mark.timeout(300)

GIT = {"cidr": "203.0.113.0/24", "ports": [443, 22]}
MODEL = {"cidr": "0.0.0.0/0", "except_cidrs": ["10.0.0.0/8"], "ports": [443]}


def selects(selector: dict[str, dict[str, str]], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_no_ingress_dns_and_the_listed_egress_only() -> None:
    worker = pod_worker(egress=[GIT, MODEL])
    policy = run_network_policy_manifest(workflow=WORKFLOW, worker=worker)
    assert policy["metadata"]["name"] == "lorenz-runs-pods"
    assert policy["metadata"]["namespace"] == WORKFLOW.namespace
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Workflow", WORKFLOW.uid)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == []
    dns, git, model = spec["egress"]
    assert dns["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    ]
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert git == {
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "ports": [{"port": 443, "protocol": "TCP"}, {"port": 22, "protocol": "TCP"}],
    }
    assert model["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]
    # It selects this Workflow's run Pods, and not another Workflow's.
    pod = pod_manifest(spec=run_spec(), workflow=WORKFLOW, worker=worker, image="agents:1")
    assert selects(spec["podSelector"], pod["metadata"]["labels"])
    other = WorkflowRef(namespace=WORKFLOW.namespace, name="other", uid="u-2")
    theirs = pod_manifest(spec=run_spec(), workflow=other, worker=worker, image="agents:1")
    assert not selects(spec["podSelector"], theirs["metadata"]["labels"])
    # Without egress rules: DNS only.
    (only_dns,) = run_network_policy_manifest(workflow=WORKFLOW, worker=pod_worker())["spec"][
        "egress"
    ]
    assert only_dns == dns


def test_a_long_workflow_name_still_makes_a_valid_policy_name() -> None:
    long = WorkflowRef(namespace="team", name="w" * 250, uid="u")
    name = run_network_policy_name(long)
    assert len(name) <= 253
    assert name.startswith("lorenz-runs-w")
    assert name != run_network_policy_name(WorkflowRef(namespace="team", name="w" * 249 + "x"))


@pytest.mark.parametrize(
    ("rule", "bad"),
    [
        ({"cidr": "not-a-network"}, "not-a-network"),
        ({"cidr": "10.1.2.3/8"}, "10.1.2.3/8"),  # host bits set: say what you mean
        ({"cidr": "0.0.0.0/0", "except_cidrs": ["10.0.0.0/33"]}, "10.0.0.0/33"),
    ],
)
def test_a_bad_network_is_refused_with_its_code(rule: dict[str, object], bad: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        pod_worker(egress=[rule])
    (error,) = caught.value.errors()
    assert error["type"] == ErrorCode.WORKER_POD_VALUE_INVALID
    assert repr(bad) in error["msg"]
    assert "CIDR" in error["msg"]


def test_ports_are_bounded() -> None:
    with pytest.raises(pydantic.ValidationError):
        pod_worker(egress=[{"cidr": "192.0.2.0/24", "ports": [0]}])
    with pytest.raises(pydantic.ValidationError):
        pod_worker(egress=[{"cidr": "192.0.2.0/24", "ports": [70000]}])
    with pytest.raises(pydantic.ValidationError):
        pod_worker(egress=[{"cidr": "192.0.2.0/24"}] * 33)


def test_the_operator_may_make_the_policies() -> None:
    (rule,) = [r for r in OPERATOR_RULES if r["resources"] == ["networkpolicies"]]
    assert rule["apiGroups"] == ["networking.k8s.io"]
    assert set(rule["verbs"]) == {"get", "create", "update"}


@pytest.fixture
def restricted_namespace(kube_control_plane: Cluster) -> Iterator[str]:
    name = kube_control_plane.create_namespace(labels=RESTRICTED)
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


@pytest.mark.cluster
async def test_made_once_updated_when_egress_changes(
    kube_api: KubeApi, restricted_namespace: str
) -> None:
    ref = WorkflowRef(namespace=restricted_namespace, name="pods")
    policies = RunNetworkPolicies()
    path = network_policies_path(restricted_namespace, "lorenz-runs-pods")
    await policies.ensure(kube_api, workflow=ref, worker=pod_worker(egress=[GIT]))
    first = await kube_api.get(path)
    # No ingress rule at all (the API server drops the empty list), both directions governed.
    assert not first["spec"].get("ingress")
    assert first["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert len(first["spec"]["egress"]) == 2
    assert first["metadata"]["labels"][LABEL_MANAGED] == "lorenz"
    assert first["metadata"]["labels"][LABEL_WORKFLOW] == "pods"
    # Known to this process: no write at all.
    await policies.ensure(kube_api, workflow=ref, worker=pod_worker(egress=[GIT]))
    assert (await kube_api.get(path))["metadata"]["resourceVersion"] == first["metadata"][
        "resourceVersion"
    ]
    # Another process (a new leader) finds it as it should be: no write either.
    await RunNetworkPolicies().ensure(kube_api, workflow=ref, worker=pod_worker(egress=[GIT]))
    assert (await kube_api.get(path))["metadata"]["resourceVersion"] == first["metadata"][
        "resourceVersion"
    ]
    # A changed worker.egress replaces the rules (here: DNS only).
    await RunNetworkPolicies().ensure(kube_api, workflow=ref, worker=pod_worker())
    changed = await kube_api.get(path)
    assert len(changed["spec"]["egress"]) == 1
    assert (
        changed["metadata"]["annotations"][POLICY_DIGEST_ANNOTATION]
        != first["metadata"]["annotations"][POLICY_DIGEST_ANNOTATION]
    )


@pytest.mark.cluster
async def test_a_launch_makes_the_policy_before_the_pod(
    kube_api: KubeApi, restricted_namespace: str
) -> None:
    ref = WorkflowRef(namespace=restricted_namespace, name="pods")
    transport = PodTransport(
        api=kube_api,
        execs=PodExec(kube_api.configuration),
        workflow=ref,
        worker=pod_worker(
            start_timeout_ms=1000, pod_template={"node_selector": {"no-such": "node"}}
        ),
        image="localhost/lorenz:absent",
        poll_s=0.2,
        policies=RunNetworkPolicies(),
    )
    with pytest.raises(PlacementFailed):
        await transport.launch(run_spec())
    policy = await kube_api.get(network_policies_path(restricted_namespace, "lorenz-runs-pods"))
    assert policy["spec"]["podSelector"]["matchLabels"][LABEL_WORKFLOW] == "pods"


@pytest.mark.cluster
async def test_no_pod_without_its_policy(
    kube_control_plane: Cluster, restricted_namespace: str
) -> None:
    """An operator that may not write NetworkPolicies starts no run Pod, and says why."""
    ns = restricted_namespace
    kube_control_plane.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "no-policies", "namespace": ns},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods", "serviceaccounts", "secrets"],
                        "verbs": ["get", "list", "watch", "create", "delete"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "no-policies", "namespace": ns},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "no-policies",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}],
            },
        ]
    )
    kubeconfig = kube_control_plane.service_account_kubeconfig(namespace=ns, name="operator")
    api = KubeApi.from_kubeconfig(kubeconfig=str(kubeconfig))
    try:
        transport = PodTransport(
            api=api,
            execs=PodExec(api.configuration),
            workflow=WorkflowRef(namespace=ns, name="pods"),
            worker=pod_worker(start_timeout_ms=1000),
            image="localhost/lorenz:absent",
            poll_s=0.2,
            policies=RunNetworkPolicies(),
        )
        with pytest.raises(WorkerLaunchError) as caught:
            await transport.launch(run_spec())
        assert caught.value.code == ErrorCode.POD_NETWORK_POLICY_FAILED
        assert "403" in str(caught.value)
        assert "networkpolicies" in str(caught.value)
        assert (await api.get(pods_path(ns)))["items"] == []
    finally:
        await api.close()
