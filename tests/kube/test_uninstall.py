"""``lorenz teardown`` (the chart's pre-delete hook) on the real API server.

``helm uninstall`` used to delete the operator's RBAC while it was still draining: Leases stayed
held by a Pod that was gone, Workflows kept ``Ready``/``Leading`` and a cleanup finalizer
nothing would remove, and run Pods kept running unfollowed. Here an operator that could not
clean up after itself (killed) leaves exactly that behind, and the teardown must leave nothing
held; and with an operator Deployment, the teardown scales it to 0 and waits before anything
else.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorenz.kube.api import resources
from lorenz.kube.leaderelection.sharding import LEASE_SET_LABEL
from lorenz.kube.operator.teardown import UNINSTALLED_REASON
from lorenz.kube.pods.manifests import LABEL_MANAGED, LABEL_WORKFLOW
from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.images import PAUSE_IMAGE
from tests.kube.operators import Kube, OperatorProcess, Rig, write_issue

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "lorenz"


def teardown(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from lorenz.cli import main; sys.exit(main())",
         "teardown", *args],
        env=cluster.environ(), capture_output=True, text=True, timeout=300, check=False,
    )


def held_leases(kube: Kube) -> list[dict[str, Any]]:
    return kube.items("leases", "-l", f"{LEASE_SET_LABEL}=lorenz")


def conditions(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (workflow.get("status") or {}).get("conditions") or ()}


def run_pod(name: str, workflow: str) -> dict[str, Any]:
    """A Pod labelled as a run Pod of ``workflow`` (no node here: it stays Pending)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_MANAGED: "lorenz", LABEL_WORKFLOW: workflow,
                                              "lorenz.dev/handle": name}},
        "spec": {"containers": [{"name": "worker", "image": PAUSE_IMAGE}]},
    }


