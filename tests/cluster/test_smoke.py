"""Smoke tests of the test cluster itself: the API behaviours the operator relies on.

If one of these fails, the operator tests built on `kube_control_plane` cannot be trusted:
namespaces, CRDs with a status subresource, watches, Lease optimistic concurrency,
ServiceAccount tokens under RBAC, and garbage collection (which proves the controller-manager
runs).
"""

from __future__ import annotations

import datetime
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client import (
    V1ConfigMap,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
    V1OwnerReference,
)
from kubernetes.client.exceptions import ApiException

from tests.cluster.cluster import Cluster, wait_until

pytestmark = pytest.mark.cluster

GROUP = "smoke.lorenz.test"
VERSION = "v1"
PLURAL = "widgets"

CRD_YAML = textwrap.dedent(
    f"""\
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: {PLURAL}.{GROUP}
    spec:
      group: {GROUP}
      scope: Namespaced
      names: {{plural: {PLURAL}, singular: widget, kind: Widget, listKind: WidgetList}}
      versions:
        - name: {VERSION}
          served: true
          storage: true
          subresources: {{status: {{}}}}
          schema:
            openAPIV3Schema:
              type: object
              properties:
                spec:
                  type: object
                  properties: {{size: {{type: integer}}}}
                status:
                  type: object
                  properties: {{phase: {{type: string}}}}
    """
)


@pytest.fixture(scope="module")
def api(kube_control_plane: Cluster) -> Iterator[kubernetes.client.ApiClient]:
    client = kube_control_plane.api_client()
    yield client
    client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def widget_crd(kube_control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("crds") / "widgets.yaml"
    path.write_text(CRD_YAML)
    names = kube_control_plane.install_crds(path)
    assert names == [f"{PLURAL}.{GROUP}"]
    return names[0]


def _obj(value: object) -> dict[str, Any]:
    """The custom-objects API returns plain JSON dicts, typed as `object`."""
    assert isinstance(value, dict)
    return value


def _status(exc: pytest.ExceptionInfo[ApiException]) -> int:
    return int(exc.value.status)


def test_namespace_lifecycle(kube_control_plane: Cluster) -> None:
    name = kube_control_plane.create_namespace(labels={"lorenz.test/smoke": "yes"})
    ns = kube_control_plane.kubectl_json("get", "namespace", name)
    assert ns["status"]["phase"] == "Active"
    assert ns["metadata"]["labels"]["lorenz.test/smoke"] == "yes"
    # The controller-manager's serviceaccount controller made the default ServiceAccount.
    kube_control_plane.kubectl("get", "-n", name, "serviceaccount", "default")
    # And its namespace controller finishes a deletion (without it: Terminating forever).
    kube_control_plane.delete_namespace(name, wait=True, timeout=60)
    gone = kube_control_plane.kubectl("get", "namespace", name, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr


def test_crd_status_subresource_and_watch(
    kube_control_plane: Cluster,
    kube_namespace: str,
    widget_crd: str,
    api: kubernetes.client.ApiClient,
) -> None:
    objects = kubernetes.client.CustomObjectsApi(api)
    listed = _obj(objects.list_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL))
    since = listed["metadata"]["resourceVersion"]

    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 1},
        "status": {"phase": "Ignored"},
    }
    created = _obj(
        objects.create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, body)
    )
    # With the status subresource, the main endpoint drops .status ...
    assert "status" not in created or "phase" not in created["status"]
    # ... and /status changes only .status (and does not bump the generation).
    patched = _obj(
        objects.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            kube_namespace,
            PLURAL,
            "w1",
            {"status": {"phase": "Ready"}, "spec": {"size": 9}},
        )
    )
    assert patched["status"] == {"phase": "Ready"}
    assert patched["spec"] == {"size": 1}
    assert patched["metadata"]["generation"] == created["metadata"]["generation"]

    events: list[tuple[str, str | None]] = []
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    for event in stream.stream(  # type: ignore[no-untyped-call]
        objects.list_namespaced_custom_object,
        GROUP,
        VERSION,
        kube_namespace,
        PLURAL,
        resource_version=since,
        timeout_seconds=10,
    ):
        obj = event["object"]
        events.append((event["type"], (obj.get("status") or {}).get("phase")))
        if event["type"] == "MODIFIED":
            stream.stop()  # type: ignore[no-untyped-call]
    assert events == [("ADDED", None), ("MODIFIED", "Ready")]

    # kubectl sees the same object through discovery of the new CRD.
    got = kube_control_plane.kubectl_json("get", "-n", kube_namespace, f"{PLURAL}.{GROUP}", "w1")
    assert got["status"]["phase"] == "Ready"


