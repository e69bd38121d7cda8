"""The pieces of a Workflow's controller on their own: the pure status, the finalizer edits."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import pytest

from lorenz.kube.api import resources
from lorenz.kube.api.crds import workflow_crd
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import Condition
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.controller.cleanup import edit_finalizer, finalizer_ops
from lorenz.kube.controller.status import (
    Degradation,
    StatusInputs,
    only_bookkeeping_changed,
    workflow_status,
)
from lorenz.kube.errors import KubeApiError
from lorenz.model import DispatchPause
from lorenz.model.spending import BudgetSnapshot, SpendFigures
from tests.cluster.cluster import Cluster
from tests.kube.snapshots import runtime_snapshot

NOW = datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)


def inputs(**fields: Any) -> StatusInputs:
    values: dict[str, Any] = {
        "generation": 2,
        "applied_generation": 2,
        "candidate_generation": 2,
        "identity": "op-a",
        "lease_name": "lorenz-wf-x",
        "running": True,
        "snapshot": runtime_snapshot(
            last_poll_at=datetime.datetime(2026, 3, 4, 5, 6, tzinfo=datetime.UTC),
            candidates=3,
            eligible=1,
        ),
    }
    values.update(fields)
    return StatusInputs(**values)


def conditions_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_polling_runtime_is_ready_and_not_degraded() -> None:
    status = workflow_status(inputs(), [], NOW)
    found = conditions_of(status)
    assert found["Ready"]["status"] == "True"
    assert found["Ready"]["reason"] == "Polling"
    assert found["Degraded"]["status"] == "False"
    assert found["Leading"]["status"] == "True"
    assert status["leader"]["identity"] == "op-a"
    assert status["observedGeneration"] == 2


def test_a_rejected_spec_is_degraded_while_the_last_good_one_keeps_running() -> None:
    degraded = Degradation(code="workflow_invalid", message="fix the prompt", generation=3)
    status = workflow_status(inputs(generation=3, degraded=degraded), [], NOW)
    found = conditions_of(status)
    assert found["Degraded"]["status"] == "True"
    assert found["Degraded"]["reason"] == "workflow_invalid"
    assert "running generation 2" in found["Degraded"]["message"]
    assert found["Ready"]["status"] == "True"  # the kept workflow still polls
    assert status["observedGeneration"] == 3


def test_a_paused_dispatch_degrades_the_workflow_with_the_fault_code() -> None:
    # Issue #32 point 2: a host fault (runs cannot be placed or launched, the claim store
    # refuses writes) pauses dispatch; the Workflow says so in Degraded, with the fault's code.
    paused = DispatchPause(
        code="placement_failed", message="0/3 nodes are available", since=NOW
    )
    snapshot = runtime_snapshot(
        last_poll_at=NOW, last_error=paused.message, dispatch_paused=paused
    )
    found = conditions_of(workflow_status(inputs(snapshot=snapshot), [], NOW))
    assert found["Degraded"]["status"] == "True"
    assert found["Degraded"]["reason"] == "placement_failed"
    assert "dispatch paused" in found["Degraded"]["message"]
    assert "0/3 nodes are available" in found["Degraded"]["message"]
    # Resumed: the next snapshot has no pause, and the condition clears.
    found = conditions_of(workflow_status(inputs(), [], LATER))
    assert found["Degraded"]["status"] == "False"


def test_without_a_runtime_the_degradation_is_why_it_is_not_ready() -> None:
    degraded = Degradation(code="tracker_unreachable", message="check the URL", generation=1)
    status = workflow_status(
        inputs(running=False, snapshot=None, applied_generation=None, degraded=degraded), [], NOW
    )
    ready = conditions_of(status)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "tracker_unreachable")


def test_a_releasing_leader_names_nobody() -> None:
    status = workflow_status(inputs(releasing=True), [], NOW)
    assert status["leader"]["identity"] is None
    assert conditions_of(status)["Leading"]["status"] == "False"


def test_conditions_keep_their_transition_time_while_their_status_holds() -> None:
    first = workflow_status(inputs(), [], NOW)
    previous = [Condition.model_validate(c) for c in first["conditions"]]
    again = workflow_status(inputs(), previous, LATER)
    assert again == first
    flipped = workflow_status(
        inputs(snapshot=runtime_snapshot(last_error="boom")), previous, LATER
    )
    ready = conditions_of(flipped)["Ready"]
    assert ready["status"] == "False"
    assert ready["lastTransitionTime"] != conditions_of(first)["Ready"]["lastTransitionTime"]


def test_only_the_poll_bookkeeping_of_an_idle_tick_may_wait() -> None:
    def polled(count: int, **poll: Any) -> dict[str, Any]:
        snapshot = runtime_snapshot(
            last_poll_at=datetime.datetime(2026, 3, 4, 5, 6, count, tzinfo=datetime.UTC),
            next_poll_at=datetime.datetime(2026, 3, 4, 5, 7, count, tzinfo=datetime.UTC),
            count=count, **{"candidates": 3, "eligible": 1, **poll},
        )
        return workflow_status(inputs(snapshot=snapshot), [], NOW)

    assert only_bookkeeping_changed(polled(2), polled(1))
    assert not only_bookkeeping_changed(polled(2, eligible=2), polled(1))
    assert not only_bookkeeping_changed(polled(2, last_error="boom"), polled(1))
    never_polled = workflow_status(inputs(snapshot=runtime_snapshot()), [], NOW)
    assert not only_bookkeeping_changed(polled(1), never_polled)



def test_the_spend_summary_is_in_the_status_while_a_cap_is_set_and_leaves_the_ledger_alone(
) -> None:
    """``status.spend`` (the SPEND column) says the day's spend against its cap; it never
    carries ``ledger``, which the claim store writes (a null there would delete it)."""
    assert "spend" not in workflow_status(inputs(), [], NOW)
    budget = BudgetSnapshot(
        day="2026-12-07", day_spend=SpendFigures(tokens=4200, usd=0.4217), max_usd_per_day=5.0,
    )
    snapshot = dataclasses.replace(runtime_snapshot(), budget=budget)
    spend = workflow_status(inputs(snapshot=snapshot), [], NOW)["spend"]
    assert spend == {
        "day": "2026-12-07", "usdToday": 0.4217, "tokensToday": 4200, "maxUsdPerDay": 5.0,
        "held": 0, "summary": "0.42/5.00 USD",
    }
    columns = {c["name"]: c for c in workflow_crd()["spec"]["versions"][0]
               ["additionalPrinterColumns"]}
    assert columns["Spend"]["jsonPath"] == ".status.spend.summary"

def test_removing_the_finalizer_tests_the_list_not_the_resource_version() -> None:
    metadata = {"resourceVersion": "7", "finalizers": ["a/b", resources.CLEANUP_FINALIZER]}
    ops = finalizer_ops(metadata, add=False)
    assert ops == [
        {"op": "test", "path": "/metadata/finalizers", "value": metadata["finalizers"]},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
    assert finalizer_ops(metadata, add=True) is None


@pytest.fixture
async def workflow(
    kube_api: KubeApi, kube_namespace: str, lorenz_crds: list[str]
) -> WorkflowRef:
    body = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf", "namespace": kube_namespace, "finalizers": ["example.com/x"]},
        "spec": {"tracker": {"kind": "files", "path": "issues"}},
    }
    created = await kube_api.create(workflows_path(kube_namespace), body)
    return WorkflowRef(namespace=kube_namespace, name="wf", uid=created["metadata"]["uid"])


async def finalizers(api: KubeApi, workflow: WorkflowRef) -> list[str]:
    current = await api.get(workflows_path(workflow.namespace, workflow.name))
    return list(current["metadata"].get("finalizers") or [])


async def clear_finalizers(api: KubeApi, workflow: WorkflowRef) -> None:
    await api.merge_patch(
        workflows_path(workflow.namespace, workflow.name), {"metadata": {"finalizers": None}}
    )


@pytest.mark.cluster
async def test_a_finalizer_edit_never_loses_to_a_status_patch(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    path = workflows_path(workflow.namespace, workflow.name)
    read = (await kube_api.get(path))["metadata"]
    # The leader's own status patch lands between the read and the edit.
    await kube_api.merge_patch(
        workflows_path(workflow.namespace, workflow.name, status=True),
        {"status": {"observedGeneration": 1}},
    )
    ops = finalizer_ops(read, add=True)
    assert ops is not None
    await kube_api.json_patch(path, ops)
    assert await finalizers(kube_api, workflow) == ["example.com/x", resources.CLEANUP_FINALIZER]
    await clear_finalizers(kube_api, workflow)


@pytest.mark.cluster
async def test_a_finalizer_edit_from_a_stale_list_is_refused_and_recomputed(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    path = workflows_path(workflow.namespace, workflow.name)
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=True)
    read = (await kube_api.get(path))["metadata"]
    # Someone else's finalizer goes first: the index computed from ``read`` is stale.
    await kube_api.json_patch(path, [{"op": "remove", "path": "/metadata/finalizers/0"}])
    ops = finalizer_ops(read, add=False)
    assert ops is not None
    with pytest.raises(KubeApiError) as refused:
        await kube_api.json_patch(path, ops)
    assert refused.value.status == 422
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=False)
    assert await finalizers(kube_api, workflow) == []


@pytest.mark.cluster
async def test_a_finalizer_edit_from_the_watched_object_reads_nothing(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    path = workflows_path(workflow.namespace, workflow.name)
    seen = await kube_api.get(path)
    reads = kube_api.requests[("get", "workflows")]
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=True, seen=seen)
    assert kube_api.requests[("get", "workflows")] == reads
    assert kube_api.requests[("patch", "workflows")] == 1
    assert await finalizers(kube_api, workflow) == ["example.com/x", resources.CLEANUP_FINALIZER]
    # Already there as watched: nothing to send at all.
    seen = await kube_api.get(path)
    reads = kube_api.requests[("get", "workflows")]
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=True, seen=seen)
    assert kube_api.requests[("get", "workflows")] == reads
    assert kube_api.requests[("patch", "workflows")] == 1
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=False, seen=seen)
    assert kube_api.requests[("get", "workflows")] == reads
    assert await finalizers(kube_api, workflow) == ["example.com/x"]
    await clear_finalizers(kube_api, workflow)


@pytest.mark.cluster
async def test_a_finalizer_edit_from_a_stale_watched_object_reads_again(
    kube_api: KubeApi, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    body = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "bare", "namespace": kube_namespace},
        "spec": {"tracker": {"kind": "files", "path": "issues"}},
    }
    created = await kube_api.create(workflows_path(kube_namespace), body)
    workflow = WorkflowRef(namespace=kube_namespace, name="bare", uid=created["metadata"]["uid"])
    # A status patch after the watched version moves the resourceVersion that adding the
    # first finalizer tests: the edit is refused, read again and made.
    await kube_api.merge_patch(
        workflows_path(kube_namespace, "bare", status=True), {"status": {"observedGeneration": 1}}
    )
    reads = kube_api.requests[("get", "workflows")]
    assert await edit_finalizer(api=kube_api, workflow=workflow, add=True, seen=created)
    assert kube_api.requests[("get", "workflows")] == reads + 1
    assert await finalizers(kube_api, workflow) == [resources.CLEANUP_FINALIZER]
    await clear_finalizers(kube_api, workflow)


@pytest.mark.cluster
async def test_a_create_in_a_terminating_namespace_says_so_and_blames_no_rbac(
    kube_api: KubeApi, kube_control_plane: Cluster, lorenz_crds: list[str]
) -> None:
    namespace = kube_control_plane.create_namespace()
    # A foreign finalizer keeps the namespace terminating for as long as the test needs.
    body = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "held", "namespace": namespace, "finalizers": ["example.com/x"]},
        "spec": {"tracker": {"kind": "files", "path": "issues"}},
    }
    await kube_api.create(workflows_path(namespace), body)
    kube_control_plane.delete_namespace(namespace)
    claim = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Claim",
        "metadata": {"name": "late", "namespace": namespace},
        "spec": {"workflow": "held", "slotKey": "i#0", "issueId": "i", "identifier": "I-1",
                 "slotIndex": 0},
    }

    async def refused() -> KubeApiError | None:
        try:
            await kube_api.create(claims_path(namespace), claim)
        except KubeApiError as exc:
            return exc
        await kube_api.delete(claims_path(namespace, "late"))
        return None

    error = None
    for _ in range(120):
        error = await refused()
        if error is not None:
            break
        await asyncio.sleep(0.5)
    assert error is not None
    assert error.status == 403
    assert error.namespace_terminating
    assert "the namespace is being deleted" in str(error)
    assert "OPERATOR_RULES" not in str(error)  # the RBAC hint of a real 403
    await clear_finalizers(kube_api, WorkflowRef(namespace=namespace, name="held", uid=None))
