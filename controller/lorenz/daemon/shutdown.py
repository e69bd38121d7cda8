"""The shutdown order of a single-host run, named step by step so it can be seen and tested.

The order is fixed: stop the runtime, unmount the terminal view, drain the worker pool,
stop the server, close the issue store (tracker), close the claim store, release the lease.
Each step depends on the ones before it: runs must be aborted before their pool goes away; the
server keeps answering (``lorenz status`` during a slow drain) until runs and pool are done; the
claim store records the runs' final state before it closes; and the lease is given back only
when nothing of this process can touch the workflow any more, so a successor never overlaps it.

The composition root logs every step (``shutdown step=<name>``) at info level on the
``lorenz.daemon`` logger, whether or not there was anything to do in it.

Before the first step comes the **drain** (:class:`GracefulStop`): SIGTERM, SIGINT,
``lorenz stop`` — and an end of the runtime by an unexpected error — first stop new claims and
let the runs in flight go on for the grace window (``--grace-seconds``, default 120). When the
window ends with runs left, detached workers are left running for the next controller to adopt
(``--force-kill`` cancels them instead); in-process runs, which cannot outlive this process,
are cancelled. ``lorenz stop --force`` (``--now``) ends the drain at once with the stop of
earlier versions: every run cancelled; a second signal is logged and ignored (the host's
handlers), and so is a second plain stop request. A controller that lost its lease never
drains: it stops before any write and leaves its workers to the new leader.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from lorenz.workers.runner import Departure

if TYPE_CHECKING:
    from lorenz.runtime import LorenzRuntime

logger = logging.getLogger("lorenz.daemon")

STOP_RUNTIME = "stop_runtime"
UNMOUNT_TUI = "unmount_tui"
DRAIN_WORKER_POOL = "drain_worker_pool"
STOP_SERVER = "stop_server"
CLOSE_TRACKER = "close_tracker"
CLOSE_CLAIM_STORE = "close_claim_store"
RELEASE_LEASE = "release_lease"

SHUTDOWN_ORDER: tuple[str, ...] = (
    STOP_RUNTIME,
    UNMOUNT_TUI,
    DRAIN_WORKER_POOL,
    STOP_SERVER,
    CLOSE_TRACKER,
    CLOSE_CLAIM_STORE,
    RELEASE_LEASE,
)
"""Every step, in order (``release_lease`` only in daemon mode)."""

STEP_MESSAGE = "shutdown step=%s"


def shutdown_step(name: str) -> None:
    """Log that step ``name`` of :data:`SHUTDOWN_ORDER` begins."""
    logger.info(STEP_MESSAGE, name)


def stops_with_server(attachment: object) -> bool:
    """Whether an attachment is a server (stopped after the drain) rather than a view.

    Servers say so with ``serves = True`` (:class:`lorenz.server.LorenzServer`, the daemon's
    control transport); everything else is unmounted with the terminal view.
    """
    return bool(getattr(attachment, "serves", False))


DEFAULT_GRACE_S: Final = 120.0
"""How long runs in flight may go on after a graceful stop was asked for (``--grace-seconds``)."""

GRACE_ELAPSED: Final = "shutdown_grace_elapsed"
KILL_UNCONFIRMED: Final = "shutdown_kill_unconfirmed"
"""The departure's reason when runs cancelled at shutdown could not be proven killed in time."""
KILL_CONFIRM_BOUND_S: Final = 60.0
"""How long a stopping controller waits for the cancelled runs' kills to be confirmed (a
frozen worker's host unreachable, a Pod the API server does not show gone) before it leaves
those runs, unsettled, to the next controller."""
"""Why a drain that ran out of time left its detached workers running."""


class GracefulStop:
    """One shutdown of a runtime: drain for the grace window, then stop.

    :meth:`request` is what a signal and ``POST /api/v1/stop`` call (any number of times: the
    first begins the drain, a later one with ``now`` cuts it short, a later one without changes
    nothing);
    :meth:`finish` is what the host awaits in its shutdown, whether a request came or the
    runtime ended on its own (``--once``, an unexpected error).
    """

    def __init__(
        self,
        *,
        runtime: LorenzRuntime,
        grace_s: float = DEFAULT_GRACE_S,
        force_kill: bool = False,
        hand_over: bool,
        departure: Departure | None = None,
    ) -> None:
        """``hand_over``: a drain that runs out of time leaves its runs' workers to the next
        controller (through ``departure``, the one the runtime's runners were given) instead
        of cancelling them."""
        if hand_over and departure is None:
            # NB: a programming error, not a user's: without the runners' departure a hand-over
            # would cancel the very workers it means to leave running.
            raise ValueError("hand_over needs the departure the runtime's runners were given")
        self._runtime = runtime
        self._departure = departure if departure is not None else Departure()
        self._grace_s = max(grace_s, 0.0)
        self._force_kill = force_kill
        self._hand_over = hand_over
        self._now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def requested(self) -> bool:
        return self._task is not None

    def request(self, *, now: bool = False) -> None:
        """Begin the drain (or, with ``now``, end it at once; a repeat without it is a no-op)."""
        if now:
            self._now.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._drain_then_stop(), name="lorenz-graceful-stop"
            )

    async def finish(self) -> None:
        """Drain (unless a request already did, or the runtime stopped) and stop the runtime."""
        if self._task is None and not self._runtime.stopped:
            self._task = asyncio.get_running_loop().create_task(
                self._drain_then_stop(), name="lorenz-graceful-stop"
            )
        if self._task is not None:
            await asyncio.shield(self._task)
        self._runtime.stop()

    async def _drain_then_stop(self) -> None:
        runtime = self._runtime
        drained = True
        if not self._now.is_set() and not runtime.stopped:
            logger.info(
                "draining: no new runs; runs in flight may finish within grace_s=%g",
                self._grace_s,
            )
            drained = await runtime.drain(grace_s=self._grace_s, cut_short=self._now)
        if drained:
            runtime.stop()
        elif self._hand_over and not self._force_kill and not self._now.is_set():
            logger.info("grace ended with runs in flight; leaving their workers to the next")
            # NB: before stop(): its aborts must leave the workers running, not cancel them.
            self._departure.leave(reason=GRACE_ELAPSED)
            runtime.stop(hand_over=True)
        else:
            logger.info("grace ended with runs in flight; cancelling them")
            runtime.stop()
