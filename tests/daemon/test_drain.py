"""Drain on stop: no new run starts, runs in flight may finish within the grace window.

In-process daemons on the files tracker with the recorder agent (real subprocesses): a stop
asked for while a run is in flight lets it finish (rc 0, nothing started after it); ``now`` ends
a drain under way at once; a window that ends first cancels in-process runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lorenz.daemon.discovery import lease_file_for, read_lease
from lorenz.daemon.host import HostOptions, run_host
from tests.daemon.harness import call, in_process, read_agent_log, write_daemon_workflow
from tests.waiting import wait_until_async

BOUND_S = 100.0
"""Hang protection only; never asserted as a figure."""


def _options(workflow: Path, env: dict[str, str], *, grace_s: float) -> HostOptions:
    return HostOptions(
        workflow_path=str(workflow),
        cli_features=["daemon", "durable_claims"],
        tui=False,
        environ=env,
        grace_seconds=grace_s,
    )


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in read_agent_log(log) if e["event"] == name]


async def _started(root: Path, daemon_env: dict[str, str], *, seconds: int, grace_s: float) -> Any:
    agent = {"AGENT_MIN_S": str(seconds), "AGENT_MAX_S": str(seconds), "AGENT_FAIL_RATE": "0"}
    workflow = write_daemon_workflow(root, issues=("A-1",), agent_env=agent)
    task = asyncio.create_task(run_host(_options(workflow, daemon_env, grace_s=grace_s)))
    await wait_until_async(
        lambda: len(_events(root / "agent.log", "start")) == 1,
        timeout=60.0,
        what='len(_events(root / "agent.log", "start")) == 1',
    )
    lease = read_lease(lease_file_for(workflow))
    assert lease is not None
    return task, lease["endpoint"]


async def _stop(endpoint: str, body: dict[str, Any] | None = None) -> None:
    reply = await asyncio.to_thread(call, endpoint, "POST", "/api/v1/stop", body)
    assert reply.status == 202, reply.body


async def test_a_stop_lets_the_run_in_flight_finish_and_starts_nothing_new(
    root: Path, daemon_env: dict[str, str]
) -> None:
    task, endpoint = await _started(root, daemon_env, seconds=3, grace_s=BOUND_S)
    await _stop(endpoint)
    assert await asyncio.wait_for(task, BOUND_S) == 0
    log = root / "agent.log"
    assert [e["rc"] for e in _events(log, "end")] == [0], "the run finished on its own"
    assert len(_events(log, "start")) == 1, "its continuation was not started by the drain"


async def test_now_ends_a_drain_under_way_and_cancels_the_run(
    root: Path, daemon_env: dict[str, str], caplog: Any
) -> None:
    caplog.set_level("INFO", logger="lorenz.daemon")
    task, endpoint = await _started(root, daemon_env, seconds=60, grace_s=BOUND_S)
    await _stop(endpoint)
    await wait_until_async(
        lambda: "draining: no new runs" in caplog.text,
        timeout=60.0,
        what='"draining: no new runs" in caplog.text',
    )
    assert not task.done()
    await _stop(endpoint, {"now": True})
    assert await asyncio.wait_for(task, BOUND_S) == 0
    assert [e["rc"] for e in _events(root / "agent.log", "end")] == [-15]


async def test_a_window_that_ends_first_cancels_in_process_runs(
    root: Path, daemon_env: dict[str, str], caplog: Any
) -> None:
    caplog.set_level("INFO", logger="lorenz.daemon")
    # NB: in-process runs (the suite's test-only switch); workers are handed over instead
    # (tests/daemon/test_detached_workers.py).
    task, endpoint = await _started(root, in_process(daemon_env), seconds=60, grace_s=0.5)
    await _stop(endpoint)
    assert await asyncio.wait_for(task, BOUND_S) == 0
    assert "grace ended with runs in flight; cancelling them" in caplog.text
    assert [e["rc"] for e in _events(root / "agent.log", "end")] == [-15]
