"""Sharded leadership: a fixed set of shard Leases, balanced between the live replicas.

One Lease per Workflow costs a renewal per Workflow every retry period, so Lease writes grew
with Workflows (0.5 writes/s per idle Workflow at the default 2 s). Instead, every Workflow
belongs to one of ``shards`` shards — :func:`shard_of`, a stable hash of ``<namespace>/<name>``
— and the replica holding that shard's Lease runs it. All Leases live in the operator's own
namespace (never beside the Workflows), so Lease writes grow with shards and replicas only, the
Lease RBAC is one Role in one namespace, and deleting a Workflow's namespace never waits for a
Lease there.

The Leases, all labelled ``lorenz.dev/lease-set=<prefix>``:

* ``<prefix>-shard-<n>`` (``n`` in ``0..shards-1``): client-go leader election per shard
  (:class:`~lorenz.kube.leaderelection.leases.KubernetesLeaseProvider`); its
  ``spec.leaseTransitions`` is the generation of every Workflow in the shard while this term lasts.
* ``<prefix>-replica-<identity>``: one per replica, renewed like a shard; it is how replicas see
  each other, including a replica that holds no shard yet. It carries the replica's shard count
  (``lorenz.dev/shards``).

Every retry period the :class:`ShardCoordinator` of a replica renews its membership and each
shard it holds — on a thread and event loop of their own
(:mod:`lorenz.kube.leaderelection.renewing`) and the operator's dedicated Lease client, so a main
loop held up past the renew deadline does not lose them — and, on the main loop, lists the Lease
set once and balances:

* **fair share**: ``ceil(shards / live replicas)``, live meaning a membership Lease renewed
  within its duration (as observed on the local monotonic clock) or a shard Lease held;
* **below it**: take free shards — never created, released, or unrenewed for a whole lease
  duration — in the replica's own order of preference (rendezvous hashing of identity and shard,
  so replicas racing for free shards mostly want different ones);
* **above it**, while a live peer is below: hand the extras over gracefully — the shard stops
  being offered, its Workflows stop their runtimes (runs end as clean shutdowns, kept in their
  Claims), and only then is the Lease released, so the taker starts at its next round. One
  handover at a time, the least preferred shard first.

So a joining replica takes ``shards / replicas`` shards from the others and a leaving one (SIGTERM:
release; killed: expiry) hands over only its own; nothing else moves.

The fence: a Workflow is led only while its shard's term lasts (:meth:`ShardTerm.holds`: the
Lease still held by this term and renewed within the renew deadline). A lost shard ends its term
at once, before any other replica can take the shard (renew deadline < lease duration), and a
handed-over shard is released only after its Workflows stopped. Generations only grow: a new
term numbers itself above every ``leaseTransitions`` of the set seen so far, so even a Workflow
that moves to another shard (a changed shard count) gets a higher generation than before.

NB: every replica must count the same shards: with different counts one Workflow maps to two
shards, and two replicas could lead it. A replica that sees a live peer with another count (or a
held shard beyond its own range) takes no new shard (``shard_count_mismatch`` in the log) until
that peer is gone, so a rolling update that changes the count waits for the old replicas to stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any, Final

from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi, leases_path
from lorenz.kube.errors import KubeApiError
from lorenz.kube.leaderelection.leases import KubernetesLeaseProvider, LeaseTiming
from lorenz.kube.leaderelection.renewing import LeaseRenewer
from lorenz.tasks import first_of

logger = logging.getLogger("lorenz.kube.sharding")

LEASE_SET_LABEL: Final = f"{resources.GROUP}/lease-set"
"""Label of every Lease of one operator installation (value: the Lease name prefix)."""
LEASE_ROLE_LABEL: Final = f"{resources.GROUP}/lease-role"
"""``shard`` or ``replica``."""
SHARDS_ANNOTATION: Final = f"{resources.GROUP}/shards"
"""The shard count of the replica that wrote the Lease."""

SHARD_ROLE: Final = "shard"
REPLICA_ROLE: Final = "replica"

START_CONCURRENCY: Final = 8
"""Workflow runtimes one replica builds (loads, hydrates, launches) at once.

