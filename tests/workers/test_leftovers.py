"""A gone worker's leftovers die before its run is settled: no second agent beside the first.

``kill -9`` of a worker leaves its agent running (a process group of its own); a silent agent —
here the gated Codex agent, waiting on a gate it never gets — notices nothing. A controller
that finds the worker ``gone`` retries the run as a failure, so by then that agent must be dead.
The same for a launch still in flight when its controller died: the successor finds the handle
gone, and the launch command must not start the old attempt's worker after that. Found by
``tests/daemon/test_chaos_workers.py`` (a ``dup`` start mark: two agents on one issue).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest

from lorenz.model import LorenzError, SpawnIntent, SpawnPhase
from lorenz.workers.handles import LocalTransport
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.states import HANDLE_ENV, worker_pid
from tests.waiting import wait_until_async
from tests.workers.conftest import base_env, process_gone
from tests.workers.test_runner import Kit


def runner(state_root: Path, tmp_path: Path, *, generation: int) -> WorkerRunner:
    return WorkerRunner(
        workflow=str(tmp_path / "WORKFLOW.md"),
        transport=LocalTransport(state_root=state_root, env=base_env()),
        generation=generation,
    )


def silent_kit(tmp_path: Path) -> Kit:
    return Kit(tmp_path, [{"message": "waiting"}, {"gate": str(tmp_path / "never")}])


async def kill_the_worker_only(
    state_root: Path, handle: str, kit: Kit, *, watched: bool = False
) -> int:
    """SIGKILL the worker process (not its agent) once the agent's turn began; the agent's pid.

    ``watched``: a runner in this process follows the worker, and may well kill the agent as
    soon as the worker is gone — before this returns.
    """
    await wait_until_async(
        lambda: kit.starts() == 1 and worker_pid(state_root / handle) is not None,
        timeout=60,
        what="kit.starts() == 1 and worker_pid(state_root / handle) is not None",
    )
    pid = worker_pid(state_root / handle)
    assert pid is not None
    agent = int(kit.pid_file.read_text())
    assert not process_gone(agent)
    os.kill(pid, signal.SIGKILL)
    await wait_until_async(lambda: process_gone(pid), timeout=60, what="process_gone(pid)")
    if not watched:
        assert not process_gone(agent), "the agent outlives its worker: the case this is about"
    return agent


async def test_a_followed_worker_killed_mid_turn_fails_the_run_only_once_its_agent_is_dead(
    state_root: Path, tmp_path: Path
) -> None:
    kit = silent_kit(tmp_path)
    following = runner(state_root, tmp_path, generation=1)
    run = asyncio.create_task(following.run(kit.request()))
    await wait_until_async(
        lambda: following.last_handle is not None,
        timeout=60,
        what="following.last_handle is not None",
    )
    assert following.last_handle is not None
    agent = await kill_the_worker_only(
        state_root, following.last_handle.handle, kit, watched=True
    )
    with pytest.raises(LorenzError) as caught:
        await asyncio.wait_for(run, timeout=60)
    assert caught.value.code == "worker_gone"
    assert process_gone(agent), "the failure retry would start a second agent beside this one"


async def test_a_resumed_run_whose_worker_is_gone_kills_its_agent_before_failing(
    state_root: Path, tmp_path: Path
) -> None:
    kit = silent_kit(tmp_path)
    spec = runner(state_root, tmp_path, generation=1).spec_for(kit.request())
    await LocalTransport(state_root=state_root, env=base_env()).launch(spec)
    agent = await kill_the_worker_only(state_root, spec.handle, kit)
    resume = SpawnIntent(handle=spec.handle, phase=SpawnPhase.RUNNING, generation=1, last_seq=3)
    with pytest.raises(LorenzError) as caught:
        await runner(state_root, tmp_path, generation=2).run(kit.request(resume=resume))
    assert caught.value.code == "worker_gone"
    assert process_gone(agent)
    assert kit.starts() == 1


async def test_without_claims_a_gone_predecessors_agent_dies_before_the_next_agent_starts(
    state_root: Path, tmp_path: Path
) -> None:
    """The memory store's path: the runner scans the state root and finds the dead worker."""
    kit = silent_kit(tmp_path)
    spec = runner(state_root, tmp_path, generation=1).spec_for(kit.request())
    await LocalTransport(state_root=state_root, env=base_env()).launch(spec)
    agent = await kill_the_worker_only(state_root, spec.handle, kit)
    successor = runner(state_root, tmp_path, generation=2)
    run = asyncio.create_task(successor.run(kit.request()))
    try:
        await wait_until_async(
            lambda: kit.starts() == 2,
            timeout=60,
            what="kit.starts() == 2",
        )
        assert process_gone(agent), "two agents of one slot ran at once"
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError, LorenzError):
            await run


async def test_a_launch_in_flight_when_its_controller_died_is_killed_when_found_gone(
    state_root: Path, tmp_path: Path
) -> None:
    """The dead controller's ``lorenz worker --detach`` is still starting (here: stopped).

    The successor probes the handle: no worker and no journal while the intent says
    ``spawn_requested``, so ``worker_never_started`` (a retry of the same attempt, no failure
    counted). The launch command must not go on to start the old attempt's worker beside that
    retry.
    """
    kit = silent_kit(tmp_path)
    spec = runner(state_root, tmp_path, generation=1).spec_for(kit.request())
    transport = LocalTransport(state_root=state_root, env=base_env())
    launching = asyncio.create_task(transport.launch(spec))
    me = psutil.Process()

    def launcher() -> psutil.Process | None:
        for child in me.children():
            with contextlib.suppress(psutil.Error):
                if child.environ().get(HANDLE_ENV) == spec.handle:
                    return child
        return None

    # NB: polled often: the interpreter takes far longer to start than one poll.
    async with asyncio.timeout(60):
        while (found := launcher()) is None:
            await asyncio.sleep(0.002)
    found.suspend()
    try:
        resume = SpawnIntent(
            handle=spec.handle, phase=SpawnPhase.SPAWN_REQUESTED, generation=1, last_seq=0
        )
        with pytest.raises(LorenzError) as caught:
            await runner(state_root, tmp_path, generation=2).run(kit.request(resume=resume))
        assert caught.value.code == "worker_never_started"
        assert process_gone(found.pid), "the launch goes on and starts a second agent"
    finally:
        with contextlib.suppress(psutil.Error):
            found.resume()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(launching, timeout=60)
    assert kit.starts() == 0
