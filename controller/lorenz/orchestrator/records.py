"""The persisted form of each in-process record, as the claim store receives it.

In-process records carry monotonic deadlines; a :class:`~lorenz.model.ClaimRecord` carries the
wall-clock equivalents, because monotonic time means nothing after a restart. Keeping the
conversions in one module means every phase is written the same way by every transition.
"""

from __future__ import annotations

import datetime

from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    ReservationRecord,
    RetryEntry,
    RunningEntry,
)


def running_record(
    entry: RunningEntry, *, owner: str, now: datetime.datetime, reservation_token: str | None = None
) -> ClaimRecord:
    return ClaimRecord(
        slot_key=entry.key,
        issue_id=entry.issue.id,
        identifier=entry.issue.identifier,
        slot_index=entry.slot_index,
        phase=ClaimPhase.RUNNING,
        owner=owner,
        attempt=entry.attempt,
        retry_kind=entry.retry_kind,
        reservation_token=reservation_token,
        host=entry.host,
        workspace_path=entry.workspace_path,
        started_at=entry.started_at,
        last_agent_at=entry.last_agent_at,
        turn_count=entry.turn_count,
        usage=entry.usage,
        session_id=entry.session_id,
        updated_at=now,
    )


def reserved_record(
    reservation: ReservationRecord, *, owner: str, now: datetime.datetime
) -> ClaimRecord:
    retry = reservation.consumed_retry
    return ClaimRecord(
        slot_key=reservation.key,
        issue_id=reservation.issue.id,
        identifier=reservation.issue.identifier,
        slot_index=reservation.slot_index,
        phase=ClaimPhase.RESERVED,
        owner=owner,
        attempt=reservation.attempt,
        retry_kind=retry.kind if retry else None,
        reservation_token=reservation.token,
        host=retry.host if retry else None,
        workspace_path=retry.workspace_path if retry else None,
        started_at=reservation.reserved_at,
        last_error=retry.error if retry else None,
        updated_at=now,
    )


def retry_record(retry: RetryEntry, *, owner: str, now: datetime.datetime) -> ClaimRecord:
    return ClaimRecord(
        slot_key=retry.key,
        issue_id=retry.issue_id,
        identifier=retry.identifier,
        slot_index=retry.slot_index,
        phase=ClaimPhase.RETRY_PENDING,
        owner=owner,
        attempt=retry.attempt,
        retry_kind=retry.kind,
        due_at=retry.due_at,
        host=retry.host,
        workspace_path=retry.workspace_path,
        last_error=retry.error,
        updated_at=now,
    )
