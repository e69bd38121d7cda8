"""The claim store of the operator: one ``Claim`` resource per claimed slot.

The orchestrator persists every claim mutation through :class:`~lorenz.model.ClaimStore`; in
Kubernetes that port is backed by Claim objects in the Workflow's namespace, so a replica that
takes a Workflow over rebuilds the scheduling state from them (``load``), and so does
``kubectl get claims``. The mapping:

==================  ===========================================================================
``acquire``         create the Claim (spec = which slot), then write its status. On 409
                    AlreadyExists read it: ours, or its owner is not the Lease holder → take it
                    (status write with CAS); owned by the live holder → ``False``.
``save``            status merge-patch carrying ``metadata.resourceVersion`` (a CAS).
``release``         delete, with the uid as precondition (a successor of the same name lives).
``load``            list the Workflow's Claims (label ``lorenz.dev/workflow``) and read the
                    checkpoint from the Workflow's status; every owner that is not the current
                    Lease holder is stale.
``take_over``       status writes (CAS) that set the owner to us.
``save_checkpoint`` merge-patch ``status.checkpoint`` of the Workflow.
``heartbeat``       nothing: the Lease renewal *is* the heartbeat.
==================  ===========================================================================

Conflicts (409) are retried with a fresh read, never by overwriting: after the re-read the
write goes ahead only if the Claim is still ours or its owner is not the live holder.

The store keeps a local cache (name, uid, resourceVersion, record) of the Claims it holds. That
is what makes an idle tick cost no Claim requests at all: reads happen at takeover (``load``)
and after a conflict, writes only on mutations.

NB: every write first asks ``may_write`` (the Lease provider's ``holds_lease``): a replica past
its renew deadline turns every mutation into a no-op *before* a follower can take over, so a
deposed leader that has not noticed yet cannot touch Claims its successor now owns.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lorenz.kube import resources
from lorenz.kube.casing import camel_keys, snake_keys
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.errors import KubeApiError
from lorenz.kube.resources import WorkflowRef
from lorenz.kube.statuses import claim_spec, claim_status, record_from_claim
from lorenz.model import ClaimRecord, SlotKey, StoredState

logger = logging.getLogger("lorenz.kube.claims")

MAX_CONFLICT_RETRIES = 5
"""Fresh-read-and-retry rounds for one write before giving up (logged; the write is lost)."""


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
    ) -> None:
        self._api = api
        self._workflow = workflow
        self._owner = owner
        self._holder = holder
        self._may_write = may_write
        self._held: dict[SlotKey, HeldClaim] = {}
        self.fenced_writes = 0
        """Mutations refused because this replica may not write (lost or expiring lease)."""

    # -- ClaimStore ------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        return self._owner

    @property
    def durable(self) -> bool:
        return True

    @property
    def held(self) -> Mapping[SlotKey, HeldClaim]:
        """The Claims this store holds (read-only view, for the operator and tests)."""
        return self._held

    async def load(self) -> StoredState:
        items = await self._api.list_items(
            claims_path(self._workflow.namespace),
            label_selector=resources.workflow_selector(self._workflow.name),
        )
        self._held.clear()
        records: list[ClaimRecord] = []
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
        holder = self._holder()
        stale = frozenset(r.owner for r in records if r.owner != holder)
        checkpoint = await self._read_checkpoint()
        return StoredState(claims=records, checkpoint=checkpoint, stale_owners=stale)

    async def acquire(self, record: ClaimRecord) -> bool:
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
        return await self._write_status(held, mine)

    async def save(self, record: ClaimRecord) -> None:
        if not self._writable("save", record.slot_key):
            return
        mine = self._mine(record)
        held = self._held.get(record.slot_key)
        if held is None:
            held = await self._create_or_read(mine)
            if held is None:
                return
        await self._write_status(held, mine)

    async def release(self, key: SlotKey) -> None:
        held = self._held.get(key)
        if held is None:
            return
        if not self._writable("release", key):
            return
        del self._held[key]
        try:
            await self._api.delete(
                claims_path(self._workflow.namespace, held.name), uid=held.uid
            )
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                raise

    async def take_over(self, *, from_owners: Iterable[str]) -> list[ClaimRecord]:
        owners = set(from_owners) - {self._owner}
        taken: list[ClaimRecord] = []
        for key, held in list(self._held.items()):
            if held.record.owner not in owners:
                continue
            if not self._writable("take_over", key):
                break
            mine = self._mine(held.record)
            if await self._write_status(held, mine):
                taken.append(copy.copy(mine))
        return taken

    async def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        if not self._writable("save_checkpoint", None):
            return
        path = workflows_path(self._workflow.namespace, self._workflow.name, status=True)
        try:
            # NB: camelCase like the rest of the status; the keys are the orchestrator's own.
            await self._api.merge_patch(
                path, {"status": {"checkpoint": camel_keys(dict(checkpoint))}}
            )
        except KubeApiError as exc:
            if not exc.not_found:
                raise

    async def heartbeat(self) -> None:
        return None

    async def close(self) -> None:
        self._held.clear()

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

    def _mine(self, record: ClaimRecord) -> ClaimRecord:
        mine = copy.copy(record)
        mine.owner = self._owner
        return mine

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

    async def _write_status(self, held: HeldClaim, record: ClaimRecord) -> bool:
        """CAS-write ``record`` as the status; on conflict re-read and re-decide."""
        for _ in range(MAX_CONFLICT_RETRIES):
            if not self._writable("status", record.slot_key):
                return False
            patch = {
                "metadata": {"resourceVersion": held.resource_version},
                "status": claim_status(record),
            }
            path = claims_path(self._workflow.namespace, held.name, status=True)
            try:
                written = await self._api.merge_patch(path, patch)
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
                if current.owner not in ("", self._owner) and current.owner == self._holder():
                    self._forget(record.slot_key, held)
                    return False
                held = self._entry(fresh, current)
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
        try:
            workflow = await self._api.get(
                workflows_path(self._workflow.namespace, self._workflow.name)
            )
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise
        checkpoint = (workflow.get("status") or {}).get("checkpoint")
        return snake_keys(dict(checkpoint)) if isinstance(checkpoint, Mapping) else None
