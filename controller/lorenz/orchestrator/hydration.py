"""Hydration planning: what a claim store's rows mean to a starting or recovering orchestrator.

Why a module of its own: recovery is where a restart either keeps its promises (no slot run
twice, no retry state lost) or breaks them, so its rules are pure functions of the stored rows,
the owner facts and the clock readings — tested table-style without a store, an event loop or
an orchestrator. :class:`~lorenz.orchestrator.scheduling.Orchestrator` (through
:mod:`lorenz.orchestrator.recovery`) reads the store, calls these, and applies the result to
its state under its lock; nothing here touches state or I/O.

The rules, in one place:

* a row whose slot key does not match its issue and slot index is a problem, never recovered;
* rows of our own owner (a previous life) and of stale owners are recovered: the store
  rebinds them to us and reads back exactly those (``ClaimStore.recover``); rows of live
  other owners are never read at start-up (``acquire`` refuses their slots when they come up,
  and the orchestrator remembers them as foreign then);
* a recovered ``retry_pending`` row comes back as that retry, its attempt kept, due after
  the time left on the *store's* clock where the store has one (SQLite/Turso: the delay the
  writer set, counted from the store's own time of that write), else its wall-clock due time
  mapped onto this process's monotonic clock;
* a recovered ``running`` or ``reserved`` row whose spawn intent names a worker that may
  still exist (any phase but ``compensated``) is a run to *adopt*: an ``adoption`` retry, due
  at once, its attempt kept, carrying the intent (the run re-attaches after ``last_seq``; the
  runner probes the worker and settles from its final record, or fails the run when the worker
  is gone). Its usage is not added: the adopted run reports it again. The row itself is left
  running with its intent, so a second crash before the dispatch finds it again;
* any other recovered ``running`` or ``reserved`` row is a run that died with its owner: a
  failure retry with the next attempt and the configured backoff, its usage added to the totals;
* from the checkpoint: usage totals, and failure streaks (with the retry budget each was
  decided under: it keeps deciding that streak) and blocked slots for the recovered
  pending retries only (an entry without its row is stale and dropped); a blocked slot
  replaces the pending retry recovered for it.

At start-up the read is bounded: the store rebinds at most :data:`RECOVERY_BOUND` rows (ours
counted) and fails closed above it (nothing recovered, moved or retried), whatever live other
owners hold. The whole of it is one plan: :func:`plan_hydration` turns the rebound rows into
a :class:`HydrationPlan`, which ``hydrate()`` applies as it is.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import cast

from lorenz.config import RetryBackoffSettings
from lorenz.model import (
    SETTLED_SPAWN_PHASES,
    ClaimPhase,
    ClaimRecord,
    RecoveredClaims,
    RetryEntry,
    RetryKind,
    SlotKey,
    TokenUsage,
    UsageTotals,
    parse_slot_key,
    stored_failure_code,
)
from lorenz.model.questions import SessionResume
from lorenz.orchestrator.checkpoints import Checkpoint, RetryStateRestore
from lorenz.orchestrator.errors import CheckpointInvalid, ClaimRecordInvalid
from lorenz.orchestrator.state import BlockedEntry, RetryBudget
from lorenz.policies import failure_backoff_ms, next_failure_attempt

RECOVERY_BOUND = 1_000
"""Claim rows a start-up rebinds and reads at most (``MAX_REBIND`` of the stores): above it the
store's rebind fails closed (``claim_rebind_too_large``) and nothing is recovered, like a
take-over above the same bound."""

_ZERO_USAGE = TokenUsage()
_AS_SLOT_KEY = cast("Callable[[str], SlotKey]", str)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValidRecords:
    """The store's claim rows by slot key, and the rows refused as malformed."""

    by_key: dict[SlotKey, ClaimRecord]
    problems: tuple[ClaimRecordInvalid, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveredSlots:
    """What recovered rows become: retries to track, and what the report says of them."""

    retries: dict[SlotKey, RetryEntry]
    """One retry per recovered slot (pending ones as they were, lost runs as failures)."""
    interrupted: tuple[SlotKey, ...]
    """Slots whose run (or acquire) died with its owner."""
    adopting: tuple[SlotKey, ...]
    """Slots whose run's worker may live on: an ``adoption`` retry each (not persisted)."""
    restored: tuple[SlotKey, ...]
    """Slots that were pending retries and stay so."""
    usage: TokenUsage
    """The interrupted runs' usage (live runs' usage is only in their rows, never in the
    checkpoint totals, so adding it cannot count it twice)."""
    slot_span: int
    """One past the highest slot index seen (0 for no rows)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HydrationPlan:
    """Everything a start-up decides from the store, for the orchestrator to apply as it is."""

    slots: RecoveredSlots
    """The recovered slots; their ``retries`` exclude the slots that come back ``blocked``."""
    blocked: dict[SlotKey, BlockedEntry]
    """Blocked slots restored from the checkpoint (each without a retry of its own)."""
    failure_streaks: dict[SlotKey, int]
    """Consecutive failures per recovered slot, from the checkpoint."""
    resumes: dict[SlotKey, SessionResume] = dataclasses.field(default_factory=dict)
    """Answered questions of recovered slots (their next run resumes the session)."""
    retry_budgets: dict[SlotKey, RetryBudget] = dataclasses.field(default_factory=dict)
    """The recorded retry budgets of recovered slots' failure streaks (they decide the rest
    of those streaks, not the current settings)."""
    usage_totals: UsageTotals | None
    """The checkpoint's usage totals, or ``None`` (none stored, or unreadable: a problem)."""
    taken_over_from: frozenset[str]
    """The owners whose rows were recovered: the stale ones, and our own previous life."""
    problems: tuple[ClaimRecordInvalid | CheckpointInvalid, ...]
    """What could not be trusted, each with its code and what to do."""


