"""A term's start-up recovery over Claims: the exact set it rebinds, bounded, and nothing else.

Why a module of its own: the SQL stores rebind in one transaction and read back exactly the
moved rows by key (:mod:`lorenz.claims.rebinding`); the API server has no such transaction,
so the Claim store gets there another way, kept apart from the write paths of
:mod:`.store`. A Workflow's Claims all belong to its one leader — the term's Lease holder —
so the Claims listed by the Workflow's own label (``lorenz.dev/workflow``, never every Claim
of the namespace) *are* the set a new term rebinds: its own from an earlier term, and those of
every owner that no longer holds the Lease (stale by definition). Above
:data:`~lorenz.claims.errors.MAX_REBIND` of them the start fails closed with nothing moved;
then each stale owner's Claim is taken, by name, with a status write conditioned on its
``resourceVersion`` (a conflict re-reads that Claim by name, never the list).

NB: a Claim of the live holder when that is not us (this replica is not leading, so it may
not write anyway) is neither rebound, returned nor counted against the bound.
"""

from __future__ import annotations

from lorenz.claims.errors import MAX_REBIND, ClaimRecoveryTooLarge
from lorenz.model import ClaimRecord, ClaimStore, RecoveredClaims, SlotKey


async def recover_listed(store: ClaimStore, *, where: str) -> RecoveredClaims:
    """Rebind the Claims of ``store``'s Workflow that are ours or stale (at most
    :data:`MAX_REBIND`, else ``claim_rebind_too_large`` and nothing moved) and return them.

    ``where`` names the Claims for the error (their namespace)."""
    stored = await store.load()
    own = store.owner
    previous: dict[SlotKey, str] = {
        record.slot_key: record.owner
        for record in stored.claims
        if record.owner == own or record.owner in stored.stale_owners
    }
    if len(previous) > MAX_REBIND:
        # NB: before the first write: nothing is rebound.
        raise ClaimRecoveryTooLarge(
            path=None, where=where, limit=MAX_REBIND, what="claims to rebind"
        )
    claims: dict[SlotKey, ClaimRecord] = {
        record.slot_key: record for record in stored.claims if record.owner == own
    }
    stale = {owner for owner in previous.values() if owner != own}
    for record in await store.take_over(from_owners=stale) if stale else []:
        claims[record.slot_key] = record
    return RecoveredClaims(
        claims=list(claims.values()),
        previous_owners={key: previous[key] for key in claims if key in previous},
        checkpoint=stored.checkpoint,
        # NB: as the list read them, before any move (the store's clock, where it has one).
        retry_ready_in_ms={
            key: ready for key, ready in stored.retry_ready_in_ms.items() if key in claims
        },
    )
