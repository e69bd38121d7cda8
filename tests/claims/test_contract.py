"""One ClaimStore contract, run against every store the orchestrator is tested or shipped with.

The cases run on the ``memory`` store (one owner: the ones that need no second owner), on both
SQL backends (``sqlite``, ``turso``), on ``SharedClaims``, the multi-owner double the core
tests use, and — the one-owner cases, on the real API server (``cluster``) — on the operator's
``Claim`` resources (``claims``; between owners they follow the Lease holder, not heartbeats:
``tests/kube/test_claims.py`` and ``tests/kube/test_claim_intents.py``). A core test is only
as good as that double: if it allowed what the real stores refuse (it once let ``acquire``
overwrite a stale owner's row), the core tests would pass on a behaviour no shipped store has,
and a bug of that class — claims that stay stranded because only ``take_over`` may recover
them — would stay invisible to them.
"""

from __future__ import annotations

import dataclasses
import datetime
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from lorenz.claims import ClaimOwnerLost, MemoryClaimStore
from lorenz.claims.owners import ProcessIdentity, current_process
from lorenz.model import ClaimPhase, ManualClock, SlotKey
from tests.claims.records import BACKENDS, claim, keys_of
from tests.orchestrator.factories import SharedClaims

if TYPE_CHECKING:
    from lorenz.kube.clients import KubeApi
    from tests.cluster.cluster import Cluster

CRDS = Path(__file__).resolve().parents[2] / "crds"

STALE_MS = 30_000
T0 = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)

OpenOwner = Callable[[str], Awaitable[Any]]
"""``await open_owner(owner)``: that owner's view of the one store under test."""


@dataclasses.dataclass
class Subject:
    name: str
    open_owner: OpenOwner
    clock: ManualClock


async def _subject(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Subject]:
    clock = ManualClock(wall=T0)
    opened: list[Any] = []
    api: KubeApi | None = None
    if name == "claims":
        # NB: imported here: the operator stack stays out of the other stores' runs.
        from lorenz.kube.api.resources import WorkflowRef
        from lorenz.kube.claims.store import ClaimResourceStore
        from lorenz.kube.clients import KubeApi, workflows_path

        cluster: Cluster = request.getfixturevalue("kube_control_plane")
        namespace: str = request.getfixturevalue("kube_namespace")
        cluster.install_crds(CRDS)
        api = KubeApi.from_kubeconfig(kubeconfig=str(cluster.kubeconfig))
        created = await api.create(
            workflows_path(namespace),
            {
                "apiVersion": "lorenz.dev/v1alpha1",
                "kind": "Workflow",
                "metadata": {"name": "wf", "namespace": namespace},
                "spec": {"tracker": {"kind": "files", "path": "issues"}},
            },
        )
        workflow = WorkflowRef(namespace=namespace, name="wf", uid=created["metadata"]["uid"])
        kube = api

        async def open_owner(owner: str) -> Any:
            # One owner, which holds the Workflow's Lease (a Claim store's staleness rule).
            opened.append(
                ClaimResourceStore(
                    api=kube,
                    workflow=workflow,
                    owner=owner,
                    holder=lambda: owner,
                    may_write=lambda: True,
                    generation=1,
                )
            )
            return opened[-1]

    elif name == "memory":

        async def open_owner(owner: str) -> Any:
            if opened:
                raise AssertionError("the memory store has exactly one owner")
            opened.append(MemoryClaimStore(owner=owner))
            return opened[-1]

    elif name == "double":
        shared = SharedClaims(clock=clock, owner_stale_ms=STALE_MS)

        async def open_owner(owner: str) -> Any:
            opened.append(shared.store(owner))
            return opened[-1]

    else:
        path = tmp_path / "claims.db"

        async def open_owner(owner: str) -> Any:
            store = await BACKENDS[name].open(
                path, owner=owner, owner_stale_ms=STALE_MS, clock=clock
            )
            opened.append(store)
            return store

    yield Subject(name=name, open_owner=open_owner, clock=clock)
    for store in opened:
        await store.close()
    if api is not None:
        await api.close()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        "turso",
        "double",
        pytest.param("claims", marks=pytest.mark.cluster),
    ]
)
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    """Every store: for cases one owner can show."""
    async for subject in _subject(str(request.param), tmp_path, request):
        yield subject


@pytest.fixture(params=["sqlite", "turso", "double"])
async def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    """The stores several owners share: for cases between owners."""
    async for subject in _subject(str(request.param), tmp_path, request):
        yield subject


# -- one owner ------------------------------------------------------------------------------


async def test_acquire_save_release_of_our_own_slot(any_store: Subject) -> None:
    store = await any_store.open_owner("me")
    assert store.owner == "me"
    assert store.durable is (any_store.name != "memory")
    assert await store.acquire(claim("1")) is True
    assert await store.acquire(claim("1")) is True  # already ours
    await store.save(dataclasses.replace(claim("1"), phase=ClaimPhase.RETRY_PENDING, attempt=2))
    [row] = (await store.load()).claims
    assert (row.owner, row.phase, row.attempt) == ("me", ClaimPhase.RETRY_PENDING, 2)
    await store.save(claim("2"))  # a free slot: created
    assert keys_of((await store.load()).claims) == {"1#0", "2#0"}
    await store.release(SlotKey("1#0"))
    await store.release(SlotKey("9#0"))  # absent: a no-op
    assert keys_of((await store.load()).claims) == {"2#0"}


