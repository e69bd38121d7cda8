"""Recovery: reading a claim store's rows back into the live state (start-up and takeover).

Why a module of its own: the rules of recovery are pure (:mod:`.hydration`); carrying them out
takes the store's reads and row moves, in a fixed order, and the state updates that follow.
That sequence is the same whether a process starts (:func:`recover_at_start`) or takes over
stale owners while running (:func:`recover_from_owners`), and it is kept apart from the slot
transitions of :class:`~lorenz.orchestrator.scheduling.Orchestrator`, which calls these under
its lock and then persists what the lost runs became.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable

from lorenz.config import WorkflowSettings
from lorenz.model import ClaimRecord, ClaimStore, Clock, SlotKey, TokenUsage
from lorenz.orchestrator.errors import CheckpointInvalid, ClaimRecordInvalid
from lorenz.orchestrator.hydration import (
    plan_hydration,
    record_problem,
    recover_slots,
    valid_records,
)
from lorenz.orchestrator.results import HydrationReport
from lorenz.orchestrator.state import OrchestratorState


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recovery:
    """A recovery applied to the state; what is left is the caller's to persist."""

    report: HydrationReport
    slot_span: int
    """One past the highest slot index recovered (0 for none)."""
    usage: TokenUsage
    """The interrupted runs' usage, to add to the totals once."""
    wall: datetime.datetime
    """The wall-clock time of the recovery (the rows are written with it)."""


def _constant(owner: str) -> Callable[[SlotKey], str]:
    def of(_key: SlotKey) -> str:
        return owner

    return of


async def recover_at_start(
    state: OrchestratorState,
    *,
    store: ClaimStore,
    clock: Clock,
    settings: WorkflowSettings,
) -> Recovery:
    """Have the store rebind the stale owners' claims to us and read back exactly those and
    ours (at most :data:`~lorenz.orchestrator.hydration.RECOVERY_BOUND`, else it fails closed),
    and apply the :func:`~lorenz.orchestrator.hydration.plan_hydration` plan to an empty
    ``state``.

    NB: no row of a live other owner is read: such a slot is found when ``acquire`` refuses
    it, and remembered in ``state.foreign`` then, as for a claim made after the start."""
    recovered = await store.recover()
    valid = valid_records(recovered.claims)
    now_ms = clock.monotonic_ms()
    wall = clock.now()
    plan = plan_hydration(
        valid,
        recovered=recovered,
        own=store.owner,
        now_ms=now_ms,
        wall=wall,
        backoff=settings.retry.backoff,
    )
    state.retry_attempts.update(plan.slots.retries)
    if plan.usage_totals is not None:
        state.usage_totals = plan.usage_totals
    state.failure_streaks.update(plan.failure_streaks)
    state.retry_budgets.update(plan.retry_budgets)
    state.restored_budgets.update(plan.retry_budgets)
    state.blocked.update(plan.blocked)
    state.resumes.update(plan.resumes)
    slots = plan.slots
    report = HydrationReport(
        interrupted=slots.interrupted,
        adopting=slots.adopting,
        restored_retries=slots.restored,
        taken_over_from=plan.taken_over_from,
        usage_restored=plan.usage_totals is not None,
        problems=plan.problems,
    )
    return Recovery(report=report, slot_span=slots.slot_span, usage=slots.usage, wall=wall)


async def recover_from_owners(
    state: OrchestratorState,
    owners: Iterable[str],
    *,
    store: ClaimStore,
    clock: Clock,
    settings: WorkflowSettings,
) -> Recovery:
    """Have the store move the rows of ``owners`` (each re-checked stale inside its own
    transaction) to us, one owner at a time, and track what they become."""
    own = store.owner
    now_ms = clock.monotonic_ms()
    wall = clock.now()
    interrupted: list[SlotKey] = []
    adopting: list[SlotKey] = []
    restored: list[SlotKey] = []
    problems: list[ClaimRecordInvalid | CheckpointInvalid] = []
    taken_from: set[str] = set()
    recovered_usage = TokenUsage()
    slot_span = 0
    for owner in sorted(set(owners) - {own}):
        # NB: one owner per call, so each interrupted run names the owner it was lost with.
        moved: dict[SlotKey, ClaimRecord] = {}
        for record in await store.take_over(from_owners=[owner]):
            taken_from.add(owner)
            problem = record_problem(record)
            if problem is not None:
                problems.append(problem)
            elif record.slot_key not in state.claimed:
                # NB: claimed cannot happen (the row was another owner's); never clobber
                moved[record.slot_key] = record
        slots = recover_slots(
            moved,
            previous_owner=_constant(owner),
            now_ms=now_ms,
            wall=wall,
            backoff=settings.retry.backoff,
        )
        for key in moved:
            state.foreign.pop(key, None)
        state.retry_attempts.update(slots.retries)
        slot_span = max(slot_span, slots.slot_span)
        interrupted += slots.interrupted
        adopting += slots.adopting
        restored += slots.restored
        recovered_usage = recovered_usage + slots.usage
    report = HydrationReport(
        interrupted=tuple(interrupted),
        adopting=tuple(adopting),
        restored_retries=tuple(restored),
        taken_over_from=frozenset(taken_from),
        problems=tuple(problems),
    )
    return Recovery(report=report, slot_span=slot_span, usage=recovered_usage, wall=wall)
