"""`helm install` the chart into the real test API server and act as its ServiceAccount.

First the grant itself, then the proof that it suffices: `lorenz operator` runs as a separate
process with nothing but the chart ServiceAccount's token and reconciles a Workflow from
dispatch to deletion (Claims, Lease, status, Events, finalizer) without one refused request.

What the chart grants is checked three ways against the API server's own RBAC authorizer:
`kubectl auth can-i` for the verbs the brief names, a SelfSubjectAccessReview for every
(verb, resource) pair of the operator's resources — the granted ones exactly
`lorenz.kube.rbac.OPERATOR_RULES`, every other one denied — and real requests, which succeed for
granted verbs and come back 403 for the rest.

NB: the test control plane has no scheduler and no kubelet: the operator Deployment gets a Pod
that stays Pending (so no `helm install --wait`), but the Pod exists only if admission (Pod
Security `restricted` on the namespace, ServiceAccount) accepted it.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.kube.rbac import LEASE_RULES, OPERATOR_RULES
from tests.cluster.cluster import Cluster, wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, issue_state, write_issue
from tests.packaging.charts import CHART, REPO

RELEASE = "lorenz"
SERVICE_ACCOUNT = "lorenz"  # the release's full name: release "lorenz" + chart "lorenz"
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")

# Resources the operator must never touch, beyond the verbs it lacks on its own resources.
FOREIGN_RESOURCES = (
    # NB: pods, pods/exec, persistentvolumeclaims and serviceaccounts are the operator's own
    # now (runs in Pods): their other verbs (watch, update, patch, …) stay denied through the
    # matrix of OPERATOR_RULES. Minting a token for any ServiceAccount stays denied here.
    ("", "pods", "log"),
    ("", "pods", "portforward"),
    ("", "pods", "attach"),
    ("", "configmaps", ""),
    ("", "serviceaccounts", "token"),
    ("", "namespaces", ""),
    ("", "nodes", ""),
    ("apps", "deployments", ""),
    ("batch", "jobs", ""),
    ("apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("rbac.authorization.k8s.io", "roles", ""),
    ("rbac.authorization.k8s.io", "clusterroles", ""),
    ("rbac.authorization.k8s.io", "rolebindings", ""),
    ("events.k8s.io", "events", ""),
    ("kopf.dev", "kopfpeerings", ""),
)


def _lease_granted() -> set[tuple[str, str, str, str]]:
    """What LEASE_RULES grants (in the release namespace only)."""
    return _granted(LEASE_RULES)


def _granted(rules: Any = None) -> set[tuple[str, str, str, str]]:
    """(group, resource, subresource, verb) for every verb OPERATOR_RULES grants."""
    granted = set()
    for rule in OPERATOR_RULES if rules is None else rules:
        for group, qualified, verb in itertools.product(
            rule["apiGroups"], rule["resources"], rule["verbs"]
        ):
            resource, _, subresource = qualified.partition("/")
            granted.add((group, resource, subresource, verb))
    return granted


def _matrix() -> list[tuple[str, str, str, str]]:
    """Every (group, resource, subresource, verb) worth asking about."""
    own = {(g, r, s) for g, r, s, _ in _granted() | _lease_granted()}
    resources = sorted(own | set(FOREIGN_RESOURCES))
    return [(g, r, s, verb) for (g, r, s) in resources for verb in VERBS]


class ServiceAccountView:
    """The API as the chart's ServiceAccount sees it."""

    def __init__(self, cluster: Cluster, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig
        self.client = cluster.api_client(kubeconfig=kubeconfig)

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]

    def allowed(
        self, group: str, resource: str, subresource: str, verb: str, namespace: str
    ) -> bool:
        import kubernetes.client

        review = kubernetes.client.V1SelfSubjectAccessReview(
            spec=kubernetes.client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=kubernetes.client.V1ResourceAttributes(
                    group=group,
                    resource=resource,
                    subresource=subresource,
                    verb=verb,
                    namespace=namespace,
                )
            )
        )
        api = kubernetes.client.AuthorizationV1Api(self.client)
        answer = api.create_self_subject_access_review(review)
        assert answer.status is not None
        return bool(answer.status.allowed)

    def granted_in(self, namespace: str) -> set[tuple[str, str, str, str]]:
        return {key for key in _matrix() if self.allowed(*key, namespace=namespace)}


def _status_of(call: Any) -> int:
    import kubernetes.client

    try:
        call()
    except kubernetes.client.ApiException as exc:
        return int(exc.status)
    return 200


