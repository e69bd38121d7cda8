"""When a pending retry on a Claim is due, by the API server's clock rather than ours.

A Claim's ``dueAt`` and ``updatedAt`` are the writer's wall clock. A controller that restarts
(or takes a Workflow over) with a clock hours ahead would run every pending retry at once, and
one hours behind would wait hours (issue #32; seed 004: the storage clock decides, "the
daemon's wall clock never releases that capacity"). So, as the SQL stores do with their
``stored_at``, only the writer's *delay* is taken from the Claim (``dueAt - updatedAt``: both
its own clock, so its skew cancels), and it is counted on the API server's clock:

* **when it was written**: every status write that schedules a retry is sent with the field
  manager :data:`RETRY_FIELD_MANAGER` (:func:`retry_field_manager`), and the API server stamps
  that manager's ``metadata.managedFields`` entry with its own time whenever such a write
  changes a field. The stamp is the write's only while the entry still owns
  ``status.updatedAt`` and ``status.dueAt``: another manager's write of them (an older
  operator, ``kubectl``) takes them away, and the Claim falls back to its wall-clock ``dueAt``.
  NB: a later write of the same manager that changes other fields moves the stamp later, never
  earlier: the retry then waits a little longer, never less. NB: a retry write that leaves
  ``updatedAt`` as it was (only a frozen test clock does) does not own it: wall clock.
* **now**: the ``Date`` header of the API server's last answer (the list that ``load`` just
  read, or newer), plus the time since it arrived on our monotonic clock
  (:class:`~lorenz.kube.clients.ServerDate`).

Both have whole seconds, cut down. The elapsed time is taken as ``now - stamp - 1 s`` (the
write may have happened up to a second after its stamp says; ``now`` is already a lower
bound) and never below zero, so a retry is due at most about two seconds later than exactly,
and never earlier. NB: with several API servers, each stamps with its own clock; they are
assumed to agree (NTP), as etcd's leases and every controller's Lease already assume.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from lorenz.model import ClaimPhase, ClaimRecord

RETRY_FIELD_MANAGER: Final = "lorenz-retry"
"""The field manager of the status writes that schedule a pending retry."""

STAMP_RESOLUTION: Final = datetime.timedelta(seconds=1)
"""``managedFields[].time`` and ``Date`` carry whole seconds, cut down."""

_RETRY_FIELDS: Final = ("f:updatedAt", "f:dueAt")
"""The status fields the retry manager must still own for its stamp to be their write's."""


def retry_field_manager(*, before: ClaimRecord, after: ClaimRecord) -> str | None:
    """The field manager of a status write from ``before`` (the Claim as held) to ``after``:
    :data:`RETRY_FIELD_MANAGER` when it schedules a pending retry (a new ``dueAt`` or
    ``updatedAt``, or the Claim's first status); ``None`` (the default manager) for the rest
    (a takeover, a Pod's phase, a question shown), which must not move the retry's stamp."""
    if after.phase is not ClaimPhase.RETRY_PENDING:
        return None
    if not before.owner:
        return RETRY_FIELD_MANAGER  # NB: a Claim just created: its first status is this write
    if (before.phase, before.due_at, before.updated_at) != (
        after.phase,
        after.due_at,
        after.updated_at,
    ):
        return RETRY_FIELD_MANAGER
    return None


def retry_written_at(claim: Mapping[str, Any]) -> datetime.datetime | None:
    """The API server's time of the write that scheduled the Claim's pending retry (whole
    seconds), or ``None`` when the Claim does not show it (see the module's rules)."""
    entries = (claim.get("metadata") or {}).get("managedFields")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping) or entry.get("manager") != RETRY_FIELD_MANAGER:
            continue
        if entry.get("subresource") != "status" or entry.get("operation") != "Update":
            continue
        fields = entry.get("fieldsV1")
        status = fields.get("f:status") if isinstance(fields, Mapping) else None
        if not isinstance(status, Mapping) or not all(f in status for f in _RETRY_FIELDS):
            return None  # NB: another manager wrote them since: not this stamp's retry
        stamp = entry.get("time")
        if not isinstance(stamp, str):
            return None
        try:
            when = datetime.datetime.fromisoformat(stamp)
        except ValueError:
            return None
        return when if when.tzinfo is not None else None
    return None


def retry_ready_in_ms(
    record: ClaimRecord, claim: Mapping[str, Any], *, server_now: datetime.datetime | None
) -> float | None:
    """Milliseconds until ``record``'s pending retry is due on the API server's clock
    (negative: overdue); ``None`` when the Claim does not tell (not a pending retry, no stamp,
    no ``Date`` yet): its wall-clock ``dueAt`` is used then, as before."""
    if record.phase is not ClaimPhase.RETRY_PENDING or server_now is None:
        return None
    if record.due_at is None or record.updated_at is None:
        return None
    written = retry_written_at(claim)
    if written is None:
        return None
    delay = record.due_at - record.updated_at
    elapsed = max(datetime.timedelta(0), server_now - written - STAMP_RESOLUTION)
    return (delay - elapsed).total_seconds() * 1000.0
