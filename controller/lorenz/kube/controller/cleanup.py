"""The ``lorenz.dev/cleanup`` finalizer of a Workflow, the garbage it guards, and the sweeps.

Everything a Workflow's controller deletes lives here, beside it: the cleanup of a deleted
Workflow (its Claims, run objects and workspaces, then the finalizer), the orphan sweep of a
new term (run Pods that no Claim names) and the workspace claims of issues that turned
terminal. The lifecycle decides *when*; this module says *what goes* and in which order.

A Workflow's Claims are owned by it (ownerReferences), so Kubernetes' garbage collector would
delete them eventually; the finalizer makes the deletion wait until the leader has stopped
its runtime and deleted them itself — and removed its workspaces from the volume, which no
garbage collector knows about — so no run outlives its Workflow and a re-created Workflow of
the same name never inherits either.

NB: the finalizer list is edited with a JSON patch whose first op tests the list just read. A
merge patch would replace the whole list (and drop other controllers' finalizers); without the
test op an edit computed from a stale read could do the same. Testing the resourceVersion
instead would make the edit lose to the leader's own status patches, which change it. On a
failed test (422) or a conflict (409) the object is read again and the edit recomputed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.controller.specs import WORKSPACES_DIR
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.cleanup import (
    delete_issue_workspaces,
    delete_workflow_runs,
    sweep_run_pods,
    workspace_claims_by_issue,
)
from lorenz.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.kube.finalizers")
sweeps = logging.getLogger("lorenz.kube.controllers")
"""NB: the name the lines of the sweeps and the cleanup have always had (the controller's)."""

MAX_PATCH_RETRIES = 5


def finalizer_ops(metadata: Mapping[str, Any], *, add: bool) -> list[dict[str, Any]] | None:
    """The JSON patch that adds or removes the cleanup finalizer (``None``: nothing to do)."""
    finalizers = list(metadata.get("finalizers") or [])
    finalizer = resources.CLEANUP_FINALIZER
    if (finalizer in finalizers) == add:
        return None
    if add and not finalizers:
        # NB: JSON patch cannot test that a path is absent: only here the resourceVersion is
        # the precondition (a Workflow without finalizers is one nobody else is editing).
        version = metadata["resourceVersion"]
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ]
    # The precondition is the list itself: status patches (which change the resourceVersion
    # several times a minute) cannot make this edit fail, another finalizer's edit can.
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers}
    ]
    if add:
        ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    else:
        ops.append({"op": "remove", "path": f"/metadata/finalizers/{finalizers.index(finalizer)}"})
    return ops


async def edit_finalizer(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    add: bool,
    seen: Mapping[str, Any] | None = None,
    on_answer: Callable[[Mapping[str, Any]], None] | None = None,
) -> bool:
    """Add or remove the cleanup finalizer; ``True`` when the object ends in that state.

    ``seen`` is the object as the watch last delivered it: the first edit is computed from it
    (no read), and only an edit it makes fail (the list or the resourceVersion moved on) reads
    the object again. With 1,000 Workflows starting or being deleted at once, that read was a
    third of the requests the start (and the cleanup) queued behind.

    ``on_answer`` gets each object the API server answered with (a read, the patched object:
    the whole Workflow, status included, as of that request) — never the watched ``seen``, so
    nothing when the edit needed no request.
    """
    path = workflows_path(workflow.namespace, workflow.name)
    for _ in range(MAX_PATCH_RETRIES):
        if seen is not None:
            current: Mapping[str, Any] = seen
            seen = None
        else:
            try:
                current = await api.get(path)
            except KubeApiError as exc:
                if exc.not_found:
                    return not add
                raise
            if on_answer is not None:
                on_answer(current)
        metadata = current.get("metadata") or {}
        if workflow.uid is not None and metadata.get("uid") != workflow.uid:
            return not add  # a re-created Workflow of the same name: not ours to edit
        ops = finalizer_ops(metadata, add=add)
        if ops is None:
            return True
        try:
            answer = await api.json_patch(path, ops)
        except KubeApiError as exc:
            if exc.not_found:
                return not add
            if not (exc.conflict or exc.status == 422):
                raise
        else:
            if on_answer is not None and answer:
                on_answer(answer)
            return True
    logger.warning("Finalizer edit kept conflicting workflow=%s", workflow.display)
    return False


async def delete_claims(
    *, api: KubeApi, workflow: WorkflowRef, lister: ClaimLister | None = None
) -> int:
    """Delete the Claims of ``workflow`` (not those of a re-created one); how many went.

    With a ``lister``, the list is shared with the other Workflows of the namespace being
    cleaned up at the same time (a namespace deletion: one list for many instead of one each).
    """
    if lister is not None:
        items = await lister.claims_of(workflow)
    else:
        items = await api.list_items(
            claims_path(workflow.namespace),
            label_selector=resources.workflow_selector(workflow.name),
        )
    deleted = 0
    for item in items:
        metadata = item.get("metadata") or {}
        owners = {o.get("uid") for o in metadata.get("ownerReferences") or ()}
        if (item.get("spec") or {}).get("workflow") != workflow.name:
            continue
        if owners and workflow.uid not in owners:
            continue  # a Claim of a re-created Workflow of the same name
        with contextlib.suppress(KubeApiError):  # NB: already gone, or the namespace is going
            await api.delete(
                claims_path(workflow.namespace, str(metadata["name"])), uid=metadata.get("uid")
            )
            deleted += 1
    return deleted