def _lease_spec(lease: V1Lease) -> V1LeaseSpec:
    assert lease.spec is not None
    return lease.spec


def _meta(obj: V1Lease | V1ConfigMap) -> V1ObjectMeta:
    assert obj.metadata is not None
    return obj.metadata


def test_lease_renewal_and_conflict(kube_namespace: str, api: kubernetes.client.ApiClient) -> None:
    leases = kubernetes.client.CoordinationV1Api(api)
    # NB: the Python client writes MicroTime with isoformat(), which drops the fraction when
    # microsecond == 0, and the API server then rejects the value: keep it non-zero.
    acquired = datetime.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=datetime.UTC)
    lease = leases.create_namespaced_lease(
        kube_namespace,
        V1Lease(
            metadata=V1ObjectMeta(name="leader"),
            spec=V1LeaseSpec(
                holder_identity="replica-a",
                lease_duration_seconds=15,
                acquire_time=acquired,
                renew_time=acquired,
                lease_transitions=0,
            ),
        ),
    )
    stale_rv = _meta(lease).resource_version

    # Renew: an update carrying the current resourceVersion succeeds and moves it on.
    _lease_spec(lease).renew_time = acquired + datetime.timedelta(seconds=5)
    renewed = leases.replace_namespaced_lease("leader", kube_namespace, lease)
    assert _meta(renewed).resource_version != stale_rv
    assert _lease_spec(renewed).holder_identity == "replica-a"
    assert _lease_spec(renewed).renew_time == acquired + datetime.timedelta(seconds=5)

    # A contender that read the lease before the renewal: its update is refused.
    stale = leases.read_namespaced_lease("leader", kube_namespace)
    _meta(stale).resource_version = stale_rv
    _lease_spec(stale).holder_identity = "replica-b"
    _lease_spec(stale).lease_transitions = 1
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease("leader", kube_namespace, stale)
    assert _status(conflict) == 409
    current = leases.read_namespaced_lease("leader", kube_namespace)
    assert _lease_spec(current).holder_identity == "replica-a"

    # With a fresh read the takeover goes through.
    _lease_spec(current).holder_identity = "replica-b"
    _lease_spec(current).lease_transitions = 1
    taken = leases.replace_namespaced_lease("leader", kube_namespace, current)
    assert _lease_spec(taken).holder_identity == "replica-b"
    assert _lease_spec(taken).lease_transitions == 1


