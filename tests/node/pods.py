"""Pod manifests and waits shared by the node tests: restricted-PSS-compliant specs that
tolerate the test node's taint, and waiting on a Pod's phase through the API."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tests.cluster.cluster import Cluster, wait_until
from tests.cluster.node import NODE_TOLERATION

RESTRICTED_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def restricted_security_context(uid: int = 10001) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod(
    name: str,
    *,
    image: str,
    command: list[str],
    ports: tuple[int, ...] = (),
    restart: str = "Never",
) -> dict[str, Any]:
    """A Pod that passes the `restricted` Pod Security Standard."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
        "securityContext": restricted_security_context(),
    }
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "tolerations": [NODE_TOLERATION],
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
        },
    }


def wait_for_phase(
    cluster: Cluster, *, namespace: str, name: str, phases: tuple[str, ...], timeout: float = 120.0
) -> dict[str, Any]:
    """The Pod once its phase is one of `phases`; fails with its status otherwise."""

    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = cluster.kubectl_json("get", "pod", name, "-n", namespace)
        return body if body.get("status", {}).get("phase") in phases else None

    try:
        return wait_until(reached, timeout=timeout, message=f"pod {name} in {phases}")
    except TimeoutError as err:
        described = cluster.kubectl("describe", "pod", name, "-n", namespace, check=False)
        raise AssertionError(f"{err}\n{described.stdout}") from err


def recorder_egress(recorder_url: str) -> list[dict[str, Any]]:
    """The Workflow's ``worker.egress`` that lets its run Pods reach the test's recorder (on the
    node's address, `Node.forward_to_host`): the node enforces the operator's run-Pod
    NetworkPolicy, which admits DNS and what the Workflow lists, nothing else."""
    address = urlsplit(recorder_url)
    return [{"cidr": f"{address.hostname}/32", "ports": [address.port]}]
