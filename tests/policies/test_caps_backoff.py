"""Caps, host choice, backoff math, stalls, worker outcomes and the reconciliation decision."""

from __future__ import annotations

import pytest

from lorenz.model import RetryKind, RunFailure, RunningEntry, StopReason
from lorenz.policies import (
    CONTINUATION_DELAY_MS,
    POISON_WORKER_ERROR_CODES,
    CapacityShortage,
    IssueRules,
    WorkerHealth,
    available_slots,
    capacity_shortage,
    classify_worker_outcome,
    failure_backoff_ms,
    is_stalled,
    reconciliation_decision,
    reservation_lifetime_ms,
    retry_plan,
    select_worker_host,
    stall_error,
    stalled_for_ms,
    state_limit,
)
from tests.orchestrator.factories import EPOCH, issue, settings

AGENT = settings(
    agent={"max_concurrent_agents": 3, "max_concurrent_agents_by_state": {" In Progress ": 1}}
).agent


def test_state_limit_uses_its_normalized_entry_or_the_global_cap() -> None:
    """The per-state map normalizes state names."""
    assert state_limit("in progress", agent=AGENT) == 1
    assert state_limit("todo", agent=AGENT) == 3


def test_global_cap_is_checked_before_the_state_cap() -> None:
    assert capacity_shortage("todo", occupied=3, occupied_in_state=0, agent=AGENT) is (
        CapacityShortage.GLOBAL
    )
    assert capacity_shortage("in progress", occupied=1, occupied_in_state=1, agent=AGENT) is (
        CapacityShortage.STATE
    )
    assert capacity_shortage("in progress", occupied=2, occupied_in_state=0, agent=AGENT) is None
    assert capacity_shortage("todo", occupied=2, occupied_in_state=2, agent=AGENT) is None


def test_available_slots_never_goes_negative() -> None:
    assert available_slots(occupied=1, agent=AGENT) == 2
    assert available_slots(occupied=7, agent=AGENT) == 0


HOSTS = ("a", "b", "c")


def test_least_loaded_host_with_ties_in_config_order() -> None:
    assert select_worker_host(HOSTS, load={}, per_host_cap=2) == "a"
    assert select_worker_host(HOSTS, load={"a": 1}, per_host_cap=2) == "b"
    assert select_worker_host(HOSTS, load={"a": 1, "b": 1, "c": 1}, per_host_cap=2) == "a"
    assert select_worker_host(HOSTS, load={"a": 2, "b": 1, "c": 0}, per_host_cap=None) == "c"


def test_a_retry_keeps_its_host_while_it_has_room() -> None:
    assert select_worker_host(HOSTS, load={"c": 1}, per_host_cap=2, preferred="c") == "c"
    assert select_worker_host(HOSTS, load={"c": 2}, per_host_cap=2, preferred="c") == "a"
    assert select_worker_host(HOSTS, load={}, per_host_cap=2, preferred="gone") == "a"


def test_every_host_full_means_no_host_not_local() -> None:
    assert select_worker_host(HOSTS, load={"a": 1, "b": 1, "c": 1}, per_host_cap=1) is None


def test_failure_backoff_progression_and_default_cap() -> None:
    """Exponential backoff from 10 s (10, 20, 40, 80, 160, then 300 s)."""
    got = [failure_backoff_ms(a, max_backoff_ms=300000) for a in range(1, 8)]
    assert got == [10000, 20000, 40000, 80000, 160000, 300000, 300000]


def test_backoff_cap_comes_from_config() -> None:
    """The cap comes from agent.max_retry_backoff_ms."""
    assert failure_backoff_ms(3, max_backoff_ms=25000) == 25000
    assert failure_backoff_ms(1, max_backoff_ms=5000) == 5000


def test_huge_attempts_do_not_overflow() -> None:
    assert failure_backoff_ms(10**9, max_backoff_ms=300000) == 300000
    assert failure_backoff_ms(0, max_backoff_ms=300000) == 10000


