"""Property tests: random sequences of scheduling operations never break the core's invariants.

A hypothesis state machine drives one orchestrator (memory store, manual clock, a switchable
worker pool) through claims, reservations, binds, cancels, finishes, expiries, reconciliation,
issue state changes, agent updates and settings reloads. After every step:

* ``claimed`` is exactly running plus reserved, and no slot is both claimed and retrying;
* the claim store holds exactly one row per tracked slot, in the matching phase;

and at every successful claim, occupancy is within every cap (global, per state, per host).
Stale reservation tokens are replayed on purpose and must change nothing at all.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lorenz.claims import MemoryClaimStore
from lorenz.config import WorkflowSettings
from lorenz.model import (
    AgentUpdate,
    ClaimPhase,
    Issue,
    ManualClock,
    ReservationRecord,
    SlotKey,
    TokenUsage,
)
from lorenz.orchestrator import DispatchCandidate, Orchestrator, Reserved, Started
from lorenz.policies import state_limit
from tests.orchestrator.claims_helpers import retry_of
from tests.orchestrator.factories import PoolProbe, issue, settings

STATES = ["Todo", "In Progress", "Done", "Backlog"]
N_ISSUES = 4


def config_strategy() -> st.SearchStrategy[WorkflowSettings]:
    return st.builds(
        lambda cap, todo_cap, hosts, per_host, ensemble, timeout: settings(
            agent={
                "max_concurrent_agents": cap,
                "max_concurrent_agents_by_state": {"Todo": todo_cap},
                "ensemble_size": ensemble,
            },
            worker={
                "ssh_hosts": hosts,
                "max_concurrent_agents_per_host": per_host,
                "worker_pool": {"acquire_timeout_ms": timeout},
            },
        ),
        st.sampled_from([1, 2, 3, 4, 6]),
        st.sampled_from([1, 2, 3, 6]),
        st.sampled_from([[], ["a", "b"], ["a", "b", "c"]]),
        st.sampled_from([None, 1, 1, 2]),
        st.integers(1, 2),
        st.sampled_from([1000, 30000]),
    )


def scheduling_view(orchestrator: Orchestrator, store: MemoryClaimStore) -> Any:
    state = orchestrator.state
    return copy.deepcopy(
        (
            state.running,
            state.reserved,
            state.claimed,
            state.retry_attempts,
            state.usage_totals,
            state.completed,
            dict(store.claims),
        )
    )


class SchedulingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store = MemoryClaimStore(owner="me")
        self.probe = PoolProbe(governs=False)
        self.issue_states = dict.fromkeys(range(N_ISSUES), "Todo")
        self.reservations: list[ReservationRecord] = []
        self.orchestrator: Orchestrator

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.loop.close()

    def issues(self) -> list[Issue]:
        return [
            issue(n, state=s, priority=n % 5, created=float(n))
            for n, s in self.issue_states.items()
        ]

    @initialize(config=config_strategy(), governs=st.booleans())
    def start(self, config: WorkflowSettings, governs: bool) -> None:
        self.probe.governing = governs
        self.orchestrator = Orchestrator(
            settings=config, store=self.store, clock=self.clock, capacity=self.probe
        )
        self.run(self.orchestrator.hydrate())

    # -- operations -----------------------------------------------------------------------

    @rule(skip=st.integers(0, 2), count=st.integers(1, 4))
    def dispatch(self, skip: int, count: int) -> None:
        candidates = self.run(self.orchestrator.eligible_issues(self.issues()))
        for candidate in candidates[skip:][:count]:
            self.claim(candidate)

    def claim(self, candidate: DispatchCandidate) -> None:
        state = self.orchestrator.state
        governed = self.probe.governs()
        result = self.run(self.orchestrator.claim(candidate))
        if isinstance(result, Started | Reserved):
            self.check_caps(candidate.issue, governed=governed, result=result)
            assert candidate.key not in state.retry_attempts
        if isinstance(result, Reserved):
            assert result.reservation.consumed_retry is candidate.retry
            self.reservations.append(result.reservation)
        if isinstance(result, Started):
            assert result.entry.attempt == candidate.attempt

    def check_caps(self, claimed_issue: Issue, *, governed: bool, result: Any) -> None:
        # NB: counted here from the raw maps, not with the state's own helpers under test.
        state = self.orchestrator.state
        config = self.orchestrator.settings
        occupied = [e.issue for e in state.running.values()]
        occupied += [r.issue for r in state.reserved.values()]
        assert len(occupied) <= config.agent.max_concurrent_agents
        state_key = claimed_issue.state.strip().lower()
        in_state = sum(1 for i in occupied if i.state.strip().lower() == state_key)
        assert in_state <= state_limit(state_key, agent=config.agent)
        if isinstance(result, Started):
            host = result.entry.host
            hosts = config.worker.ssh_hosts
            per_host = config.worker.max_concurrent_agents_per_host
            if hosts:
                assert host in hosts  # never a local fallback
                if per_host is not None:
                    on_host = sum(1 for e in state.running.values() if e.host == host)
                    assert on_host <= per_host
            else:
                assert host is None
        else:
            assert governed

    @rule(pick=st.integers(0, 50), host=st.sampled_from([None, "a", "b"]))
    def bind(self, pick: int, host: str | None) -> None:
        if not self.reservations:
            return
        reservation = self.reservations[pick % len(self.reservations)]
        if self.is_stale(reservation):
            self.assert_stale_is_noop(reservation)
            return
        entry = self.run(self.orchestrator.bind_reservation(reservation, host=host))
        assert entry is not None
        assert entry.key == reservation.key

    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        if not self.reservations:
            return
        reservation = self.reservations[pick % len(self.reservations)]
        if self.is_stale(reservation):
            self.assert_stale_is_noop(reservation)
            return
        assert self.run(self.orchestrator.cancel_reservation(reservation)) is True
        restored = self.orchestrator.state.retry_attempts.get(reservation.key)
        assert restored is reservation.consumed_retry

    def is_stale(self, reservation: ReservationRecord) -> bool:
        current = self.orchestrator.state.reserved.get(reservation.key)
        return current is None or current.token != reservation.token

    def assert_stale_is_noop(self, reservation: ReservationRecord) -> None:
        before = scheduling_view(self.orchestrator, self.store)
        assert self.run(self.orchestrator.bind_reservation(reservation, host="a")) is None
        assert self.run(self.orchestrator.cancel_reservation(reservation)) is False
        assert scheduling_view(self.orchestrator, self.store) == before

    @rule()
    def replay_every_stale_token(self) -> None:
        for reservation in self.reservations:
            if self.is_stale(reservation):
                self.assert_stale_is_noop(reservation)

    @precondition(lambda self: bool(self.orchestrator.state.running))
    @rule(pick=st.integers(0, 50), normal=st.booleans(), wait=st.booleans())
    def finish(self, pick: int, normal: bool, wait: bool) -> None:
        keys = sorted(self.orchestrator.state.running)
        key = keys[pick % len(keys)]
        previous = self.orchestrator.state.running[key].attempt
        finished = self.run(self.orchestrator.finish(key, normal=normal, error=None))
        retry = retry_of(finished)
        if not normal and finished is not None and finished.blocked is not None:
            # NB: the failure used up retry.max_attempts: blocked, never retried.
            assert retry is None
            assert finished.blocked.failures >= self.orchestrator.settings.retry.max_attempts
            assert key in self.orchestrator.state.blocked
            return
        assert retry is not None
        assert retry.attempt == (1 if normal else (previous or 0) + 1)
        if wait:  # make the retry due and try to consume it at once
            self.clock.advance(retry.due_at_ms - self.clock.monotonic_ms())
            candidates = self.run(self.orchestrator.eligible_issues(self.issues()))
            for candidate in candidates:
                if candidate.key == key:
                    assert candidate.retry is retry
                    self.claim(candidate)

    @precondition(lambda self: bool(self.orchestrator.state.running))
    @rule(pick=st.integers(0, 50), total=st.integers(0, 100), sid=st.sampled_from(["s1", "s2"]))
    def agent_update(self, pick: int, total: int, sid: str) -> None:
        keys = sorted(self.orchestrator.state.running)
        key = keys[pick % len(keys)]
        before = self.orchestrator.state.running[key].usage.total_tokens
        update = AgentUpdate(event="u", session_id=sid, usage=TokenUsage(0, 0, total))
        self.run(self.orchestrator.apply_update(key, update))
        assert self.orchestrator.state.running[key].usage.total_tokens >= before

    @rule(ms=st.sampled_from([0, 1, 999, 1000, 10000, 62000, 130000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def expire(self) -> None:
        expired = self.run(self.orchestrator.sweep_expired_reservations())
        now = self.clock.monotonic_ms()
        assert all(r.expires_at_ms <= now for r in expired)
        assert all(r.expires_at_ms > now for r in self.orchestrator.state.reserved.values())

    @rule(n=st.integers(0, N_ISSUES - 1), state=st.sampled_from(STATES))
    def move_issue(self, n: int, state: str) -> None:
        self.issue_states[n] = state

    @rule()
    def reconcile(self) -> None:
        by_id = {i.id: i for i in self.issues()}
        for issue_id in sorted(self.orchestrator.tracked_issue_ids()):
            fresh = by_id.get(issue_id)
            if self.orchestrator.reconciliation_decision(fresh) is None:
                assert fresh is not None
                self.run(self.orchestrator.refresh_running_issue(fresh))
            else:
                self.run(self.orchestrator.cleanup_issue(issue_id))
                assert issue_id not in self.orchestrator.tracked_issue_ids()

    @rule(config=config_strategy())
    def reload(self, config: WorkflowSettings) -> None:
        self.orchestrator.update_settings(config)

    @rule(governs=st.booleans(), room=st.booleans())
    def pool(self, governs: bool, room: bool) -> None:
        self.probe.governing = governs
        self.probe.room = room

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def claimed_is_running_plus_reserved(self) -> None:
        state = self.orchestrator.state
        assert state.claimed == set(state.running) | set(state.reserved)
        assert not set(state.running) & set(state.reserved)

    @invariant()
    def nothing_is_both_claimed_and_retrying(self) -> None:
        state = self.orchestrator.state
        assert not state.claimed & set(state.retry_attempts)

    @invariant()
    def the_store_mirrors_the_state(self) -> None:
        state = self.orchestrator.state
        expected: dict[SlotKey, ClaimPhase] = {}
        expected.update(dict.fromkeys(state.running, ClaimPhase.RUNNING))
        expected.update(dict.fromkeys(state.reserved, ClaimPhase.RESERVED))
        expected.update(dict.fromkeys(state.retry_attempts, ClaimPhase.RETRY_PENDING))
        # NB: a blocked slot keeps its row as a pending retry (the checkpoint says it is blocked).
        expected.update(dict.fromkeys(state.blocked, ClaimPhase.RETRY_PENDING))
        assert {k: r.phase for k, r in self.store.claims.items()} == expected
        for key, reservation in state.reserved.items():
            assert self.store.claims[key].reservation_token == reservation.token


SchedulingMachine.TestCase.settings = hypothesis_settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestScheduling = SchedulingMachine.TestCase


@hypothesis_settings(max_examples=150, deadline=None)
@given(
    config=config_strategy(),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), min_size=1, max_size=25),
)
def test_static_dispatch_respects_every_cap(
    config: WorkflowSettings, steps: list[tuple[bool, int]]
) -> None:
    """A focused version for the static path: claim everything, finish some, repeat."""
    machine = SchedulingMachine()
    machine.probe.governing = False
    try:
        machine.orchestrator = Orchestrator(
            settings=config, store=machine.store, clock=machine.clock, capacity=machine.probe
        )
        for finish_one, pick in steps:
            running = sorted(machine.orchestrator.state.running)
            if finish_one and running:
                machine.run(machine.orchestrator.finish(running[pick % len(running)], normal=True))
                machine.clock.advance(1000)
            machine.dispatch(skip=0, count=8)
            machine.claimed_is_running_plus_reserved()
            machine.nothing_is_both_claimed_and_retrying()
            machine.the_store_mirrors_the_state()
    finally:
        machine.teardown()
