"""The run Pod and the objects beside it, as names and manifests, and what a Pod's status says.

Everything here is pure (no I/O): the Pod's name from the run's handle, the labels and
annotations that tie it to its Workflow and issue, the Pod, its spec Secret, its workspace
claim and the ``lorenz-agent`` ServiceAccount as manifests, the API paths of each kind, and the
reading of a Pod's status (why it does not run, whether its worker runs). The transport, the
runner and the cleanup build on it, and a test can check a manifest without a cluster.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from lorenz.agents import (
    SESSION_STORE_ENV,
    PlacementFailed,
)
from lorenz.codes import ErrorCode
from lorenz.config import WorkerSettings
from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef, digest
from lorenz.kube.errors import KubeApiError
from lorenz.workers.launch import WorkerLaunchError
from lorenz.workers.placement import POD_WORKSPACE_ROOT
from lorenz.workers.spec import RunSpec

logger = logging.getLogger(__name__)


CONTAINER: Final = "worker"
STATE_ROOT: Final = "/var/lib/lorenz/run"
SPEC_DIR: Final = "/var/run/lorenz/spec"
SPEC_KEY: Final = "spec.json"
RUN_UID: Final = 10001
"""The Lorenz image's user; a run's image is built ``FROM`` it (docs/install.md)."""
SPEC_SECRET_LIMIT: Final = 900 * 1024
"""A Secret holds at most 1 MiB; the spec must fit with room to spare."""
SESSION_STORE_ROOT: Final = f"{POD_WORKSPACE_ROOT}/.lorenz-sessions"
"""Where a Pod run with a workspace claim keeps its agent's sessions: on the claim, beside the
issue's workspace folder (never inside its git tree), so a resumed run's new Pod finds them."""
POD_LINGER_MS: Final = 15 * 60 * 1000
"""How long a run's worker keeps its final record for a controller to collect.

NB: the journal lives in the Pod's ``emptyDir``: once the worker exits, the Pod ends and the
record is gone with it. A leader elected after a failover must find the record still served,
so the wait is far longer than a local worker's; a controller that collects acks at once, and
the worker exits then."""

LABEL_MANAGED: Final = "app.kubernetes.io/managed-by"
LABEL_WORKFLOW: Final = "lorenz.dev/workflow"
LABEL_ISSUE: Final = "lorenz.dev/issue"
LABEL_HANDLE: Final = "lorenz.dev/handle"
LABEL_ISSUE_ID: Final = "lorenz.dev/issue-id"
ANNOTATION_HANDLE: Final = "lorenz.dev/handle"
ANNOTATION_ISSUE_ID: Final = "lorenz.dev/issue-id"

AGENT_SERVICE_ACCOUNT: Final = "lorenz-agent"
"""The ServiceAccount of run Pods when ``worker.service_account_name`` is unset."""
SERVICE_ACCOUNT_TOKEN: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")

WAITING_FAILURES: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
     "CreateContainerError", "ErrImageNeverPull"}
)
"""Container waiting reasons worth reporting when a Pod does not start in time."""
PROBE_BACKOFF_MAX_S: Final = 8.0
"""The longest pause between exec probes of a launch whose container runs but does not serve."""
IMAGE_PULL_FAILURES: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


def pod_name(handle: str) -> str:
    """The Pod of a run: its handle in DNS-1123 form (deterministic; the hash keeps it unique)."""
    name = _NOT_DNS.sub("-", handle.lower()).strip("-")
    if len(name) > 63:
        name = f"{name[:38].rstrip('-')}-{name[-24:].lstrip('-')}"
    return name


def label_value(text: str) -> str:
    value = _NOT_LABEL.sub("_", text)[:63]
    return value.strip("._-") or "x"


def workspace_claim_name(*, workflow: str, issue_id: str, identifier: str, slot_index: int) -> str:
    """The PersistentVolumeClaim of one issue slot's workspace: ``ws-<workflow>-<issue>-<hash>``
    (deterministic, so every attempt of the issue finds it; the hash covers the exact Workflow
    name, issue id and slot, so sanitized forms that collide still get different names)."""
    suffix = digest(workflow, issue_id, str(slot_index))
    wf = _NOT_DNS.sub("-", workflow.lower()).strip("-")[:20].strip("-")
    issue = _NOT_DNS.sub("-", identifier.lower()).strip("-")[:20].strip("-")
    slot = f"s{slot_index}" if slot_index else ""
    return "-".join(part for part in ("ws", wf, issue, slot, suffix) if part)


def spec_claim_name(spec: RunSpec, *, workflow: WorkflowRef) -> str:
    return workspace_claim_name(
        workflow=workflow.name,
        issue_id=spec.issue.id,
        identifier=spec.issue.identifier,
        slot_index=spec.slot_index,
    )


def workspace_claim_manifest(
    *, spec: RunSpec, workflow: WorkflowRef, worker: WorkerSettings
) -> dict[str, Any] | None:
    """The issue slot's workspace claim (``None``: the workspace is an ``emptyDir``)."""
    template = worker.workspace.volume_claim_template
    if template is None:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": list(template.access_modes),
        "resources": {"requests": {"storage": template.storage}},
        "volumeMode": "Filesystem",
    }
    if template.storage_class_name is not None:
        claim_spec["storageClassName"] = template.storage_class_name
    labels = {
        LABEL_MANAGED: "lorenz",
        LABEL_WORKFLOW: label_value(workflow.name),
        LABEL_ISSUE: label_value(spec.issue.identifier),
        LABEL_ISSUE_ID: resources.label_value(spec.issue.id),
    }
    metadata: dict[str, Any] = {
        "name": spec_claim_name(spec, workflow=workflow),
        "namespace": workflow.namespace,
        "labels": labels,
        "annotations": {ANNOTATION_ISSUE_ID: spec.issue.id},
    }
    if workflow.uid:
        metadata["ownerReferences"] = [workflow_owner(workflow)]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": claim_spec,
    }