async def test_nobody_takes_over_from_itself(any_store: Subject) -> None:
    store = await any_store.open_owner("me")
    await store.acquire(claim("1"))
    assert await store.take_over(from_owners=["me"]) == []
    assert "me" not in (await store.load()).stale_owners


async def test_checkpoint_round_trip(any_store: Subject) -> None:
    store = await any_store.open_owner("me")
    await store.save_checkpoint({"usage_totals": {"total_tokens": 3}})
    assert (await store.load()).checkpoint == {"usage_totals": {"total_tokens": 3}}


async def test_recover_returns_exactly_our_claims_and_the_checkpoint(any_store: Subject) -> None:
    store = await any_store.open_owner("me")
    await store.acquire(claim("1"))
    await store.acquire(claim("2", phase=ClaimPhase.RETRY_PENDING, attempt=2))
    await store.save_checkpoint({"usage_totals": {"total_tokens": 3}})
    recovered = await store.recover()
    assert {r.slot_key: (r.owner, r.attempt) for r in recovered.claims} == {
        "1#0": ("me", None),
        "2#0": ("me", 2),
    }
    assert recovered.previous_owners == {"1#0": "me", "2#0": "me"}
    assert recovered.checkpoint == {"usage_totals": {"total_tokens": 3}}


# -- several owners -------------------------------------------------------------------------


async def test_recover_rebinds_exactly_the_stale_owners_claims_and_reads_no_live_one(
    shared_store: Subject,
) -> None:
    live = await shared_store.open_owner("live")
    dead = await shared_store.open_owner("dead")
    await live.acquire(claim("1"))
    await dead.acquire(claim("2"))
    await dead.acquire(claim("3", phase=ClaimPhase.RETRY_PENDING, attempt=2))
    shared_store.clock.advance(STALE_MS + 1)
    await live.heartbeat()
    heir = await shared_store.open_owner("heir")
    recovered = await heir.recover()
    assert {r.slot_key: (r.owner, r.attempt) for r in recovered.claims} == {
        "2#0": ("heir", None),
        "3#0": ("heir", 2),
    }
    assert recovered.previous_owners == {"2#0": "dead", "3#0": "dead"}
    owners = {r.slot_key: r.owner for r in (await heir.load()).claims}
    assert owners == {"1#0": "live", "2#0": "heir", "3#0": "heir"}
    assert "dead" not in await heir.stale_owners()  # its heartbeat row went with its claims
    assert await heir.acquire(claim("1")) is False




async def test_acquire_refuses_a_live_owners_slot(shared_store: Subject) -> None:
    a = await shared_store.open_owner("a")
    b = await shared_store.open_owner("b")
    assert await a.acquire(claim("1"))
    assert await b.acquire(claim("1")) is False
    await b.save(dataclasses.replace(claim("1"), last_error="not mine"))
    await b.release(SlotKey("1#0"))
    [row] = (await a.load()).claims
    assert (row.owner, row.last_error) == ("a", None)


async def test_acquire_refuses_a_stale_owners_slot_until_it_is_taken_over(
    shared_store: Subject,
) -> None:
    dead = await shared_store.open_owner("dead")
    await dead.acquire(claim("1"))
    await dead.acquire(claim("2", phase=ClaimPhase.RETRY_PENDING, attempt=2))
    shared_store.clock.advance(STALE_MS + 1)
    heir = await shared_store.open_owner("heir")
    assert (await heir.load()).stale_owners == frozenset({"dead"})
    assert await heir.stale_owners() == frozenset({"dead"})
    # NB: never silently overwritten: a stale owner's slot comes back only through take_over,
    # so that the interrupted run is retried as a failure, not restarted as new work.
    assert await heir.acquire(claim("1")) is False
    await heir.save(dataclasses.replace(claim("1"), last_error="overwritten"))
    assert {r.owner for r in (await heir.load()).claims} == {"dead"}
    taken = await heir.take_over(from_owners=["dead"])
    assert {r.slot_key: (r.owner, r.attempt) for r in taken} == {
        "1#0": ("heir", None),
        "2#0": ("heir", 2),
    }
    assert all(r.updated_at == shared_store.clock.now() for r in taken)
    assert await heir.acquire(claim("1")) is True
    assert "dead" not in await heir.stale_owners()  # its heartbeat row went with its claims


