"""What a claimed slot holds: the reservation or running entry a claim makes, and what a
reservation becomes when its run is bound or given back.

Why a module of its own: a slot's retry carries what its next run needs (attempt, kind,
workspace, the session to resume), and that hand-over happens in three transitions of
:class:`~lorenz.orchestrator.scheduling.Orchestrator` (a claim that starts at once, a
reservation bound later, a reservation given back unplaced). These build the entries, the same
way each time; the orchestrator decides when, under its lock, and persists them.
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets

from lorenz.model import (
    Issue,
    ReservationRecord,
    RetryEntry,
    RetryKind,
    RunningEntry,
)
from lorenz.policies import placement_wait_ms, reservation_lifetime_ms


def running_entry(
    issue: Issue,
    *,
    slot_index: int,
    attempt: int | None,
    retry: RetryEntry | None,
    host: str | None,
    agent_kind: str | None,
    now_ms: float,
    wall: datetime.datetime,
) -> RunningEntry:
    """A run starting now on ``host``, continuing what ``retry`` (if any) handed over.

    A ``placement`` retry hands over no retry kind: its run is still a first run.
    """
    return RunningEntry(
        issue=issue,
        slot_index=slot_index,
        attempt=attempt,
        started_at_ms=now_ms,
        started_at=wall,
        host=host,
        workspace_path=retry.workspace_path if retry is not None else None,
        retry_kind=(
            retry.kind if retry is not None and retry.kind is not RetryKind.PLACEMENT else None
        ),
        agent_kind=agent_kind,
        resume=retry.resume if retry is not None else None,
    )


def new_reservation(
    issue: Issue,
    *,
    slot_index: int,
    attempt: int | None,
    retry: RetryEntry | None,
    acquire_timeout_ms: int,
    agent_kind: str | None,
    now_ms: float,
    wall: datetime.datetime,
) -> ReservationRecord:
    """A reservation made now, with a fresh token, keeping the retry it consumed (a cancel
    puts it back)."""
    lifetime = reservation_lifetime_ms(acquire_timeout_ms)
    return ReservationRecord(
        issue=issue,
        slot_index=slot_index,
        token=secrets.token_hex(8),
        attempt=attempt,
        reserved_at_ms=now_ms,
        expires_at_ms=now_ms + lifetime,
        reserved_at=wall,
        consumed_retry=retry,
        agent_kind=agent_kind,
    )


def placement_retry(
    reservation: ReservationRecord,
    *,
    failures: int,
    error: str,
    code: str,
    now_ms: float,
    wall: datetime.datetime,
) -> RetryEntry:
    """The retry of a reservation whose run could not be placed (``failures`` in a row).

    Due after the placement wait (doubling with each failure): the retry it had consumed comes
    back with its attempt and kind, due no sooner than that; a first run comes back as a
    ``placement`` retry (still a first run). Neither counts as a run.
    """
    wait = placement_wait_ms(failures)
    consumed = reservation.consumed_retry
    if consumed is not None:
        due_ms = max(consumed.due_at_ms, now_ms + wait)
        return dataclasses.replace(
            consumed,
            due_at_ms=due_ms,
            due_at=wall + datetime.timedelta(milliseconds=due_ms - now_ms),
            error=error,
            error_code=code,
        )
    return RetryEntry(
        issue_id=reservation.issue.id,
        identifier=reservation.issue.identifier,
        slot_index=reservation.slot_index,
        attempt=0,
        kind=RetryKind.PLACEMENT,
        due_at_ms=now_ms + wait,
        due_at=wall + datetime.timedelta(milliseconds=wait),
        error=error,
        error_code=code,
    )
