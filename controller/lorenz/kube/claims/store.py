"""The claim store of the operator: one ``Claim`` resource per claimed slot.

The orchestrator persists every claim mutation through :class:`~lorenz.model.ClaimStore`; in
Kubernetes that port is backed by Claim objects in the Workflow's namespace, so a replica that
takes a Workflow over rebuilds the scheduling state from them (``load``), and so does
``kubectl get claims``. The mapping:

==================  ===========================================================================
``acquire``         create the Claim (spec = which slot), then write its status. On 409
                    AlreadyExists read it: ours, or its owner is not the Lease holder → take it
                    (status write with CAS); owned by the live holder → ``False``.
``save``            status merge-patch carrying ``metadata.resourceVersion`` (a CAS); the
                    spawn intent on the Claim is kept (dropped when it goes back to a pending
                    retry: its run is settled).
``record_intent``   the same status write, with the slot's spawn intent (docs/runs.md). An
                    update that only moves ``lastSeq`` is written at most once per
                    ``seq_interval_s`` per Claim (the newest one; the API is not a journal).
``release``         delete, with the uid as precondition (a successor of the same name lives).
``load``            list the Workflow's Claims (label ``lorenz.dev/workflow``) and read the
                    checkpoint from the Workflow's status (the first load of a term takes it
                    from the Workflow the term's finalizer edit got back, when there was one);
                    every owner that is not the current Lease holder is stale.
``recover``         a term's start: that list, bounded, and the take-over of its stale
                    owners' Claims (:mod:`.recovering`).
``take_over``       status writes (CAS) that set the owner to us.
``save_checkpoint`` merge-patch ``status.checkpoint`` of the Workflow; a top-level key the
                    new checkpoint no longer has (``resumes`` once the resumed run
                    ended, ``blocked``…) is sent as ``null``, so the merge removes it.
                    The waiting slots it names show ``WaitingForInput`` on their Claims.
``heartbeat``       nothing: the Lease renewal *is* the heartbeat.
``add_spend``       the spend ledger (:mod:`.spending`): in memory, written whole to
                    ``status.spend.ledger`` of the Workflow at most once a second and at
                    close; read from there at a term's first load.
==================  ===========================================================================

Conflicts (409) are retried with a fresh read, never by overwriting: after the re-read the
write goes ahead only if the Claim is still ours or its owner is not the live holder.

The store keeps a local cache (name, uid, resourceVersion, record) of the Claims it holds. That
is what makes an idle tick cost no Claim requests at all: reads happen at takeover (``load``)
and after a conflict, writes only on mutations.

NB: every write first asks ``may_write`` (the Lease provider's ``holds_lease``): a replica past
its renew deadline turns every mutation into a no-op *before* a follower can take over, so a
deposed leader that has not noticed yet cannot touch Claims its successor now owns.

**Generation fencing.** That check is a timing rule; the compare-and-swap behind it is the
generation. Every status write stamps ``status.generation`` with the store's ``generation``
(the shard term's ``leaseTransitions``, strictly increasing across terms) and is conditioned on
the ``resourceVersion`` of the Claim as last read — a Claim whose generation is *higher* than
ours is refused before any request (``claim_generation_stale``), and one that changed since we
read it answers 409 and is judged again on the fresh read. So a deposed replica, however late
it wakes up, cannot overwrite a Claim its successor has written: the successor's takeover
stamped every Claim it took with the newer generation. The first refusal is reported through
``on_fenced`` and every later write of the store is refused without a request. NB: there is no
fence row shared by all Claims, so a slot new to both (no Claim the successor wrote) is held
back by ``may_write`` alone; the successor takes such a Claim at its next acquire.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from lorenz.claims import ClaimGenerationStale, ClaimRecoveryTooLarge
from lorenz.claims.memory import MemoryClaimStore
from lorenz.claims.spend import IssueSpend, SpendCharge, SpendTotal, check_charge
from lorenz.kube.api import resources
from lorenz.kube.api.casing import camel_keys, snake_keys
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import (
    QUESTION_STATUS_LIMIT,
    ClaimQuestion,
    claim_spec,
    claim_status,
    record_from_claim,
)
from lorenz.kube.claims.clock import retry_field_manager, retry_ready_in_ms
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.claims.recovering import recover_listed
from lorenz.kube.claims.spending import SPEND_FLUSH_S, ledger_document, spend_book
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.errors import KubeApiError, LeaseLost
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    LorenzError,
    RecoveredClaims,
    SlotKey,
    SpawnIntent,
    StoredState,
)
from lorenz.orchestrator.checkpoints import blocked_from_checkpoint

logger = logging.getLogger("lorenz.kube.claims")

MAX_CONFLICT_RETRIES = 5
"""Fresh-read-and-retry rounds for one write before giving up (logged; the write is lost)."""

SEQ_INTERVAL_S: Final = 2.0
"""At most one write per Claim per this many seconds for intents that only move ``lastSeq``."""


@dataclasses.dataclass(slots=True)
class HeldClaim:
    """What the store knows about one Claim it holds."""

    name: str
    uid: str
    resource_version: str
    record: ClaimRecord


class ClaimResourceStore:
    """:class:`~lorenz.model.ClaimStore` over the Claims of one Workflow."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        owner: str,
        holder: Callable[[], str | None],
        may_write: Callable[[], bool],
        generation: int | None = None,
        on_fenced: Callable[[LorenzError], None] | None = None,
        seq_interval_s: float = SEQ_INTERVAL_S,
        workflow_object: Mapping[str, Any] | None = None,
        lister: ClaimLister | None = None,
    ) -> None:
        self._api = api
        self._lister = lister
        """Shares ``load``'s list with other Workflows of the namespace loading at once."""
        self._workflow_object = workflow_object
        """The Workflow as the API server returned it after this term began (used once, by the
        first ``load``): its checkpoint is as fresh as a read's, since only this term writes
        it from then on."""
        self._workflow = workflow
        self._owner = owner
        self._holder = holder
        self._may_write = may_write
        self._generation = generation
        self._on_fenced = on_fenced
        self._seq_interval_s = seq_interval_s
        self._held: dict[SlotKey, HeldClaim] = {}
        self._pending_seq: dict[SlotKey, SpawnIntent] = {}
        """Intents that only moved ``lastSeq``, waiting for their Claim's next write slot."""
        self._seq_flushes: dict[SlotKey, asyncio.Task[None]] = {}
        self._intent_written_at: dict[SlotKey, float] = {}
        self._pods: dict[SlotKey, tuple[str | None, str | None]] = {}
        """The phase and node of each slot's run Pod, as the Pod watch last told
        (:meth:`note_pod`); every status write of the slot carries them."""
        self._questions: dict[SlotKey, ClaimQuestion] = {}
        """The question of each waiting slot, as the last checkpoint named it: a status write
        of such a slot shows phase ``WaitingForInput`` and the question."""
        self._checkpoint_keys: frozenset[str] = frozenset()
        """The top-level keys of ``status.checkpoint`` as last read or written (those a new
        checkpoint leaves out are deleted with ``null``)."""
        self.fenced_writes = 0
        """Mutations refused because this replica may not write (lost or expiring lease)."""
        self._spend: MemoryClaimStore | None = None
        """The spend ledger, once read from the Workflow's status (see :mod:`.spending`)."""
        self._spend_seed: object = None
        """``status.spend.ledger`` as the term's first load read it."""
        self._spend_flush: asyncio.Task[None] | None = None
        self._spend_dirty = False
        self.fenced_out: ClaimGenerationStale | None = None
        """Why every write is refused, once a Claim showed a newer leader generation."""
        self.found_answers: list[resources.ClaimAnswer] = []
        """Answer annotations the last :meth:`load` found on the Claims (set while no leader
        was there to take them); the controller takes them once the runtime runs."""
        self.loaded = asyncio.Event()
        """Set once :meth:`load` has read the Workflow's Claims: until then :attr:`held` names
        none of them, and nothing may be judged by it (the orphan sweep of a new term)."""

    # -- ClaimStore ------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def durable(self) -> bool:
        return True

    @property
    def generation(self) -> int | None:
        """The leader generation every write carries (``None``: unfenced, as in tests)."""
        return self._generation

    @property
    def held(self) -> Mapping[SlotKey, HeldClaim]:
        """The Claims this store holds (read-only view, for the operator and tests)."""
        return self._held

    async def load(self, *, bound: int | None = None) -> StoredState:
        if self._lister is not None:
            items = await self._lister.claims_of(self._workflow)
        else:
            items = await self._api.list_items(
                claims_path(self._workflow.namespace),
                label_selector=resources.workflow_selector(self._workflow.name),
            )
        self._drop_all_pending()
        self._held.clear()
        self.found_answers = []
        records: list[ClaimRecord] = []
        ready: dict[SlotKey, float] = {}
        server_now = self._api.server_date.at_least()
        for item in items:
            if (item.get("spec") or {}).get("workflow") != self._workflow.name:
                continue  # NB: a hashed label value could (in theory) collide
            if (item.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if resources.on_hold(item) is not None:
                continue  # NB: held from Kubernetes: neither a run to resume nor a retry
            try:
                record = record_from_claim(item)
            except ValueError as exc:
                logger.warning(
                    "Claim unreadable, ignored claim=%s/%s error=%s",
                    self._workflow.namespace,
                    (item.get("metadata") or {}).get("name"),
                    exc,
                )
                continue
            records.append(record)
            self._held[record.slot_key] = self._entry(item, record)
            ready_in = retry_ready_in_ms(record, item, server_now=server_now)
            if ready_in is not None:
                ready[record.slot_key] = ready_in
            answer = resources.answer_of(item)
            if answer is not None:
                self.found_answers.append(answer)
        if bound is not None and len(records) > bound:
            # NB: the Claims are listed by this workflow's label only; above the bound nothing
            # is recovered (fail closed), as in the single-host stores.
            self._held.clear()
            raise ClaimRecoveryTooLarge(
                path=None, where=f"namespace {self._workflow.namespace}", limit=bound
            )
        self.loaded.set()
        holder = self._holder()
        stale = frozenset(r.owner for r in records if r.owner != holder)
        checkpoint = await self._read_checkpoint()
        self._questions = waiting_questions(checkpoint)
        return StoredState(
            claims=records, checkpoint=checkpoint, stale_owners=stale, retry_ready_in_ms=ready
        )

    async def recover(self) -> RecoveredClaims:
        """A term's start: the Workflow's Claims, ours and stale ones rebound (see
        :mod:`.recovering`); above the bound the store holds none of them."""
        try:
            return await recover_listed(self, where=f"namespace {self._workflow.namespace}")
        except ClaimRecoveryTooLarge:
            self._held.clear()
            raise

    async def acquire(self, record: ClaimRecord) -> bool:
        self._check_fence(None, key=record.slot_key)
        if not self._writable("acquire", record.slot_key):
            return False
        mine = self._mine(record)
        held = self._held.get(record.slot_key)
        if held is None:
            found = await self._create_or_read(mine)
            if found is None:
                return False
            held = found
            current = held.record
            if current.owner not in ("", self._owner) and current.owner == self._holder():
                return False
        return await self._write_status(
            held, self._kept(mine, held), redo=lambda fresh: self._kept(mine, fresh)
        )

    async def save(self, record: ClaimRecord) -> None:
        self._check_fence(None, key=record.slot_key)
        if not self._writable("save", record.slot_key):
            return
        mine = self._mine(record)
        held = self._held.get(record.slot_key)
        if held is None:
            held = await self._create_or_read(mine)
            if held is None:
                return
        # NB: a seq still waiting for its slot rides along (one write, not two).
        pending = self._pending_seq.get(record.slot_key)
        self._drop_pending(record.slot_key)
        kept = self._kept(mine, held, pending=pending)
        written = await self._write_status(
            held, kept, redo=lambda fresh: self._kept(
                mine, fresh, pending=_still_newer(pending, fresh.record.intent)
            )
        )
        if written and self._held[record.slot_key].record.intent is not None:
            self._intent_written_at[record.slot_key] = time.monotonic()

    async def record_intent(self, key: SlotKey, intent: SpawnIntent | None) -> bool:
        """Write the spawn intent of our Claim of ``key`` (``None`` clears it); ``False`` when
        the Claim is not ours (or not held here).

        NB: an intent that only moved ``last_seq`` (the journal collected so far) is written at
        most once per ``seq_interval_s`` per Claim, the newest one — a successor re-attaches
        after the seq it finds, so an older one only replays a little more. Every other change
        (a phase, a handle) is written at once and pending seqs are dropped.
        """
        self._check_fence(None, key=key)
        held = self._held.get(key)
        if held is None or held.record.owner != self._owner:
            return False
        self._check_fence(held.record, key=key)
        if not self._writable("record_intent", key):
            # NB: raised, not a quiet no-op: the runner starts no worker without its intent.
            raise LeaseLost(
                lease=f"of {self._workflow.display}", holder=self._holder(), since_renew_s=None
            )
        now = datetime.datetime.now(datetime.UTC)
        stamped = dataclasses.replace(intent, updated_at=now) if intent is not None else None
        if stamped is not None and _only_seq_moved(held.record.intent, stamped):
            wait = self._intent_written_at.get(key, 0.0) + self._seq_interval_s
            wait -= time.monotonic()
            if wait > 0:
                self._pending_seq[key] = stamped
                if key not in self._seq_flushes:
                    self._seq_flushes[key] = asyncio.get_running_loop().create_task(
                        self._flush_seq_later(key, wait), name=f"lorenz-claim-seq:{key}"
                    )
                return True
        self._drop_pending(key)
        return await self._write_intent(held, stamped)

    async def flush_intents(self) -> None:
        """Write the intents still waiting for their write slot now (a handover's last step
        before it lets go, so the successor re-attaches after the newest collected seq)."""
        for key in list(self._pending_seq):
            intent = self._pending_seq.pop(key)
            flush = self._seq_flushes.pop(key, None)
            if flush is not None:
                flush.cancel()
            held = self._held.get(key)
            if held is None or not self._may_write() or self.fenced_out is not None:
                continue
            with contextlib.suppress(LorenzError):
                await self._write_intent(held, intent)

    async def release(self, key: SlotKey) -> None:
        self._check_fence(None, key=key)
        held = self._held.get(key)
        if held is None:
            return
        self._check_fence(held.record, key=key)
        if not self._writable("release", key):
            return
        self._drop_pending(key)
        del self._held[key]
        self._pods.pop(key, None)
        try:
            await self._api.delete(
                claims_path(self._workflow.namespace, held.name), uid=held.uid
            )
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                raise

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        self._check_fence(None, key=None)
        owners = set(from_owners) - {self._owner}
        taken: list[ClaimRecord] = []
        for key, held in list(self._held.items()):
            if held.record.owner not in owners:
                continue
            self._check_fence(held.record, key=key)
            if not self._writable("take_over", key):
                break
            mine = self._mine(held.record)  # NB: the intent comes along: it is adopted
            if await self._write_status(
                held, mine, redo=lambda fresh: self._mine(fresh.record)
            ):
                taken.append(copy.copy(mine))
        return taken

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        self._check_fence(None, key=None)
        if not self._writable("save_checkpoint", None):
            return
        path = workflows_path(self._workflow.namespace, self._workflow.name, status=True)
        # NB: camelCase like the rest of the status; the keys are the orchestrator's own.
        document: dict[str, Any] = camel_keys(dict(checkpoint))
        # NB: a merge patch keeps what it does not name: a key the checkpoint dropped (the
        # ``resumes`` of a resumed run that ended, the last ``blocked`` slot) must be nulled.
        patch: dict[str, Any] = {key: None for key in self._checkpoint_keys - document.keys()}
        patch.update(document)
        try:
            await self._api.merge_patch(path, {"status": {"checkpoint": patch}})
        except KubeApiError as exc:
            if not exc.not_found:
                raise
        else:
            self._checkpoint_keys = frozenset(document)
        await self._show_questions(waiting_questions(checkpoint))

    async def _show_questions(self, questions: dict[SlotKey, ClaimQuestion]) -> None:
        """Rewrite the status of each held Claim whose question changed (``WaitingForInput``
        when it waits, its record's phase again once answered or released)."""
        before, self._questions = self._questions, questions
        for key in sorted(before.keys() | questions.keys()):
            if before.get(key) == questions.get(key):
                continue
            held = self._held.get(key)
            if held is None or held.record.owner != self._owner:
                continue
            try:
                await self._write_status(held, held.record, redo=lambda fresh: fresh.record)
            except KubeApiError as exc:  # shown at the slot's next write; never fatal here
                logger.warning(
                    "Claim question not shown workflow=%s slot=%s error=%s",
                    self._workflow.display,
                    key,
                    exc,
                )

    async def heartbeat(self) -> None:
        # NB: the Lease renewal is the heartbeat; only a fenced-out store has news to tell.
        if self.fenced_out is not None:
            raise self.fenced_out

    async def close(self) -> None:
        if self._spend_flush is not None:
            self._spend_flush.cancel()
            self._spend_flush = None
        if self._spend_dirty:
            # NB: a graceful stop writes the last charges; a failed write is only logged.
            try:
                await self._write_spend()
            except Exception:  # closing must not fail on it
                logger.exception("spend ledger not written at close workflow=%s",
                                 self._workflow.display)
        self._drop_all_pending()
        self._held.clear()
        self._pods.clear()

    async def note_pod(
        self, key: SlotKey, *, phase: str | None, node: str | None, write: bool = True
    ) -> bool:
        """Show the phase and node of the run Pod of our Claim of ``key`` (``kubectl get
        claims``); ``True`` when a status write was made.

        NB: rate-limited to one write per phase change: a node alone (the scheduler bound a
        Pending Pod) rides along with the next write, and so does any change noted with
        ``write=False`` (a ``Running`` Pod whose run is about to be bound, a write anyway)."""
        before = self._pods.get(key, (None, None))
        if not self.remember_pod(key, phase=phase, node=node):
            return False
        held = self._held.get(key)
        if not write or phase == before[0] or held is None or held.record.owner != self._owner:
            return False
        if self.fenced_out is not None or not self._may_write():
            return False
        return await self._write_status(held, held.record, redo=lambda fresh: fresh.record)

    def remember_pod(self, key: SlotKey, *, phase: str | None, node: str | None) -> bool:
        """Note the phase and node of the slot's run Pod for the slot's next status write (no
        write of its own); ``True`` when they changed."""
        if self._pods.get(key, (None, None)) == (phase, node):
            return False
        self._pods[key] = (phase, node)
        return True

    def pod_nodes(self) -> dict[SlotKey, str]:
        """The node of each slot's run Pod, where known (``status.placements``)."""
        return {key: node for key, (_, node) in self._pods.items() if node}

    # -- the operator's side ---------------------------------------------------------------

    def claim_deleted(self, *, uid: str, slot_key: SlotKey) -> bool:
        """A watch saw Claim ``uid`` deleted: ``True`` if it was a live Claim of ours that we
        did not delete ourselves (so its run must be cancelled)."""
        held = self._held.get(slot_key)
        if held is None or held.uid != uid:
            return False
        del self._held[slot_key]
        return True

    def claim_held(self, *, uid: str, slot_key: SlotKey) -> bool:
        """A watch saw Claim ``uid`` put on hold: ``True`` if it was a live Claim of ours (its
        run must stop). It is forgotten here, so stopping the run keeps the Claim — and the
        hold — instead of deleting it."""
        held = self._held.get(slot_key)
        if held is None or held.uid != uid:
            return False
        del self._held[slot_key]
        return True

    # -- pieces ----------------------------------------------------------------------------

    def _writable(self, operation: str, key: SlotKey | None) -> bool:
        if self._may_write():
            return True
        self.fenced_writes += 1
        logger.warning(
            "Claim write refused: not the leader workflow=%s operation=%s slot=%s",
            self._workflow.display,
            operation,
            key,
        )
        return False

    def _check_fence(self, current: ClaimRecord | None, *, key: SlotKey | None) -> None:
        """Refuse (``claim_generation_stale``) before any request once a newer generation
        wrote a Claim we were about to write, and from then on, every write."""
        if self.fenced_out is None:
            ours = self._generation
            if current is None or current.generation is None or ours is None:
                return
            theirs = current.generation
            if theirs <= ours:
                return
            self.fenced_out = ClaimGenerationStale(
                path=None, generation=ours, current=theirs, holder=current.owner or None
            )
            logger.warning(
                "Claim write refused: a newer leader generation wrote it workflow=%s slot=%s "
                "generation=%s current=%s",
                self._workflow.display,
                key,
                ours,
                theirs,
            )
            if self._on_fenced is not None:
                self._on_fenced(self.fenced_out)
        self.fenced_writes += 1
        raise self.fenced_out

    def _mine(self, record: ClaimRecord) -> ClaimRecord:
        mine = copy.copy(record)
        mine.owner = self._owner
        mine.generation = self._generation
        return mine

    def _kept(
        self, mine: ClaimRecord, held: HeldClaim, *, pending: SpawnIntent | None = None
    ) -> ClaimRecord:
        """``mine`` with the Claim's spawn intent (or the ``pending`` newer one), as ``save``
        keeps it (the SQL stores' rule): only ``record_intent`` changes it, and a claim back to
        a pending retry drops it."""
        if mine.phase is ClaimPhase.RETRY_PENDING:
            return dataclasses.replace(mine, intent=None)
        return dataclasses.replace(mine, intent=pending or held.record.intent)

    async def _write_intent(self, held: HeldClaim, intent: SpawnIntent | None) -> bool:
        def with_intent(claim: HeldClaim) -> ClaimRecord:
            return dataclasses.replace(
                claim.record, owner=self._owner, generation=self._generation, intent=intent
            )

        written = await self._write_status(held, with_intent(held), redo=with_intent)
        if written:
            self._intent_written_at[held.record.slot_key] = time.monotonic()
        return written

    async def _flush_seq_later(self, key: SlotKey, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
        finally:
            if self._seq_flushes.get(key) is asyncio.current_task():
                del self._seq_flushes[key]
        intent = self._pending_seq.pop(key, None)
        held = self._held.get(key)
        if intent is None or held is None or held.record.owner != self._owner:
            return
        if self.fenced_out is not None or not self._may_write():
            return
        try:
            await self._write_intent(held, intent)
        except Exception as exc:  # noqa: BLE001 - best effort: the next seq or phase rewrites it
            logger.warning(
                "Claim intent write failed workflow=%s slot=%s error=%s",
                self._workflow.display,
                key,
                exc,
            )

    def _drop_all_pending(self) -> None:
        for key in list(self._seq_flushes):
            self._drop_pending(key)
        self._pending_seq.clear()

    def _drop_pending(self, key: SlotKey) -> None:
        self._pending_seq.pop(key, None)
        flush = self._seq_flushes.pop(key, None)
        if flush is not None:
            flush.cancel()

    def _entry(self, obj: Mapping[str, Any], record: ClaimRecord) -> HeldClaim:
        metadata = obj.get("metadata") or {}
        return HeldClaim(
            name=str(metadata["name"]),
            uid=str(metadata["uid"]),
            resource_version=str(metadata["resourceVersion"]),
            record=record,
        )

    def _body(self, record: ClaimRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": resources.claim_name(self._workflow.name, record.slot_key),
            "namespace": self._workflow.namespace,
            "labels": {
                resources.WORKFLOW_LABEL: resources.workflow_label(self._workflow.name),
                resources.SLOT_LABEL: resources.label_value(record.slot_key),
            },
        }
        if self._workflow.uid is not None:
            metadata["ownerReferences"] = [resources.owner_reference(self._workflow)]
        return {
            "apiVersion": resources.API_VERSION,
            "kind": resources.CLAIM_KIND,
            "metadata": metadata,
            "spec": claim_spec(record, workflow=self._workflow.name),
        }

    async def _create_or_read(self, record: ClaimRecord) -> HeldClaim | None:
        """The Claim of ``record``'s slot: created if absent, else read as it is."""
        name = resources.claim_name(self._workflow.name, record.slot_key)
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                created = await self._api.create(
                    claims_path(self._workflow.namespace), self._body(record)
                )
            except KubeApiError as exc:
                if not exc.already_exists:
                    raise
            else:
                held = self._entry(created, record)
                # NB: no status yet (the create ignores it): until the status write, a reader
                # would see an ownerless Reserved claim.
                held.record = dataclasses.replace(record, owner="")
                return held
            existing = await self._read(name)
            if existing is not None and resources.on_hold(existing) is not None:
                return None  # held from Kubernetes: not dispatched while the annotation stays
            if existing is not None:
                return self._entry(existing, record_from_claim(existing))
        logger.warning("Claim kept vanishing and reappearing claim=%s", name)
        return None

    async def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._api.get(claims_path(self._workflow.namespace, name))
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise

    async def _write_status(
        self,
        held: HeldClaim,
        record: ClaimRecord,
        *,
        redo: Callable[[HeldClaim], ClaimRecord],
    ) -> bool:
        """CAS-write ``record`` as the status; on conflict re-read and re-decide.

        ``redo`` makes the record again from the Claim as re-read after a conflict: each write
        changes only what it is about (an intent write the intent, a save the run's fields
        with the intent kept, a Pod note nothing but the Pod's fields), and takes the rest from
        the fresh Claim. NB: writing ``record`` again as it was undid the write that won: the
        bind of a run (``save``, phase ``Running``) and the intent write after its launch
        (``probing``) race with one resourceVersion, and the loser's retry put back either
        ``Reserved`` or ``spawn_requested`` — a Claim that said ``Reserved /
        spawn_requested`` while its agent ran (#37).
        """
        for _ in range(MAX_CONFLICT_RETRIES):
            self._check_fence(held.record, key=record.slot_key)
            if not self._writable("status", record.slot_key):
                return False
            status = claim_status(record, question=self._questions.get(record.slot_key))
            status["podPhase"], status["node"] = self._pods.get(record.slot_key, (None, None))
            patch = {"metadata": {"resourceVersion": held.resource_version}, "status": status}
            path = claims_path(self._workflow.namespace, held.name, status=True)
            # NB: a write that schedules a retry is stamped by the server (see .clock).
            manager = retry_field_manager(before=held.record, after=record)
            try:
                written = await self._api.merge_patch(path, patch, field_manager=manager)
            except KubeApiError as exc:
                if exc.not_found:
                    self._forget(record.slot_key, held)
                    return False
                if not exc.conflict:
                    raise
                fresh = await self._read(held.name)
                if fresh is None or (fresh.get("metadata") or {}).get("uid") != held.uid:
                    # Deleted (perhaps re-created) by someone else: not ours to write.
                    self._forget(record.slot_key, held)
                    return False
                current = record_from_claim(fresh)
                self._check_fence(current, key=record.slot_key)
                if current.owner not in ("", self._owner) and current.owner == self._holder():
                    self._forget(record.slot_key, held)
                    return False
                held = self._entry(fresh, current)
                record = redo(held)
                continue
            held = self._entry(written, record)
            self._held[record.slot_key] = held
            return True
        logger.warning(
            "Claim status write kept conflicting, gave up claim=%s/%s",
            self._workflow.namespace,
            held.name,
        )
        return False

    def _forget(self, key: SlotKey, held: HeldClaim) -> None:
        current = self._held.get(key)
        if current is not None and current.uid == held.uid:
            del self._held[key]

    async def _read_checkpoint(self) -> Mapping[str, Any] | None:
        workflow, self._workflow_object = self._workflow_object, None
        # NB: never the watched object: a previous leader's last checkpoint may not have
        # reached this replica's watch yet when it takes over.
        if workflow is None:
            try:
                workflow = await self._api.get(
                    workflows_path(self._workflow.namespace, self._workflow.name)
                )
            except KubeApiError as exc:
                if exc.not_found:
                    return None
                raise
        status = workflow.get("status") or {}
        spend = status.get("spend") if isinstance(status, Mapping) else None
        if self._spend is None and isinstance(spend, Mapping):
            self._spend_seed = spend.get("ledger")
        checkpoint = status.get("checkpoint") if isinstance(status, Mapping) else None
        if not isinstance(checkpoint, Mapping):
            self._checkpoint_keys = frozenset()
            return None
        self._checkpoint_keys = frozenset(str(key) for key in checkpoint)
        read: Mapping[str, Any] = snake_keys(dict(checkpoint))
        return read

    # -- the spend ledger (lorenz.claims.spend.SpendLedger) -------------------------------------

    async def add_spend(
        self, *, issue_id: str, identifier: str, day: str, tokens: int, usd: float
    ) -> SpendCharge:
        check_charge(tokens=tokens, usd=usd)
        book = await self._spend_book()
        charge = await book.add_spend(
            issue_id=issue_id, identifier=identifier, day=day, tokens=tokens, usd=usd
        )
        self._spend_dirty = True
        if self._spend_flush is None or self._spend_flush.done():
            self._spend_flush = asyncio.get_running_loop().create_task(
                self._flush_spend_later(), name=f"lorenz-spend-flush:{self._workflow.display}"
            )
        return charge

    async def issue_spend(self, issue_id: str) -> SpendTotal:
        return await (await self._spend_book()).issue_spend(issue_id)

    async def day_spend(self, day: str) -> SpendTotal:
        return await (await self._spend_book()).day_spend(day)

    async def issue_spends(self, *, limit: int = 100) -> list[IssueSpend]:
        return await (await self._spend_book()).issue_spends(limit=limit)

    async def _spend_book(self) -> MemoryClaimStore:
        if self._spend is None:
            seed = self._spend_seed
            if seed is None:
                try:
                    workflow = await self._api.get(
                        workflows_path(self._workflow.namespace, self._workflow.name)
                    )
                except KubeApiError as exc:
                    if not exc.not_found:
                        raise
                    workflow = {}
                status = workflow.get("status") or {}
                spend = status.get("spend") if isinstance(status, Mapping) else None
                seed = spend.get("ledger") if isinstance(spend, Mapping) else None
            if self._spend is None:  # NB: a concurrent first read may have filled it
                self._spend = spend_book(seed)
        return self._spend

    async def _flush_spend_later(self) -> None:
        await asyncio.sleep(SPEND_FLUSH_S)
        try:
            await self._write_spend()
        except Exception:  # kept dirty: the next charge or close writes it
            logger.exception("spend ledger write failed workflow=%s", self._workflow.display)

    async def _write_spend(self) -> None:
        """Write the whole ledger to ``status.spend.ledger`` (only the leader writes it)."""
        book = self._spend
        if book is None or self.fenced_out is not None or not self._may_write():
            return
        self._spend_dirty = False
        path = workflows_path(self._workflow.namespace, self._workflow.name, status=True)
        try:
            await self._api.merge_patch(
                path, {"status": {"spend": {"ledger": ledger_document(book)}}}
            )
        except KubeApiError as exc:
            if not exc.not_found:
                self._spend_dirty = True
                raise
        except BaseException:
            self._spend_dirty = True
            raise


def _still_newer(pending: SpawnIntent | None, stored: SpawnIntent | None) -> SpawnIntent | None:
    """``pending`` (a seq waiting for its write slot) if it only moves the seq of ``stored``,
    the intent a fresh read found; ``None`` when ``stored`` moved on meanwhile (a new phase or
    handle written by another write), which then stays."""
    if pending is None or stored is None or not _only_seq_moved(stored, pending):
        return None
    return pending if pending.last_seq >= stored.last_seq else None
def waiting_questions(checkpoint: Mapping[str, Any] | None) -> dict[SlotKey, ClaimQuestion]:
    """The waiting slots of an orchestrator checkpoint (snake_case keys) and their questions,
    bounded for a Claim's status."""
    rows = checkpoint.get("blocked") if isinstance(checkpoint, Mapping) else None
    questions: dict[SlotKey, ClaimQuestion] = {}
    for row in rows if isinstance(rows, list) else ():
        blocked = blocked_from_checkpoint(row)
        if blocked is None or not blocked.waiting or blocked.question is None:
            continue
        question = blocked.question
        text = question.text
        if len(text) > QUESTION_STATUS_LIMIT:
            text = text[: QUESTION_STATUS_LIMIT - 1] + "…"
        questions[blocked.key] = ClaimQuestion(
            text=text,
            options=[option[:200] for option in question.options[:20]],
            session_id=question.session_id,
            asked_at=blocked.blocked_at,
            posted=blocked.question_posted,
        )
    return questions


def _only_seq_moved(before: SpawnIntent | None, after: SpawnIntent) -> bool:
    """Whether ``after`` differs from ``before`` in the collected seq (and its time) alone."""
    if before is None:
        return False
    return (before.handle, before.phase, before.generation, before.placement) == (
        after.handle,
        after.phase,
        after.generation,
        after.placement,
    )