def pod_manifest(
    *,
    spec: RunSpec,
    workflow: WorkflowRef,
    worker: WorkerSettings,
    image: str,
) -> dict[str, Any]:
    """The run's Pod (see the module docstring); pure, so tests read it as written."""
    template = worker.pod_template
    name = pod_name(spec.handle)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": ["lorenz", "worker", "--spec", f"{SPEC_DIR}/{SPEC_KEY}",
                    "--state-root", STATE_ROOT],
        "env": [{"name": "HOME", "value": "/home/lorenz"}, *session_store_env(worker)],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_ROOT},
            {"name": "workspace", "mountPath": POD_WORKSPACE_ROOT},
            {"name": "home", "mountPath": "/home/lorenz"},
            {"name": "tmp", "mountPath": "/tmp"},
            *(volume.mount() for volume in template.volumes),
        ],
    }
    if template.image_pull_policy is not None:
        container["imagePullPolicy"] = template.image_pull_policy.value
    resources = {
        key: dict(values)
        for key, values in (
            ("requests", template.resources.requests),
            ("limits", template.resources.limits),
        )
        if values
    }
    if resources:
        container["resources"] = resources
    if template.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in template.env_from_secrets]
    workspace: dict[str, Any]
    if worker.workspace.volume_claim_template is not None:
        workspace = {
            "persistentVolumeClaim": {"claimName": spec_claim_name(spec, workflow=workflow)}
        }
    else:
        workspace = {"emptyDir": worker.workspace.empty_dir.manifest()}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_UID,
            "runAsGroup": RUN_UID,
            "fsGroup": RUN_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {
                "name": "spec",
                "secret": {"secretName": f"{name}-spec", "defaultMode": 0o440},
            },
            {"name": "state", "emptyDir": {}},
            {"name": "workspace", **workspace},
            {"name": "home", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            *(volume.manifest() for volume in template.volumes),
        ],
        "serviceAccountName": worker.service_account_name or AGENT_SERVICE_ACCOUNT,
    }
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = [t.manifest() for t in template.tolerations]
    if template.affinity:
        pod_spec["affinity"] = json.loads(json.dumps(template.affinity))
    if template.runtime_class_name:
        pod_spec["runtimeClassName"] = template.runtime_class_name
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": workflow.namespace,
        "labels": run_labels(spec=spec, workflow=workflow),
        "annotations": {ANNOTATION_HANDLE: spec.handle},
    }
    if workflow.uid:
        metadata["ownerReferences"] = [workflow_owner(workflow)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def session_store_env(worker: WorkerSettings) -> list[dict[str, str]]:
    """The variables that put the agent's session store on the workspace claim (none for an
    ``emptyDir`` workspace: that goes with the Pod anyway). ``agents.<kind>.env`` wins."""
    if worker.workspace.volume_claim_template is None:
        return []
    return [
        {"name": name, "value": f"{SESSION_STORE_ROOT}/{folder}"}
        for name, folder in SESSION_STORE_ENV.items()
    ]


def pod_owner(*, name: str, uid: str) -> dict[str, Any]:
    """An owner reference to a run's Pod (its spec Secret's): gone with the Pod."""
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def workflow_owner(workflow: WorkflowRef) -> dict[str, Any]:
    """An owner reference to the Workflow: its deletion garbage-collects what carries it."""
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "name": workflow.name,
        "uid": workflow.uid,
    }


def run_labels(*, spec: RunSpec, workflow: WorkflowRef) -> dict[str, str]:
    return {
        LABEL_MANAGED: "lorenz",
        LABEL_WORKFLOW: label_value(workflow.name),
        LABEL_ISSUE: label_value(spec.issue.identifier),
        LABEL_HANDLE: label_value(spec.handle),
    }


RUN_POLICY_PREFIX: Final = "lorenz-runs-"
DNS_NAMESPACE: Final = "kube-system"
"""Where run Pods may send DNS queries (port 53): the cluster DNS runs there."""


def run_network_policy_name(workflow: WorkflowRef) -> str:
    """``lorenz-runs-<workflow>``, shortened with a digest past a name's 253 characters."""
    name = RUN_POLICY_PREFIX + workflow.name
    if len(name) <= 253:
        return name
    hashed = digest(workflow.namespace, workflow.name)
    return f"{name[: 252 - len(hashed)]}-{hashed}"


