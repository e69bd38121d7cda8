"""``lorenz teardown``: what must happen before an operator release's RBAC goes away.

``helm uninstall`` deletes a release's objects all at once: the Deployment and the operator's
Roles go together, so an operator still draining got 403 on every Claim write and Lease
release, its Leases stayed held by a Pod that no longer existed, its Workflows kept
``Ready=True, Leading=True`` and the ``lorenz.dev/cleanup`` finalizer that nothing would ever
remove again (``kubectl delete workflow`` hung, and with it the deletion of the namespace), and
run Pods kept running with nobody following them. The chart runs this command as a
``pre-delete`` hook Job, while every object of the release still exists, in this order:

1. **stop the operator**: scale its Deployment to 0 and wait until its Pods are gone; each
   replica's own SIGTERM path (drain, then release its shard Leases) runs with its RBAC intact;
2. **delete the run Pods** (and their spec Secrets) of every Workflow in scope: with no
   operator left, nobody would follow them; their Claims stay, so a later install retries;
3. **delete the shard and membership Leases** of the release (a replica that was killed
   instead of stopped leaves its Leases held until they expire; deleted, nothing is held);
4. **remove the cleanup finalizer** of every Workflow in scope, so deleting a Workflow (or its
   namespace) later is not blocked by an operator that no longer exists, and mark its
   ``Ready`` and ``Leading`` conditions ``False`` with reason ``OperatorUninstalled``.

What it leaves: the Workflows and Claims (the CRDs are not the release's to delete), the
workspaces on the operator's volume (an emptyDir goes with the Pod; the chart's claim is kept)
and the per-issue workspace claims of runs in Pods, so reinstalling picks up where it stopped
(the new operator adds the finalizers again). Every step is best effort and idempotent: a step
that fails is logged and the next one still runs; the exit code says whether all went well.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.statuses import LEADING, READY
from lorenz.kube.clients import KubeApi, leases_path, workflows_path
from lorenz.kube.controller.cleanup import edit_finalizer
from lorenz.kube.controller.specs import workflow_ref
from lorenz.kube.errors import KubeApiError
from lorenz.kube.leaderelection.sharding import LEASE_SET_LABEL
from lorenz.kube.pods.manifests import pods_path, run_pods_selector, secrets_path
from lorenz.kube.settings import OperatorSettings

logger = logging.getLogger("lorenz.kube.teardown")

UNINSTALLED_REASON = "OperatorUninstalled"
"""Reason of the ``Ready`` and ``Leading`` conditions a teardown leaves on a Workflow."""
DEFAULT_TIMEOUT_S = 120.0
"""How long the operator's Pods get to stop (the chart passes its grace period plus slack)."""


@dataclasses.dataclass
class TeardownReport:
    """What a teardown did (printed as its last log line, and read by the tests)."""

    operator_pods_left: int = 0
    """Operator Pods still there when the wait ended (0: stopped)."""
    run_pods_deleted: list[str] = dataclasses.field(default_factory=list)
    leases_deleted: list[str] = dataclasses.field(default_factory=list)
    finalizers_removed: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.operator_pods_left == 0


def deployment_path(namespace: str, name: str, *, scale: bool = False) -> str:
    base = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    return f"{base}/scale" if scale else base


async def teardown(
    *,
    api: KubeApi,
    settings: OperatorSettings,
    deployment: str | None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = 1.0,
) -> TeardownReport:
    """Run the four steps of the module docstring; never raises for an API error."""
    report = TeardownReport()
    namespace = settings.lease_namespace
    if deployment:
        await _stop_operator(
            api, namespace=namespace, name=deployment, timeout_s=timeout_s, poll_s=poll_s,
            report=report,
        )
    workflows = await _workflows_in_scope(api, settings=settings, report=report)
    for workflow in workflows:
        await _delete_run_pods(api, workflow, report=report)
    await _delete_leases(api, settings=settings, report=report)
    for workflow in workflows:
        await _release_workflow(api, workflow, report=report)
    logger.info(
        "Teardown done operator_pods_left=%d run_pods_deleted=%d leases_deleted=%d "
        "finalizers_removed=%d failures=%d",
        report.operator_pods_left, len(report.run_pods_deleted), len(report.leases_deleted),
        len(report.finalizers_removed), len(report.failures),
    )
    return report