def plan_hydration(
    valid: ValidRecords,
    *,
    recovered: RecoveredClaims,
    own: str,
    now_ms: float,
    wall: datetime.datetime,
    backoff: RetryBackoffSettings,
) -> HydrationPlan:
    """What a start-up rebuilds from ``valid``, the trusted rows of ``recovered`` (the claims
    the store rebound to us: a stale owner's, or our own previous life's)."""
    by_key = valid.by_key
    previous = recovered.previous_owners
    slots = recover_slots(
        by_key,
        previous_owner=lambda key: previous.get(key, own),
        now_ms=now_ms,
        wall=wall,
        backoff=backoff,
        ready_in_ms=recovered.retry_ready_in_ms,
    )
    problems: list[ClaimRecordInvalid | CheckpointInvalid] = list(valid.problems)
    usage_totals: UsageTotals | None = None
    restore = RetryStateRestore(failure_streaks={}, blocked={}, problem=None)
    if recovered.checkpoint is not None:
        checkpoint, unreadable = Checkpoint.from_json(recovered.checkpoint)
        problems.extend(unreadable)
        usage_totals = checkpoint.usage_totals
        restore = checkpoint.retry_state(recovered=by_key)
    if restore.blocked:
        slots = dataclasses.replace(
            slots,
            retries={k: r for k, r in slots.retries.items() if k not in restore.blocked},
        )
    return HydrationPlan(
        slots=slots,
        blocked=restore.blocked,
        failure_streaks=restore.failure_streaks,
        resumes=restore.resumes,
        retry_budgets=restore.retry_budgets,
        usage_totals=usage_totals,
        taken_over_from=frozenset(previous.get(key, own) for key in by_key),
        problems=tuple(problems),
    )


def record_problem(record: ClaimRecord) -> ClaimRecordInvalid | None:
    """Why a stored row cannot be trusted (its key disagrees with its issue/slot), or ``None``."""
    try:
        issue_id, index = parse_slot_key(record.slot_key)
    except ValueError:
        issue_id, index = "", -1
    if issue_id == record.issue_id and index == record.slot_index:
        return None
    return ClaimRecordInvalid(
        f"claim {record.slot_key!r} does not match issue {record.issue_id!r} slot "
        f"{record.slot_index}; delete that claim row from the claim store",
    )


def valid_records(records: Iterable[ClaimRecord]) -> ValidRecords:
    """Split the store's rows into trusted rows by key and problems."""
    by_key: dict[SlotKey, ClaimRecord] = {}
    problems: list[ClaimRecordInvalid] = []
    for record in records:
        problem = record_problem(record)
        if problem is not None:
            problems.append(problem)
        else:
            by_key[record.slot_key] = record
    return ValidRecords(by_key=by_key, problems=tuple(problems))


