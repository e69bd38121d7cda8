"""A term's start recovers from the exact, bounded set of Claims it rebinds.

Issue #32 point 6. The start lists this Workflow's Claims by its label (never every Claim of
the namespace: another Workflow's live Claims are not read), rebinds the stale ones by name
(a status write on each, conditioned on its resourceVersion), and counts only those and ours
against the bound: a live holder's Claims do not count. Above the bound it fails closed with
``claim_rebind_too_large``, nothing moved and nothing held. The stores use 1,000; here the
bound is lowered so the cluster test creates a few Claims, not 1,001. A bounded ``load`` (a
diagnostic read) fails closed the same way.
"""

from __future__ import annotations

import pytest

from lorenz.claims import ClaimRebindTooLarge, ClaimRecoveryTooLarge
from lorenz.config import WorkflowSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims import recovering
from lorenz.kube.clients import KubeApi, workflows_path
from lorenz.model import ClaimStore, SlotKey, SystemClock
from lorenz.orchestrator import Orchestrator
from tests.kube.test_claims import Leadership, record, store_for
from tests.kube.test_claims import workflow as workflow  # NB: the fixture, re-exported

pytestmark = pytest.mark.cluster


async def test_a_bounded_load_above_the_bound_fails_closed(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    writer = store_for(kube_api, workflow, "leader", Leadership("leader"))
    for issue in ("A", "B", "C"):
        assert await writer.acquire(record(issue))
    successor = store_for(kube_api, workflow, "next", Leadership("next"))
    with pytest.raises(ClaimRecoveryTooLarge) as caught:
        await successor.load(bound=2)
    assert caught.value.code == "claim_rebind_too_large"
    assert dict(successor.held) == {}
    loaded = await successor.load(bound=3)
    assert len(loaded.claims) == 3
    assert {claim.owner for claim in loaded.claims} == {"leader"}


def _orchestrator(store: ClaimStore) -> Orchestrator:
    return Orchestrator(settings=WorkflowSettings(), store=store, clock=SystemClock())


async def _other_workflow(api: KubeApi, namespace: str) -> WorkflowRef:
    body = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf-other", "namespace": namespace},
        "spec": {"tracker": {"kind": "files", "path": "issues"}},
    }
    created = await api.create(workflows_path(namespace), body)
    return WorkflowRef(namespace=namespace, name="wf-other", uid=created["metadata"]["uid"])


async def test_a_term_start_rebinds_its_stale_claims_and_counts_no_live_ones(
    kube_api: KubeApi, workflow: WorkflowRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recovering, "MAX_REBIND", 2)
    other = await _other_workflow(kube_api, workflow.namespace)
    elsewhere = store_for(kube_api, other, "other", Leadership("other"))
    for index in range(5):  # NB: another Workflow's live Claims, in the same namespace
        assert await elsewhere.acquire(record(f"W{index}"))
    holder = Leadership("leader")
    live = store_for(kube_api, workflow, "leader", holder)
    for issue in ("A", "B", "C"):
        assert await live.acquire(record(issue))
    holder.holder = "old"
    assert await store_for(kube_api, workflow, "old", holder).acquire(record("D"))
    holder.holder = "leader"

    report = await _orchestrator(store_for(kube_api, workflow, "next", holder)).hydrate()
    assert report.interrupted == (SlotKey("D#0"),)
    assert report.taken_over_from == {"old"}
    owners = {c.slot_key: c.owner for c in (await live.load()).claims}
    assert owners == {"A#0": "leader", "B#0": "leader", "C#0": "leader", "D#0": "next"}
    assert {c.owner for c in (await elsewhere.load()).claims} == {"other"}


async def test_a_term_start_above_the_bound_fails_closed_holding_nothing(
    kube_api: KubeApi, workflow: WorkflowRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recovering, "MAX_REBIND", 2)
    writer = store_for(kube_api, workflow, "old", Leadership("old"))
    for issue in ("A", "B", "C"):
        assert await writer.acquire(record(issue))
    successor = store_for(kube_api, workflow, "next", Leadership("next"))
    with pytest.raises(ClaimRebindTooLarge) as caught:
        await _orchestrator(successor).hydrate()
    assert caught.value.code == "claim_rebind_too_large"
    assert "claims to rebind" in caught.value.message
    assert dict(successor.held) == {}
    assert {c.owner for c in (await writer.load()).claims} == {"old"}
