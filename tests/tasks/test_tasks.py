"""lorenz.tasks: background task sets, first-of waits, work that runs to completion."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from lorenz.tasks import BackgroundTasks, first_of, run_to_completion


async def test_a_background_task_is_kept_alive_until_it_ends() -> None:
    tasks = BackgroundTasks(name="test")
    finished = asyncio.Event()

    async def work() -> None:
        await asyncio.sleep(0.01)
        finished.set()

    tasks.spawn(work(), name="work")
    gc.collect()  # the set, not the caller, holds the only reference
    assert len(tasks) == 1
    await asyncio.wait_for(finished.wait(), timeout=10)
    await tasks.wait(timeout_s=10)
    assert len(tasks) == 0


async def test_a_failing_background_task_is_logged_with_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(name="updates")

    async def boom() -> None:
        raise ValueError("bad update")

    with caplog.at_level(logging.ERROR, logger="lorenz.tasks"):
        tasks.spawn(boom(), name="apply-update")
        await tasks.wait(timeout_s=10)
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    [record] = [r for r in caplog.records if "background task failed" in r.getMessage()]
    assert "set=updates task=apply-update error=ValueError: bad update" in record.getMessage()


async def test_a_cancelled_background_task_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(name="test")
    tasks.spawn(asyncio.sleep(3600))
    with caplog.at_level(logging.ERROR, logger="lorenz.tasks"):
        await tasks.cancel_all(timeout_s=10)
        await asyncio.sleep(0)
    assert len(tasks) == 0
    assert not caplog.records


async def test_first_of_returns_the_winner_and_cancels_and_awaits_the_rest() -> None:
    loser_cleaned = asyncio.Event()

    async def loser() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            loser_cleaned.set()

    async def winner() -> str:
        await asyncio.sleep(0.01)
        return "won"

    done = await first_of(loser(), winner(), timeout_s=10)
    assert done is not None
    assert done.result() == "won"
    assert loser_cleaned.is_set()  # awaited, not merely cancelled


async def test_first_of_times_out_to_none_and_cancels_everything() -> None:
    sleeper = asyncio.ensure_future(asyncio.sleep(3600))
    assert await first_of(sleeper, timeout_s=0.01) is None
    assert sleeper.cancelled()


async def test_run_to_completion_finishes_the_work_then_reraises_the_cancellation() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    completed: list[str] = []

    async def send() -> str:
        started.set()
        await release.wait()
        completed.append("sent")
        return "ok"

    caller = asyncio.ensure_future(run_to_completion(send()))
    await asyncio.wait_for(started.wait(), timeout=10)
    caller.cancel()
    await asyncio.sleep(0.01)
    caller.cancel()  # a second cancellation is absorbed too
    await asyncio.sleep(0.01)
    assert not caller.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert completed == ["sent"]


async def test_run_to_completion_returns_the_result_and_raises_the_work_error() -> None:
    async def ok() -> int:
        return 7

    async def fails() -> int:
        raise KeyError("x")

    assert await run_to_completion(ok()) == 7
    with pytest.raises(KeyError):
        await run_to_completion(fails())