def retry_of_recovered(
    record: ClaimRecord,
    *,
    previous_owner: str,
    now_ms: float,
    wall: datetime.datetime,
    backoff: RetryBackoffSettings,
    ready_in_ms: float | None = None,
) -> RetryEntry:
    """The retry a recovered row comes back as (see the module's rules).

    ``ready_in_ms``: when the store has a clock of its own, how long until the pending retry
    is due on it; it replaces the wall-clock ``due_at`` (which the writer's clock set)."""
    if record.phase is ClaimPhase.RETRY_PENDING:
        due_at = record.due_at or wall
        if ready_in_ms is not None:
            due_at = wall + datetime.timedelta(milliseconds=ready_in_ms)
        return RetryEntry(
            issue_id=record.issue_id,
            identifier=record.identifier,
            slot_index=record.slot_index,
            # NB: ``0`` (``None`` on a Claim) is the slot's first run retried without counting
            # (its worker never started); no other retry has attempt 0.
            attempt=record.attempt or 0,
            kind=record.retry_kind or RetryKind.FAILURE,
            due_at_ms=now_ms + (due_at - wall).total_seconds() * 1000.0,
            due_at=due_at,
            error=record.last_error,
            error_code=stored_failure_code(record.last_error),
            host=record.host,
            workspace_path=record.workspace_path,
        )
    if adoptable(record):
        assert record.intent is not None
        return RetryEntry(
            issue_id=record.issue_id,
            identifier=record.identifier,
            slot_index=record.slot_index,
            # NB: the attempt of the run it adopts, as is: ``0`` for a first run (dispatched
            # as ``None``), so a failure after the adoption is numbered as without the restart.
            attempt=record.attempt or 0,
            kind=RetryKind.ADOPTION,
            due_at_ms=now_ms,
            due_at=wall,
            error=f"adopting: owner {previous_owner} lost; its worker {record.intent.handle} "
            "is probed",
            host=record.intent.placement or record.host,
            workspace_path=record.workspace_path,
            resume=record.intent,
        )
    # The run (or the acquire) died with its owner: it failed, retry with backoff.
    attempt = next_failure_attempt(record.attempt)
    delay = failure_backoff_ms(
        attempt,
        max_backoff_ms=backoff.max_ms,
        initial_ms=backoff.initial_ms,
        multiplier=backoff.multiplier,
    )
    return RetryEntry(
        issue_id=record.issue_id,
        identifier=record.identifier,
        slot_index=record.slot_index,
        attempt=attempt,
        kind=RetryKind.FAILURE,
        due_at_ms=now_ms + delay,
        due_at=wall + datetime.timedelta(milliseconds=delay),
        error=f"interrupted: owner {previous_owner} lost",
        host=record.host,
        workspace_path=record.workspace_path,
    )


def adoptable(record: ClaimRecord) -> bool:
    """Whether a recovered row's run may live on in a worker (its intent has a handle to
    probe): a ``running`` or ``reserved`` row whose intent is not settled."""
    return (
        record.phase is not ClaimPhase.RETRY_PENDING
        and record.intent is not None
        and record.intent.phase not in SETTLED_SPAWN_PHASES
    )


def recover_slots(
    records: Mapping[SlotKey, ClaimRecord],
    *,
    previous_owner: Callable[[SlotKey], str],
    now_ms: float,
    wall: datetime.datetime,
    backoff: RetryBackoffSettings,
    ready_in_ms: Mapping[SlotKey, float] | None = None,
) -> RecoveredSlots:
    """The retries, report lists and usage of recovered rows, in the rows' order."""
    retries: dict[SlotKey, RetryEntry] = {}
    interrupted: list[SlotKey] = []
    adopting: list[SlotKey] = []
    restored: list[SlotKey] = []
    usage = _ZERO_USAGE
    span = 0
    for key, record in records.items():
        span = max(span, record.slot_index + 1)
        retries[key] = retry_of_recovered(
            record,
            previous_owner=previous_owner(key),
            now_ms=now_ms,
            wall=wall,
            backoff=backoff,
            ready_in_ms=(ready_in_ms or {}).get(key),
        )
        if record.phase is ClaimPhase.RETRY_PENDING:
            restored.append(key)
        elif adoptable(record):
            adopting.append(key)
        else:
            usage = usage + record.usage
            interrupted.append(key)
    return RecoveredSlots(
        retries=retries,
        interrupted=tuple(interrupted),
        adopting=tuple(adopting),
        restored=tuple(restored),
        usage=usage,
        slot_span=span,
    )
