"""Runs in Pods of their own (``worker.kind: pod``): the Pod transport and its runner.

Each run is one Pod in the Workflow's namespace whose main container runs ``lorenz worker``
for the run's spec, the same worker as everywhere else (journal, control protocol, hooks, the
agent). What the operator adds is where it runs and how it is reached:

* **Placement.** The Pod is named after the run's deterministic handle (lowercased,
  DNS-safe), labelled with the Workflow, the issue and the handle, owned by the Workflow (its
  deletion takes the Pods along), and built from ``worker.pod_template``: the image, resources,
  node selector, tolerations, affinity, ``envFrom`` the Secrets the user names. It runs as a
  non-root user with a read-only root filesystem, no capabilities and the runtime's seccomp
  profile (the ``restricted`` Pod Security Standard), ``automountServiceAccountToken: false``
  and no service links. The worker's state, ``HOME`` and ``/tmp`` are ``emptyDir`` volumes of
  that Pod only; so is the workspace, unless ``worker.workspace.volume_claim_template`` makes
  it a PersistentVolumeClaim of the issue's own (:func:`workspace_claim_manifest`: named after
  the Workflow and the issue, kept across the issue's attempts, deleted when the issue is
  terminal or the Workflow is deleted). Extra volumes (``pod_template.volumes``) are Secrets,
  ConfigMaps, claims or ``emptyDir`` only, never the node's disk or a token.
* **Identity.** The Pod runs as the ServiceAccount ``worker.service_account_name`` names, else
  ``lorenz-agent``, which the operator creates in the namespace when it is missing
  (:class:`AgentAccounts`: no RBAC binding, no token mounted); never as the operator's own.
* **The spec** travels in a per-run Secret (``<pod>-spec``) mounted only in that Pod (0440,
  group-readable by the Pod's ``fsGroup``), created right after the Pod and owned by it (by
  uid), so it goes with the Pod however the Pod goes; a launch that dies between the two
  leaves no Secret behind. It holds no tracker credential: host-side tools run in the operator.
* **Start.** The transport waits — up to ``worker.start_timeout_ms`` — until the Pod runs and
  its worker answers a probe. It reads no Pod to find out: every launch of the namespace waits
  on one shared list+watch of the run Pods (:mod:`lorenz.kube.pods.watch`), and the exec probe
  runs only once the watch says the worker's container runs. A Pod that cannot be scheduled,
  whose image cannot be pulled or whose container cannot be created is deleted when the time
  is up, and a create a ResourceQuota refuses fails at once (``pod_refused``): both raise
  :class:`~lorenz.agents.PlacementFailed` with the last reason Kubernetes gave, and the runtime
  gives the slot's reservation back (a placement wait, no attempt counted). Only once the
  worker serves is the reservation bound (``on_placed``: the Pod's name becomes the slot's
  host). A create refused for any other reason (an invalid affinity), or a worker whose
  container runs but does not serve in time, is a failure of the run.
* **The channel** is the API's exec subresource (:mod:`lorenz.kube.pods.execs`): ``lorenz worker
  --bridge`` inside the Pod splices the exec stream onto the worker's unix socket, so the socket
  keeps its 0600 mode and ``SO_PEERCRED`` check, the Pod opens no port and holds no token, and
  the operator needs only ``pods/exec``. Probes and journal catch-ups are short execs.
* **The end.** When the run is settled the Pod and its Secret are deleted; a controller that
  is leaving its workers for the next one (leadership lost, handed over, shut down) leaves the
  Pod running, never deletes it.
* **Adoption.** A run records its spawn intent on its Claim like a local worker (the handle,
  which names the Pod, is built from the leader generation of the term that started it), so a
  newly elected leader finds each Pod through its Claim, re-attaches after the collected
  ``lastSeq`` through the exec channel and runs nothing again. A finished worker in a Pod
  lingers (:data:`POD_LINGER_MS`) for a controller to collect its final record, so a run that
  ended while no leader watched is settled from it instead of retried. What no Claim names —
  a Pod or spec Secret of a run no Claim holds any more — is the orphan sweep's
  (:func:`sweep_run_pods`): deleted at the start of every term.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Final

from lorenz.agents import (
    AgentRunRequest,
    AgentRunResult,
    DroppedAdoption,
    PlacementFailed,
    RunPlacement,
)
from lorenz.config import WorkerSettings
from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef, digest
from lorenz.kube.claims.lists import SharedLists
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.execs import PodExec, PodExecError
from lorenz.kube.pods.watch import WATCHES, RunPodWatch, RunPodWatches
from lorenz.model import SlotKey, SpawnIntents, slot_key
from lorenz.workers.journal import Record
from lorenz.workers.launch import LaunchResult, WorkerLaunchError
from lorenz.workers.placement import HOOK_VARIABLE_PREFIX, POD_WORKSPACE_ROOT
from lorenz.workers.protocol import SOCKET_NAME
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.spec import HookSpec, RunSpec
from lorenz.workers.states import Probe, ProbeState

logger = logging.getLogger(__name__)

CONTAINER: Final = "worker"
STATE_ROOT: Final = "/var/lib/lorenz/run"
SPEC_DIR: Final = "/var/run/lorenz/spec"
SPEC_KEY: Final = "spec.json"
RUN_UID: Final = 10001
"""The Lorenz image's user; a run's image is built ``FROM`` it (docs/install.md)."""
SPEC_SECRET_LIMIT: Final = 900 * 1024
"""A Secret holds at most 1 MiB; the spec must fit with room to spare."""
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
        "env": [{"name": "HOME", "value": "/home/lorenz"}],
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
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": workflow.namespace,
        "labels": run_labels(spec=spec, workflow=workflow),
        "annotations": {ANNOTATION_HANDLE: spec.handle},
    }
    if workflow.uid:
        metadata["ownerReferences"] = [workflow_owner(workflow)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


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


def _claims_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    return base if name is None else f"{base}/{name}"


def _service_accounts_path(namespace: str, name: str | None = None) -> str:
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


class AgentAccounts:
    """The ``lorenz-agent`` ServiceAccounts this operator has made sure of, per namespace.

    A namespace is checked once per process (a ``get``, and a ``create`` when it is missing);
    :meth:`forget` makes the next launch check again (the Pod's create said it is gone)."""

    def __init__(self) -> None:
        self._ensured: set[str] = set()
        self._lock = asyncio.Lock()

    async def ensure(self, api: KubeApi, *, namespace: str) -> None:
        if namespace in self._ensured:
            return
        async with self._lock:
            if namespace in self._ensured:
                return
            path = _service_accounts_path(namespace, AGENT_SERVICE_ACCOUNT)
            try:
                await api.get(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    raise _account_error(namespace, exc) from exc
                try:
                    await api.create(
                        _service_accounts_path(namespace),
                        agent_service_account_manifest(namespace),
                    )
                except KubeApiError as created:
                    if created.status != 409:
                        raise _account_error(namespace, created) from created
            self._ensured.add(namespace)

    def forget(self, namespace: str) -> None:
        self._ensured.discard(namespace)


def _account_error(namespace: str, exc: KubeApiError) -> WorkerLaunchError:
    return WorkerLaunchError(
        f"the ServiceAccount {namespace}/{AGENT_SERVICE_ACCOUNT} for run Pods could not be "
        f"made: {exc.status} {exc.detail or exc.reason}; create it (no RBAC, "
        "automountServiceAccountToken: false) or set worker.service_account_name",
        code="pod_service_account_failed",
    )


async def _workflow_objects(
    api: KubeApi, path: str, *, workflow: WorkflowRef, lists: SharedLists | None
) -> list[dict[str, Any]]:
    """The objects under ``path`` labelled for ``workflow``; with ``lists``, from one list per
    namespace shared by the Workflows asking at the same time (a thousand leaders starting
    at once make one list, not a thousand)."""
    if lists is None:
        # NB: run Pods and workspace claims carry the same two labels.
        return await api.list_items(path, label_selector=run_pods_selector(workflow))
    return await lists.labelled(
        path, selector=f"{LABEL_MANAGED}=lorenz", label=LABEL_WORKFLOW,
        value=label_value(workflow.name),
    )


async def workspace_claims_by_issue(
    api: KubeApi, *, workflow: WorkflowRef, lists: SharedLists | None = None
) -> dict[str, int]:
    """The issues that have workspace claims of ``workflow``: issue id → how many claims (the
    raw id from each claim's annotation; the label holds only a sanitized form)."""
    items = await _workflow_objects(
        api, _claims_path(workflow.namespace), workflow=workflow, lists=lists
    )
    counts: dict[str, int] = {}
    for item in items:
        metadata = item.get("metadata") or {}
        issue_id = (metadata.get("annotations") or {}).get(ANNOTATION_ISSUE_ID)
        if isinstance(issue_id, str) and issue_id and not metadata.get("deletionTimestamp"):
            counts[issue_id] = counts.get(issue_id, 0) + 1
    return counts


async def delete_issue_workspaces(
    api: KubeApi, *, workflow: WorkflowRef, issue_id: str
) -> list[str]:
    """Delete the workspace claims of one issue (all its slots); the names deleted.

    NB: a claim still mounted by a Pod that is going away is kept by the API server's
    ``kubernetes.io/pvc-protection`` finalizer until that Pod is gone."""
    selector = (
        f"{LABEL_MANAGED}=lorenz,{LABEL_WORKFLOW}={label_value(workflow.name)},"
        f"{LABEL_ISSUE_ID}={resources.label_value(issue_id)}"
    )
    items = await api.list_items(_claims_path(workflow.namespace), label_selector=selector)
    deleted: list[str] = []
    for item in items:
        metadata = item.get("metadata") or {}
        if (metadata.get("annotations") or {}).get(ANNOTATION_ISSUE_ID) != issue_id:
            continue  # NB: a label value is hashed when long; the annotation is exact
        name = str(metadata.get("name"))
        try:
            await api.delete(_claims_path(workflow.namespace, name))
        except KubeApiError as exc:
            if not exc.not_found:
                raise
        deleted.append(name)
    return deleted


async def delete_workflow_runs(
    api: KubeApi, *, workflow: WorkflowRef, lists: SharedLists | None = None
) -> dict[str, list[str]]:
    """Delete every run Pod, spec Secret and workspace claim of a Workflow (its deletion);
    the names deleted, by kind. The owner references to the Workflow back this up. With
    ``lists``, the Workflows deleted together share one list of each kind per namespace."""
    namespace = workflow.namespace
    deleted: dict[str, list[str]] = {"pods": [], "secrets": [], "claims": []}
    pods = await _workflow_objects(api, _pods_path(namespace), workflow=workflow, lists=lists)
    claims = await _workflow_objects(
        api, _claims_path(namespace), workflow=workflow, lists=lists
    )
    targets: list[tuple[str, str]] = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        name = str((pod.get("metadata") or {}).get("name"))
        targets.append(("pods", name))
        targets.append(("secrets", f"{name}-spec"))
    for claim in claims:
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            continue
        targets.append(("claims", str((claim.get("metadata") or {}).get("name"))))
    paths = {"pods": _pods_path, "secrets": _secrets_path, "claims": _claims_path}
    for kind, name in targets:
        try:
            await api.delete(paths[kind](namespace, name))
        except KubeApiError as exc:
            if not exc.not_found:
                raise
            if kind == "secrets":
                continue
        deleted[kind].append(name)
    return deleted


def _pods_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return base if name is None else f"{base}/{name}"


def _secrets_path(namespace: str, name: str | None = None) -> str:
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
    if _worker_running(pod):
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
        return PlacementFailed(message, code="pod_refused", reason=refusal)
    return WorkerLaunchError(message, code="pod_refused")


def _worker_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        (c.get("state") or {}).get("running") is not None
        for c in status.get("containerStatuses") or []
        if c.get("name") == CONTAINER
    )


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def run_pods_selector(workflow: WorkflowRef) -> str:
    """The label selector of a Workflow's run Pods."""
    return f"{LABEL_MANAGED}=lorenz,{LABEL_WORKFLOW}={label_value(workflow.name)}"


async def sweep_run_pods(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    keep: Callable[[], Collection[str]],
    may_delete: Callable[[], bool] = lambda: True,
    lists: SharedLists | None = None,
) -> list[str]:
    """Delete the run Pods of ``workflow`` (and their spec Secrets) that ``keep()`` does not
    name, while ``may_delete()`` says so; the handles deleted.

    The orphan sweep of a new term (``keep``: the handles the Workflow's Claims name in their
    spawn intents — every Pod a leader may adopt) and of a Workflow's deletion (``keep``:
    nothing). Deleting a Pod stops its worker gracefully: the kubelet's SIGTERM cancels the
    run, and ``after_run`` runs within the Pod's grace period.

    NB: ``keep`` is read *after* the Pods are listed: a run records its intent before it
    creates its Pod, so every Pod listed that a live run owns is named by then — a run that
    starts while the sweep lists is never taken for an orphan.
    """
    pods = await _workflow_objects(
        api, _pods_path(workflow.namespace), workflow=workflow, lists=lists
    )
    kept = set(keep())
    deleted: list[str] = []
    for pod in pods:
        if not may_delete():
            break  # NB: a leader on its way out leaves every Pod to the next one
        metadata = pod.get("metadata") or {}
        handle = (metadata.get("annotations") or {}).get(ANNOTATION_HANDLE)
        if not isinstance(handle, str) or handle in kept or metadata.get("deletionTimestamp"):
            continue
        owners = {ref.get("uid") for ref in metadata.get("ownerReferences") or ()}
        if workflow.uid and owners and workflow.uid not in owners:
            continue  # NB: a namesake Workflow's (a label value is cut to 63 characters)
        name = str(metadata.get("name"))
        for path in (_pods_path(workflow.namespace, name),
                     _secrets_path(workflow.namespace, f"{name}-spec")):
            try:
                await api.delete(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    logger.warning("orphan sweep could not delete %s: %s", path, exc)
        deleted.append(handle)
    if deleted:
        logger.info(
            "orphan run Pods deleted workflow=%s handles=%s", workflow.display, sorted(deleted)
        )
    return deleted


class PodTransport:
    """Workers in Pods of one Workflow's namespace (one transport per run's settings)."""

    name = "pod"

    def __init__(
        self,
        *,
        api: KubeApi,
        execs: PodExec,
        workflow: WorkflowRef,
        worker: WorkerSettings,
        image: str,
        poll_s: float = 1.0,
        accounts: AgentAccounts | None = None,
        operator_account: tuple[str, str] | None = None,
        watches: RunPodWatches | None = None,
    ) -> None:
        self.api = api
        self.watches = watches if watches is not None else WATCHES
        """Where this transport's namespace watch is shared (the process's, by default)."""
        self._watch: RunPodWatch | None = None
        """The namespace's run Pod watch, held from the first launch until :meth:`close`."""
        self.accounts = accounts if accounts is not None else AgentAccounts()
        """The ``lorenz-agent`` ServiceAccounts made sure of (the operator shares one)."""
        self.operator_account = operator_account
        """The operator's own ServiceAccount (namespace, name), which no run Pod may use."""
        self.execs = execs.scoped()
        """This run's exec channels (closed with the transport; counted in ``execs`` too)."""
        self._credentials = execs
        self.workflow = workflow
        self.worker = worker
        self.image = image
        self.poll_s = poll_s
        self.namespace = workflow.namespace
        self.started_in_s: float | None = None
        """How long the newest launch took, create to serving (for metrics and figures)."""
        self.created: list[str] = []
        """Handles whose Pod this transport created (the runner deletes them at the end)."""
        self.on_pod: Callable[[str], None] | None = None
        """Told the name of each Pod a launch created or found (the runner shows its phase)."""

    def _state_dir(self, handle: str) -> str:
        return f"{STATE_ROOT}/{handle}"

    def watch(self) -> RunPodWatch:
        """The namespace's shared run Pod watch, held by this transport until it is closed."""
        if self._watch is None:
            self._watch = self.watches.of(
                api=self.api, execs=self._credentials, namespace=self.namespace
            )
            self._watch.hold()
        return self._watch

    async def launch(self, spec: RunSpec) -> LaunchResult:
        name = pod_name(spec.handle)
        payload = spec.model_dump_json()
        if len(payload) > SPEC_SECRET_LIMIT:
            raise WorkerLaunchError(
                f"the run spec of {spec.handle} is {len(payload)} bytes, more than a Secret "
                f"holds ({SPEC_SECRET_LIMIT}); shorten the prompt",
                code="pod_spec_too_large",
            )
        began = time.monotonic()
        manifest = pod_manifest(
            spec=spec, workflow=self.workflow, worker=self.worker, image=self.image
        )
        await self._ensure_identity()
        await self._ensure_workspace_claim(spec)
        # NB: the Pod first, then its spec Secret owned by it (uid and all): a launch that
        # dies between the two leaves a Pod (which its Claim's intent names: adopted or swept),
        # never a Secret nothing deletes, and the Secret goes with its Pod however the Pod goes.
        # The kubelet waits for a Secret volume that is not there yet; the Secret is made
        # within milliseconds of the Pod, before the Pod is even scheduled.
        fresh = False
        try:
            created = await self.api.create(_pods_path(self.namespace), manifest)
            self.created.append(spec.handle)
            fresh = True
        except KubeApiError as exc:
            if exc.status != 409:
                if "service account" in (exc.detail or "").lower():
                    self.accounts.forget(self.namespace)
                raise refused(
                    exc, what=f"the API refused the run's Pod {self.namespace}/{name}"
                ) from exc
            created = await self.api.get(_pods_path(self.namespace, name))
            annotations = (created.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANNOTATION_HANDLE) != spec.handle:
                raise WorkerLaunchError(
                    f"a Pod {self.namespace}/{name} exists that is not this run's; delete it",
                    code="pod_name_taken",
                ) from exc
            if _ended(created) or (created.get("metadata") or {}).get("deletionTimestamp"):
                # NB: an earlier run of this handle ended (or was stopped: a deleted Claim,
                # then the same attempt dispatched again); the runner moves to the next one.
                raise WorkerLaunchError(
                    f"the Pod of {spec.handle} already ran", code="worker_handle_used"
                ) from exc
        if self.on_pod is not None:
            self.on_pod(name)
        try:
            await self._create_spec_secret(spec, pod=created, payload=payload)
        except BaseException:
            if fresh:
                # NB: shielded: a launch cancelled here still removes the Pod that would
                # wait for its Secret forever.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.delete(spec.handle))
            raise
        deadline = began + self.worker.start_timeout_ms / 1000
        last = "the Pod was created"
        last_pod: Mapping[str, Any] = {}
        watch = self.watch()
        seen = False
        probe_wait = self.poll_s
        # NB: no GET per launch: every launch of the namespace waits on the one watch's copy
        # of its Pod, and the exec probe runs only once that copy says the worker's container
        # runs (a thousand launches waiting for image pulls cost one stream, not a thousand
        # polls a second; bench/README.md, kwok_bench.py).
        while True:
            found = watch.get(name)
            if found is not None:
                seen = True
                last_pod = found
            elif seen and watch.synced.is_set():
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} was deleted while starting",
                    code="worker_start_failed",
                )
            wait = deadline - time.monotonic()
            if found is not None and _ended(found):
                reason = why_not_running(found)
                await self.delete(spec.handle)
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} ended before its worker served: "
                    f"{reason}",
                    code="worker_start_failed",
                )
            if found is not None and _worker_running(found):
                probe = await self._probe_running(spec.handle, found)
                if probe.state is ProbeState.ALIVE or probe.state is ProbeState.FINAL:
                    self.started_in_s = time.monotonic() - began
                    return LaunchResult(
                        handle=spec.handle,
                        state_dir=self._state_dir(spec.handle),
                        socket=f"{self._state_dir(spec.handle)}/{SOCKET_NAME}",
                        pid=probe.pid,
                        # NB: a worker this launch started is this run, even if it is done
                        # already; only a Pod found in place may be an earlier run's.
                        existing=None if fresh or probe.state is ProbeState.ALIVE else "final",
                    )
                last = f"the worker does not serve yet ({probe.detail or probe.state.value})"
                # NB: a container that runs serves within a second or two; one that does not
                # (kwok runs none) is asked less and less often.
                wait = min(wait, probe_wait)
                probe_wait = min(probe_wait * 2, PROBE_BACKOFF_MAX_S)
            elif found is not None:
                last = why_not_running(found)
            if time.monotonic() >= deadline:
                await self.delete(spec.handle)
                message = (
                    f"the run's Pod {self.namespace}/{name} did not serve its worker within "
                    f"{self.worker.start_timeout_ms} ms (worker.start_timeout_ms): {last}"
                )
                unplaced = placement_reason(last_pod)
                if unplaced is not None:
                    # NB: never placed (not scheduled, no image, not created): nothing ran,
                    # so the reservation goes back; a worker that ran and did not serve is a
                    # failure of the run.
                    raise PlacementFailed(message, code="pod_start_timeout", reason=unplaced)
                raise WorkerLaunchError(message, code="pod_start_timeout")
            await watch.changed(name, timeout_s=max(0.0, wait))

    async def _ensure_identity(self) -> None:
        """The run Pod's ServiceAccount exists and is not the operator's own."""
        named = self.worker.service_account_name
        if named is None:
            await self.accounts.ensure(self.api, namespace=self.namespace)
            return
        if self.operator_account == (self.namespace, named):
            raise WorkerLaunchError(
                f"worker.service_account_name {named!r} is the operator's own ServiceAccount; "
                "run Pods never use it: name another or unset it (lorenz-agent)",
                code="pod_service_account_refused",
            )

    async def _ensure_workspace_claim(self, spec: RunSpec) -> None:
        """Create the issue slot's workspace claim, or find the one an earlier attempt made."""
        claim = workspace_claim_manifest(spec=spec, workflow=self.workflow, worker=self.worker)
        if claim is None:
            return
        name = claim["metadata"]["name"]
        try:
            await self.api.create(_claims_path(self.namespace), claim)
            return
        except KubeApiError as exc:
            if exc.status != 409:
                raise WorkerLaunchError(
                    f"the API refused the workspace claim {self.namespace}/{name}: {exc.status} "
                    f"{exc.detail or exc.reason}",
                    code="pod_refused",
                ) from exc
        found = await self.api.get(_claims_path(self.namespace, name))
        metadata = found.get("metadata") or {}
        if (metadata.get("annotations") or {}).get(ANNOTATION_ISSUE_ID) != spec.issue.id:
            raise WorkerLaunchError(
                f"a PersistentVolumeClaim {self.namespace}/{name} exists that is not the "
                f"workspace of {spec.issue.identifier}; delete it",
                code="pod_name_taken",
            )
        if metadata.get("deletionTimestamp"):
            # NB: the issue was terminal a moment ago; its claim goes once its last Pod has.
            raise WorkerLaunchError(
                f"the workspace claim {self.namespace}/{name} of {spec.issue.identifier} is "
                "still being deleted; the retry makes a new one",
                code="pod_workspace_terminating",
            )

    async def _create_spec_secret(
        self, spec: RunSpec, *, pod: Mapping[str, Any], payload: str
    ) -> None:
        """The run's spec as a Secret that only its Pod mounts, owned by that Pod (by uid: the
        garbage collector deletes it with the Pod, and a namesake Pod's Secret is not it)."""
        pod_metadata = pod.get("metadata") or {}
        name = str(pod_metadata.get("name"))
        uid = str(pod_metadata.get("uid"))
        secret_name = f"{name}-spec"
        metadata: dict[str, Any] = {
            "name": secret_name,
            "namespace": self.namespace,
            "labels": run_labels(spec=spec, workflow=self.workflow),
            "annotations": {ANNOTATION_HANDLE: spec.handle},
            "ownerReferences": [pod_owner(name=name, uid=uid)],
        }
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": metadata,
            "data": {SPEC_KEY: base64.b64encode(payload.encode()).decode()},
        }
        for _ in range(3):
            try:
                await self.api.create(_secrets_path(self.namespace), secret)
                return
            except KubeApiError as exc:
                if exc.status != 409:
                    raise refused(
                        exc,
                        what=(
                            "the API refused the run's spec Secret "
                            f"{self.namespace}/{secret_name}"
                        ),
                    ) from exc
            path = _secrets_path(self.namespace, secret_name)
            try:
                found = await self.api.get(path)
            except KubeApiError as exc:
                if exc.not_found:
                    continue
                raise
            found_metadata = found.get("metadata") or {}
            owners = {ref.get("uid") for ref in found_metadata.get("ownerReferences") or ()}
            if uid in owners:
                return  # NB: this Pod's (a launch of an adopted Pod, or one that crashed)
            # NB: an earlier Pod's of the same name (the garbage collector has not got to it):
            # it would take this Pod's Secret along; replaced, uid-checked.
            with contextlib.suppress(KubeApiError):
                await self.api.delete(path, uid=str(found_metadata.get("uid")))
        raise WorkerLaunchError(
            f"the spec Secret {self.namespace}/{secret_name} of an earlier Pod kept coming "
            "back; delete it",
            code="pod_name_taken",
        )

    async def probe(self, handle: str) -> Probe:
        name = pod_name(handle)
        # NB: the watch's copy when it has one (a launch of this namespace holds it); a Pod
        # it has not seen is read, never taken for gone.
        pod = self._watch.get(name) if self._watch is not None else None
        if pod is None:
            try:
                pod = await self.api.get(_pods_path(self.namespace, name))
            except KubeApiError as exc:
                if exc.not_found:
                    return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is gone")
                return Probe(state=ProbeState.UNKNOWN, detail=f"{exc.status} {exc.reason}")
        return await self._probe_running(handle, pod)

    async def _probe_running(self, handle: str, pod: Mapping[str, Any]) -> Probe:
        """Probe the worker of ``pod`` (as last seen): through an exec when it runs."""
        name = pod_name(handle)
        if _ended(pod):
            # NB: the journal was in the Pod's emptyDir; a Pod that ended has taken it along.
            return Probe(state=ProbeState.GONE, detail=why_not_running(pod))
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is being deleted")
        if not _worker_running(pod):
            return Probe(state=ProbeState.UNKNOWN, detail=why_not_running(pod))
        try:
            result = await self.execs.run(
                namespace=self.namespace,
                pod=name,
                container=CONTAINER,
                command=["lorenz", "worker", "--probe", "--state-dir", self._state_dir(handle)],
            )
        except PodExecError as exc:
            return Probe(state=ProbeState.UNKNOWN, detail=str(exc))
        if result.exit_code != 0:
            return Probe(
                state=ProbeState.UNKNOWN,
                detail=f"the probe exited {result.exit_code}: {result.stderr[-300:]!r}",
            )
        try:
            return Probe.from_json(json.loads(result.stdout))
        except ValueError as exc:
            return Probe(state=ProbeState.UNKNOWN, detail=f"unreadable probe answer ({exc})")

    async def read_journal(self, handle: str, *, after_seq: int) -> list[Record]:
        """The journal's records after ``after_seq``; none when the Pod is gone or ended
        (its journal went with its ``emptyDir``: the run is followed to ``worker_gone``)."""
        try:
            result = await self.execs.run(
                namespace=self.namespace,
                pod=pod_name(handle),
                container=CONTAINER,
                command=["lorenz", "worker", "--journal-after", str(after_seq),
                         "--state-dir", self._state_dir(handle)],
            )
        except PodExecError as exc:
            if (await self.probe(handle)).state is ProbeState.GONE:
                return []
            raise OSError(str(exc)) from exc
        if result.exit_code != 0:
            raise OSError(f"reading the journal of {handle} failed: {result.stderr[-300:]!r}")
        return [
            Record.from_json(json.loads(line))
            for line in result.stdout.decode().splitlines()
            if line.strip()
        ]

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await self.execs.open_stream(
                namespace=self.namespace,
                pod=pod_name(handle),
                container=CONTAINER,
                command=["lorenz", "worker", "--state-dir", self._state_dir(handle), "--bridge"],
            )
        except PodExecError as exc:
            raise OSError(str(exc)) from exc

    async def delete(self, handle: str) -> None:
        """Delete the run's Pod and its spec Secret (gone already is fine)."""
        name = pod_name(handle)
        spec_secret = _secrets_path(self.namespace, f"{name}-spec")
        for path in (_pods_path(self.namespace, name), spec_secret):
            try:
                await self.api.delete(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    logger.warning("could not delete %s: %s", path, exc)

    async def close(self) -> None:
        """Close this transport's exec channels and let go of the namespace's watch (it
        lingers for the next run); idempotent."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.release()
        await self.execs.close()


class PodWorkerRunner(WorkerRunner):
    """A :class:`WorkerRunner` for one run in a Pod: the worker creates the workspace on the
    Pod's volume, runs every hook there, and starts its agent from the container's environment
    (the image's, plus the Secrets of ``env_from_secrets``); the Pod is deleted afterwards."""

    def __init__(
        self,
        *,
        workflow: str,
        transport: PodTransport,
        placement: RunPlacement,
        generation: int = 0,
        intents: SpawnIntents | None = None,
        leaving: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(
            workflow=workflow,
            transport=transport,
            placement=placement.host,
            generation=generation,
            intents=intents,
            leaving=leaving,
        )
        self.pods = transport
        self.run_placement = placement
        self._placed_key: SlotKey | None = None
        """The slot of the run (whose Claim shows its Pod's phase and node)."""
        self._follow_pod: Callable[[str], None] | None = None


    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        spec = super().spec_for(request, run=run)
        hooks = self.run_placement.hooks
        variables = {
            name: value
            for name, value in request.env.items()
            if name.startswith(HOOK_VARIABLE_PREFIX)
        }
        return spec.model_copy(
            update={
                "workspace": str(request.workspace),
                "create_workspace": True,
                "inherit_env": True,
                "host": self.run_placement.host,
                "hooks": HookSpec(
                    after_create=hooks.after_create,
                    before_run=hooks.before_run,
                    after_run=hooks.after_run,
                    timeout_ms=hooks.timeout_ms,
                    env=variables,
                ),
                "linger_ms": max(spec.linger_ms, POD_LINGER_MS),
            }
        )

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        stop = self._show_pods(slot_key(request.issue.id, request.slot_index))
        try:
            return await super().run(request)
        finally:
            stop()
            try:
                await self._delete_pods()
            finally:
                await self._close()

    def _show_pods(self, key: SlotKey) -> Callable[[], None]:
        """Show the phase and node of this run's Pods on its Claim (``kubectl get claims``),
        from the namespace's Pod watch; the function that stops it."""
        store = self.intents
        if not isinstance(store, ClaimResourceStore):
            return lambda: None
        writes: set[asyncio.Task[bool]] = set()
        stops: dict[str, Callable[[], None]] = {}
        watch = self.pods.watch()

        def changed(name: str, pod: Mapping[str, Any] | None) -> None:
            if pod is None:
                return
            phase = (pod.get("status") or {}).get("phase")
            node = (pod.get("spec") or {}).get("nodeName")
            if phase not in ("Pending", "Failed"):
                # NB: a Running or Succeeded Pod's run is bound or settled in a moment (a
                # status write anyway): the phase rides along with it.
                store.remember_pod(key, phase=phase, node=node)
                return
            task = asyncio.ensure_future(store.note_pod(key, phase=phase, node=node))
            writes.add(task)
            task.add_done_callback(_settled(writes))

        def follow(name: str) -> None:
            if name not in stops:
                stops[name] = watch.listen(changed, name=name)
                changed(name, watch.get(name))

        self.pods.on_pod = follow
        self._placed_key = key
        self._follow_pod = follow

        def stop() -> None:
            self.pods.on_pod = None
            self._follow_pod = None
            for unlisten in stops.values():
                unlisten()
            for task in writes:
                task.cancel()

        return stop

    def placed_at(self, handle: str) -> str | None:
        """The run's Pod: where the slot's binding (and ``kubectl get claims``) says it runs.

        NB: the Pod's phase and node as the watch sees them now ride along with the binding's
        status write (no write of their own)."""
        name = pod_name(handle)
        store, key = self.intents, self._placed_key
        if self._follow_pod is not None:
            self._follow_pod(name)  # NB: an adopted run's Pod, which no launch of ours found
        pod = self.pods.watch().get(name)
        if isinstance(store, ClaimResourceStore) and key is not None and pod is not None:
            store.remember_pod(
                key,
                phase=(pod.get("status") or {}).get("phase"),
                node=(pod.get("spec") or {}).get("nodeName"),
            )
        return name

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        """Cancel a lost controller's run that is not adopted, then delete its Pod."""
        try:
            return await super().cancel_adoption(dropped)
        finally:
            try:
                await self._delete_pods()
            finally:
                await self._close()

    async def _close(self) -> None:
        """The run is over for this controller (ended, cancelled or left to the next one):
        its exec channels close on every path (shielded: a cancelled run still closes them)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self.pods.close())

    async def _delete_pods(self) -> None:
        """Delete the Pods (and spec Secrets) of this runner's runs, unless this controller
        leaves its workers to the next one.

        NB: only ever after the run was followed to its end, cancelled, or found gone: a
        controller that may not write any more (leadership lost, fenced, handed over) leaves
        the Pod running for the leader that adopts it, whatever failed.
        """
        handles = set(self.pods.created)
        if self.last_handle is not None:
            handles.add(self.last_handle.handle)
        if self._leaves_workers():
            if handles:
                logger.info("run Pod left for the next controller handles=%s", sorted(handles))
            return
        for handle in sorted(handles):
            # NB: shielded: a cancelled run still removes its Pod (the worker has written its
            # final record or is gone by now); a failed delete is logged, and the next term's
            # orphan sweep removes what is left.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.pods.delete(handle))


def _settled(tasks: set[asyncio.Task[bool]]) -> Callable[[asyncio.Task[bool]], None]:
    """A done-callback: forget the task, and log a failed Claim write (never raised)."""

    def done(task: asyncio.Task[bool]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("Claim Pod status write failed: %s", task.exception())

    return done
