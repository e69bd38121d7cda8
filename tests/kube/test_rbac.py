"""The operator needs exactly :data:`lorenz.kube.rbac.OPERATOR_RULES`, and they are enough.

The operator runs as a ServiceAccount bound to a Role built from those rules (a namespaced
install) and goes through a whole lifecycle: leadership, Claims, status, Events, the
finalizer, deletion. Any verb it needed beyond the rules would show up as a 403 in its log.
"""

from __future__ import annotations

from collections.abc import Callable

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

    operator = operators("rbac", namespaces=(namespace,), kubeconfig=kubeconfig)
    write_issue(rig.issues_of("least"), "TASK-1")
    kube.apply(rig.workflow("least", seconds=1.0))
    wait_until(lambda: kube.items("claims") or None, timeout=30, message="a Claim")
    wait_until(lambda: issue_state(rig.issues_of("least"), "TASK-1") == "Done" or None, timeout=30,
               message="the run completes")
    wait_until(lambda: kube.items("claims") == [] or None, timeout=30, message="released")
    workflow = kube.get("workflow", "least")
    assert workflow["status"]["leader"]["identity"] == "rbac"
    assert "lorenz.dev/cleanup" in workflow["metadata"]["finalizers"]
    wait_until(lambda: "RunStarted" in kube.reasons("least") or None, timeout=15,
               message="Events posted")
    kube_control_plane.kubectl(
        "delete", "workflow", "least", "-n", namespace, "--wait=true", "--timeout=60s"
    )
    log = operator.log()
    assert " 403 " not in log
    assert "Forbidden" not in log