def test_retry_plan_continuation_and_failure() -> None:
    """Clean exit → attempt 1 in 1 s; continuation then crash → attempt 2, 20 s."""
    assert retry_plan(kind=RetryKind.CONTINUATION, previous_attempt=5, max_backoff_ms=300000) == (
        1,
        CONTINUATION_DELAY_MS,
    )
    assert retry_plan(kind=RetryKind.FAILURE, previous_attempt=None, max_backoff_ms=300000) == (
        1,
        10000,
    )
    assert retry_plan(kind=RetryKind.FAILURE, previous_attempt=1, max_backoff_ms=300000) == (
        2,
        20000,
    )


def test_reservation_lifetime() -> None:
    assert reservation_lifetime_ms(30000) == 120000
    assert reservation_lifetime_ms(1) == 60002


def _entry(*, started: float, last: float | None) -> RunningEntry:
    return RunningEntry(
        issue=issue(),
        slot_index=0,
        attempt=None,
        started_at_ms=started,
        started_at=EPOCH,
        last_agent_timestamp_ms=last,
    )


def test_stall_is_measured_from_last_event_or_start() -> None:
    assert stalled_for_ms(_entry(started=0, last=None), now_ms=1001, stall_timeout_ms=1000) == 1001
    assert not is_stalled(_entry(started=0, last=None), now_ms=1000, stall_timeout_ms=1000)
    assert not is_stalled(_entry(started=0, last=500), now_ms=1400, stall_timeout_ms=1000)
    assert is_stalled(_entry(started=0, last=500), now_ms=1501, stall_timeout_ms=1000)


@pytest.mark.parametrize("timeout", [0, -5])
def test_non_positive_stall_timeout_disables_detection(timeout: int) -> None:
    assert not is_stalled(_entry(started=0, last=None), now_ms=10**12, stall_timeout_ms=timeout)


def test_stall_error_text() -> None:
    assert stall_error(1234.9) == "stalled for 1234ms without agent activity"


@pytest.mark.parametrize("code", sorted(POISON_WORKER_ERROR_CODES))
def test_host_caused_failures_poison_by_code(code: str) -> None:
    assert classify_worker_outcome(RunFailure(code=code, text="x")) is WorkerHealth.POISON


@pytest.mark.parametrize(
    "failure",
    [
        None,
        RunFailure(code="invalid_ssh_timeout", text="ssh_timeout: bad value"),
        RunFailure(code="turn_failed", text="workspace hook failed with status 2"),
        RunFailure(code="agent_exited", text="workspace_hook_failed: mentioned, not the code"),
    ],
)
def test_everything_else_is_healthy(failure: RunFailure | None) -> None:
    assert classify_worker_outcome(failure) is WorkerHealth.HEALTHY


def test_a_stall_always_poisons() -> None:
    assert classify_worker_outcome(None, stalled=True) is WorkerHealth.POISON


RULES = IssueRules.build(
    active_states=("Todo", "In Progress"),
    terminal_states=("Done",),
    required_labels=("agent",),
)


@pytest.mark.parametrize(
    ("fresh", "reason"),
    [
        (None, StopReason.MISSING),
        (issue(state="Done", labels=["agent"]), StopReason.TERMINAL),
        (issue(state="Backlog", labels=["agent"]), StopReason.INACTIVE),
        (issue(state="Todo"), StopReason.UNROUTED),
        (issue(state="Todo", labels=["agent"], dispatchable=False), StopReason.UNROUTED),
        (issue(state="Todo", labels=["agent"], blockers=["In Progress"]), StopReason.BLOCKED),
        (issue(state="In Progress", labels=["agent"], blockers=["Done"]), None),
        (issue(state="Todo", labels=["agent"], title=" "), StopReason.INACTIVE),
    ],
)
def test_reconciliation_decision(fresh: object, reason: StopReason | None) -> None:
    assert reconciliation_decision(fresh, RULES) is reason  # type: ignore[arg-type]
