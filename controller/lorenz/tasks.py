"""The small asyncio kit every layer uses for background work, first-of waits and shielding.

Three patterns kept recurring by hand, each with a trap of its own:

* **fire-and-forget tasks** — the event loop holds only a weak reference to a task, so a task
  nobody keeps can be garbage-collected mid-flight, and an exception in a task nobody awaits is
  reported only as "Task exception was never retrieved" at interpreter exit.
  :class:`BackgroundTasks` keeps a strong reference until the task ends and logs its failure
  at once, with the task's name;
* **first of several awaitables** — ``asyncio.wait(..., return_when=FIRST_COMPLETED)`` leaves
  the losers running unless the caller remembers to cancel them. :func:`first_of` cancels and
  awaits them;
* **work that must not be cut in half** — a tracker request or a file write that a cancelled
  caller abandons mid-send leaves the other side with a truncated body.
  :func:`run_to_completion` lets the work finish, then re-raises the cancellation;
* **noticing that a child exited** — on Python 3.11 asyncio starts a thread per subprocess that
  blocks in ``waitpid`` until the child ends (its default ``ThreadedChildWatcher``): one
  thread start per agent, hook and git command on the event loop's thread.
  :func:`install_child_watcher` puts in the pidfd watcher 3.12 uses by default instead (a
  readable process file descriptor on the running loop, no thread);
* **full garbage collections on the loop's thread** — a long-running process keeps every
  object its start-up made (modules, settings, the runtime), and each full collection of the
  cyclic garbage collector walks all of them again (about 95,000 objects, 50 ms of the loop's
  thread on a loaded 2-core machine) although none of them will ever be garbage.
  :func:`start_up_objects_frozen` moves them out of the collector's reach while the process
  runs;
* **one coroutine, then exit, in a forked process** — ``asyncio.run`` is made for a program's
  main: it copies a context, installs a SIGINT handler through the ``signal`` module's enum
  wrappers and sets the policy's current loop. A worker forked from the launcher pays for every
  page such first calls write (copy-on-write), ~0.2 MiB of private memory per live run, for
  handling it does itself. :func:`run_on_fresh_loop` does only what such a process needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


class BackgroundTasks:
    """A set of tasks nobody awaits: kept alive until they end, failures logged at once."""

    def __init__(self, *, name: str, log: logging.Logger | None = None) -> None:
        self._name = name
        self._log = log or logger
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task of this set and return it."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._log.error(
                "background task failed set=%s task=%s error=%s: %s",
                self._name,
                task.get_name(),
                type(exc).__name__,
                exc,
                exc_info=exc,
            )

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def wait(self, *, timeout_s: float | None = None) -> bool:
        """Wait until every task has ended (or ``timeout_s`` seconds); true if all ended."""
        pending = list(self._tasks)
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=timeout_s)
        return not still

    async def cancel_all(self, *, timeout_s: float | None = None) -> None:
        """Cancel every task and wait (at most ``timeout_s`` seconds) for them to end."""
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)


async def first_of(
    *awaitables: Awaitable[Any], timeout_s: float | None = None
) -> asyncio.Task[Any] | None:
    """The first of ``awaitables`` to finish (``None`` on timeout); the others are cancelled.

    NB: the losers are awaited after their cancellation, so nothing they hold (a subprocess
    pipe, a socket) is still being torn down when the caller goes on.
    """
    tasks = [asyncio.ensure_future(item) for item in awaitables]
    try:
        done, _ = await asyncio.wait(
            tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        # NB: a loser that fails while being cancelled has nothing to say to the winner's caller.
        await asyncio.gather(*tasks, return_exceptions=True)
    if not done:
        return None
    # Several can finish in the same loop iteration: the first in argument order wins.
    return next(task for task in tasks if task in done)


async def run_to_completion(aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end even if the caller is cancelled meanwhile; then re-raise that.

    For work that must not be cut in half (a request being sent, a record being written). The
    work itself is not cancelled; a second cancellation of the caller while it waits is also
    absorbed until the work has finished.
    """
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
        except BaseException:  # noqa: BLE001 - the work's own error: task.result() re-raises it
            break
    if cancelled:
        # The caller asked to stop while the work ran; now that it has ended, it may.
        raise asyncio.CancelledError
    return task.result()


