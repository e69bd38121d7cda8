"""The Claim-backed claim store against the real API server, and the orchestrator on top of it.

Each test gets a fresh namespace with one Workflow object (the owner of its Claims and the
holder of the checkpoint). "Who is the live holder" and "may this replica write" are plain
callables here; in the operator they are the Lease provider's view.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from lorenz.config import WorkflowSettings
from lorenz.kube.api.resources import WorkflowRef, claim_name
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.controller.cleanup import edit_finalizer
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    Issue,
    ManualClock,
    RetryKind,
    SlotKey,
    TokenUsage,
)
from lorenz.orchestrator import DispatchCandidate, Orchestrator, Started
from tests.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster

NOW = datetime.datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=datetime.UTC)


class Leadership:
    """The two facts the store asks the Lease about."""

    def __init__(self, holder: str | None) -> None:
        self.holder = holder
        self.writable = True

    def current_holder(self) -> str | None:
        return self.holder

    def may_write(self) -> bool:
        return self.writable


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


def store_for(
    api: KubeApi, workflow: WorkflowRef, owner: str, leadership: Leadership
) -> ClaimResourceStore:
    return ClaimResourceStore(
        api=api,
        workflow=workflow,
        owner=owner,
        holder=leadership.current_holder,
        may_write=leadership.may_write,
    )


def record(
    issue: str = "ISSUE-1", slot: int = 0, *, owner: str = "x", **fields: Any
) -> ClaimRecord:
    return ClaimRecord(
        slot_key=SlotKey(f"{issue}#{slot}"),
        issue_id=issue,
        identifier=issue,
        slot_index=slot,
        phase=fields.pop("phase", ClaimPhase.RUNNING),
        owner=owner,
        started_at=fields.pop("started_at", NOW),
        **fields,
    )


async def claim_object(api: KubeApi, workflow: WorkflowRef, key: str) -> dict[str, Any]:
    return await api.get(claims_path(workflow.namespace, claim_name(workflow.name, key)))


async def test_acquire_creates_a_claim_owned_by_the_workflow(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    assert await store.acquire(record(owner="ignored", attempt=2, host="h1"))
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    assert obj["spec"] == {
        "workflow": "wf",
        "slotKey": "ISSUE-1#0",
        "issueId": "ISSUE-1",
        "identifier": "ISSUE-1",
        "slotIndex": 0,
    }
    assert obj["status"]["phase"] == "Running"
    assert obj["status"]["owner"] == "leader"
    assert obj["status"]["attempt"] == 2
    assert obj["metadata"]["labels"]["lorenz.dev/workflow"] == "wf"
    (owner,) = obj["metadata"]["ownerReferences"]
    assert owner["uid"] == workflow.uid

    loaded = await store_for(kube_api, workflow, "next", Leadership("next")).load()
    (back,) = loaded.claims
    assert back.owner == "leader"
    assert back.started_at == NOW
    assert back.attempt == 2
    assert loaded.stale_owners == frozenset({"leader"})


async def test_every_record_field_survives_the_round_trip(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    full = record(
        "A#B",  # a '#' inside the issue id: the slot index is after the last one
        3,
        owner="leader",
        phase=ClaimPhase.RETRY_PENDING,
        attempt=4,
        retry_kind=RetryKind.FAILURE,
        due_at=NOW + datetime.timedelta(seconds=80),
        reservation_token="tok",
        host="worker-1",
        workspace_path="/ws/A_B",
        last_agent_at=NOW,
        turn_count=7,
        usage=TokenUsage(input_tokens=1, output_tokens=2, total_tokens=3),
        last_error="agent_exited: boom",
        session_id="s-1",
        updated_at=NOW,
    )
    assert await store.acquire(full)
    (back,) = (await store.load()).claims
    assert back == full


async def test_acquire_takes_over_a_stale_claim_but_not_the_live_holders(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    old = Leadership("old")
    assert await store_for(kube_api, workflow, "old", old).acquire(record())
    # "old" is no longer the holder: its claim is stale and the new leader takes it.
    new = store_for(kube_api, workflow, "new", Leadership("new"))
    assert await new.acquire(record(attempt=1))
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    assert obj["status"]["owner"] == "new"
    # A store whose Lease view says "new" holds it refuses to take new's claim.
    other = store_for(kube_api, workflow, "third", Leadership("new"))
    assert not await other.acquire(record())
    assert (await claim_object(kube_api, workflow, "ISSUE-1#0"))["status"]["owner"] == "new"


async def test_a_conflicting_save_is_retried_after_a_fresh_read_not_overwritten(
    kube_api: KubeApi, workflow: WorkflowRef, kube_control_plane: Cluster
) -> None:
    leadership = Leadership("leader")
    store = store_for(kube_api, workflow, "leader", leadership)
    assert await store.acquire(record())
    name = claim_name("wf", "ISSUE-1#0")
    # Someone else writes the status: our cached resourceVersion is now stale.
    kube_control_plane.kubectl(
        "patch", "claim", name, "-n", workflow.namespace, "--subresource=status",
        "--type=merge", "-p", '{"status": {"lastError": "edited by hand"}}',
    )
    before = kube_api.requests[("get", "claims")]
    await store.save(record(turn_count=5))
    assert kube_api.requests[("get", "claims")] == before + 1  # the fresh read
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    assert obj["status"]["turnCount"] == 5
    assert obj["status"]["owner"] == "leader"

    # A foreign write that makes the live holder someone else is respected.
    kube_control_plane.kubectl(
        "patch", "claim", name, "-n", workflow.namespace, "--subresource=status",
        "--type=merge", "-p", '{"status": {"owner": "usurper"}}',
    )
    leadership.holder = "usurper"
    await store.save(record(turn_count=9))
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    assert obj["status"]["owner"] == "usurper"
    assert obj["status"]["turnCount"] == 5
    assert SlotKey("ISSUE-1#0") not in store.held


async def test_release_deletes_only_the_claim_it_held(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    assert await store.acquire(record())
    await store.release(SlotKey("ISSUE-1#0"))
    claims = await kube_api.list_items(claims_path(workflow.namespace))
    assert claims == []
    await store.release(SlotKey("ISSUE-1#0"))  # no-op

    # A successor Claim of the same name (another uid) survives a stale release.
    assert await store.acquire(record())
    stale = store.held[SlotKey("ISSUE-1#0")]
    fresh_store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    await kube_api.delete(claims_path(workflow.namespace, stale.name))
    assert await fresh_store.acquire(record())
    await store.release(SlotKey("ISSUE-1#0"))
    assert len(await kube_api.list_items(claims_path(workflow.namespace))) == 1


async def test_a_fenced_store_makes_no_requests_and_refuses_acquires(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    leadership = Leadership("leader")
    store = store_for(kube_api, workflow, "leader", leadership)
    assert await store.acquire(record())
    leadership.writable = False
    before = kube_api.total_requests
    assert not await store.acquire(record("ISSUE-2"))
    await store.save(record(turn_count=3))
    await store.release(SlotKey("ISSUE-1#0"))
    await store.save_checkpoint({"schema": 1})
    await store.heartbeat()
    assert kube_api.total_requests == before
    assert store.fenced_writes == 4
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    assert obj["status"]["turnCount"] == 0


async def test_checkpoint_lives_in_the_workflow_status(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    checkpoint = {"schema": 1, "usage_totals": {"input_tokens": 5, "seconds_running": 1.5}}
    await store.save_checkpoint(checkpoint)
    assert (await store.load()).checkpoint == checkpoint


async def test_a_terms_first_load_takes_the_checkpoint_from_its_finalizer_edits_answer(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    checkpoint = {"schema": 1, "usage_totals": {"input_tokens": 5, "seconds_running": 1.5}}
    await store_for(kube_api, workflow, "old", Leadership("old")).save_checkpoint(checkpoint)
    # The new term's first request: the finalizer edit, whose answer is the whole Workflow.
    answers: list[Any] = []
    assert await edit_finalizer(
        api=kube_api, workflow=workflow, add=True, on_answer=answers.append
    )
    assert answers[-1]["metadata"]["finalizers"] == ["lorenz.dev/cleanup"]
    store = ClaimResourceStore(
        api=kube_api, workflow=workflow, owner="new", holder=lambda: "new",
        may_write=lambda: True, workflow_object=answers[-1],
    )
    reads = kube_api.requests[("get", "workflows")]
    assert (await store.load()).checkpoint == checkpoint
    assert kube_api.requests[("get", "workflows")] == reads  # no read of the Workflow
    # Once only: a later load of the term (a restarted runtime) reads what the term wrote.
    newer = {"schema": 1, "usage_totals": {"input_tokens": 9, "seconds_running": 2.5}}
    await store.save_checkpoint(newer)
    assert (await store.load()).checkpoint == newer
    assert kube_api.requests[("get", "workflows")] == reads + 1


async def test_a_deleted_claim_is_reported_once_and_only_for_its_uid(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    assert await store.acquire(record())
    held = store.held[SlotKey("ISSUE-1#0")]
    assert not store.claim_deleted(uid="someone-else", slot_key=SlotKey("ISSUE-1#0"))
    assert store.claim_deleted(uid=held.uid, slot_key=SlotKey("ISSUE-1#0"))
    assert not store.claim_deleted(uid=held.uid, slot_key=SlotKey("ISSUE-1#0"))


async def test_a_new_leader_hydrates_interrupted_runs_into_failure_retries(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    settings = WorkflowSettings.model_validate({"tracker": {"kind": "memory"}})
    clock = ManualClock(wall=NOW)
    old_store = store_for(kube_api, workflow, "old", Leadership("old"))
    old = Orchestrator(settings=settings, store=old_store, clock=clock)
    await old.hydrate()
    issue = Issue(id="ISSUE-1", identifier="ISSUE-1", title="t", state="Todo")
    result = await old.claim(
        DispatchCandidate(issue=issue, slot_index=0, key=SlotKey("ISSUE-1#0"))
    )
    assert isinstance(result, Started)

    new_store = store_for(kube_api, workflow, "new", Leadership("new"))
    new = Orchestrator(settings=settings, store=new_store, clock=clock)
    report = await new.hydrate()
    assert report.interrupted == (SlotKey("ISSUE-1#0"),)
    assert report.taken_over_from == frozenset({"old"})
    obj = await claim_object(kube_api, workflow, "ISSUE-1#0")
    status = obj["status"]
    assert status["owner"] == "new"
    assert status["phase"] == "RetryPending"
    assert status["retryKind"] == "failure"
    assert status["attempt"] == 1
    due = datetime.datetime.fromisoformat(status["dueAt"])
    assert due - NOW == datetime.timedelta(seconds=10)


async def test_an_idle_store_makes_no_requests(kube_api: KubeApi, workflow: WorkflowRef) -> None:
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    assert await store.acquire(record())
    before = kube_api.total_requests
    for _ in range(10):
        await store.heartbeat()
    assert kube_api.total_requests == before


async def test_workflows_listing_their_claims_at_once_share_one_list(
    kube_api: KubeApi, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    refs = []
    for i in range(5):
        body = {
            "apiVersion": "lorenz.dev/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": f"wf-{i}", "namespace": kube_namespace},
            "spec": {"tracker": {"kind": "files", "path": "issues"}},
        }
        created = await kube_api.create(workflows_path(kube_namespace), body)
        ref = WorkflowRef(namespace=kube_namespace, name=f"wf-{i}", uid=created["metadata"]["uid"])
        refs.append(ref)
        for issue in range(i):  # wf-i has i Claims
            store = store_for(kube_api, ref, "leader", Leadership("leader"))
            assert await store.acquire(record(f"ISSUE-{issue}"))
    lister = ClaimLister(api=kube_api)
    lists = kube_api.requests[("list", "claims")]
    found = await asyncio.gather(*(lister.claims_of(ref) for ref in refs))
    assert kube_api.requests[("list", "claims")] == lists + 1  # one list for the five
    for i, items in enumerate(found):
        assert sorted(item["spec"]["issueId"] for item in items) == [
            f"ISSUE-{n}" for n in range(i)
        ]
    # A caller that asks while a list is in flight is answered by a later one: it sees a Claim
    # written after that list started.
    first = asyncio.ensure_future(lister.claims_of(refs[0]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    late = store_for(kube_api, refs[0], "leader", Leadership("leader"))
    assert await late.acquire(record("ISSUE-LATE"))
    second = await lister.claims_of(refs[0])
    assert "ISSUE-LATE" in [item["spec"]["issueId"] for item in second]
    await first
    # The claim store's load goes through the lister when it has one.
    store = ClaimResourceStore(
        api=kube_api, workflow=refs[4], owner="next", holder=lambda: "next",
        may_write=lambda: True, lister=lister,
    )
    before = lister.lists
    assert len((await store.load()).claims) == 4
    assert lister.lists == before + 1


async def test_a_new_leader_continues_the_days_spend_from_the_workflow_status(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    """The spend ledger lives in ``status.spend.ledger``: a leader killed without closing has
    flushed its charges within a second, and the next leader's first load continues the day's
    and the issue's counts; the deposed one writes nothing more."""
    day = "2026-12-07"
    old_lease = Leadership("old")
    old = store_for(kube_api, workflow, "old", old_lease)
    await old.load()
    await old.add_spend(issue_id="id-1", identifier="ISSUE-1", day=day, tokens=1000, usd=0.25)
    charge = await old.add_spend(
        issue_id="id-2", identifier="ISSUE-2", day=day, tokens=500, usd=0.5
    )
    assert (charge.day.tokens, charge.day.usd) == (1500, 0.75)
    path = workflows_path(workflow.namespace, workflow.name)

    async def stored_ledger() -> Any:
        return ((await kube_api.get(path)).get("status") or {}).get("spend", {}).get("ledger")

    async with asyncio.timeout(30):  # the flush is due within a second
        while not await stored_ledger():
            await asyncio.sleep(0.05)
    # The old leader dies (no close) and loses its Lease; the new one takes over.
    old_lease.writable = False
    new = store_for(kube_api, workflow, "new", Leadership("new"))
    await new.load()
    assert await new.day_spend(day) == charge.day
    assert (await new.issue_spend("id-1")).usd == 0.25
    again = await new.add_spend(
        issue_id="id-1", identifier="ISSUE-1", day=day, tokens=100, usd=0.125
    )
    assert (again.day.tokens, again.day.usd) == (1600, 0.875)
    assert (again.issue.tokens, again.issue.usd) == (1100, 0.375)
    # The deposed leader's late charge is kept in its memory only: its write is refused.
    await old.add_spend(issue_id="id-3", identifier="ISSUE-3", day=day, tokens=7, usd=7.0)
    await new.close()  # graceful: the last charges are written at once
    await old.close()
    ledger = await stored_ledger()
    assert ledger["days"] == [{"day": day, "tokens": 1600, "usd": 0.875}]
    assert [row["identifier"] for row in ledger["issues"]] == ["ISSUE-2", "ISSUE-1"]
    third = store_for(kube_api, workflow, "third", Leadership("third"))
    await third.load()
    assert (await third.day_spend(day)).usd == 0.875
    assert (await third.issue_spend("id-3")).usd == 0.0


