"""The plain manifests in deploy/: generated from the chart and current, free of Helm's
bookkeeping, accepted by the real API server, and admitted under the restricted Pod Security
Standard; the sample Workflow validates against the CRD.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import Cluster, wait_until
from tests.packaging.charts import REPO, render

DEPLOY = REPO / "deploy"
SAMPLE = DEPLOY / "samples" / "sample-workflow.yaml"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_generate", DEPLOY / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _applied_files() -> list[Path]:
    """What `kubectl apply -f deploy/` reads: the directory's manifests, not its subfolders."""
    return sorted(p for p in DEPLOY.iterdir() if p.suffix in (".yaml", ".yml", ".json"))


def test_manifests_are_current() -> None:
    stale = generator.stale_files()
    assert stale == [], f"stale {stale}: run .venv/bin/python deploy/generate.py"


def test_check_mode_reports_a_stale_file() -> None:
    original = generator.OPERATOR_FILE.read_text()
    try:
        generator.OPERATOR_FILE.write_text(original.replace("readOnlyRootFilesystem: true", ""))
        assert generator.stale_files() == ["deploy/02-operator.yaml"]
        assert generator.main(["--check"]) == 1
    finally:
        generator.OPERATOR_FILE.write_text(original)
    assert generator.main(["--check"]) == 0


def test_apply_order_and_contents() -> None:
    assert [p.name for p in _applied_files()] == [
        "00-namespace.yaml",
        "01-crds.yaml",
        "02-operator.yaml",
    ]
    kinds = [[doc["kind"] for doc in _documents(path)] for path in _applied_files()]
    assert kinds == [
        ["Namespace"],
        ["CustomResourceDefinition"] * len(list((REPO / "crds").glob("*.yaml"))),
        ["NetworkPolicy",  # the operator's, on by default (#37)
         "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
         "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"],
    ]


def test_operator_manifests_are_the_chart_without_helm_bookkeeping(tmp_path: Path) -> None:
    chart = render(tmp=tmp_path, extra=["--skip-crds", "--no-hooks"])
    plain = _documents(generator.OPERATOR_FILE)
    text = generator.OPERATOR_FILE.read_text()
    assert "helm.sh/chart" not in text
    assert "managed-by: Helm" not in text
    assert "# Source:" not in text
    assert len(plain) == len(chart)
    for ours, theirs in zip(plain, chart, strict=True):
        labels = theirs["metadata"]["labels"]
        del labels["helm.sh/chart"]
        labels["app.kubernetes.io/managed-by"] = "kubectl"
        pod_labels = theirs.get("spec", {}).get("template", {}).get("metadata", {}).get("labels")
        if pod_labels:
            del pod_labels["helm.sh/chart"]
            pod_labels["app.kubernetes.io/managed-by"] = "kubectl"
        assert ours == theirs
    # The reason of each RBAC rule survives as a comment.
    assert "# coordination.k8s.io/leases:" in text


def test_every_page_installs_deploy_with_the_same_server_side_apply() -> None:
    # A CRD in deploy/ outgrows client-side apply's 256 KiB annotation: the pages must not
    # disagree on the command (they did: README client-side, docs/install.md server-side).
    import re

    for page in (REPO / "README.md", REPO / "docs" / "install.md", DEPLOY / "README.md"):
        if not page.exists():
            continue
        for command in re.findall(r"kubectl apply[^`\n]*-f deploy/?(?=[\s`)])", page.read_text()):
            assert "--server-side" in command, f"{page.name}: {command}"


def test_namespace_enforces_the_restricted_pod_security_standard() -> None:
    (namespace,) = _documents(generator.NAMESPACE_FILE)
    assert namespace["metadata"]["name"] == "lorenz-system"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_sample_workflow_keeps_the_token_in_a_secret() -> None:
    (workflow,) = _documents(SAMPLE)
    assert workflow["apiVersion"] == "lorenz.dev/v1alpha1"
    assert workflow["kind"] == "Workflow"
    tracker = workflow["spec"]["tracker"]
    assert "apiKey" not in tracker
    assert tracker["apiKeySecretRef"] == {"name": "linear-api", "key": "token"}
    assert "kubectl -n team-a create secret generic linear-api" in SAMPLE.read_text()


