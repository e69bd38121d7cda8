"""The NetworkPolicy probe (#37 point 5): the probe Pod, and the Workflow's
``NetworkPolicyEnforced`` condition and ``NetworkPolicyNotEnforced`` Event — against the real
API server.

There is no node here, so the test plays the kubelet for the probe Pod: it writes the
container's end (the exit code the probe's script uses) through the Pod's status, as a kubelet
would. What the probe finds on a real node is tests/node/test_hostile_tenant.py.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import pytest

from lorenz.codes import ErrorCode
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import NETWORK_POLICY_ENFORCED
from lorenz.kube.clients import KubeApi
from lorenz.kube.controller.enforcement import (
    EXIT_CONNECTED,
    EXIT_REFUSED,
    LABEL_PROBE,
    NOT_ENFORCED_EVENT,
    NetworkPolicyProbes,
    probe_pod_manifest,
    probe_target,
)
from lorenz.kube.controller.status import StatusInputs, workflow_status
from lorenz.kube.pods.manifests import network_policies_path, pods_path, run_network_policy_manifest
from lorenz.kube.pods.transport import AgentAccounts, RunNetworkPolicies
from tests.cluster.cluster import Cluster, wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig
from tests.kube.test_pods import pod_worker
from tests.kube.test_run_network_policy import restricted_namespace as restricted_namespace
from tests.kube.test_run_network_policy import selects

pytestmark = pytest.mark.timeout(300)

TARGET = ("192.0.2.10", 9090)
"""The operator's address as the probe sees it (TEST-NET-1: nothing answers there)."""


def test_the_probe_pod_is_a_run_pod_to_the_policy_restricted_and_tiny() -> None:
    ref = WorkflowRef(namespace="team-b", name="pods", uid="u-1")
    worker = pod_worker(pod_template={
        "node_selector": {"pool": "agents"},
        "tolerations": [{"key": "lorenz", "operator": "Exists", "effect": "NoSchedule"}],
        "image_pull_policy": "Never",
    })
    pod = probe_pod_manifest(workflow=ref, worker=worker, image="agents:1", target=TARGET)
    policy = run_network_policy_manifest(workflow=ref, worker=worker)
    assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert pod["metadata"]["labels"][LABEL_PROBE] == "network-policy"
    assert "lorenz.dev/handle" not in pod["metadata"]["labels"]  # no run, no orphan sweep
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "lorenz-agent"
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"pool": "agents"}
    assert spec["tolerations"][0]["key"] == "lorenz"
    (container,) = spec["containers"]
    assert container["image"] == "agents:1"
    assert container["imagePullPolicy"] == "Never"
    assert container["command"][-2:] == ["192.0.2.10", "9090"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"]["memory"] == "128Mi"


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://10.1.2.3:9090", ("10.1.2.3", 9090)),
        ("http://[fd00::5]:9090/", ("fd00::5", 9090)),
        ("https://lorenz.example", ("lorenz.example", 443)),
        (None, None),
        ("", None),
        ("not a url", None),
    ],
)
def test_the_target_is_the_advertised_api(
    url: str | None, target: tuple[str, int] | None
) -> None:
    assert probe_target(url) == target


def test_the_condition_is_written_only_with_an_answer() -> None:
    now = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    inputs = StatusInputs(generation=1, applied_generation=1, identity="me", lease_name="l")
    types = [c["type"] for c in workflow_status(inputs, [], now)["conditions"]]
    assert NETWORK_POLICY_ENFORCED not in types
    said = StatusInputs(
        generation=1, applied_generation=1, identity="me", lease_name="l",
        network_policy=("False", ErrorCode.NETWORK_POLICY_NOT_ENFORCED, "an enforcing CNI"),
    )
    conditions = {c["type"]: c for c in workflow_status(said, [], now)["conditions"]}
    found = conditions[NETWORK_POLICY_ENFORCED]
    assert (found["status"], found["reason"]) == ("False", "network_policy_not_enforced")
    assert conditions["Degraded"]["status"] == "False"  # never Degraded on its own


@pytest.mark.cluster
async def test_a_probe_that_cannot_run_says_unknown_and_leaves_no_pod(
    kube_api: KubeApi, restricted_namespace: str
) -> None:
    ref = WorkflowRef(namespace=restricted_namespace, name="pods")
    probes = NetworkPolicyProbes(timeout_s=3.0, poll_s=0.2, policies=RunNetworkPolicies())
    verdict = await probes.verdict(
        kube_api, workflow=ref, worker=pod_worker(), image="localhost/lorenz:absent",
        target=TARGET, accounts=AgentAccounts(), max_age_s=3600,
    )
    assert verdict.status == "Unknown"
    assert verdict.reason == ErrorCode.NETWORK_POLICY_PROBE_FAILED
    assert "did not answer within 3 s" in verdict.message
    assert probes.probes == 1
    # The policy that should refuse it was made first; the Pod is gone (or going).
    await kube_api.get(network_policies_path(restricted_namespace, "lorenz-runs-pods"))
    pods = (await kube_api.get(pods_path(restricted_namespace)))["items"]
    assert [p for p in pods if not p["metadata"].get("deletionTimestamp")] == []
    # An answer holds: no second Pod for the namespace while it is young.
    again = await probes.verdict(
        kube_api, workflow=WorkflowRef(namespace=restricted_namespace, name="other"),
        worker=pod_worker(), image="localhost/lorenz:absent", target=TARGET,
        accounts=AgentAccounts(), max_age_s=3600,
    )
    assert again is verdict
    assert probes.probes == 1
    # Without an address of its own there is nothing to probe (and no Pod).
    none = await NetworkPolicyProbes().verdict(
        kube_api, workflow=ref, worker=pod_worker(), image="x", target=None,
        accounts=AgentAccounts(), max_age_s=3600,
    )
    assert none.status == "Unknown"
    assert "--advertise-url" in none.message


