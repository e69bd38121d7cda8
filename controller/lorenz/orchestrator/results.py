"""What the orchestrator hands back: dispatch candidates, claim outcomes, hydration reports.

These are the vocabulary between the decider (the orchestrator) and the actor (the runtime):
the runtime asks for candidates, tries to claim each one, and acts on the outcome — start a run,
start acquiring a worker for a reservation, or emit ``dispatch_skipped`` with the reason.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any, NamedTuple

from lorenz.model import (
    Issue,
    LorenzError,
    ReservationRecord,
    RetryEntry,
    RunningEntry,
    SlotKey,
    TokenUsage,
)
from lorenz.orchestrator.state import BlockedEntry


class DispatchCandidate(NamedTuple):
    """One slot of one eligible issue, in dispatch order.

    NB: a named tuple rather than a dataclass on purpose: eligibility builds one per eligible
    slot on every tick, and a tuple is several times cheaper to construct (and immutable).
    """

    issue: Issue
    slot_index: int
    key: SlotKey
    retry: RetryEntry | None = None
    """The due retry this slot would consume (``None`` for a first run)."""

    @property
    def attempt(self) -> int | None:
        """The attempt the run would carry: the retry's, or ``None`` for a first run."""
        return self.retry.run_attempt if self.retry is not None else None

    @property
    def preferred_host(self) -> str | None:
        """The host a retry would like to go back to."""
        return self.retry.host if self.retry is not None else None


class SkipReason(enum.StrEnum):
    """Why :meth:`~lorenz.orchestrator.Orchestrator.claim` did not claim a candidate."""

    GLOBAL_CAPACITY = "global_capacity"
    STATE_CAPACITY = "state_capacity"
    KIND_CAPACITY = "kind_capacity"
    """The issue's agent kind is at its ``agent.concurrency`` cap."""
    KIND_DISABLED = "kind_disabled"
    """The issue's agent kind has ``agent.concurrency`` 0."""
    WORKER_HOST_CAPACITY = "worker_host_capacity"
    ALREADY_CLAIMED = "already_claimed"
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    """Another live owner of the claim store holds the slot (``acquire`` said no)."""
    NOT_DUE = "not_due"
    STALE_CANDIDATE = "stale_candidate"
    """The candidate carried a retry that is gone (released or replaced) since eligibility."""


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """Static/local path: the slot is running now, on ``entry.host``."""

    entry: RunningEntry


@dataclasses.dataclass(frozen=True, slots=True)
class Reserved:
    """Pool-governed path: the slot is held while the pool finds a host; bind or cancel it."""

    reservation: ReservationRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """Nothing was claimed; ``reason`` is a :class:`SkipReason` (a ``str``)."""

    reason: SkipReason


ClaimResult = Started | Reserved | Skipped


@dataclasses.dataclass(frozen=True, slots=True)
class AgentProgress:
    """What an agent update left on its running slot (``apply_update()``'s answer)."""

    issue_id: str
    identifier: str
    usage: TokenUsage
    """The run's tokens so far, as the orchestrator counts them (deltas of the reports)."""
    message: str | None
    """The agent's last message (an update without one keeps the previous)."""
    at: datetime.datetime | None
    """When the agent last reported (wall clock)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """What :meth:`~lorenz.orchestrator.Orchestrator.finish` ended, and what it scheduled."""

    entry: RunningEntry
    """The running entry as it was when the run ended (usage, session, turns, start time)."""
    retry: RetryEntry | None
    """The retry it wrote; ``None`` when the slot was released instead (``release=True``)."""
    blocked: BlockedEntry | None = None
    """Set (and ``retry`` is ``None``) when the slot was blocked instead of retried."""


@dataclasses.dataclass(frozen=True, slots=True)
class StalledRun:
    """One run :meth:`~lorenz.orchestrator.Orchestrator.finish_stalled` ended as a stall."""

    entry: RunningEntry
    retry: RetryEntry | None
    """The failure retry it wrote; ``None`` when the stall used up the budget (``blocked``)."""
    error: str
    """The stall text the retry carries (``stalled for <ms>ms without agent activity``)."""
    silent_ms: float
    """How long the run had been silent."""
    blocked: BlockedEntry | None = None
    """Set when the stall used up ``retry.max_attempts``: the slot is blocked, not retried."""


@dataclasses.dataclass(frozen=True, slots=True)
class Released:
    """What :meth:`~lorenz.orchestrator.Orchestrator.cleanup_issue` or ``release_slot`` removed.

    Nothing of it was turned into a retry; every claim row of it was released.
    """

    runs: tuple[RunningEntry, ...] = ()
    """Running slots that ended (their time and usage went into the totals)."""
    reservations: tuple[ReservationRecord, ...] = ()
    """Reservations that were dropped (their acquire is still under way in the runtime)."""
    retries: tuple[RetryEntry, ...] = ()
    """Pending retries that were dropped."""

    @property
    def aborted(self) -> tuple[SlotKey, ...]:
        """Keys of the runs and reservations: the runtime aborts those tasks."""
        return (*(e.key for e in self.runs), *(r.key for r in self.reservations))

    @property
    def identifier(self) -> str | None:
        """The issue's identifier, from whatever was removed (``None`` if nothing was)."""
        for entry in self.runs:
            return entry.issue.identifier
        for reservation in self.reservations:
            return reservation.issue.identifier
        for retry in self.retries:
            return retry.identifier
        return None

    def __bool__(self) -> bool:
        return bool(self.runs or self.reservations or self.retries)


@dataclasses.dataclass(frozen=True, slots=True)
class EligibilityReport:
    """Side effects of the last eligibility pass, for the runtime's events and timers."""

    expired: tuple[ReservationRecord, ...] = ()
    """Reservations swept because they outlived ``acquire_timeout_ms * 2 + 60000``."""
    pruned: tuple[RetryEntry, ...] = ()
    """Retries dropped because their issue is no longer an active, routable candidate."""
    unblocked: tuple[BlockedEntry, ...] = ()
    """Blocked slots whose issue changed in the tracker: they retry now."""
    released_blocked: tuple[BlockedEntry, ...] = ()
    """Blocked slots dropped because their issue is no longer an active, routable candidate."""


@dataclasses.dataclass(frozen=True, slots=True)
class HydrationReport:
    """What :meth:`~lorenz.orchestrator.Orchestrator.hydrate` found in the claim store."""

    interrupted: tuple[SlotKey, ...] = ()
    """Running or reserved slots of a lost owner, turned into failure retries."""
    adopting: tuple[SlotKey, ...] = ()
    """Running or reserved slots of a lost owner whose worker may live on: ``adoption``
    retries, due at once (their next run re-attaches to the worker)."""
    restored_retries: tuple[SlotKey, ...] = ()
    """Pending retries restored with their original due time."""
    taken_over_from: frozenset[str] = frozenset()
    """Owners whose claims this process now owns (stale ones, and our own previous life)."""
    usage_restored: bool = False
    """Whether usage totals came back from the checkpoint."""
    problems: tuple[LorenzError, ...] = ()
    """Rows or checkpoint parts that could not be used, each with a stable code."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "interrupted": list(self.interrupted),
            "adopting": list(self.adopting),
            "restored_retries": list(self.restored_retries),
            "taken_over_from": sorted(self.taken_over_from),
            "usage_restored": self.usage_restored,
            "problems": [{"code": p.code, "message": p.message} for p in self.problems],
        }