@contextlib.contextmanager
def _installed(cluster: Cluster, namespace: str, *values: str) -> Iterator[None]:
    """`helm install` (never --wait: pods stay Pending here), `helm uninstall` afterwards so
    the cluster-scoped ClusterRole and binding go too (``--no-hooks``: no kubelet here runs
    the pre-delete teardown Job, which Helm would wait for; tests/kube/test_uninstall.py
    runs it)."""
    args = ["install", RELEASE, str(CHART), "-n", namespace]
    for value in values:
        args += ["--set", value]
    result = cluster.helm(*args)
    assert "STATUS: deployed" in result.stdout, result.stdout + result.stderr
    try:
        yield
    finally:
        cluster.helm(
            "uninstall", RELEASE, "-n", namespace, "--wait=false", "--no-hooks", check=False
        )


@pytest.fixture
def crds(kube_control_plane: Cluster) -> Cluster:
    kube_control_plane.install_crds(REPO / "crds")
    return kube_control_plane


@pytest.fixture
def other_namespace(kube_control_plane: Cluster) -> Iterator[str]:
    name = kube_control_plane.create_namespace()
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


@pytest.mark.cluster
def test_cluster_wide_install_grants_exactly_the_operator_rules(
    crds: Cluster, kube_namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    cluster = crds
    cluster.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    with _installed(cluster, kube_namespace):
        kubeconfig = cluster.service_account_kubeconfig(
            namespace=kube_namespace, name=SERVICE_ACCOUNT, create=False
        )
        view = ServiceAccountView(cluster, kubeconfig)
        try:
            # Cluster-wide: the same grants in its own namespace and in any other, plus the
            # Leases in its own namespace only.
            assert view.granted_in(kube_namespace) == _granted() | _lease_granted()
            assert view.granted_in(other_namespace) == _granted()
            assert cluster.can_i(
                "update", "leases.coordination.k8s.io", namespace=kube_namespace,
                kubeconfig=kubeconfig,
            )

            for verb, resource in (
                ("watch", "workflows.lorenz.dev"),
                ("patch", "workflows.lorenz.dev"),
                ("create", "claims.lorenz.dev"),
                ("delete", "claims.lorenz.dev"),
                ("get", "secrets"),
                ("create", "events"),
                # NB: the shared watch of a namespace's run Pods (lorenz.kube.pods.watch).
                ("watch", "pods"),
            ):
                assert cluster.can_i(
                    verb, resource, namespace=other_namespace, kubeconfig=kubeconfig
                ), (verb, resource)
            for verb, resource in (
                ("update", "secrets"),
                ("list", "secrets"),
                ("patch", "pods"),
                ("update", "serviceaccounts"),
                ("create", "deployments.apps"),
                ("delete", "leases.coordination.k8s.io"),
                ("update", "leases.coordination.k8s.io"),
                ("update", "claims.lorenz.dev"),
                ("delete", "workflows.lorenz.dev"),
                ("list", "customresourcedefinitions.apiextensions.k8s.io"),
                ("list", "namespaces"),
            ):
                assert not cluster.can_i(
                    verb, resource, namespace=other_namespace, kubeconfig=kubeconfig
                ), (verb, resource)

            _real_requests(
                cluster, view, namespace=other_namespace, lease_namespace=kube_namespace
            )
        finally:
            view.close()

        # The operator's pod passed admission under the restricted Pod Security Standard.
        def pods() -> list[dict[str, Any]] | None:
            listed = cluster.kubectl_json(
                "get", "pods", "-n", kube_namespace, "-l", f"app.kubernetes.io/instance={RELEASE}"
            )["items"]
            return listed or None

        (pod,) = wait_until(pods, timeout=60, message="the ReplicaSet created no operator pod")
        assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
        assert pod["status"]["phase"] == "Pending"

        # Everything works with that grant: the default install watches every namespace, so
        # the operator runs cluster-wide and reconciles a Workflow in another namespace.
        _reconcile_as_chart_account(
            cluster,
            kubeconfig=kubeconfig,
            workflow_namespace=other_namespace,
            namespaces=(),
            lease_namespace=kube_namespace,
            workdir=tmp_path,
        )


def _real_requests(
    cluster: Cluster, view: ServiceAccountView, *, namespace: str, lease_namespace: str
) -> None:
    """Requests the operator makes succeed; requests outside its verbs are refused (403)."""
    import kubernetes.client

    admin = cluster.api_client()
    try:
        kubernetes.client.CoreV1Api(admin).create_namespaced_secret(
            namespace,
            kubernetes.client.V1Secret(
                metadata=kubernetes.client.V1ObjectMeta(name="tracker-token"),
                string_data={"token": "t0ken"},
            ),
        )
    finally:
        admin.close()  # type: ignore[no-untyped-call]

    core = kubernetes.client.CoreV1Api(view.client)
    leases = kubernetes.client.CoordinationV1Api(view.client)
    custom = kubernetes.client.CustomObjectsApi(view.client)
    apps = kubernetes.client.AppsV1Api(view.client)

    # Granted: read the named Secret, campaign for a Lease, hold a Claim, post an Event.
    secret = core.read_namespaced_secret("tracker-token", namespace)
    assert secret.data is not None
    assert secret.data["token"]
    lease = leases.create_namespaced_lease(
        lease_namespace,
        kubernetes.client.V1Lease(
            metadata=kubernetes.client.V1ObjectMeta(name="lorenz-wf-rbac"),
            spec=kubernetes.client.V1LeaseSpec(holder_identity="me", lease_duration_seconds=15),
        ),
    )
    assert lease.spec is not None
    lease.spec.holder_identity = "me-again"
    leases.replace_namespaced_lease("lorenz-wf-rbac", lease_namespace, lease)
    claim = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Claim",
        "metadata": {"name": "rbac-check"},
        "spec": {
            "workflow": "wf",
            "slotKey": "ISSUE-1#0",
            "issueId": "ISSUE-1",
            "identifier": "ISSUE-1",
            "slotIndex": 0,
        },
    }
    custom.create_namespaced_custom_object("lorenz.dev", "v1alpha1", namespace, "claims", claim)
    listed: dict[str, Any] = custom.list_namespaced_custom_object(  # type: ignore[assignment]
        "lorenz.dev", "v1alpha1", namespace, "claims"
    )
    assert [item["metadata"]["name"] for item in listed["items"]] == ["rbac-check"]
    core.create_namespaced_event(
        namespace,
        kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(generate_name="rbac-check-"),
            involved_object=kubernetes.client.V1ObjectReference(
                kind="Claim", name="rbac-check", namespace=namespace
            ),
            reason="RbacCheck",
            message="posted by the operator's ServiceAccount",
            type="Normal",
        ),
    )

    # Denied: everything else.
    refused = {
        "list secrets": lambda: core.list_namespaced_secret(namespace),
        # NB: creating and deleting Secrets and Pods, and listing Pods, is granted (runs in
        # Pods); changing a Secret or a Pod, or reading a Pod's logs, is not.
        "update secret": lambda: core.patch_namespaced_secret(
            "tracker-token", namespace, {"stringData": {"token": "stolen"}}
        ),
        "patch pod": lambda: core.patch_namespaced_pod(
            "escape", namespace, {"metadata": {"labels": {"lorenz.dev/handle": "x"}}}
        ),
        "mint a token": lambda: core.create_namespaced_service_account_token(
            "default",
            namespace,
            kubernetes.client.AuthenticationV1TokenRequest(
                spec=kubernetes.client.V1TokenRequestSpec(audiences=["x"])
            ),
        ),
        "read pod logs": lambda: core.read_namespaced_pod_log("escape", namespace),
        "list deployments": lambda: apps.list_namespaced_deployment(namespace),
        "delete lease": lambda: leases.delete_namespaced_lease(
            "lorenz-wf-rbac", lease_namespace
        ),
        "create lease elsewhere": lambda: leases.create_namespaced_lease(
            namespace,
            kubernetes.client.V1Lease(metadata=kubernetes.client.V1ObjectMeta(name="elsewhere")),
        ),
        "patch claim spec": lambda: custom.patch_namespaced_custom_object(
            "lorenz.dev",
            "v1alpha1",
            namespace,
            "claims",
            "rbac-check",
            {"metadata": {"labels": {"x": "y"}}},
        ),
        "list namespaces": lambda: core.list_namespace(),
    }
    statuses = {what: _status_of(call) for what, call in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)

    # ... and the granted delete still works.
    custom.delete_namespaced_custom_object(
        "lorenz.dev", "v1alpha1", namespace, "claims", "rbac-check"
    )


