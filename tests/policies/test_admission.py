"""Admission (``lorenz.policies.admission``): whether a candidate slot may be claimed now, the
order of the refusals, and what an admitted slot carries — as a pure function of the state."""

from __future__ import annotations

import dataclasses

import pytest

from lorenz.config import TerminalAction, WorkflowSettings
from lorenz.model import (
    BlockReason,
    Issue,
    RetryEntry,
    RetryKind,
    RunningEntry,
    StaticCapacity,
    slot_key,
)
from lorenz.orchestrator import ForeignClaim, OrchestratorState, SkipReason
from lorenz.orchestrator.state import BlockedEntry
from lorenz.policies.admission import Admission, Admitted, Refusal, admission
from lorenz.policies.placement import ClaimPlacement, RunLocation
from tests.orchestrator.factories import EPOCH, PoolProbe, issue, settings

NOW_MS = 50_000.0
K1 = slot_key("i1", 0)


def admit(
    state: OrchestratorState,
    candidate: Issue,
    *,
    config: WorkflowSettings | None = None,
    carried: RetryEntry | None = None,
    capacity: PoolProbe | StaticCapacity | None = None,
) -> Admission:
    return admission(
        state,
        key=slot_key(candidate.id, 0),
        issue=candidate,
        candidate_retry=carried,
        settings=config or settings(),
        capacity=capacity or StaticCapacity(),
        now_ms=NOW_MS,
    )


def retry(*, due_at_ms: float = NOW_MS, host: str | None = None) -> RetryEntry:
    return RetryEntry(
        issue_id="i1", identifier="ABC-1", slot_index=0, attempt=2, kind=RetryKind.FAILURE,
        due_at_ms=due_at_ms, due_at=EPOCH, host=host,
    )


def running(n: int, *, state: str = "Todo", host: str | None = None) -> RunningEntry:
    return RunningEntry(
        issue=issue(n, state=state), slot_index=0, attempt=None, started_at_ms=0.0,
        started_at=EPOCH, host=host,
    )


def occupied(*entries: RunningEntry) -> OrchestratorState:
    state = OrchestratorState()
    for entry in entries:
        state.running[entry.key] = entry
        state.claimed.add(entry.key)
    return state


def test_a_free_slot_is_admitted_locally_with_its_agent_kind() -> None:
    decision = admit(OrchestratorState(), issue(1))
    assert decision == Admitted(
        kind="codex", placement=ClaimPlacement(location=RunLocation.LOCAL), retry=None
    )


def test_a_due_retry_is_admitted_and_consumed() -> None:
    state = OrchestratorState()
    pending = retry(host="b")
    state.retry_attempts[K1] = pending
    config = settings(worker={"ssh_hosts": ["a", "b"]})
    decision = admit(state, issue(1), config=config, carried=pending)
    assert isinstance(decision, Admitted)
    assert decision.retry is pending
    assert decision.placement == ClaimPlacement(location=RunLocation.SSH, host="b")


def test_refusals_come_in_their_documented_order() -> None:
    config = settings(agent={"max_concurrent_agents": 1})
    state = occupied(running(9))  # the global cap is full: the last check would refuse too
    assert admit(state, issue(1), config=config) is Refusal.GLOBAL_CAPACITY

    state.foreign[K1] = ForeignClaim(owner="other", recheck_at_ms=NOW_MS + 1)
    assert admit(state, issue(1), config=config) is Refusal.CLAIMED_ELSEWHERE

    state.blocked[K1] = BlockedEntry(
        issue_id="i1", identifier="ABC-1", slot_index=0, reason=BlockReason.INPUT_REQUIRED,
        error=None, failures=1, attempt=1, blocked_at=EPOCH, action=TerminalAction.BLOCK,
        action_key="k",
    )
    assert admit(state, issue(1), config=config) is Refusal.STALE_CANDIDATE

    state.claimed.add(K1)
    assert admit(state, issue(1), config=config) is Refusal.ALREADY_CLAIMED


def test_a_foreign_slot_past_its_recheck_time_is_asked_again() -> None:
    state = OrchestratorState()
    state.foreign[K1] = ForeignClaim(owner="other", recheck_at_ms=NOW_MS)
    assert isinstance(admit(state, issue(1)), Admitted)


def test_a_retry_that_is_not_the_candidates_or_not_due_is_refused() -> None:
    state = OrchestratorState()
    current = retry(due_at_ms=NOW_MS + 1)
    state.retry_attempts[K1] = current
    replaced = dataclasses.replace(current)
    assert admit(state, issue(1), carried=replaced) is Refusal.STALE_CANDIDATE
    assert admit(state, issue(1), carried=current) is Refusal.NOT_DUE
    assert admit(state, issue(1)) is Refusal.NOT_DUE  # a candidate listed before the retry


@pytest.mark.parametrize(
    ("agent", "refusal"),
    [
        ({"concurrency": {"codex": 0}}, Refusal.KIND_DISABLED),
        ({"max_concurrent_agents_by_state": {"todo": 1}}, Refusal.STATE_CAPACITY),
        ({"concurrency": {"codex": 1}}, Refusal.KIND_CAPACITY),
    ],
    ids=["kind-disabled", "state", "kind"],
)
def test_the_caps_refuse_with_their_shortage(agent: dict[str, object], refusal: Refusal) -> None:
    state = occupied(running(9, state="Todo"))
    assert admit(state, issue(1), config=settings(agent=agent)) is refusal


def test_no_place_to_run_is_worker_host_capacity() -> None:
    config = settings(worker={"ssh_hosts": ["a"], "max_concurrent_agents_per_host": 1})
    assert admit(occupied(running(9, host="a")), issue(1), config=config) is (
        Refusal.WORKER_HOST_CAPACITY
    )
    assert admit(OrchestratorState(), issue(1), capacity=PoolProbe(room=False)) is (
        Refusal.WORKER_HOST_CAPACITY
    )


def test_a_pool_admits_a_reservation() -> None:
    decision = admit(OrchestratorState(), issue(1), capacity=PoolProbe())
    assert isinstance(decision, Admitted)
    assert decision.placement.reserves


def test_every_refusal_is_a_skip_reason_of_the_orchestrator() -> None:
    assert {refusal.value for refusal in Refusal} == {reason.value for reason in SkipReason}


def test_admission_reads_the_state_and_changes_nothing() -> None:
    state = OrchestratorState()
    pending = retry()
    state.retry_attempts[K1] = pending
    before = dataclasses.asdict(state)
    assert isinstance(admit(state, issue(1), carried=pending), Admitted)
    assert dataclasses.asdict(state) == before
