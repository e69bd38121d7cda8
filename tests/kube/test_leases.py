"""The Lease provider against the real API server: client-go's election rules, exactly.

Expiry is judged on each candidate's own monotonic clock, so the tests move those clocks by
hand (:class:`ManualMonotonic`) instead of sleeping: a takeover at 3.01 s and none at 2.99 s is
asserted exactly, with real HTTP and real resourceVersion conflicts underneath.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re

import pytest

from lorenz.kube.clients import KubeApi, leases_path
from lorenz.kube.errors import InvalidOperatorSettings, LeaseHeldElsewhere
from lorenz.kube.leaderelection.leases import KubernetesLeaseProvider, LeaseTiming, micro_time
from lorenz.leadership import DaemonAlreadyRunning, LeadershipLost, LeaseStoreKind
from tests.kube.conftest import ManualMonotonic

pytestmark = pytest.mark.cluster

TIMING = LeaseTiming(lease_duration_s=3, renew_deadline_s=2.0, retry_period_s=0.5)
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def provider(
    api: KubeApi, namespace: str, identity: str, clock: ManualMonotonic, *, name: str = "wf"
) -> KubernetesLeaseProvider:
    return KubernetesLeaseProvider(
        api=api,
        namespace=namespace,
        name=name,
        identity=identity,
        timing=TIMING,
        labels={"lorenz.dev/lease-set": "test"},
        monotonic=clock,
    )


async def test_first_acquire_creates_the_lease(kube_api: KubeApi, kube_namespace: str) -> None:
    clock = ManualMonotonic()
    a = provider(kube_api, kube_namespace, "a", clock)
    record = await a.acquire()
    assert record.holder == "a"
    assert record.transitions == 0
    assert record.store is LeaseStoreKind.KUBERNETES
    assert a.holds_lease()
    lease = await kube_api.get(leases_path(kube_namespace, "wf"))
    spec = lease["spec"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 3
    assert MICRO.match(lease["spec"]["renewTime"]), lease["spec"]["renewTime"]
    assert lease["metadata"]["labels"] == {"lorenz.dev/lease-set": "test"}


async def test_micro_time_with_zero_microseconds_is_accepted(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    whole = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert micro_time(whole) == "2026-01-02T03:04:05.000000Z"
    a = KubernetesLeaseProvider(
        api=kube_api,
        namespace=kube_namespace,
        name="zero",
        identity="a",
        timing=TIMING,
        wall=lambda: whole,
    )
    assert (await a.acquire()).heartbeat_at == whole


async def test_a_held_lease_is_not_taken_before_its_duration_passes_unobserved(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    a_clock, b_clock = ManualMonotonic(), ManualMonotonic()
    a = provider(kube_api, kube_namespace, "a", a_clock)
    b = provider(kube_api, kube_namespace, "b", b_clock)
    await a.acquire()
    with pytest.raises(LeaseHeldElsewhere) as caught:
        await b.acquire()
    assert isinstance(caught.value, DaemonAlreadyRunning)
    assert caught.value.code == "lease_held_elsewhere"
    assert caught.value.holder == "a"

    b_clock.advance(2.9)
    assert not await b.try_acquire_or_renew()
    # A renewal is a change B observes: its wait starts over.
    a_clock.advance(0.5)
    await a.heartbeat()
    b_clock.advance(0.2)
    assert not await b.try_acquire_or_renew()
    b_clock.advance(2.9)
    assert not await b.try_acquire_or_renew()
    b_clock.advance(0.2)
    assert await b.try_acquire_or_renew()

    record = b.observed
    assert record is not None
    assert record.holder == "b"
    assert record.transitions == 1
    assert b.holds_lease()
    with pytest.raises(LeadershipLost):
        await a.heartbeat()
    assert not a.holds_lease()


async def test_renewals_keep_acquire_time_and_transitions_and_use_one_write(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    clock = ManualMonotonic()
    a = provider(kube_api, kube_namespace, "a", clock)
    first = await a.acquire()
    before = dict(kube_api.requests)
    clock.advance(0.5)
    await a.heartbeat()
    after = dict(kube_api.requests)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert delta == {("update", "leases"): 1}
    record = a.observed
    assert record is not None
    assert record.acquired_at == first.acquired_at
    assert record.transitions == first.transitions
    assert record.heartbeat_at >= first.heartbeat_at


async def test_a_leader_stops_holding_at_its_renew_deadline(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    clock = ManualMonotonic()
    a = provider(kube_api, kube_namespace, "a", clock)
    await a.acquire()
    clock.advance(1.99)
    assert a.holds_lease()
    clock.advance(0.02)
    assert not a.holds_lease()


async def test_release_lets_a_follower_take_over_at_once(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    a_clock, b_clock = ManualMonotonic(), ManualMonotonic()
    a = provider(kube_api, kube_namespace, "a", a_clock)
    b = provider(kube_api, kube_namespace, "b", b_clock)
    await a.acquire()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.holds_lease()
    lease = await kube_api.get(leases_path(kube_namespace, "wf"))
    assert lease["spec"]["holderIdentity"] == ""
    assert lease["spec"]["leaseDurationSeconds"] == 1
    assert await b.read() is None
    assert await b.try_acquire_or_renew()  # no waiting: nobody holds it
    assert b.observed is not None
    assert b.observed.transitions == 1


async def test_racing_candidates_elect_exactly_one(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    clocks = [ManualMonotonic() for _ in range(8)]
    candidates = [
        provider(kube_api, kube_namespace, f"c{i}", clock) for i, clock in enumerate(clocks)
    ]
    for round_ in range(3):
        results = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
        winners = [c for c, won in zip(candidates, results, strict=True) if won]
        assert len(winners) == 1, (round_, results)
        winner = winners[0]
        lease = await kube_api.get(leases_path(kube_namespace, "wf"))
        assert lease["spec"]["holderIdentity"] == winner.identity
        assert lease["spec"]["leaseTransitions"] == round_
        await winner.release()


async def test_a_new_term_numbers_itself_above_the_floor_and_a_lapsed_holder_starts_a_new_term(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    floor = {"value": 0}
    clock = ManualMonotonic()
    a = KubernetesLeaseProvider(
        api=kube_api, namespace=kube_namespace, name="floored", identity="a", timing=TIMING,
        transitions_floor=lambda: floor["value"], monotonic=clock,
    )
    floor["value"] = 7
    assert (await a.acquire()).transitions == 7  # created at the floor
    clock.advance(0.5)
    await a.heartbeat()
    assert a.transitions == 7  # a renewal keeps the term
    # The renew deadline passes without a renewal: the term is over even though the Lease
    # still names "a"; taking it again is a new term with a higher generation.
    clock.advance(2.5)
    assert not a.holds_lease()
    assert await a.try_acquire_or_renew()
    assert a.transitions == 8
    floor["value"] = 20
    await a.release()
    assert await a.try_acquire_or_renew()
    assert a.transitions == 20


@pytest.mark.parametrize(
    ("duration", "deadline", "period"), [(10, 10.0, 2.0), (15, 10.0, 9.0), (0, 0.5, 0.1)]
)
def test_inconsistent_timings_are_refused(duration: int, deadline: float, period: float) -> None:
    with pytest.raises(InvalidOperatorSettings) as caught:
        LeaseTiming(lease_duration_s=duration, renew_deadline_s=deadline, retry_period_s=period)
    assert caught.value.code == "invalid_operator_settings"


async def test_a_renewal_that_times_out_names_the_timeout_in_its_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import socket

    import kubernetes.client

    # An API server that accepts the connection and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    api = KubeApi(configuration)
    try:
        lease = KubernetesLeaseProvider(api=api, namespace="ops", name="lorenz-shard-0",
                                        identity="op-a")
        with caplog.at_level(logging.WARNING, logger="lorenz.kube.leases"):
            assert not await lease.renew()
    finally:
        await api.close()
        silent.close()
    warnings = [r.getMessage() for r in caplog.records if "renew failed" in r.getMessage()]
    assert warnings, caplog.text
    # It once said "error=" and nothing more (a TimeoutError has no message).
    assert all(w.endswith("error=TimeoutError()") for w in warnings), warnings