@pytest.fixture
def lorenz_system(kube_control_plane: Cluster) -> Any:
    """The real lorenz-system namespace from 00-namespace.yaml; deleted with the cluster-scoped
    RBAC objects afterwards."""
    cluster = kube_control_plane
    cluster.install_crds(REPO / "crds")
    cluster.kubectl("apply", "-f", str(generator.NAMESPACE_FILE))
    cluster.kubectl(
        "wait", "--for=create", "--timeout=30s", "-n", "lorenz-system", "serviceaccount/default"
    )
    yield cluster
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "clusterrolebinding/lorenz-lorenz-system",
        "clusterrole/lorenz-lorenz-system",
        "clusterrolebinding/lorenz-lorenz-system-api-auth",
        "clusterrole/lorenz-lorenz-system-api-auth",
    )
    cluster.delete_namespace("lorenz-system", wait=True)


@pytest.mark.cluster
def test_server_side_dry_run_of_the_whole_directory(lorenz_system: Cluster) -> None:
    result = lorenz_system.kubectl("apply", "--dry-run=server", "-f", str(DEPLOY))
    out = result.stdout
    for line in (
        "namespace/lorenz-system",
        "customresourcedefinition.apiextensions.k8s.io/workflows.lorenz.dev",
        "customresourcedefinition.apiextensions.k8s.io/claims.lorenz.dev",
        "serviceaccount/lorenz",
        "clusterrole.rbac.authorization.k8s.io/lorenz-lorenz-system",
        "clusterrolebinding.rbac.authorization.k8s.io/lorenz-lorenz-system",
        "service/lorenz",
        "deployment.apps/lorenz",
    ):
        assert line in out, out
    assert "(server dry run)" in out
    # A pod template that broke the namespace's restricted standard is reported as a warning.
    assert "PodSecurity" not in result.stderr, result.stderr


@pytest.mark.cluster
def test_applied_operator_gets_a_pod_under_restricted_pod_security(
    lorenz_system: Cluster,
) -> None:
    cluster = lorenz_system
    result = cluster.kubectl("apply", "--server-side", "-f", str(generator.OPERATOR_FILE))
    assert "would violate PodSecurity" not in result.stderr, result.stderr

    def pods() -> list[dict[str, Any]] | None:
        listed = cluster.kubectl_json(
            "get", "pods", "-n", "lorenz-system", "-l", "app.kubernetes.io/name=lorenz"
        )["items"]
        return listed or None

    # NB: no scheduler or kubelet: the pod stays Pending, but it exists only if admission
    # (PodSecurity restricted, ServiceAccount) let the ReplicaSet create it.
    (pod,) = wait_until(pods, timeout=60, message="the ReplicaSet created no operator pod")
    assert pod["spec"]["serviceAccountName"] == "lorenz"
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.cluster
def test_sample_workflow_passes_server_side_validation(
    kube_control_plane: Cluster, kube_namespace: str
) -> None:
    kube_control_plane.install_crds(REPO / "crds")
    result = kube_control_plane.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", kube_namespace, "-f", str(SAMPLE)
    )
    assert "workflow.lorenz.dev/sample created (server dry run)" in result.stdout


@pytest.mark.cluster
def test_a_server_side_apply_after_a_client_side_one_has_no_field_conflicts(
    lorenz_system: Cluster,
) -> None:
    cluster = lorenz_system
    cluster.kubectl("apply", "-f", str(generator.OPERATOR_FILE))
    result = cluster.kubectl(
        "apply", "--server-side", "-f", str(generator.OPERATOR_FILE), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "conflict" not in result.stderr.lower(), result.stderr
