"""lorenz.tasks: background task sets, first-of waits, work that runs to completion, the child
watcher."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import weakref
from collections.abc import AsyncIterator

import pytest

from lorenz.tasks import (
    BackgroundTasks,
    PidfdChildWatcher,
    first_of,
    install_child_watcher,
    run_on_fresh_loop,
    run_to_completion,
    start_up_objects_frozen,
)


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


# -- the child watcher ---------------------------------------------------------------------

needs_pidfd_watcher = pytest.mark.skipif(
    sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"),
    reason="the pidfd watcher is installed only on Python 3.11 with pidfd_open",
)


async def _exit_statuses() -> list[int]:
    """Exit codes of a clean exit, a failure and a SIGKILL, each as asyncio reports it."""
    codes = []
    for script in ("exit 0", "exit 3", "kill -9 $$"):
        process = await asyncio.create_subprocess_exec("sh", "-c", script)
        codes.append(await asyncio.wait_for(process.wait(), timeout=30))
    piped = await asyncio.create_subprocess_exec(
        "sh", "-c", "echo out", stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await asyncio.wait_for(piped.communicate(), timeout=30)
    assert stdout == b"out\n"
    return codes


@needs_pidfd_watcher
async def test_the_pidfd_watcher_reports_exit_codes_and_starts_no_thread() -> None:
    assert install_child_watcher()
    watcher = asyncio.get_event_loop_policy().get_child_watcher()
    assert isinstance(watcher, PidfdChildWatcher)
    before = {thread.ident for thread in threading.enumerate()}
    assert await _exit_statuses() == [0, 3, -9]
    # NB: asyncio's threaded watcher names its threads "waitpid-N"; none may have started.
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not [name for name in started if name.startswith("waitpid")]


@needs_pidfd_watcher
def test_the_pidfd_watcher_serves_a_loop_in_another_thread() -> None:
    assert install_child_watcher()
    results: list[list[int]] = []
    thread = threading.Thread(target=lambda: results.append(asyncio.run(_exit_statuses())))
    thread.start()
    thread.join(timeout=60)
    assert results == [[0, 3, -9]]


@needs_pidfd_watcher
async def test_a_child_reaped_elsewhere_ends_with_255_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert install_child_watcher()
    # NB: the child may not exit before this coroutine stops yielding to the loop:
    # create_subprocess_exec yields, and the watcher's reader, run then, would reap a child that
    # had already exited first. So it waits for end of file on a pipe only this test writes to.
    gate_read, gate_write = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            "sh", "-c", "read -r _; exit 7", stdin=gate_read
        )
    finally:
        os.close(gate_read)
    # Let the child exit and reap it with a stray waitpid, all without yielding to the loop:
    # the watcher's reader cannot run before the child is gone.
    os.close(gate_write)
    _, status = os.waitpid(process.pid, 0)  # noqa: ASYNC222 - the blocking reap is the case
    assert os.waitstatus_to_exitcode(status) == 7  # the exit status only the stray reap saw
    with caplog.at_level(logging.WARNING, logger="lorenz.tasks"):
        assert await asyncio.wait_for(process.wait(), timeout=30) == 255
    assert f"child {process.pid} was reaped elsewhere" in caplog.text


class _Node:
    """A garbage-collectable object that can be part of a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return weakref.ref(first)


def test_start_up_objects_are_left_to_the_collector_again_on_exit() -> None:
    old = _cycle()  # garbage already, but only the cyclic collector can free it
    with start_up_objects_frozen():
        assert gc.get_freeze_count() > 0
        new = _cycle()
        gc.collect()
        assert new() is None  # made after entry: collected as usual
        assert old() is not None  # frozen on entry: not walked
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert old() is None


def test_a_fresh_loop_runs_the_coroutine_and_cleans_up_as_asyncio_run_does() -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    tasks: list[asyncio.Task[None]] = []
    threads: list[threading.Thread] = []
    generators: list[AsyncIterator[int]] = []
    left_over_cancelled = threading.Event()
    generator_closed = threading.Event()

    async def linger() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            left_over_cancelled.set()
            raise

    async def numbers() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            generator_closed.set()

    async def main() -> int:
        loops.append(asyncio.get_running_loop())
        tasks.append(asyncio.create_task(linger()))
        generators.append(numbers())
        assert await anext(generators[0]) == 1
        threads.append(await asyncio.to_thread(threading.current_thread))
        return 42

    threads_before = set(threading.enumerate())
    assert run_on_fresh_loop(main()) == 42
    assert loops[0].is_closed()
    assert left_over_cancelled.is_set()
    assert tasks[0].cancelled()
    assert generator_closed.is_set()
    # NB: the default executor's thread was joined, not left behind.
    assert threads[0] not in threading.enumerate()
    assert set(threading.enumerate()) <= threads_before


def test_a_fresh_loop_reports_a_left_over_task_that_failed_and_installs_no_signal_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import signal

    handler_before = signal.getsignal(signal.SIGINT)

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("cleanup went wrong")

    kept: list[asyncio.Task[None]] = []

    async def main() -> None:
        kept.append(asyncio.create_task(fails_when_cancelled()))
        await asyncio.sleep(0)
        assert signal.getsignal(signal.SIGINT) is handler_before

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run_on_fresh_loop(main())
    assert "left over at the end of the run" in caplog.text
    assert "cleanup went wrong" in caplog.text


def test_a_fresh_loop_raises_the_coroutine_error_and_still_closes() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        seen.append(asyncio.get_running_loop())
        raise ValueError("bad run")

    with pytest.raises(ValueError, match="bad run"):
        run_on_fresh_loop(main())
    assert seen[0].is_closed()
