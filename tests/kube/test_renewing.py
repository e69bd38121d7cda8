"""Shard renewals run on their own thread: a main loop blocked past the renew deadline keeps them.

The coordinator runs against the real API server, in this test's event loop, which then blocks
(``time.sleep``: no round, no callback, no coroutine of that loop runs) for twice the renew
deadline. Before the renewals had their own thread and loop, nothing renewed meanwhile, so at
wake-up every term had ended (``holds()`` false) and the Workflows of those shards would have
stopped. The bound is the renew deadline itself (10 s, a renewal a second), not a speed figure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from lorenz.kube.clients import KubeApi, leases_path
from lorenz.kube.leaderelection.leases import LeaseTiming
from lorenz.kube.leaderelection.sharding import ShardCoordinator, shard_lease_name

pytestmark = pytest.mark.cluster

TIMING = LeaseTiming(lease_duration_s=15, renew_deadline_s=10.0, retry_period_s=1.0)


async def eventually(check: Callable[[], bool], *, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s: {message}")
        await asyncio.sleep(0.1)


async def test_a_blocked_main_loop_does_not_lose_the_shards(
    kube_api: KubeApi, kube_namespace: str
) -> None:
    lease_api = kube_api.dedicated(request_timeout_s=TIMING.request_timeout_s)
    coordinator = ShardCoordinator(
        api=lease_api, namespace=kube_namespace, prefix="blocked", shards=2, identity="solo",
        timing=TIMING,
    )
    coordinator.start()
    try:
        await eventually(lambda: coordinator.held() == [0, 1], timeout=120,
                         message="both shards held")
        terms = [shard.term for shard in coordinator.shards]
        paths = [leases_path(kube_namespace, shard_lease_name("blocked", i)) for i in (0, 1)]
        before = [(await lease_api.get(path))["spec"] for path in paths]

        # The main loop is blocked on purpose: nothing on it runs.
        time.sleep(2 * TIMING.renew_deadline_s)  # noqa: ASYNC251

        # NB: asked before this loop runs anything again: only the renewer can have renewed.
        assert [shard.term for shard in coordinator.shards] == terms
        assert all(term is not None and term.holds() for term in terms)
        assert not any(term is not None and term.lost.is_set() for term in terms)
        after = [(await lease_api.get(path))["spec"] for path in paths]
        for old, new in zip(before, after, strict=True):
            assert new["holderIdentity"] == "solo"
            assert new["leaseTransitions"] == old["leaseTransitions"]
            assert new["renewTime"] > old["renewTime"]
        # The main loop's rounds go on as before, with the same terms.
        rounds = coordinator.rounds
        await eventually(lambda: coordinator.rounds >= rounds + 2, timeout=60,
                         message="two more rounds")
        assert [shard.term for shard in coordinator.shards] == terms
        assert coordinator.held() == [0, 1]
    finally:
        await coordinator.close()
        await lease_api.close()
