"""The operator needs exactly :data:`lorenz.kube.rbac.OPERATOR_RULES`, and they are enough.

The operator runs as a ServiceAccount bound to a Role built from those rules (a namespaced
install) and goes through a whole lifecycle: leadership, Claims, status, Events, the
finalizer, deletion. Then a Workflow whose runs are Pods with a claim per issue (there is no
node here, so each Pod is given up after its start timeout): the ``lorenz-agent``
ServiceAccount is made, the issue's claim outlives its attempts and goes when the issue is
Done, and the Workflow's deletion takes the other issue's claim and the Pods along. Any verb
it needed beyond the rules would show up as a 403 in its log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lorenz.kube import rbac
from tests.cluster.cluster import Cluster, wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, issue_state, write_issue

pytestmark = pytest.mark.cluster


def test_the_operator_works_with_only_the_declared_verbs(
    kube_control_plane: Cluster,
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
) -> None:
    namespace = kube.namespace
    kube_control_plane.create_service_account(namespace=namespace, name="lorenz-operator")
    kube_control_plane.apply(rbac.role(name="lorenz-operator", namespace=namespace))
    kube_control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "lorenz-operator", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "lorenz-operator",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "lorenz-operator", "namespace": namespace}
            ],
        }
    )
    # Leadership: a Role of its own in the operator's namespace (here the same one).
    kube_control_plane.apply(rbac.lease_role(name="lorenz-operator-leases", namespace=namespace))
    kube_control_plane.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "lorenz-operator-leases", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "lorenz-operator-leases",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "lorenz-operator", "namespace": namespace}
            ],
        }
    )
    kubeconfig = kube_control_plane.service_account_kubeconfig(
        namespace=namespace, name="lorenz-operator", create=False
    )
    for verb, resource in [
        ("delete", "leases.coordination.k8s.io"),
        ("update", "workflows.lorenz.dev"),
        ("list", "secrets"),
        ("create", "workflows.lorenz.dev"),
    ]:
        assert not kube_control_plane.can_i(
            verb, resource, namespace=namespace, kubeconfig=kubeconfig
        ), (verb, resource)

    operator = operators(
        "rbac",
        namespaces=(namespace,),
        kubeconfig=kubeconfig,
        extra_args=("--worker-image", "localhost/lorenz:absent"),
    )
    write_issue(rig.issues_of("least"), "TASK-1")
    kube.apply(rig.workflow("least", seconds=1.0))
    wait_until(lambda: kube.items("claims") or None, timeout=30, message="a Claim")
    wait_until(lambda: issue_state(rig.issues_of("least"), "TASK-1") == "Done" or None, timeout=30,
               message="the run completes")
    wait_until(lambda: kube.items("claims") == [] or None, timeout=30, message="released")
    workflow = kube.get("workflow", "least")
    assert workflow["status"]["leader"]["identity"] == "rbac"
    assert "lorenz.dev/cleanup" in workflow["metadata"]["finalizers"]
    wait_until(lambda: "RunStarted" in kube.reasons("least") or None, timeout=60,
               message="Events posted")
    kube_control_plane.kubectl(
        "delete", "workflow", "least", "-n", namespace, "--wait=true", "--timeout=60s"
    )

    # -- runs in Pods, a claim per issue (no node: every Pod is given up after 2 s).
    issues = rig.issues_of("podsec")
    write_issue(issues, "TASK-2")
    write_issue(issues, "TASK-3")
    body = rig.workflow("podsec", seconds=1.0, max_backoff_ms=2000)
    body["spec"]["worker"] = {  # no kind: pod is the operator's default
        "startTimeoutMs": 2000,
        "workspace": {"volumeClaimTemplate": {"storage": "1Gi", "storageClassName": ""}},
    }
    kube.apply(body)

    def claims_by_issue() -> dict[str, dict[str, Any]]:
        return {
            c["metadata"]["labels"]["lorenz.dev/issue"]: c
            for c in kube.items("persistentvolumeclaims", "-l", "lorenz.dev/workflow=podsec")
            if not c["metadata"].get("deletionTimestamp")
        }

    wait_until(lambda: len(claims_by_issue()) == 2 or None, timeout=60, message="two claims")
    account = kube.get("serviceaccount", "lorenz-agent")
    assert account["automountServiceAccountToken"] is False
    # Placements come and go (a Pod never placed gives its reservation back: PlacementFailed,
    # not RunFailed, since 5e398aa); the claims stay.
    wait_until(
        lambda: "PlacementFailed" in kube.reasons("podsec") or None, timeout=60,
        message="PlacementFailed",
    )
    first = claims_by_issue()["TASK-2"]["metadata"]["uid"]
    write_issue(issues, "TASK-2", state="Done")
    wait_until(lambda: "TASK-2" not in claims_by_issue() or None, timeout=60,
               message="the Done issue's claim deleted")
    assert "TASK-3" in claims_by_issue()
    assert first
    kube_control_plane.kubectl(
        "delete", "workflow", "podsec", "-n", namespace, "--wait=true", "--timeout=60s"
    )
    wait_until(lambda: claims_by_issue() == {} or None, timeout=30, message="claims deleted")
    wait_until(
        lambda: kube.items("pods", "-l", "lorenz.dev/workflow=podsec") == [] or None,
        timeout=30, message="run Pods deleted",
    )
    log = operator.log()
    assert " 403 " not in log
    assert "Forbidden" not in log
