"""Admission: whether one dispatch candidate may be claimed now, and as what.

The orchestrator asks this for every candidate and then does the one thing it alone does: the
store write (``acquire``) and the state change after it. Everything before that is here, as a
function of the scheduling state, the candidate and the settings.

Checks, in order (the first that fails names the refusal, also the orchestrator's skip reason):

1. ``already_claimed``: the slot is running or reserved here;
2. ``stale_candidate``: the slot is blocked, or the candidate carried a retry that is no longer
   the slot's current one (released or replaced since eligibility);
3. ``claimed_elsewhere``: another owner holds the slot and its recheck time has not come;
4. ``not_due``: the slot's retry is not due yet;
5. the caps (:func:`~lorenz.policies.concurrency.capacity_shortage`): ``kind_disabled``,
   ``global_capacity``, ``state_capacity``, ``kind_capacity``;
6. ``worker_host_capacity``: no place to run it (:func:`~lorenz.policies.placement.
   claim_placement`: the pool has no room, or every SSH host is at its per-host cap).

An admitted slot consumes its pending retry (the orchestrator keeps it inside a reservation, so
a cancel can put it back).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from lorenz.config import WorkflowSettings
from lorenz.model import CapacityProbe, Issue, RetryEntry, SlotKey
from lorenz.policies.concurrency import agent_kind_for, capacity_shortage, kind_limit
from lorenz.policies.placement import ClaimPlacement, claim_placement


class Refusal(enum.StrEnum):
    """Why a candidate is not admitted (the values are the orchestrator's skip reasons)."""

    ALREADY_CLAIMED = "already_claimed"
    STALE_CANDIDATE = "stale_candidate"
    CLAIMED_ELSEWHERE = "claimed_elsewhere"
    NOT_DUE = "not_due"
    KIND_DISABLED = "kind_disabled"
    GLOBAL_CAPACITY = "global_capacity"
    STATE_CAPACITY = "state_capacity"
    KIND_CAPACITY = "kind_capacity"
    WORKER_HOST_CAPACITY = "worker_host_capacity"


class HeldElsewhere(Protocol):
    """A slot another owner holds (the orchestrator's ``ForeignClaim``)."""

    @property
    def recheck_at_ms(self) -> float: ...


class SlotOccupancy(Protocol):
    """What admission reads of the scheduling state (``OrchestratorState`` is one)."""

    @property
    def claimed(self) -> Collection[SlotKey]: ...

    @property
    def blocked(self) -> Collection[SlotKey]: ...

    @property
    def foreign(self) -> Mapping[SlotKey, HeldElsewhere]: ...

    @property
    def retry_attempts(self) -> Mapping[SlotKey, RetryEntry]: ...

    def occupied(self) -> int: ...

    def occupied_in_state(self, state_key: str) -> int: ...

    def occupied_of_kind(self, kind: str, *, chosen: Callable[[Issue], str]) -> int: ...

    def host_load(self) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """The candidate may be claimed: by which agent kind, where, consuming which retry."""

    kind: str
    """The agent kind that runs it."""
    placement: ClaimPlacement
    retry: RetryEntry | None
    """The slot's pending retry, consumed by the claim (``None`` for a first run)."""


Admission = Admitted | Refusal


def admission(
    state: SlotOccupancy,
    *,
    key: SlotKey,
    issue: Issue,
    candidate_retry: RetryEntry | None,
    settings: WorkflowSettings,
    capacity: CapacityProbe,
    now_ms: float,
) -> Admission:
    """Admit the candidate slot ``key`` of ``issue`` (which carried ``candidate_retry`` when it
    was listed), or say why not (see the module docstring for the order)."""
    if key in state.claimed:
        return Refusal.ALREADY_CLAIMED
    if key in state.blocked:
        return Refusal.STALE_CANDIDATE
    held = state.foreign.get(key)
    if held is not None and held.recheck_at_ms > now_ms:
        return Refusal.CLAIMED_ELSEWHERE
    current = state.retry_attempts.get(key)
    if candidate_retry is not None and current is not candidate_retry:
        return Refusal.STALE_CANDIDATE
    if current is not None and current.due_at_ms > now_ms:
        return Refusal.NOT_DUE
    agent = settings.agent
    kind = agent_kind_for(issue, agent=agent)
    state_key = issue.state_key
    shortage = capacity_shortage(
        state_key,
        occupied=state.occupied(),
        occupied_in_state=state.occupied_in_state(state_key),
        agent=agent,
        kind=kind,
        occupied_of_kind=(
            state.occupied_of_kind(kind, chosen=lambda i: agent_kind_for(i, agent=agent))
            if kind_limit(kind, agent=agent)
            else 0
        ),
    )
    if shortage is not None:
        return Refusal(shortage.value)
    placement = claim_placement(
        settings.worker, capacity=capacity, retry=current, host_load=state.host_load
    )
    if placement is None:
        return Refusal.WORKER_HOST_CAPACITY
    return Admitted(kind=kind, placement=placement, retry=current)