def probe_pods(kube: Kube) -> list[dict[str, Any]]:
    return [
        p for p in kube.items("pods", "-l", f"{LABEL_PROBE}=network-policy")
        if not p["metadata"].get("deletionTimestamp")
    ]


def end_probe(kube: Kube, pod: dict[str, Any], *, exit_code: int, said: str) -> None:
    """What the kubelet would write when the probe's container exits with ``exit_code``."""
    terminated = {
        "exitCode": exit_code, "reason": "Error", "message": said,
        "startedAt": "2026-12-07T00:00:00Z", "finishedAt": "2026-12-07T00:00:01Z",
    }
    status = {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "probe", "image": pod["spec"]["containers"][0]["image"], "imageID": "",
            "ready": False, "restartCount": 0, "state": {"terminated": terminated},
        }],
    }
    kube.cluster.kubectl(
        "patch", "pod", pod["metadata"]["name"], "-n", kube.namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )


@pytest.mark.cluster
def test_the_workflow_says_whether_its_namespace_enforces_network_policy(
    kube_control_plane: Cluster,
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
) -> None:
    """A Workflow whose runs go to Pods gets a probe Pod selected by its run Pods' policy; a
    probe that connected makes ``NetworkPolicyEnforced=False`` (reason
    ``network_policy_not_enforced``) and a ``NetworkPolicyNotEnforced`` Warning, never
    ``Degraded``; the next probe (the interval, here 2 s) that is refused makes it ``True``."""
    from tests.kube.test_operator import condition, wait_condition

    operators(
        "prober", namespaces=(kube.namespace,),
        extra_args=("--worker-image", "localhost/lorenz:absent",
                    "--advertise-url", f"http://{TARGET[0]}:{TARGET[1]}",
                    "--network-policy-probe-interval-seconds", "2"),
    )
    body = rig.workflow("probed", seconds=0.2)
    del body["spec"]["worker"]  # pod, the default kind
    kube.apply(body)

    (pod,) = wait_until(lambda: probe_pods(kube) or None, timeout=60, message="the probe Pod")
    policy = kube.get("networkpolicy", "lorenz-runs-probed")
    assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert pod["spec"]["containers"][0]["command"][-2:] == [TARGET[0], str(TARGET[1])]
    end_probe(kube, pod, exit_code=EXIT_CONNECTED, said="connected to 192.0.2.10:9090")

    workflow = wait_condition(kube, "probed", NETWORK_POLICY_ENFORCED, "False",
                              reason="network_policy_not_enforced", timeout=60)
    message = condition(workflow, NETWORK_POLICY_ENFORCED)["message"]  # type: ignore[index]
    assert "192.0.2.10:9090" in message
    assert "enforcing CNI" in message
    assert condition(workflow, "Degraded")["status"] == "False"  # type: ignore[index]
    warnings = wait_until(
        lambda: [e for e in kube.events("probed") if e["reason"] == NOT_ENFORCED_EVENT] or None,
        timeout=30, message="the NetworkPolicyNotEnforced Event",
    )
    assert warnings[0]["type"] == "Warning"
    assert "enforcing CNI" in warnings[0]["message"]
    wait_until(lambda: not [p for p in probe_pods(kube)
                            if p["metadata"]["uid"] == pod["metadata"]["uid"]] or None,
               timeout=30, message="the answered probe Pod deleted")

    # The next probe is refused: the condition turns True.
    second = wait_until(
        lambda: [p for p in probe_pods(kube) if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        or None, timeout=60, message="the next probe Pod",
    )[0]
    end_probe(kube, second, exit_code=EXIT_REFUSED, said="refused: TimeoutError: timed out")
    workflow = wait_condition(kube, "probed", NETWORK_POLICY_ENFORCED, "True",
                              reason="ConnectionRefused", timeout=60)
    assert "timed out" in condition(workflow, NETWORK_POLICY_ENFORCED)["message"]  # type: ignore[index]
    kube_control_plane.kubectl(
        "delete", "workflow", "probed", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )


@pytest.mark.cluster
def test_the_probe_can_be_turned_off(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    from tests.kube.test_operator import condition, wait_condition

    operators(
        "no-probe", namespaces=(kube.namespace,),
        extra_args=("--worker-image", "localhost/lorenz:absent",
                    "--advertise-url", f"http://{TARGET[0]}:{TARGET[1]}",
                    "--network-policy-probe", "false"),
    )
    body = rig.workflow("unprobed", seconds=0.2)
    del body["spec"]["worker"]
    kube.apply(body)
    workflow = wait_condition(kube, "unprobed", "Ready", "True", timeout=60)
    assert condition(workflow, NETWORK_POLICY_ENFORCED) is None
    assert probe_pods(kube) == []