ChildCallback = Callable[..., object]


class PidfdChildWatcher(asyncio.AbstractChildWatcher):
    """Reaps each child when its pidfd becomes readable on the loop that started it.

    Unlike the standard library's 3.11 ``PidfdChildWatcher`` it is attached to no loop: each
    handler goes on the loop running when the subprocess is created (what 3.12 does), so event
    loops in several threads can each start subprocesses.
    """

    # NB: typeshed types the callback with a TypeVarTuple over ``args``; asyncio passes
    # (pid, returncode, *args), which that cannot say.
    def add_child_handler(  # type: ignore[override]
        self, pid: int, callback: ChildCallback, *args: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

    @staticmethod
    def _reap(
        loop: asyncio.AbstractEventLoop,
        pid: int,
        pidfd: int,
        callback: ChildCallback,
        args: tuple[Any, ...],
    ) -> None:
        loop.remove_reader(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            # NB: someone else reaped it (a stray waitpid(-1)): asyncio's own watchers report
            # 255 then too.
            returncode = 255
            logger.warning("child %d was reaped elsewhere; its exit status is unknown", pid)
        else:
            returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        # NB: asyncio calls this only for a child it failed to start, which never got a
        # handler; the pidfd reader goes when the child has been reaped.
        return True

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        return None

    def close(self) -> None:
        return None

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> PidfdChildWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def install_child_watcher() -> bool:
    """Use :class:`PidfdChildWatcher` for this process's subprocesses; ``True`` if installed.

    A no-op on Python 3.12 and later (pidfds are the default there) and where the kernel has no
    ``pidfd_open`` (Linux before 5.3, or a seccomp filter refusing it): asyncio's threaded
    watcher stays. Children started before the call keep the watcher that started them.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    policy = asyncio.get_event_loop_policy()
    # NB: asked before the warnings are silenced: a worker forked from the launcher inherits
    # the launcher's watcher, and catching warnings copies the filters (pages of its own).
    if isinstance(getattr(policy, "_watcher", None), PidfdChildWatcher):
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return False
        policy.set_child_watcher(PidfdChildWatcher())
    return True


@contextlib.contextmanager
def start_up_objects_frozen() -> Iterator[None]:
    """While inside, the cyclic garbage collector leaves alone every object alive on entry.

    Enter it once start-up is over: later collections then walk only what the process made
    since (runs, events, tracker answers), not the modules and settings it will keep until it
    exits. On exit the frozen objects are handed back to the collector (``gc.unfreeze``), so a
    caller that goes on running (a test process) loses nothing. NB: cyclic garbage alive on
    entry is not collected until the exit; at the end of the host's start-up there is none
    (``gc.collect()`` there finds nothing), and reference counting still frees everything else.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_on_fresh_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new event loop, then clean up and close the loop.

    What :func:`asyncio.run` does for a process that runs one coroutine and exits — the tasks
    left over cancelled and awaited, async generators finalized, the default executor's threads
    joined, the loop closed — without what it adds for an interactive program's main (module
    docstring): no SIGINT handler (the caller installs its own signal handlers, as the worker
    does), no copied context, no current loop set on the policy. Issue #35: a forked worker's
    private memory.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_left_over_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _cancel_left_over_tasks(loop: asyncio.AbstractEventLoop) -> None:
    left_over = asyncio.all_tasks(loop)
    if not left_over:
        return
    for task in left_over:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left_over, return_exceptions=True))
    for task in left_over:
        if not task.cancelled() and task.exception() is not None:
            # NB: as asyncio.run reports them: an error nobody awaited is not lost silently.
            loop.call_exception_handler(
                {
                    "message": "unhandled exception in a task left over at the end of the run",
                    "exception": task.exception(),
                    "task": task,
                }
            )
