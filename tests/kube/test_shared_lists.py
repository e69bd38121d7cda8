"""The run objects of Workflows deleted together are listed together (one list per kind).

A namespace being deleted with 1,000 Workflows had every cleanup list its own run Pods and
workspace PersistentVolumeClaims: two requests per Workflow, each a scan of the namespace on
the API server's side. :meth:`~lorenz.kube.claims.lists.SharedLists.labelled` answers the
cleanups that wait together from one namespace-wide list; each still sees only its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.lists import SharedLists
from lorenz.kube.clients import KubeApi
from lorenz.kube.pods.cleanup import delete_workflow_runs
from lorenz.kube.pods.manifests import LABEL_MANAGED, LABEL_WORKFLOW, label_value

pytestmark = pytest.mark.cluster


def _labels(workflow: str) -> dict[str, str]:
    return {LABEL_MANAGED: "lorenz", LABEL_WORKFLOW: label_value(workflow)}


def _pod(name: str, workflow: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": _labels(workflow)},
        "spec": {"containers": [{"name": "worker", "image": "lorenz:none"}]},
    }


def _claim(name: str, workflow: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": _labels(workflow)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }


async def test_workflows_deleted_together_share_one_list_of_each_run_kind(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    claims = f"/api/v1/namespaces/{kube_namespace}/persistentvolumeclaims"
    refs = [WorkflowRef(namespace=kube_namespace, name=f"wf-{i}", uid=None) for i in range(4)]
    for i, ref in enumerate(refs):
        for n in range(i):  # wf-i has i run Pods and i workspace claims
            await kube_api.create(pods, _pod(f"{ref.name}-run-{n}", ref.name))
            await kube_api.create(claims, _claim(f"{ref.name}-ws-{n}", ref.name))
    # Someone else's Pod (not managed by lorenz) is never touched.
    await kube_api.create(pods, {**_pod("bystander", "wf-3"), "metadata": {
        "name": "bystander", "labels": {LABEL_WORKFLOW: label_value("wf-3")}}})
    lists = SharedLists(api=kube_api)
    before = dict(kube_api.requests)
    deleted = await asyncio.gather(
        *(delete_workflow_runs(kube_api, workflow=ref, lists=lists) for ref in refs)
    )
    assert kube_api.requests[("list", "pods")] - before.get(("list", "pods"), 0) == 1
    assert (
        kube_api.requests[("list", "persistentvolumeclaims")]
        - before.get(("list", "persistentvolumeclaims"), 0)
        == 1
    )
    for i, (ref, runs) in enumerate(zip(refs, deleted, strict=True)):
        assert sorted(runs["pods"]) == [f"{ref.name}-run-{n}" for n in range(i)]
        assert sorted(runs["claims"]) == [f"{ref.name}-ws-{n}" for n in range(i)]
    left = await kube_api.list_items(pods)
    assert [
        p["metadata"]["name"] for p in left if not p["metadata"].get("deletionTimestamp")
    ] == ["bystander"]
    # One cleanup alone lists with its own label selector, as before.
    await kube_api.create(pods, _pod("wf-9-run-0", "wf-9"))
    alone = await delete_workflow_runs(
        kube_api, workflow=WorkflowRef(namespace=kube_namespace, name="wf-9", uid=None),
        lists=lists,
    )
    assert alone["pods"] == ["wf-9-run-0"]