def run_network_policy_manifest(*, workflow: WorkflowRef, worker: WorkerSettings) -> dict[str, Any]:
    """The NetworkPolicy of one Workflow's run Pods: no ingress (the operator reaches a worker
    through the API's exec channel, never the Pod network); egress to DNS in the
    ``kube-system`` namespace and to ``worker.egress``, nothing else — not the API server, not
    the operator, not another namespace. Owned by the Workflow: deleted with it."""
    dns = {
        "to": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": DNS_NAMESPACE}}}
        ],
        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
    }
    metadata: dict[str, Any] = {
        "name": run_network_policy_name(workflow),
        "namespace": workflow.namespace,
        "labels": {LABEL_MANAGED: "lorenz", LABEL_WORKFLOW: label_value(workflow.name)},
    }
    if workflow.uid:
        metadata["ownerReferences"] = [workflow_owner(workflow)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {
                "matchLabels": {
                    LABEL_MANAGED: "lorenz",
                    LABEL_WORKFLOW: label_value(workflow.name),
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [dns, *(rule.manifest() for rule in worker.egress)],
        },
    }


def network_policies_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    return base if name is None else f"{base}/{name}"


def volume_claims_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    return base if name is None else f"{base}/{name}"


def service_accounts_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    return base if name is None else f"{base}/{name}"


def agent_service_account_manifest(namespace: str) -> dict[str, Any]:
    """``lorenz-agent``: an identity for run Pods that holds nothing (no RBAC binding refers
    to it, and its token is never mounted)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": AGENT_SERVICE_ACCOUNT,
            "namespace": namespace,
            "labels": {LABEL_MANAGED: "lorenz"},
        },
        "automountServiceAccountToken": False,
    }


def operator_service_account(token: Path = SERVICE_ACCOUNT_TOKEN) -> tuple[str, str] | None:
    """The operator's own ServiceAccount (namespace, name), read from the claims of its
    mounted token (never verified: it only keeps run Pods off this identity); ``None``
    outside a Pod."""
    try:
        payload = token.read_text(encoding="ascii").split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (OSError, IndexError, ValueError):
        return None
    subject = str(claims.get("sub") or "")
    parts = subject.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
        return None
    return parts[2], parts[3]


def pods_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return base if name is None else f"{base}/{name}"


def secrets_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return base if name is None else f"{base}/{name}"


def why_not_running(pod: Mapping[str, Any]) -> str:
    """What keeps a Pod from running its worker, in Kubernetes' words."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason') or 'Unschedulable'}: {condition.get('message') or ''}"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting = state.get("waiting")
        if waiting and waiting.get("reason"):
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
        terminated = state.get("terminated")
        if terminated:
            return (
                f"{terminated.get('reason') or 'Terminated'} (exit code "
                f"{terminated.get('exitCode')}): {terminated.get('message') or ''}"
            ).rstrip(": ")
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message') or ''}".rstrip(": ")
    return f"phase {status.get('phase') or 'Pending'}"


def placement_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a Pod that did not start in time was not *placed* (a label for metrics), or
    ``None`` when its worker's container runs: then the worker itself failed to serve."""
    if worker_running(pod):
        return None
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return "unschedulable"
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in IMAGE_PULL_FAILURES:
            return "image_pull"
        if reason in WAITING_FAILURES:
            return "container_config"
    return "start_timeout"


def refusal_reason(exc: KubeApiError) -> str | None:
    """``quota`` when the API refused a create because a ResourceQuota is used up (the run
    may be placed once it frees up), else ``None`` (a refusal no wait cures).

    NB: a quota the controller-manager has not counted yet refuses every create with ``status
    unknown for quota``: a wait cures that too."""
    text = f"{exc.reason} {exc.detail or ''}"
    quota = "exceeded quota" in text or "status unknown for quota" in text
    return "quota" if exc.status == 403 and quota else None


def refused(exc: KubeApiError, *, what: str) -> PlacementFailed | WorkerLaunchError:
    """The launch error of a create the API refused (``pod_refused``): a placement failure
    (the reservation goes back) when a wait may cure it (a full ResourceQuota), else a failed
    launch."""
    message = f"{what}: {exc.status} {exc.detail or exc.reason}"
    refusal = refusal_reason(exc)
    if refusal is not None:
        return PlacementFailed(message, code=ErrorCode.POD_REFUSED, reason=refusal)
    return WorkerLaunchError(message, code=ErrorCode.POD_REFUSED)


def worker_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        (c.get("state") or {}).get("running") is not None
        for c in status.get("containerStatuses") or []
        if c.get("name") == CONTAINER
    )


def pod_ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def run_pods_selector(workflow: WorkflowRef) -> str:
    """The label selector of a Workflow's run Pods."""
    return f"{LABEL_MANAGED}=lorenz,{LABEL_WORKFLOW}={label_value(workflow.name)}"
