"""Where a run executes (``lorenz.policies.placement``): at the claim, at the run, and for the
parts that only ask whether runs go to Pods."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from lorenz.config import WorkerSettings
from lorenz.model import RetryEntry, RetryKind, SpawnIntent, SpawnPhase, StaticCapacity
from lorenz.policies import HOST_UNREACHABLE_CODE
from lorenz.policies.placement import (
    ClaimPlacement,
    RunLocation,
    claim_placement,
    run_location,
    runs_in_pods,
)
from tests.orchestrator.factories import EPOCH, PoolProbe

LOCAL = StaticCapacity()


def load(**running: int) -> Callable[[], Mapping[str, int]]:
    """Running slots per SSH host, as the orchestrator's state gives them."""
    return lambda: running


def worker(**fields: object) -> WorkerSettings:
    return WorkerSettings.model_validate(fields)


def retry(*, host: str | None = None, code: str | None = None, adopted_on: str | None = None
          ) -> RetryEntry:
    resume = (
        SpawnIntent(handle="h", phase=SpawnPhase.RUNNING, placement=adopted_on)
        if adopted_on is not None
        else None
    )
    return RetryEntry(
        issue_id="i1", identifier="ABC-1", slot_index=0, attempt=1, kind=RetryKind.FAILURE,
        due_at_ms=0.0, due_at=EPOCH, error_code=code, host=host, resume=resume,
    )


def test_without_hosts_a_run_stays_on_this_machine() -> None:
    placement = claim_placement(worker(), capacity=LOCAL, retry=None, host_load=load())
    assert placement == ClaimPlacement(location=RunLocation.LOCAL)
    assert placement is not None
    assert not placement.reserves


def test_the_least_loaded_host_with_room_is_chosen_and_a_full_set_refuses() -> None:
    hosts = worker(ssh_hosts=["a", "b"], max_concurrent_agents_per_host=1)
    chosen = claim_placement(hosts, capacity=LOCAL, retry=None, host_load=load(a=1))
    assert chosen == ClaimPlacement(location=RunLocation.SSH, host="b")
    full = claim_placement(hosts, capacity=LOCAL, retry=None, host_load=load(a=1, b=1))
    assert full is None  # NB: never a fall back to this machine


def test_a_retry_goes_back_to_its_host_unless_it_was_unreachable() -> None:
    hosts = worker(ssh_hosts=["a", "b"])
    back = claim_placement(hosts, capacity=LOCAL, retry=retry(host="b"), host_load=load(b=3))
    assert back is not None
    assert back.host == "b"
    away = claim_placement(
        hosts, capacity=LOCAL, retry=retry(host="b", code=HOST_UNREACHABLE_CODE),
        host_load=load(b=3),
    )
    assert away is not None
    assert away.host == "a"


def test_an_adopted_run_stays_on_its_workers_host_even_over_the_cap() -> None:
    hosts = worker(ssh_hosts=["a", "b"], max_concurrent_agents_per_host=1)
    placement = claim_placement(
        hosts, capacity=LOCAL, retry=retry(adopted_on="a"), host_load=load(a=1, b=1)
    )
    assert placement == ClaimPlacement(location=RunLocation.SSH, host="a")


def test_a_governing_pool_reserves_while_it_has_room() -> None:
    settings = worker(worker_pool={"acquire_timeout_ms": 7000})
    placement = claim_placement(settings, capacity=PoolProbe(), retry=None, host_load=load())
    assert placement == ClaimPlacement(location=RunLocation.POOL, acquire_timeout_ms=7000)
    assert placement.reserves
    full = claim_placement(settings, capacity=PoolProbe(room=False), retry=None, host_load=load())
    assert full is None


def test_pods_reserve_for_the_longer_of_acquire_and_start_whatever_the_pool_says() -> None:
    settings = worker(kind="pod", pod_template={"image": "img"}, start_timeout_ms=90000)
    assert runs_in_pods(settings)
    placement = claim_placement(
        settings, capacity=PoolProbe(room=False), retry=retry(adopted_on="a"), host_load=load()
    )
    assert placement == ClaimPlacement(location=RunLocation.POD, acquire_timeout_ms=90000)
    assert placement.reserves


@pytest.mark.parametrize(
    ("fields", "host", "pooled", "where"),
    [
        ({}, None, False, RunLocation.LOCAL),
        ({"ssh_hosts": ["a"]}, "a", False, RunLocation.SSH),
        ({"ssh_hosts": ["a"]}, None, True, RunLocation.POOL),
        ({"kind": "pod", "pod_template": {"image": "img"}}, None, False, RunLocation.POD),
        ({"kind": "pod", "pod_template": {"image": "img"}}, None, True, RunLocation.POOL),
    ],
    ids=["local", "ssh", "pool", "pod", "pooled-wins"],
)
def test_where_a_claimed_run_executes(
    fields: dict[str, object], host: str | None, pooled: bool, where: RunLocation
) -> None:
    assert run_location(worker(**fields), host=host, pooled=pooled) is where


def test_only_pod_workers_run_in_pods() -> None:
    assert not runs_in_pods(worker())
    assert not runs_in_pods(worker(ssh_hosts=["a"]))



def test_the_host_load_is_read_only_when_a_host_is_chosen() -> None:
    def never() -> Mapping[str, int]:
        raise AssertionError("the host load was read")

    pod = worker(kind="pod", pod_template={"image": "img"})
    for settings, capacity in ((worker(), LOCAL), (worker(), PoolProbe()), (pod, LOCAL)):
        assert claim_placement(settings, capacity=capacity, retry=None, host_load=never)
