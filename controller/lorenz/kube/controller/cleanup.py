"""The ``lorenz.dev/cleanup`` finalizer of a Workflow, and the garbage it guards.

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.controller.specs import WORKSPACES_DIR
from lorenz.kube.errors import KubeApiError

logger = logging.getLogger("lorenz.kube.finalizers")

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
