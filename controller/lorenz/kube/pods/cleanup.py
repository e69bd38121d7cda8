"""What a Workflow's runs leave in its namespace, found by their labels and deleted.

Run Pods and their spec Secrets that no Claim names (the orphan sweep of a new term), the
workspace claims of an issue that turned terminal, and everything of a deleted Workflow. Each
list may be shared with the other Workflows of the namespace asking at the same time
(:class:`~lorenz.kube.claims.lists.SharedLists`): a thousand leaders starting at once make one
list, not a thousand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.lists import SharedLists
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.manifests import (
    ANNOTATION_HANDLE,
    ANNOTATION_ISSUE_ID,
    LABEL_ISSUE_ID,
    LABEL_MANAGED,
    LABEL_WORKFLOW,
    label_value,
    pods_path,
    run_pods_selector,
    secrets_path,
    volume_claims_path,
)

logger = logging.getLogger(__name__)


async def workflow_objects(
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
    items = await workflow_objects(
        api, volume_claims_path(workflow.namespace), workflow=workflow, lists=lists
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
    items = await api.list_items(volume_claims_path(workflow.namespace), label_selector=selector)
    deleted: list[str] = []
    for item in items:
        metadata = item.get("metadata") or {}
        if (metadata.get("annotations") or {}).get(ANNOTATION_ISSUE_ID) != issue_id:
            continue  # NB: a label value is hashed when long; the annotation is exact
        name = str(metadata.get("name"))
        try:
            await api.delete(volume_claims_path(workflow.namespace, name))
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
    pods = await workflow_objects(api, pods_path(namespace), workflow=workflow, lists=lists)
    claims = await workflow_objects(
        api, volume_claims_path(namespace), workflow=workflow, lists=lists
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
    paths = {"pods": pods_path, "secrets": secrets_path, "claims": volume_claims_path}
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
    pods = await workflow_objects(
        api, pods_path(workflow.namespace), workflow=workflow, lists=lists
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
        for path in (pods_path(workflow.namespace, name),
                     secrets_path(workflow.namespace, f"{name}-spec")):
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