@pytest.mark.cluster
def test_watch_namespace_install_grants_only_that_namespace(
    crds: Cluster, kube_namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    cluster = crds
    watched = other_namespace
    with _installed(cluster, kube_namespace, f"watchNamespace={watched}"):
        kinds = cluster.kubectl_json(
            "get",
            "roles,rolebindings",
            "-n",
            watched,
            "-l",
            f"app.kubernetes.io/instance={RELEASE}",
        )["items"]
        assert sorted(item["kind"] for item in kinds) == ["Role", "RoleBinding"]
        cluster_wide = cluster.kubectl_json(
            "get", "clusterroles", "-l", f"app.kubernetes.io/instance={RELEASE}"
        )["items"]
        # Only the API authentication's reviews are cluster-wide (they read no object).
        (auth,) = cluster_wide
        assert auth["metadata"]["name"].endswith("-api-auth")
        assert {r["resources"][0] for r in auth["rules"]} == {
            "tokenreviews", "subjectaccessreviews"
        }

        kubeconfig = cluster.service_account_kubeconfig(
            namespace=kube_namespace, name=SERVICE_ACCOUNT, create=False
        )
        view = ServiceAccountView(cluster, kubeconfig)
        try:
            assert view.granted_in(watched) == _granted()
            # In the operator's own namespace only its Leases, nothing anywhere else.
            assert view.granted_in(kube_namespace) == _lease_granted()
            assert view.granted_in("default") == set()
        finally:
            view.close()
        assert cluster.can_i("get", "secrets", namespace=watched, kubeconfig=kubeconfig)
        assert not cluster.can_i("get", "secrets", namespace=kube_namespace, kubeconfig=kubeconfig)
        assert not cluster.can_i(
            "watch", "workflows.lorenz.dev", namespace="default", kubeconfig=kubeconfig
        )

        # The Role alone is enough for the operator watching that one namespace.
        _reconcile_as_chart_account(
            cluster,
            kubeconfig=kubeconfig,
            workflow_namespace=watched,
            namespaces=(watched,),
            lease_namespace=kube_namespace,
            workdir=tmp_path,
        )


def _reconcile_as_chart_account(
    cluster: Cluster,
    *,
    kubeconfig: Path,
    workflow_namespace: str,
    namespaces: tuple[str, ...],
    lease_namespace: str,
    workdir: Path,
) -> None:
    """`lorenz operator` with only the chart ServiceAccount's token takes a Workflow from
    dispatch to deletion, and no request it makes is refused."""
    rig = Rig(root=workdir / "rig", volume=workdir / "operator" / "volume",
              namespace=workflow_namespace)
    write_issue(rig.issues_of("packaged"), "PKG-1")
    operator = OperatorProcess(
        cluster,
        identity="chart-account",
        workdir=workdir / "operator",
        namespaces=namespaces,
        kubeconfig=kubeconfig,
        lease_namespace=lease_namespace,
    )
    kube = Kube(cluster, workflow_namespace, lease_namespace=lease_namespace)
    try:
        operator.start()
        # The Workflow is created by its user (the admin here), not by the operator.
        kube.apply(rig.workflow("packaged", seconds=0.5))
        wait_until(
            lambda: issue_state(rig.issues_of("packaged"), "PKG-1") == "Done"
            and kube.items("claims") == [],
            timeout=60,
            message="the run completes and its Claim is released",
        )
        (run,) = rig.runs()
        assert run.ended
        workflow = kube.get("workflow", "packaged")
        assert workflow["status"]["leader"]["identity"] == "chart-account"
        ready = [c for c in workflow["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]
        assert kube.holder("packaged") == "chart-account"
        wait_until(
            lambda: {"LeadershipAcquired", "RunStarted"} <= kube.reasons("packaged"),
            timeout=15,
            message="the operator's Events on the Workflow",
        )

        # Deletion goes through the operator's finalizer (patch workflows, delete claims,
        # release the Lease).
        cluster.kubectl(
            "delete",
            "workflow",
            "packaged",
            "-n",
            workflow_namespace,
            "--timeout=60s",
            timeout=70,
        )
        assert kube.items("workflows") == []  # the finalizer came off (a patch)
    finally:
        operator.stop()
    assert operator.wait() == 0, operator.log()
    # The shards' release on stop (updates of the Leases) went through under the grant.
    assert re.search(
        rf"Lease released lease={lease_namespace}/lorenz-shard-\d+ identity=chart-account",
        operator.log(),
    )
    log = operator.log()
    # Every API call is logged (urllib3, debug level) with its status: none was refused.
    # NB: the test control plane is shared by the whole session, so a cluster-wide operator
    # also sees Workflows other tests left in namespaces that are still terminating; the API
    # server refuses new objects there whatever the RBAC. Only our own namespace counts (the
    # authorizer matrix above already pins the grant everywhere).
    foreign = re.compile(r"/namespaces/(?!" + re.escape(workflow_namespace) + r"/)[^/]+/")
    refused = [
        line
        for line in log.splitlines()
        if re.search(r'HTTP/1\.1" 403 |[Ff]orbidden', line)
        and not foreign.search(line)
        and "because it is being terminated" not in line
    ]
    assert refused == [], "\n".join(refused)
    assert re.search(
        r'"PATCH /apis/lorenz\.dev/v1alpha1/namespaces/\S+/workflows/packaged/status', log
    )