NB: a replica that takes shards with hundreds of Workflows (1,000 created at once across 3
replicas) would otherwise build them all concurrently and crowd the main loop: before the
renewals had their own thread they waited behind the builds past the renew deadline (measured
on 2 loaded cores: 14 shards lost to their own holders); the listing and balancing still run
there. Queued builds wait on the gate instead of crowding the loop."""

_NOT_NAME_CHARS = re.compile(r"[^a-z0-9-]+")


def shard_of(namespace: str, name: str, *, shards: int) -> int:
    """The shard of Workflow ``namespace/name``: stable across processes, versions and hosts
    (sha256, never Python's salted ``hash``)."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shard_lease_name(prefix: str, index: int) -> str:
    return f"{prefix}-shard-{index}"


def replica_lease_name(prefix: str, identity: str) -> str:
    """``<prefix>-replica-<identity>``, sanitized to a DNS label-ish name plus a hash of the
    exact identity (two identities that sanitize alike still get two Leases)."""
    readable = _NOT_NAME_CHARS.sub("-", identity.lower()).strip("-")[:120].strip("-")
    suffix = resources.digest(identity)
    return f"{prefix}-replica-{readable}-{suffix}" if readable else f"{prefix}-replica-{suffix}"


def preference(identity: str, index: int) -> int:
    """How much ``identity`` wants shard ``index`` (rendezvous hashing: every replica ranks the
    shards differently, so racing replicas mostly go for different free shards)."""
    digest = hashlib.sha256(f"{identity}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class ShardTerm:
    """One term of this replica holding one shard: Workflows lead in it until it ends."""

    def __init__(self, shard: Shard, *, generation: int) -> None:
        self.shard = shard
        self.generation = generation
        """``spec.leaseTransitions`` of the shard Lease when this term began."""
        self.lost = asyncio.Event()
        """The Lease was lost (or released past the handover bound): stop without writing."""
        self.yielding = asyncio.Event()
        """The shard is being handed over: stop gracefully, then let go."""
        self.idle = asyncio.Event()
        """No Workflow is engaged in this term."""
        self.idle.set()
        self._engaged: set[object] = set()

    def holds(self) -> bool:
        """Whether a Workflow of this shard may act as leader *now* (no API call)."""
        return self.shard.term is self and self.shard.lease.holds_lease()

    @property
    def engaged(self) -> int:
        return len(self._engaged)

    def engage(self, token: object) -> None:
        self._engaged.add(token)
        self.idle.clear()

    def disengage(self, token: object) -> None:
        self._engaged.discard(token)
        if not self._engaged:
            self.idle.set()


class Shard:
    """One shard: its Lease and, while this replica holds it, the current term."""

    def __init__(self, index: int, lease: KubernetesLeaseProvider) -> None:
        self.index = index
        self.lease = lease
        self.term: ShardTerm | None = None
        self.available = asyncio.Event()
        """Set while a term runs that is not being handed over (Workflows may start)."""
        self.present = False
        """The Lease existed at the last listing."""

    def acquirable(self) -> bool:
        """Free as observed here: never created, released, or unrenewed for its duration."""
        return self.term is None and (not self.present or self.lease.free())


class ShardCoordinator:
    """This replica's side of sharded leadership: membership, shard terms, balancing."""

    def __init__(
        self,
        *,
        api: KubeApi,
        namespace: str,
        prefix: str,
        shards: int,
        identity: str,
        timing: LeaseTiming | None = None,
        handover_timeout_s: float = 40.0,
        endpoint: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self._api = api
        self.namespace = namespace
        self.prefix = prefix
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self._handover_timeout_s = handover_timeout_s
        self._monotonic = monotonic
        self._endpoint = endpoint
        shard_count = str(shards)
        self.member = self._provider(
            replica_lease_name(prefix, identity), role=REPLICA_ROLE,
            annotations={SHARDS_ANNOTATION: shard_count},
        )
        self.shards = [
            Shard(
                index,
                self._provider(
                    shard_lease_name(prefix, index), role=SHARD_ROLE,
                    annotations={SHARDS_ANNOTATION: shard_count},
                    floor=self._generation_floor,
                ),
            )
            for index in range(shards)
        ]
        self._peers: dict[str, KubernetesLeaseProvider] = {}
        """Observers of the other replicas' membership Leases (by Lease name)."""
        self._foreign_shards: dict[str, KubernetesLeaseProvider] = {}
        """Observers of shard Leases beyond our range (a peer counting more shards)."""
        self._max_transitions = -1
        self._acquiring = True
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._handover: asyncio.Task[None] | None = None
        self._mismatch: str | None = None
        self.rounds = 0
        """Completed rounds (renew, list, balance)."""
        self.start_gate = asyncio.Semaphore(START_CONCURRENCY)
        """Held by a Workflow while its runtime is built (:data:`START_CONCURRENCY`)."""
        self.live_replicas = 1
        self.fair_share = shards
        self.renewer = LeaseRenewer(
            period_s=self.timing.retry_period_s, name=f"lorenz-lease-renewer:{identity}"
        )
        """Renews the membership and the held shards on its own thread and loop."""
        self._available_listeners: list[Callable[[Shard], None]] = []

    # -- facts -----------------------------------------------------------------------------

    def shard_for(self, workflow: WorkflowRef) -> Shard:
        return self.shards[shard_of(workflow.namespace, workflow.name, shards=len(self.shards))]

    def when_available(self, listener: Callable[[Shard], None]) -> None:
        """Call ``listener`` (on the main loop) each time a shard is offered here: a term
        began, so the shard's Workflows may start."""
        self._available_listeners.append(listener)

    def held(self) -> list[int]:
        """Indexes of the shards this replica holds now."""
        return [s.index for s in self.shards if s.term is not None and s.term.holds()]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.renewer.add(self.member.name, self._renew_membership)
        self.renewer.start()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"lorenz-shards:{self.identity}"
        )

    def stop_acquiring(self) -> None:
        """Take no new shard from now on (the process is stopping); keep renewing."""
        self._acquiring = False

    async def close(self) -> None:
        """Stop renewing and release every shard and the membership (after the Workflows
        stopped: a release lets another replica start them at once)."""
        self._acquiring = False
        self._stopped.set()
        if self._handover is not None:
            self._handover.cancel()
            # NB: cancelled just above: how it ended (cancelled, or failing mid-release) is
            # not ours to report; the releases below let go of its shard either way.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._handover
        if self._task is not None:
            # NB: the loop logs every failed round itself and ends once _stopped is set; only
            # its end is awaited here.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        # NB: a renewal in flight ends before the releases below are written (the renewer's
        # last PUT must not land after the release and name this replica again).
        await self.renewer.close()
        held = [s for s in self.shards if s.term is not None]
        for shard in held:
            self._end_term(shard, lost=False)
        await asyncio.gather(
            *(s.lease.release() for s in held), self.member.release(), return_exceptions=True
        )

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                await self.round()
            except Exception:
                logger.exception("Shard round failed identity=%s", self.identity)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout=self.timing.retry_period_s)

    async def round(self) -> None:
        """Observe the Lease set, balance (the renewals run on :attr:`renewer`)."""
        if self.rounds == 0:
            # NB: the first round announces this replica: its membership Lease is written (the
            # renewer's first pass) before the listing that peers starting at the same moment
            # will see.
            await self.renewer.first_pass(timeout_s=2 * self.timing.retry_period_s)
        try:
            items = await self._api.list_items(
                leases_path(self.namespace), label_selector=f"{LEASE_SET_LABEL}={self.prefix}"
            )
        except KubeApiError as exc:
            logger.warning("Lease listing failed namespace=%s error=%s", self.namespace, exc)
            return
        self._observe(items)
        first = self.rounds == 0
        self.rounds += 1
        if first or self._stopped.is_set():
            # NB: the first round only announces this replica (its membership Lease): peers
            # starting at the same moment see each other before anyone takes shards.
            return
        await self._balance()

    def _lost(self, shard: Shard, term: ShardTerm) -> None:
        """The renewer saw ``term``'s Lease lost (another holder, a lost race, the deadline)."""
        if shard.term is not term:
            return
        logger.warning(
            "Shard lost shard=%d identity=%s holder=%s",
            shard.index, self.identity, shard.lease.holder,
        )
        self._end_term(shard, lost=True)

    async def _renew_membership(self) -> bool:
        try:
            return await asyncio.wait_for(
                self.member.try_acquire_or_renew(), timeout=self.timing.request_timeout_s
            )
        except (KubeApiError, TimeoutError) as exc:
            logger.warning("Membership renew failed lease=%s error=%s", self.member.display,
                           str(exc) or repr(exc))
            return False

    def _observe(self, items: list[dict[str, Any]]) -> None:
        by_name = {str((i.get("metadata") or {}).get("name")): i for i in items}
        own = {s.lease.name for s in self.shards} | {self.member.name}
        highest = self._max_transitions
        for item in items:
            labels = (item.get("metadata") or {}).get("labels") or {}
            if labels.get(LEASE_ROLE_LABEL) == SHARD_ROLE:
                transitions = int((item.get("spec") or {}).get("leaseTransitions") or 0)
                highest = max(highest, transitions)
        self._max_transitions = highest
        for shard in self.shards:
            found = by_name.get(shard.lease.name)
            shard.present = found is not None
            if found is not None:
                shard.lease.observe(found)
            else:
                shard.lease.forget()
        seen_peers: set[str] = set()
        seen_foreign: set[str] = set()
        for name, item in by_name.items():
            if name in own:
                continue
            role = ((item.get("metadata") or {}).get("labels") or {}).get(LEASE_ROLE_LABEL)
            table = self._peers if role == REPLICA_ROLE else self._foreign_shards
            (seen_peers if role == REPLICA_ROLE else seen_foreign).add(name)
            observer = table.get(name)
            if observer is None:
                observer = table[name] = self._provider(name, role=str(role))
            observer.observe(item)
        for table, seen in ((self._peers, seen_peers), (self._foreign_shards, seen_foreign)):
            for name in [n for n in table if n not in seen]:
                del table[name]

    def _live_peers(self) -> dict[str, KubernetesLeaseProvider]:
        """Other replicas whose membership Lease is alive, by identity."""
        live: dict[str, KubernetesLeaseProvider] = {}
        for observer in self._peers.values():
            holder = observer.holder
            if holder and holder != self.identity and not observer.free():
                live[holder] = observer
        return live

    def _check_counts(self, peers: dict[str, KubernetesLeaseProvider]) -> str | None:
        mine = str(len(self.shards))
        for holder, observer in sorted(peers.items()):
            theirs = observer.annotations.get(SHARDS_ANNOTATION)
            if theirs is not None and theirs != mine:
                return f"replica {holder} counts {theirs} shards, this one {mine}"
        for name, observer in sorted(self._foreign_shards.items()):
            if observer.holder and not observer.free():
                return f"{name} is held by {observer.holder}, beyond this replica's {mine} shards"
        return None

    async def _balance(self) -> None:
        peers = self._live_peers()
        counts: collections.Counter[str] = collections.Counter()
        for shard in self.shards:
            holder = shard.lease.holder
            if shard.term is None and shard.present and holder and not shard.lease.free():
                counts[holder] += 1
        live = {self.identity, *peers, *counts}
        self.live_replicas = len(live)
        self.fair_share = math.ceil(len(self.shards) / len(live))
        mismatch = self._check_counts(peers)
        if mismatch != self._mismatch:
            self._mismatch = mismatch
            if mismatch is not None:
                logger.error(
                    "shard_count_mismatch: %s; no new shard is taken until every live replica "
                    "uses the same --shards", mismatch,
                )
        mine = [s for s in self.shards if s.term is not None and not s.term.yielding.is_set()]
        if len(mine) < self.fair_share and self._acquiring and mismatch is None:
            wanted = sorted(
                (s for s in self.shards if s.acquirable()),
                key=lambda s: preference(self.identity, s.index),
                reverse=True,
            )[: self.fair_share - len(mine)]
            await asyncio.gather(*(self._acquire(s) for s in wanted))
        elif (
            len(mine) > self.fair_share
            and self._handover is None
            and any(counts[p] < self.fair_share for p in live if p != self.identity)
        ):
            extra = min(mine, key=lambda s: preference(self.identity, s.index))
            self._handover = asyncio.get_running_loop().create_task(
                self._hand_over(extra), name=f"lorenz-shard-handover:{extra.index}"
            )

    async def _acquire(self, shard: Shard) -> None:
        try:
            won = await asyncio.wait_for(
                shard.lease.try_acquire_or_renew(), timeout=self.timing.request_timeout_s * 2
            )
        except (KubeApiError, TimeoutError) as exc:
            logger.warning("Shard acquire failed shard=%d error=%s", shard.index,
                           str(exc) or repr(exc))
            return
        if not won or shard.term is not None or self._stopped.is_set():
            return
        term = shard.term = ShardTerm(shard, generation=shard.lease.transitions)
        self._max_transitions = max(self._max_transitions, shard.lease.transitions)
        self.renewer.add(
            shard.lease.name, shard.lease.renew, on_lost=lambda: self._lost(shard, term)
        )
        shard.available.set()
        self._offered(shard)
        logger.info(
            "Shard acquired shard=%d identity=%s generation=%d fair_share=%d live_replicas=%d",
            shard.index, self.identity, shard.term.generation, self.fair_share,
            self.live_replicas,
        )

    async def _hand_over(self, shard: Shard) -> None:
        """Stop the shard's Workflows gracefully, then release its Lease."""
        term = shard.term
        try:
            if term is None:
                return
            term.yielding.set()
            shard.available.clear()
            logger.info(
                "Shard handover shard=%d identity=%s engaged=%d fair_share=%d",
                shard.index, self.identity, term.engaged, self.fair_share,
            )
            await first_of(term.idle.wait(), term.lost.wait(), timeout_s=self._handover_timeout_s)
            if shard.term is not term:
                return  # lost meanwhile
            if not term.idle.is_set():
                logger.warning(
                    "Shard handover: %d Workflow(s) did not stop in %.0f s; releasing anyway "
                    "(they are fenced from now on) shard=%d",
                    term.engaged, self._handover_timeout_s, shard.index,
                )
            # NB: the renewer lets go of the Lease first (a renewal in flight ends), so the
            # release below is the last write of this term.
            await self.renewer.remove(shard.lease.name)
            if shard.term is not term:
                return  # lost meanwhile
            self._end_term(shard, lost=False)
            await shard.lease.release()
            term.lost.set()  # NB: stragglers past the bound abandon their runs
        finally:
            self._handover = None

    def _offered(self, shard: Shard) -> None:
        """Tell the listeners that ``shard`` is offered here (see :meth:`when_available`)."""
        for listener in self._available_listeners:
            try:
                listener(shard)
            except Exception:
                logger.exception("Shard listener failed shard=%d", shard.index)

    def _end_term(self, shard: Shard, *, lost: bool) -> None:
        term = shard.term
        shard.term = None
        shard.available.clear()
        if lost:
            shard.lease.drop()
        if term is not None and lost:
            term.lost.set()

    # -- pieces ----------------------------------------------------------------------------

    def _generation_floor(self) -> int:
        """A new term numbers itself above every ``leaseTransitions`` seen in the set."""
        return self._max_transitions + 1

    def _provider(
        self,
        name: str,
        *,
        role: str,
        annotations: dict[str, str] | None = None,
        floor: Callable[[], int] | None = None,
    ) -> KubernetesLeaseProvider:
        return KubernetesLeaseProvider(
            api=self._api,
            namespace=self.namespace,
            name=name,
            identity=self.identity,
            timing=self.timing,
            labels={LEASE_SET_LABEL: self.prefix, LEASE_ROLE_LABEL: role},
            annotations=annotations,
            transitions_floor=floor,
            endpoint=self._endpoint,
            monotonic=self._monotonic,
        )