def test_service_account_under_rbac(kube_control_plane: Cluster, kube_namespace: str) -> None:
    sa_kubeconfig = kube_control_plane.service_account_kubeconfig(
        namespace=kube_namespace, name="operator"
    )
    whoami = kube_control_plane.kubectl_json("auth", "whoami", kubeconfig=sa_kubeconfig)
    assert whoami["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{kube_namespace}:operator"
    )
    kube_control_plane.kubectl(
        "create", "configmap", "cfg", "-n", kube_namespace, "--from-literal=k=v"
    )

    sa_api = kube_control_plane.api_client(kubeconfig=sa_kubeconfig)
    try:
        core = kubernetes.client.CoreV1Api(sa_api)
        with pytest.raises(ApiException) as denied:
            core.read_namespaced_config_map("cfg", kube_namespace)
        assert _status(denied) == 403

        kube_control_plane.apply(
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "read-configmaps", "namespace": kube_namespace},
                    "rules": [
                        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}
                    ],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "operator-reads", "namespace": kube_namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "read-configmaps",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "operator", "namespace": kube_namespace}
                    ],
                },
            ]
        )
        # NB: the RBAC authorizer reads bindings from an informer: allow a moment to catch up.
        cm = wait_until(
            lambda: core.read_namespaced_config_map("cfg", kube_namespace),
            timeout=10,
            message="RoleBinding to take effect",
        )
        assert cm.data == {"k": "v"}
        # Only what the Role grants: no writes, no secrets, no other namespace.
        with pytest.raises(ApiException) as no_delete:
            core.delete_namespaced_config_map("cfg", kube_namespace)
        assert _status(no_delete) == 403
        with pytest.raises(ApiException) as no_secrets:
            core.list_namespaced_secret(kube_namespace)
        assert _status(no_secrets) == 403
        with pytest.raises(ApiException) as other_ns:
            core.list_namespaced_config_map("default")
        assert _status(other_ns) == 403
    finally:
        sa_api.close()  # type: ignore[no-untyped-call]
    assert kube_control_plane.can_i(
        "list", "configmaps", namespace=kube_namespace, kubeconfig=sa_kubeconfig
    )
    assert not kube_control_plane.can_i(
        "list", "configmaps", namespace="default", kubeconfig=sa_kubeconfig
    )


def test_garbage_collection_of_owned_objects(
    kube_namespace: str, api: kubernetes.client.ApiClient
) -> None:
    core = kubernetes.client.CoreV1Api(api)

    def configmap(name: str, owner: V1ConfigMap | None = None) -> V1ConfigMap:
        refs = None
        if owner is not None:
            refs = [
                V1OwnerReference(
                    api_version="v1", kind="ConfigMap", name=_meta(owner).name, uid=_meta(owner).uid
                )
            ]
        return V1ConfigMap(metadata=V1ObjectMeta(name=name, owner_references=refs))

    owner = core.create_namespaced_config_map(kube_namespace, configmap("owner"))
    keeper = core.create_namespaced_config_map(kube_namespace, configmap("keeper"))
    core.create_namespaced_config_map(kube_namespace, configmap("child", owner))
    core.create_namespaced_config_map(kube_namespace, configmap("kept-child", keeper))

    core.delete_namespaced_config_map(
        "owner",
        kube_namespace,
        body=kubernetes.client.V1DeleteOptions(propagation_policy="Background"),
    )

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", kube_namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_until(child_gone, timeout=60, interval=0.5, message="GC to delete the owned ConfigMap")
    # A child whose owner still exists stays.
    kept = core.read_namespaced_config_map("kept-child", kube_namespace)
    assert _meta(kept).name == "kept-child"


def test_helm_installs_a_chart(
    kube_control_plane: Cluster, kube_namespace: str, tmp_path: Path
) -> None:
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    # NB: kubeVersion is checked against the API server's gitVersion: build.sh stamps the real
    # version into the binaries (unstamped they say v0.0.0-master and this chart is refused).
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: smoke\nversion: 0.1.0\nkubeVersion: '>=1.34.0-0'\n"
    )
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: v1
            kind: ConfigMap
            metadata:
              name: {{ .Release.Name }}-greeting
            data:
              greeting: {{ .Values.greeting | quote }}
              kube: {{ .Capabilities.KubeVersion.Version | quote }}
            """
        )
    )
    kube_control_plane.helm("lint", "--strict", str(chart))
    kube_control_plane.helm(
        "install", "smoke", str(chart), "-n", kube_namespace, "--set", "greeting=hi"
    )
    cm = kube_control_plane.kubectl_json("get", "-n", kube_namespace, "configmap", "smoke-greeting")
    assert cm["data"]["greeting"] == "hi"
    assert cm["data"]["kube"].startswith("v1.")
    kube_control_plane.helm("uninstall", "smoke", "-n", kube_namespace, "--wait")
    gone = kube_control_plane.kubectl(
        "get", "-n", kube_namespace, "configmap", "smoke-greeting", check=False
    )
    assert "NotFound" in gone.stderr