async def test_staleness_is_the_heartbeat_age_by_the_stores_clock(shared_store: Subject) -> None:
    sleeper = await shared_store.open_owner("sleeper")
    await sleeper.acquire(claim("1"))
    shared_store.clock.advance(STALE_MS - 1)
    heir = await shared_store.open_owner("heir")
    assert await heir.stale_owners() == frozenset()
    assert await heir.take_over(from_owners=["sleeper"]) == []
    shared_store.clock.advance(2)
    assert await heir.stale_owners() == frozenset({"sleeper"})
    await sleeper.heartbeat()  # resumed between the heir's look and its take_over
    assert await heir.take_over(from_owners=["sleeper"]) == []
    assert {r.owner for r in (await heir.load()).claims} == {"sleeper"}


async def test_a_closed_owner_is_stale_at_once(shared_store: Subject) -> None:
    a = await shared_store.open_owner("a")
    await a.acquire(claim("1"))
    await a.close()
    b = await shared_store.open_owner("b")
    assert await b.stale_owners() == frozenset({"a"})
    assert keys_of(await b.take_over(from_owners=["a"])) == {"1#0"}


async def test_two_heirs_move_each_claim_once(shared_store: Subject) -> None:
    dead = await shared_store.open_owner("dead")
    for i in range(3):
        await dead.acquire(claim(str(i)))
    shared_store.clock.advance(STALE_MS + 1)
    first = await shared_store.open_owner("first")
    second = await shared_store.open_owner("second")
    assert len(await first.take_over(from_owners=["dead"])) == 3
    assert await second.take_over(from_owners=["dead"]) == []


async def test_a_taken_over_owner_hears_it_once_on_its_next_heartbeat(
    shared_store: Subject,
) -> None:
    sleeper = await shared_store.open_owner("sleeper")
    await sleeper.acquire(claim("1"))
    shared_store.clock.advance(STALE_MS + 1)
    heir = await shared_store.open_owner("heir")
    assert keys_of(await heir.take_over(from_owners=["sleeper"])) == {"1#0"}
    with pytest.raises(ClaimOwnerLost):
        await sleeper.heartbeat()
    await sleeper.heartbeat()  # said once
    assert await sleeper.acquire(claim("1")) is False  # the slot stays the heir's


async def test_an_owner_declared_dead_is_stale_at_once(shared_store: Subject) -> None:
    old = await shared_store.open_owner("old")
    await old.acquire(claim("1"))
    heir = await shared_store.open_owner("heir")
    assert await heir.stale_owners() == frozenset()
    assert await heir.mark_owners_dead(["old", "heir", "nobody"]) == ["old"]
    assert await heir.stale_owners() == frozenset({"old"})
    assert keys_of(await heir.take_over(from_owners=["old"])) == {"1#0"}


# -- owners on this host: proven dead or alive by pid and start time ------------------------


@pytest.fixture
def dead_owner() -> str:
    """The owner id of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = psutil.Process(child.pid).create_time()
    child.kill()
    child.wait()
    me = current_process()
    return ProcessIdentity(host=me.host, pid=child.pid, started_at=started).holder


@pytest.fixture
def reused_pid_owner() -> str:
    """Our own pid, with another start time: the process it named is gone (pid reuse)."""
    me = current_process()
    return ProcessIdentity(host=me.host, pid=me.pid, started_at=me.started_at - 100).holder


async def test_a_dead_local_owner_is_stale_at_once_whatever_its_heartbeat(
    shared_store: Subject, dead_owner: str, reused_pid_owner: str
) -> None:
    for owner, issue in ((dead_owner, "1"), (reused_pid_owner, "2")):
        crashed = await shared_store.open_owner(owner)
        await crashed.acquire(claim(issue))
        await crashed.heartbeat()
    heir = await shared_store.open_owner("heir")
    # Fresh heartbeats, a 30 s threshold, no clock movement: only the proof explains it.
    assert await heir.stale_owners() == frozenset({dead_owner, reused_pid_owner})
    assert (await heir.load()).stale_owners == frozenset({dead_owner, reused_pid_owner})
    assert keys_of(await heir.take_over(from_owners=[dead_owner, reused_pid_owner])) == {
        "1#0",
        "2#0",
    }


async def test_a_live_local_owner_is_never_stale_however_old_its_heartbeat(
    shared_store: Subject,
) -> None:
    alive = current_process().holder
    hung = await shared_store.open_owner(alive)
    await hung.acquire(claim("1"))
    shared_store.clock.advance(STALE_MS * 100)
    heir = await shared_store.open_owner("heir")
    # NB: a hung Lorenz must be stopped, not shadowed: its agents may still be working.
    assert await heir.stale_owners() == frozenset()
    assert await heir.take_over(from_owners=[alive]) == []
    await hung.close()  # a goodbye counts, alive or not
    assert await heir.stale_owners() == frozenset({alive})


async def test_another_hosts_owner_is_judged_by_its_heartbeat(shared_store: Subject) -> None:
    me = current_process()
    remote = ProcessIdentity(host=f"not-{me.host}", pid=me.pid, started_at=me.started_at).holder
    far = await shared_store.open_owner(remote)
    await far.acquire(claim("1"))
    heir = await shared_store.open_owner("heir")
    assert await heir.stale_owners() == frozenset()
    shared_store.clock.advance(STALE_MS + 1)
    assert await heir.stale_owners() == frozenset({remote})
