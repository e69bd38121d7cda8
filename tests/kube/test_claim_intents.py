"""Spawn intents and generation fencing on ``Claim`` resources, against the real API server.

The cases of ``tests/claims/test_fencing.py`` (which run on the memory, sqlite and turso
stores) for :class:`~lorenz.kube.claims.store.ClaimResourceStore`: an intent recorded on our Claim
round-trips in camelCase, ``save`` keeps it, a pending retry drops it; a successor's takeover
stamps its generation on every Claim it takes, after which each write of the deposed replica is
refused before it changes anything (checked in the Claims' contents and resourceVersions, not
by timing); and the new leader's hydration turns a recovered running Claim with an intent into
an ``adoption`` retry, as on a single host. Also the Kubernetes-only parts: ``lastSeq``-only
updates are paced per Claim, and ``kubectl get claims`` shows the worker's phase (and its
handle with ``-o wide``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from lorenz.claims import ClaimGenerationStale
from lorenz.config import WorkflowSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.errors import LeaseLost
from lorenz.model import (
    ClaimPhase,
    Issue,
    LorenzError,
    ManualClock,
    RetryKind,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
)
from lorenz.orchestrator import DispatchCandidate, Orchestrator, Started
from tests.cluster.cluster import Cluster
from tests.kube.operators import Kube
from tests.kube.test_claims import NOW, Leadership, claim_object, record

pytestmark = pytest.mark.cluster

KEY = SlotKey("ISSUE-1#0")


@pytest.fixture
async def workflow(
    kube_api: KubeApi, kube_namespace: str, lorenz_crds: list[str]
) -> WorkflowRef:
    body = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "wf", "namespace": kube_namespace},
        "spec": {"tracker": {"kind": "files", "path": "issues"}},
    }
    created = await kube_api.create(workflows_path(kube_namespace), body)
    return WorkflowRef(namespace=kube_namespace, name="wf", uid=created["metadata"]["uid"])


def store_of(
    api: KubeApi,
    workflow: WorkflowRef,
    owner: str,
    leadership: Leadership,
    *,
    generation: int | None,
    **kwargs: Any,
) -> ClaimResourceStore:
    return ClaimResourceStore(
        api=api,
        workflow=workflow,
        owner=owner,
        holder=leadership.current_holder,
        may_write=leadership.may_write,
        generation=generation,
        **kwargs,
    )


def intent(
    handle: str = "lzw-h", phase: SpawnPhase = SpawnPhase.RUNNING, **kw: Any
) -> SpawnIntent:
    return SpawnIntent(handle=handle, phase=phase, **kw)


async def claims_as_stored(api: KubeApi, workflow: WorkflowRef) -> dict[str, Any]:
    """Every Claim of the namespace: name → (resourceVersion, status)."""
    items = await api.list_items(claims_path(workflow.namespace))
    return {
        i["metadata"]["name"]: (i["metadata"]["resourceVersion"], i.get("status"))
        for i in items
    }


async def test_spawn_intents_round_trip_and_follow_the_claim(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    leadership = Leadership("a")
    a = store_of(kube_api, workflow, "a", leadership, generation=1, seq_interval_s=0)
    b = store_of(kube_api, workflow, "b", Leadership("b"), generation=None)
    assert await a.acquire(record("ISSUE-1"))
    assert await b.acquire(record("ISSUE-2"))
    written = intent("lzw-x", SpawnPhase.SPAWN_REQUESTED, generation=1, placement="h:22")
    assert await a.record_intent(KEY, written) is True
    assert await a.record_intent(SlotKey("ISSUE-2#0"), written) is False  # b's claim
    assert await a.record_intent(SlotKey("ISSUE-7#0"), written) is False  # nobody's

    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert status["generation"] == 1
    assert status["intent"]["handle"] == "lzw-x"
    assert status["intent"]["phase"] == "spawn_requested"
    assert status["intent"]["generation"] == 1
    assert status["intent"]["lastSeq"] == 0
    assert status["intent"]["placement"] == "h:22"
    assert status["intent"]["updatedAt"]  # stamped by the store

    def stored(rows: list[Any]) -> dict[SlotKey, SpawnIntent | None]:
        return {r.slot_key: r.intent for r in rows}

    got = stored((await b.load()).claims)[KEY]
    assert got is not None
    assert (got.handle, got.phase, got.generation, got.placement) == (
        "lzw-x",
        SpawnPhase.SPAWN_REQUESTED,
        1,
        "h:22",
    )
    # save() of the running claim keeps the intent; last_seq moves through record_intent.
    await a.save(dataclasses.replace(record("ISSUE-1"), turn_count=2))
    await a.record_intent(KEY, dataclasses.replace(written, phase=SpawnPhase.RUNNING))
    await a.record_intent(
        KEY, dataclasses.replace(written, phase=SpawnPhase.RUNNING, last_seq=17)
    )
    kept = stored((await b.load()).claims)[KEY]
    assert kept is not None
    assert (kept.phase, kept.last_seq) == (SpawnPhase.RUNNING, 17)
    # Back to a pending retry: the run is settled, nothing to probe.
    await a.save(record("ISSUE-1", phase=ClaimPhase.RETRY_PENDING, attempt=1))
    rows = stored((await b.load()).claims)
    assert rows[KEY] is None
    assert rows[SlotKey("ISSUE-2#0")] is None
    assert "intent" not in (await claim_object(kube_api, workflow, KEY))["status"]


async def test_seq_only_updates_are_paced_per_claim_and_flushed_on_demand(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_of(
        kube_api, workflow, "a", Leadership("a"), generation=1, seq_interval_s=0.5
    )
    assert await store.acquire(record())
    running = intent("lzw-x", SpawnPhase.RUNNING, generation=1)
    assert await store.record_intent(KEY, running)  # a phase change: written at once
    patches = kube_api.requests[("patch", "claims/status")]
    for seq in range(1, 51):
        assert await store.record_intent(KEY, dataclasses.replace(running, last_seq=seq))
    assert kube_api.requests[("patch", "claims/status")] == patches  # all pending

    async def last_seq() -> int:
        status = (await claim_object(kube_api, workflow, KEY))["status"]
        return int(status["intent"]["lastSeq"])

    for _ in range(600):
        if await last_seq() == 50:
            break
        await asyncio.sleep(0.05)
    assert await last_seq() == 50
    assert kube_api.requests[("patch", "claims/status")] == patches + 1  # the newest, once

    # A save while a seq waits carries it: one write, and nothing left to flush.
    assert await store.record_intent(KEY, dataclasses.replace(running, last_seq=55))
    patches = kube_api.requests[("patch", "claims/status")]
    await store.save(dataclasses.replace(record(), turn_count=3))
    assert kube_api.requests[("patch", "claims/status")] == patches + 1
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert (status["turnCount"], status["intent"]["lastSeq"]) == (3, 55)
    await asyncio.sleep(0.7)  # past the interval: no flush of 55 follows
    assert kube_api.requests[("patch", "claims/status")] == patches + 1

    # A handover's flush writes what is pending at once; a phase change is never paced.
    assert await store.record_intent(KEY, dataclasses.replace(running, last_seq=60))
    await store.flush_intents()
    assert await last_seq() == 60
    assert await store.record_intent(
        KEY, dataclasses.replace(running, phase=SpawnPhase.QUARANTINED, last_seq=60)
    )
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert status["intent"]["phase"] == "quarantined"
    await store.close()


async def test_a_deposed_generation_writes_nothing(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    old_view = Leadership("old")
    refusals: list[LorenzError] = []
    old = store_of(kube_api, workflow, "old", old_view, generation=1, on_fenced=refusals.append)
    assert await old.acquire(record("ISSUE-1"))
    assert await old.acquire(record("ISSUE-2"))
    assert await old.record_intent(KEY, intent(generation=1, last_seq=3))
    await old.save_checkpoint({"n": 1})

    # A replica of generation 1 that has read the Claims, and will see the new holder.
    aware_view = Leadership("old")
    aware = store_of(kube_api, workflow, "old", aware_view, generation=1)
    await aware.load()

    # The successor takes the Workflow over: every Claim it takes carries generation 2.
    new = store_of(kube_api, workflow, "new", Leadership("new"), generation=2)
    stored = await new.load()
    assert stored.stale_owners == frozenset({"old"})
    taken = await new.take_over(from_owners=stored.stale_owners)
    assert {r.slot_key for r in taken} == {KEY, SlotKey("ISSUE-2#0")}
    (moved,) = [r for r in taken if r.slot_key == KEY]
    assert moved.intent is not None
    assert moved.intent.last_seq == 3  # adopted with the claim
    assert (await claim_object(kube_api, workflow, KEY))["status"]["generation"] == 2
    before = await claims_as_stored(kube_api, workflow)
    checkpoint_before = (await new.load()).checkpoint

    # The old replica has not noticed (its Lease view still says it may write). Its first
    # write finds the Claim changed (409), reads it again and sees the newer generation.
    with pytest.raises(ClaimGenerationStale) as caught:
        await old.save(dataclasses.replace(record("ISSUE-1"), attempt=7))
    assert caught.value.code == "claim_generation_stale"
    assert (caught.value.generation, caught.value.current) == (1, 2)
    # From then on every write is refused before any request, new slots included.
    requests = kube_api.total_requests
    attempts: list[Callable[[], Awaitable[object]]] = [
        lambda: old.acquire(record("ISSUE-4")),
        lambda: old.save(dataclasses.replace(record("ISSUE-2"), attempt=7)),
        lambda: old.record_intent(KEY, intent(generation=1, last_seq=99)),
        lambda: old.release(SlotKey("ISSUE-2#0")),
        lambda: old.take_over(from_owners=["new"]),
        lambda: old.save_checkpoint({"n": 2}),
        lambda: old.heartbeat(),
    ]
    for attempt in attempts:
        with pytest.raises(ClaimGenerationStale):
            await attempt()
    assert kube_api.total_requests == requests
    assert await claims_as_stored(kube_api, workflow) == before
    assert (await new.load()).checkpoint == checkpoint_before
    assert [e.code for e in refusals] == ["claim_generation_stale"]  # said once

    # One that already sees the new holder is refused by the generation too, not dropped
    # quietly as a Claim of the live holder.
    aware_view.holder = "new"
    with pytest.raises(ClaimGenerationStale):
        await aware.save(dataclasses.replace(record("ISSUE-2"), attempt=5))
    assert await claims_as_stored(kube_api, workflow) == before

    # A deposed replica that reads the Claims after the takeover is refused without a request.
    late = store_of(kube_api, workflow, "late", Leadership("late"), generation=1)
    await late.load()
    requests = kube_api.total_requests
    with pytest.raises(ClaimGenerationStale):
        await late.take_over(from_owners=["new"])
    assert kube_api.total_requests == requests
    assert await claims_as_stored(kube_api, workflow) == before

    # The new generation keeps writing.
    await new.save(dataclasses.replace(record("ISSUE-2"), attempt=2))
    status = (await claim_object(kube_api, workflow, SlotKey("ISSUE-2#0")))["status"]
    assert (status["owner"], status["attempt"], status["generation"]) == ("new", 2, 2)


async def test_an_intent_is_not_recorded_by_a_replica_that_may_not_write(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    """The runner starts no worker unless its intent is on the Claim: a refusal raises."""
    leadership = Leadership("a")
    store = store_of(kube_api, workflow, "a", leadership, generation=1)
    assert await store.acquire(record())
    leadership.writable = False
    with pytest.raises(LeaseLost) as caught:
        await store.record_intent(KEY, intent(phase=SpawnPhase.PROVISIONING))
    assert caught.value.code == "leadership_lost"
    assert "intent" not in (await claim_object(kube_api, workflow, KEY))["status"]


async def test_a_new_leader_hydrates_a_running_claim_with_an_intent_into_an_adoption(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    settings = WorkflowSettings.model_validate({"tracker": {"kind": "memory"}})
    clock = ManualClock(wall=NOW)
    old_store = store_of(kube_api, workflow, "old", Leadership("old"), generation=3)
    old = Orchestrator(settings=settings, store=old_store, clock=clock)
    await old.hydrate()
    issue = Issue(id="ISSUE-1", identifier="ISSUE-1", title="t", state="Todo")
    started = await old.claim(DispatchCandidate(issue=issue, slot_index=0, key=KEY))
    assert isinstance(started, Started)
    worker = intent("lzw-ISSUE-1-s0-a0-g3-0123456789ab", generation=3, last_seq=12)
    assert await old_store.record_intent(KEY, worker)

    new_store = store_of(kube_api, workflow, "new", Leadership("new"), generation=4)
    new = Orchestrator(settings=settings, store=new_store, clock=clock)
    report = await new.hydrate()
    assert report.adopting == (KEY,)
    assert report.interrupted == ()
    retry = new.state.retry_attempts[KEY]
    assert retry.kind is RetryKind.ADOPTION
    assert retry.resume is not None
    assert (retry.resume.handle, retry.resume.last_seq) == (worker.handle, 12)
    # The Claim stays running with its intent (a second crash finds it again), now ours.
    status = (await claim_object(kube_api, workflow, KEY))["status"]
    assert (status["owner"], status["phase"], status["generation"]) == ("new", "Running", 4)
    assert status["intent"]["handle"] == worker.handle
    assert status["intent"]["lastSeq"] == 12


async def test_kubectl_get_claims_shows_the_workers_phase_handle_and_host(
    kube_api: KubeApi, workflow: WorkflowRef, kube_control_plane: Cluster
) -> None:
    store = store_of(kube_api, workflow, "a", Leadership("a"), generation=1)
    # a run in a Pod: the Claim's host is the Pod's name
    assert await store.acquire(record(host="lzw-issue-1-s0-a0-g1-0123456789ab"))
    handle = "lzw-ISSUE-1-s0-a0-g1-0123456789ab"
    assert await store.record_intent(KEY, intent(handle, SpawnPhase.PROBING, generation=1))
    kube = Kube(kube_control_plane, workflow.namespace)
    (row,) = kube.table("claims")
    assert row["WORKER"] == "probing"
    assert "HANDLE" not in row
    assert row["HOST"] == handle.lower()
    (wide,) = kube.table("claims", "-o", "wide")
    assert wide["HANDLE"] == handle
    assert wide["WORKER"] == "probing"
    assert (wide["PHASE"], wide["OWNER"]) == ("Running", "a")
    updated = datetime.datetime.fromisoformat(
        (await claim_object(kube_api, workflow, KEY))["status"]["intent"]["updatedAt"]
    )
    assert updated.tzinfo is not None