async def test_a_malformed_stored_ledger_is_read_as_far_as_it_is_valid(
    kube_api: KubeApi, workflow: WorkflowRef
) -> None:
    path = workflows_path(workflow.namespace, workflow.name, status=True)
    await kube_api.merge_patch(path, {"status": {"spend": {"ledger": {
        "days": [{"day": "2026-12-07", "tokens": 10, "usd": 0.5}, {"day": "x", "usd": -1},
                 "garbage"],
        "issues": [{"id": "id-1", "identifier": "I-1", "tokens": 10, "usd": 0.5, "at": 1},
                   {"id": "id-2", "identifier": "I-2", "tokens": True, "usd": 1}],
    }}}})
    store = store_for(kube_api, workflow, "leader", Leadership("leader"))
    await store.load()
    assert (await store.day_spend("2026-12-07")).usd == 0.5
    assert (await store.day_spend("x")).usd == 0.0
    assert [row.issue_id for row in await store.issue_spends()] == ["id-1"]
@pytest.mark.parametrize("first", ["intent", "bind"])
async def test_a_bind_and_an_intent_write_that_race_both_land(
    kube_api: KubeApi, workflow: WorkflowRef, first: str
) -> None:
    """#37: the bind of a run in a Pod (``save``, phase ``Running``) and the intent write after
    its launch answered (``probing``) go out with one resourceVersion; the one that conflicts
    is written again from the fresh Claim, so neither undoes the other — never a Claim that
    says ``Reserved / spawn_requested`` while its agent runs (whichever wins the race)."""
    from lorenz.model import SpawnIntent, SpawnPhase

    leadership = Leadership("leader")
    store = store_for(kube_api, workflow, "leader", leadership)
    key = SlotKey("ISSUE-1#0")
    assert await store.acquire(record(phase=ClaimPhase.RESERVED, started_at=None))
    handle = "wf-issue-1-0-g1-r0"
    requested = SpawnIntent(handle=handle, phase=SpawnPhase.SPAWN_REQUESTED, generation=None)
    assert await store.record_intent(key, requested)
    probing = SpawnIntent(handle=handle, phase=SpawnPhase.PROBING, generation=None)
    bind = store.save(record(phase=ClaimPhase.RUNNING, turn_count=1))
    intent = store.record_intent(key, probing)
    # NB: both requests leave before either answers (the first await of each is its PATCH).
    if first == "intent":
        await asyncio.gather(intent, bind)
    else:
        await asyncio.gather(bind, intent)
    status = (await claim_object(kube_api, workflow, "ISSUE-1#0"))["status"]
    assert status["phase"] == "Running"
    assert status["turnCount"] == 1
    assert status["intent"]["phase"] == "probing"
    assert status["intent"]["handle"] == handle
    held = store.held[key].record
    assert (held.phase, held.intent.phase if held.intent else None) == (
        ClaimPhase.RUNNING, SpawnPhase.PROBING,
    )
