"""A follower's wait for its Workflow's shard: asleep until the shard changes, never polling.

Every replica keeps a controller for every Workflow it watches, so the followers' waits are a
replica's steady cost (two thirds of its controllers with three replicas). The waits are counted
in loop work: every wake-up of :meth:`WorkflowLeadership.win` makes new tasks (the waits it
races), so a task factory on the test's own loop counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

import kubernetes.client

from lorenz.kube.clients import KubeApi
from lorenz.kube.leading import WorkflowLeadership
from lorenz.kube.leases import LeaseTiming
from lorenz.kube.resources import WorkflowRef
from lorenz.kube.sharding import ShardCoordinator, ShardTerm

TIMING = LeaseTiming(lease_duration_s=1, renew_deadline_s=0.5, retry_period_s=0.05)
WORKFLOW = WorkflowRef(namespace="team-a", name="wf", uid="uid-1")


def coordinator() -> ShardCoordinator:
    """A coordinator that is never started: no request is made, the shards stay as set here."""
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://127.0.0.1:9"
    return ShardCoordinator(
        api=KubeApi(configuration), namespace="lorenz", prefix="lorenz", shards=4,
        identity="op-a", timing=TIMING,
    )


class TaskCount:
    """Tasks created on the running loop while installed (every wake-up of a wait makes some)."""

    def __init__(self) -> None:
        self.created = 0

    def __enter__(self) -> TaskCount:
        loop = asyncio.get_running_loop()

        def factory(
            loop: asyncio.AbstractEventLoop,
            coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
            **kwargs: Any,
        ) -> asyncio.Task[Any]:
            self.created += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)  # type: ignore[arg-type]
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.get_running_loop().set_task_factory(None)


async def test_a_follower_sleeps_until_its_shard_is_available() -> None:
    shards = coordinator()
    leadership = WorkflowLeadership(coordinator=shards, workflow=WORKFLOW)
    stop = asyncio.Event()
    with TaskCount() as count:
        waiting = asyncio.ensure_future(leadership.win(stop=stop))
        # 20 retry periods: a wait with the retry period as its timeout would wake 20 times
        await asyncio.sleep(20 * TIMING.retry_period_s)
        assert not waiting.done()
        woken = count.created
        stop.set()
        assert await asyncio.wait_for(waiting, timeout=5) is False
    # the win() task itself, then its two waits, once
    assert woken <= 3, f"{woken} tasks made while the shard stayed with another replica"


async def test_a_term_that_no_longer_holds_is_polled_at_the_retry_period_not_spun() -> None:
    shards = coordinator()
    leadership = WorkflowLeadership(coordinator=shards, workflow=WORKFLOW)
    shard = leadership.shard
    # A term whose renewal is late: available to its Workflows, but it does not hold (the
    # coordinator has not ended it yet).
    shard.term = ShardTerm(shard, generation=1)
    shard.available.set()
    assert not shard.term.holds()
    stop = asyncio.Event()
    with TaskCount() as count:
        waiting = asyncio.ensure_future(leadership.win(stop=stop))
        await asyncio.sleep(10 * TIMING.retry_period_s)
        assert not waiting.done()
        woken = count.created
        stop.set()
        assert await asyncio.wait_for(waiting, timeout=5) is False
    # about one wake-up per retry period (10), a task each; a spinning loop makes thousands
    assert woken <= 40, f"{woken} tasks made in 10 retry periods"