async def _stop_operator(
    api: KubeApi, *, namespace: str, name: str, timeout_s: float, poll_s: float,
    report: TeardownReport,
) -> None:
    try:
        found = await api.get(deployment_path(namespace, name))
    except KubeApiError as exc:
        if not exc.not_found:
            report.failures.append(f"read Deployment {namespace}/{name}: {exc}")
        else:
            logger.info("No operator Deployment deployment=%s/%s", namespace, name)
        return
    labels = ((found.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    try:
        await api.merge_patch(deployment_path(namespace, name, scale=True),
                              {"spec": {"replicas": 0}})
    except KubeApiError as exc:
        report.failures.append(f"scale Deployment {namespace}/{name} to 0: {exc}")
        return
    logger.info("Operator scaled to 0 deployment=%s/%s; waiting for its Pods", namespace, name)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = await api.list_items(pods_path(namespace), label_selector=selector or None)
        except KubeApiError as exc:
            report.failures.append(f"list the operator's Pods: {exc}")
            return
        # NB: only the Deployment's own Pods (owned by its ReplicaSets), whatever else wears
        # its labels (this teardown's own Pod must not wait for itself).
        pods = [pod for pod in listed if _owned_by_replica_set(pod)]
        report.operator_pods_left = len(pods)
        if not pods:
            return
        if time.monotonic() >= deadline:
            logger.warning(
                "Operator Pods still there after %.0f s pods=%s; going on", timeout_s,
                ",".join(str((p.get("metadata") or {}).get("name")) for p in pods),
            )
            return
        await asyncio.sleep(poll_s)


def _owned_by_replica_set(pod: Mapping[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("kind") == "ReplicaSet" for owner in owners)


async def _workflows_in_scope(
    api: KubeApi, *, settings: OperatorSettings, report: TeardownReport
) -> list[dict[str, Any]]:
    paths = (
        [workflows_path(namespace) for namespace in settings.namespaces]
        if settings.namespaces
        else [f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.WORKFLOW_PLURAL}"]
    )
    found: list[dict[str, Any]] = []
    for path in paths:
        try:
            found.extend(await api.list_items(path))
        except KubeApiError as exc:
            report.failures.append(f"list Workflows ({path}): {exc}")
    return found


async def _delete_run_pods(
    api: KubeApi, body: Mapping[str, Any], *, report: TeardownReport
) -> None:
    workflow = workflow_ref(body)
    try:
        pods = await api.list_items(
            pods_path(workflow.namespace), label_selector=run_pods_selector(workflow)
        )
    except KubeApiError as exc:
        report.failures.append(f"list run Pods of {workflow.display}: {exc}")
        return
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name"))
        for path in (pods_path(workflow.namespace, name),
                     secrets_path(workflow.namespace, f"{name}-spec")):
            try:
                await api.delete(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    report.failures.append(f"delete {path}: {exc}")
        report.run_pods_deleted.append(f"{workflow.namespace}/{name}")
        logger.info("Run Pod deleted workflow=%s pod=%s", workflow.display, name)


async def _delete_leases(
    api: KubeApi, *, settings: OperatorSettings, report: TeardownReport
) -> None:
    namespace = settings.lease_namespace
    try:
        leases = await api.list_items(
            leases_path(namespace),
            label_selector=f"{LEASE_SET_LABEL}={settings.lease_name_prefix}",
        )
    except KubeApiError as exc:
        report.failures.append(f"list Leases in {namespace}: {exc}")
        return
    for lease in leases:
        name = str((lease.get("metadata") or {}).get("name"))
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        try:
            await api.delete(leases_path(namespace, name))
        except KubeApiError as exc:
            if not exc.not_found:
                report.failures.append(f"delete Lease {namespace}/{name}: {exc}")
                continue
        report.leases_deleted.append(name)
        logger.info("Lease deleted lease=%s/%s holder=%s", namespace, name, holder or "-")


async def _release_workflow(
    api: KubeApi, body: Mapping[str, Any], *, report: TeardownReport
) -> None:
    workflow = workflow_ref(body)
    try:
        finalizers = (body.get("metadata") or {}).get("finalizers") or []
        if resources.CLEANUP_FINALIZER in finalizers and await edit_finalizer(
            api=api, workflow=workflow, add=False, seen=body
        ):
            report.finalizers_removed.append(workflow.display)
            logger.info("Finalizer removed workflow=%s", workflow.display)
        conditions = uninstalled_conditions((body.get("status") or {}).get("conditions") or [])
        if conditions is not None:
            await api.merge_patch(
                workflows_path(workflow.namespace, workflow.name, status=True),
                {"status": {"conditions": conditions}},
            )
    except KubeApiError as exc:
        if not exc.not_found:
            report.failures.append(f"release Workflow {workflow.display}: {exc}")


def uninstalled_conditions(
    conditions: Sequence[Mapping[str, Any]], *, now: datetime.datetime | None = None
) -> list[dict[str, Any]] | None:
    """``conditions`` with ``Ready`` and ``Leading`` set to ``False`` (reason
    :data:`UNINSTALLED_REASON`); ``None`` when there is nothing to change."""
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    message = (
        "the operator was uninstalled (helm uninstall): nothing runs this Workflow until an "
        "operator is installed again"
    )
    changed = False
    result: list[dict[str, Any]] = []
    for entry in conditions:
        updated = dict(entry)
        if updated.get("type") in (READY, LEADING) and (
            updated.get("status") != "False" or updated.get("reason") != UNINSTALLED_REASON
        ):
            if updated.get("status") != "False":
                updated["lastTransitionTime"] = stamp
            updated.update({"status": "False", "reason": UNINSTALLED_REASON, "message": message})
            changed = True
        result.append(updated)
    return result if changed else None