def test_teardown_leaves_no_held_lease_no_run_pod_and_no_finalizer(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("doomed", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("kept"), "TASK-1")
    kube.apply(rig.workflow("kept", seconds=600.0))
    wait_until(
        lambda: [c for c in kube.items("claims")
                 if (c.get("status") or {}).get("phase") == "Running"] or None,
        timeout=60, message="a Running Claim",
    )
    workflow = kube.get("workflow", "kept")
    assert resources.CLEANUP_FINALIZER in workflow["metadata"]["finalizers"]
    # What an operator that lost its RBAC mid-drain leaves: killed, it releases nothing.
    operator.kill()
    operator.wait()
    assert any((lease.get("spec") or {}).get("holderIdentity") == "doomed"
               for lease in held_leases(kube))
    assert conditions(kube.get("workflow", "kept"))["Leading"]["status"] == "True"
    kube.apply(run_pod("kept-run-1", "kept"))
    kube.cluster.kubectl("create", "secret", "generic", "kept-run-1-spec", "-n", kube.namespace,
                         "--from-literal=spec=x")
    kube.apply(run_pod("other-run-1", "other"))  # another Workflow's (none here): left alone

    done = teardown(kube.cluster, "--namespaces", kube.namespace,
                    "--lease-namespace", kube.namespace)
    assert done.returncode == 0, done.stderr
    assert "Teardown done" in done.stderr

    assert not held_leases(kube)
    workflow = kube.get("workflow", "kept")
    assert resources.CLEANUP_FINALIZER not in (workflow["metadata"].get("finalizers") or [])
    for kind in ("Ready", "Leading"):
        condition = conditions(workflow)[kind]
        assert (condition["status"], condition["reason"]) == ("False", UNINSTALLED_REASON)
    pods = {p["metadata"]["name"] for p in kube.items("pods")
            if not p["metadata"].get("deletionTimestamp")}
    assert pods == {"other-run-1"}
    assert "kept-run-1-spec" not in {s["metadata"]["name"] for s in kube.items("secrets")}
    # The Workflow and its Claims are kept (the CRDs are not the release's) ...
    assert kube.items("claims")
    # ... and deleting it now is not held up by a finalizer nothing would remove.
    kube.cluster.kubectl("delete", "workflow", "kept", "-n", kube.namespace, "--timeout=30s")

    again = teardown(kube.cluster, "--namespaces", kube.namespace,
                     "--lease-namespace", kube.namespace)
    assert again.returncode == 0, again.stderr  # idempotent: nothing left to do


def test_teardown_scales_the_operator_deployment_to_zero_and_waits_for_its_pods(
    kube: Kube,
) -> None:
    labels = {"app.kubernetes.io/name": "lorenz", "app.kubernetes.io/instance": "gone"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gone-lorenz"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "operator", "image": PAUSE_IMAGE}]},
            },
        },
    }
    kube.cluster.kubectl("apply", "-n", kube.namespace, "-f", "-",
                         input=yaml.safe_dump(deployment))
    wait_until(lambda: len(kube.items("pods", "-l", "app.kubernetes.io/instance=gone")) == 2
               or None, timeout=60, message="the Deployment's two Pods")
    # The hook's own Pod wears the same labels but is no Pod of the Deployment.
    bystander = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "bystander", "labels": labels},
                 "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE}]}}
    kube.apply(bystander)

    done = teardown(kube.cluster, "--namespaces", kube.namespace,
                    "--lease-namespace", kube.namespace, "--deployment", "gone-lorenz",
                    "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert kube.get("deployment", "gone-lorenz")["spec"]["replicas"] == 0
    left = {p["metadata"]["name"] for p in kube.items("pods", "-l",
                                                       "app.kubernetes.io/instance=gone")}
    assert left == {"bystander"}


def test_teardown_without_the_deployment_or_anything_to_clean_succeeds(kube: Kube) -> None:
    done = teardown(kube.cluster, "--namespaces", kube.namespace,
                    "--lease-namespace", kube.namespace, "--deployment", "never-installed")
    assert done.returncode == 0, done.stderr


def test_helm_uninstall_runs_the_teardown_hook_before_the_rbac_goes(
    kube: Kube, rig: Rig, tmp_path: Path
) -> None:
    """``helm uninstall`` of a real release: its pre-delete hook Job is created while the
    release's RBAC still exists. No kubelet here, so the test does the kubelet's part: it runs
    the Job's container command (its args and env, as the Job's ServiceAccount) and reports
    the Pod Succeeded; Helm then deletes the release."""
    cluster, namespace = kube.cluster, kube.namespace
    cluster.helm("install", "lorenz", str(CHART), "-n", namespace,
                 "--set", f"watchNamespace={namespace}")
    kube.apply(rig.workflow("kept"))
    cluster.kubectl("patch", "workflow", "kept", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"metadata": {"finalizers": [resources.CLEANUP_FINALIZER]}}))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube.apply({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lorenz-shard-0", "labels": {LEASE_SET_LABEL: "lorenz"}},
        "spec": {"holderIdentity": "lorenz-5d9c_0a1b2c3d", "leaseDurationSeconds": 15,
                 "acquireTime": now, "renewTime": now},
    })
    kube.apply(run_pod("kept-run-1", "kept"))

    uninstall = subprocess.Popen(
        [str(cluster.helm_bin), f"--kubeconfig={cluster.kubeconfig}", "uninstall", "lorenz",
         "-n", namespace, "--timeout=240s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        hook = wait_until(
            lambda: next(iter(kube.items("pods", "-l", "app.kubernetes.io/component=teardown")),
                         None),
            timeout=120, message="the teardown hook's Pod",
        )
        # The release's own objects are all still there while the hook runs.
        assert kube.items("deployments", "-l", "app.kubernetes.io/instance=lorenz")
        assert kube.items("roles", "-l", "app.kubernetes.io/instance=lorenz")
        spec = hook["spec"]
        (container,) = spec["containers"]
        as_job = cluster.service_account_kubeconfig(
            namespace=namespace, name=spec["serviceAccountName"], create=False
        )
        env = {**cluster.environ(kubeconfig=as_job), "HOME": str(tmp_path),
               **{e["name"]: e["value"] for e in container["env"] if e["name"] != "HOME"}}
        ran = subprocess.run(
            [sys.executable, "-c", "import sys; from lorenz.cli import main; sys.exit(main())",
             *container["args"]],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert "Operator scaled to 0" in ran.stderr
        assert "operator_pods_left=0" in ran.stderr
        cluster.kubectl("patch", "pod", hook["metadata"]["name"], "-n", namespace,
                        "--subresource=status", "--type=merge",
                        "-p", json.dumps({"status": {"phase": "Succeeded"}}))
        output, _ = uninstall.communicate(timeout=240)
    finally:
        if uninstall.poll() is None:
            uninstall.kill()
            uninstall.wait()
    assert uninstall.returncode == 0, output

    assert not held_leases(kube)
    workflow = kube.get("workflow", "kept")
    assert resources.CLEANUP_FINALIZER not in (workflow["metadata"].get("finalizers") or [])
    assert "kept-run-1" not in {p["metadata"]["name"] for p in kube.items("pods")}
    assert not kube.items("deployments", "-l", "app.kubernetes.io/instance=lorenz")
    assert not kube.items("roles", "-l", "app.kubernetes.io/instance=lorenz")
    kube.cluster.kubectl("delete", "workflow", "kept", "-n", namespace, "--timeout=30s")

