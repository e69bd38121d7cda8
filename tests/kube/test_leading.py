"""Waiting for a Workflow's shard: a follower keeps only the newest object, with no controller
and no task, until its shard comes; a term that is offered but does not hold is polled, not
spun.

A replica watches every Workflow but leads about one in three (with three replicas), so what a
follower keeps and does is a replica's steady cost. The waits are counted in loop work: every
task made on the test's own loop is counted by a task factory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

import kubernetes.client

from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi
from lorenz.kube.leaderelection.leading import WorkflowLeadership
from lorenz.kube.leaderelection.leases import LeaseTiming
from lorenz.kube.leaderelection.sharding import ShardCoordinator, ShardTerm
from lorenz.kube.operator.process import Supervisor
from lorenz.kube.settings import OperatorSettings

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


async def test_win_returns_at_once_while_the_shard_is_not_offered_here() -> None:
    shards = coordinator()
    leadership = WorkflowLeadership(coordinator=shards, workflow=WORKFLOW)
    # NB: the supervisor makes a controller only once the shard is offered; a controller whose
    # shard left (lost, handed over) ends its loop instead of waiting.
    assert await asyncio.wait_for(leadership.win(stop=asyncio.Event()), timeout=5) is False


def workflow_body(*, generation: int, interval_ms: int) -> dict[str, Any]:
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {
            "name": WORKFLOW.name, "namespace": WORKFLOW.namespace, "uid": WORKFLOW.uid,
            "generation": generation,
        },
        "spec": {"tracker": {"kind": "files", "path": "issues"},
                 "polling": {"intervalMs": interval_ms}},
    }


async def test_a_follower_keeps_only_the_newest_object_until_its_shard_is_offered(
    tmp_path: Path,
) -> None:
    shards = coordinator()
    supervisor = Supervisor(
        api=shards.member._api,
        settings=OperatorSettings(identity="op-a", workspace_root=str(tmp_path)),
        coordinator=shards,
        base_env={},
        post=lambda *_: None,
    )
    key = (WORKFLOW.namespace, WORKFLOW.name)
    with TaskCount() as count:
        supervisor.workflow_event(None, workflow_body(generation=1, interval_ms=5000))
        supervisor.workflow_event("MODIFIED", workflow_body(generation=2, interval_ms=7000))
        await asyncio.sleep(10 * TIMING.retry_period_s)
    assert count.created == 0, "a follower made tasks"
    assert supervisor.controllers == {}
    # NB: what it watches, said from the inside: the probe tells any Pod only ok or not (#37).
    assert list(supervisor.workflows) == [key]
    assert not any(c.leading for c in supervisor.controllers.values())
    assert supervisor.probe() == {"ok": True}
    watched = supervisor.workflows[key]
    assert watched.controller is None
    assert watched.runtime is None
    assert not watched.leading

    # The shard comes: the controller is made at once, from the newest object.
    shard = watched.shard
    shard.term = ShardTerm(shard, generation=1)
    shard.available.set()
    shards._offered(shard)
    controller = supervisor.controllers[key]
    assert watched.controller is controller
    assert controller.task is not None
    assert not controller.task.done()
    assert controller.status_inputs().generation == 2

    # The shard leaves (here: its term ends): the controller's loop ends, the record stays.
    shard.term = None
    shard.available.clear()
    await asyncio.wait_for(asyncio.shield(controller.task), timeout=30)
    await asyncio.sleep(0)  # NB: the task's done callbacks run one loop step later
    assert supervisor.controllers == {}
    assert supervisor.workflows[key] is watched
    assert watched.controller is None
    assert json.loads(watched.body_text)["metadata"]["generation"] == 2

    supervisor.workflow_event("DELETED", workflow_body(generation=2, interval_ms=7000))
    assert supervisor.workflows == {}


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