async def remove_workspaces(workflow_dir: Path) -> None:
    """Remove the workspaces of a deleted Workflow (``<its folder>/workspaces``).

    The rest of the Workflow's folder (a files tracker's issues, say) is the user's data and
    stays.
    """
    target = workflow_dir / WORKSPACES_DIR
    if not target.exists():
        return

    def remove() -> None:
        def failed(function: object, path: str, info: Any) -> None:
            logger.warning("Workspace removal failed path=%s error=%s", path, info[1])

        shutil.rmtree(target, onerror=failed)

    await asyncio.to_thread(remove)
    logger.info("Workspaces removed path=%s", target)


async def clean_up_deleted(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    lister: ClaimLister | None,
    workflow_dir: Path,
    seen: Mapping[str, Any],
    release: Callable[[], Awaitable[None]],
) -> int:
    """The Workflow is being deleted: delete its Claims, the run Pods nobody followed (a
    previous leader's, not adopted yet) and workspaces, let go of the shard (``release``),
    unblock the deletion; how many Claims went."""
    deleted = await delete_claims(api=api, workflow=workflow, lister=lister)
    try:
        runs = await delete_workflow_runs(api, workflow=workflow, lists=lister)
    except KubeApiError as exc:
        # NB: the owner references to the Workflow take them along anyway; a deletion
        # must not wait on this.
        sweeps.warning("Run objects not deleted workflow=%s error=%s", workflow.display, exc)
    else:
        if any(runs.values()):
            sweeps.info(
                "Run objects deleted workflow=%s pods=%d secrets=%d claims=%d",
                workflow.display, len(runs["pods"]), len(runs["secrets"]),
                len(runs["claims"]),
            )
    await release()
    # NB: before the finalizer goes: only then can a Workflow of the same name be created,
    # and it must not find (or lose) this one's workspaces.
    await remove_workspaces(workflow_dir)
    await edit_finalizer(api=api, workflow=workflow, add=False, seen=seen)
    return deleted


async def sweep_orphans_of_term(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    store: ClaimResourceStore,
    may_delete: Callable[[], bool],
    lists: ClaimLister | None = None,
) -> list[str]:
    """The orphan sweep of a new term: delete the run Pods of ``workflow`` that no Claim's
    spawn intent names, once ``store`` has loaded the Claims; the handles deleted.

    NB: the sweep starts beside the runtime, whose start-up loads the store: a sweep that read
    :attr:`ClaimResourceStore.held` before that load named nothing, and deleted every Pod of
    the previous leader that this term was about to adopt (a loaded machine, a ``helm
    upgrade`` mid-run: the run was stopped and started again instead of adopted).
    """
    await store.loaded.wait()

    def named() -> set[str]:
        return {
            held.record.intent.handle
            for held in store.held.values()
            if held.record.intent is not None
        }

    return await sweep_run_pods(
        api=api, workflow=workflow, keep=named, may_delete=may_delete, lists=lists
    )


async def sweep_orphans(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    store: ClaimResourceStore,
    may_delete: Callable[[], bool],
    lists: ClaimLister | None,
) -> None:
    """Delete the run Pods of this Workflow that no Claim names (see
    :func:`~lorenz.kube.pods.cleanup.sweep_run_pods`): a Pod the previous leader started whose
    Claim is gone, or whose Claim names a newer run; never one a Claim's intent names."""

    try:
        await sweep_orphans_of_term(
            api=api, workflow=workflow, store=store, may_delete=may_delete, lists=lists
        )
    except KubeApiError as exc:
        sweeps.warning("Orphan sweep failed workflow=%s error=%s", workflow.display, exc)


async def sweep_terminal_workspaces(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    runtime: LorenzRuntime,
    store: ClaimResourceStore,
    still_ours: Callable[[], bool],
    lists: ClaimLister | None,
) -> None:
    """Delete the workspace claims (PVCs) of issues that turned terminal while no replica
    tracked them (given up, then closed; or closed while the operator was away): the Pod
    runs' counterpart of the start-up workspace cleanup. Once per term (``still_ours``: the
    term holds and ``store`` is still its store); an issue this term holds a Claim for or
    tracks is left to reconciliation."""
    try:
        by_issue = await workspace_claims_by_issue(api, workflow=workflow, lists=lists)
        held = {h.record.issue_id for h in store.held.values()}
        ids = sorted(set(by_issue) - held - runtime.orchestrator.tracked_issue_ids())
        if not ids:
            return
        issues = await runtime.tracker.fetch_issues_by_ids(ids)
        terminal = {state.strip().lower() for state in runtime.settings.tracker.terminal_states}
        for issue in issues:
            if issue.state_key not in terminal:
                continue
            if not still_ours():
                return  # NB: the term ended: the next leader sweeps again
            deleted = await delete_issue_workspaces(api, workflow=workflow, issue_id=issue.id)
            if deleted:
                sweeps.info(
                    "Workspace claims of a terminal issue deleted workflow=%s issue=%s "
                    "claims=%s",
                    workflow.display, issue.identifier, ",".join(deleted),
                )
    except Exception as exc:  # noqa: BLE001 - reported; the next term sweeps again
        sweeps.warning(
            "Terminal workspace sweep failed workflow=%s error=%s", workflow.display, exc
        )


async def delete_issue_claims(*, api: KubeApi, workflow: WorkflowRef, issue_id: str) -> None:
    """The issue is terminal: delete its workspace claims (an emptyDir went with its Pod)."""
    try:
        deleted = await delete_issue_workspaces(api, workflow=workflow, issue_id=issue_id)
    except KubeApiError as exc:
        sweeps.warning(
            "Workspace claims not deleted workflow=%s issue=%s error=%s",
            workflow.display, issue_id, exc,
        )
        return
    if deleted:
        sweeps.info(
            "Workspace claims deleted workflow=%s issue=%s claims=%s",
            workflow.display, issue_id, ",".join(deleted),
        )
