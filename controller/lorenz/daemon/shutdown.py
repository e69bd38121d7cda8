"""The shutdown order of a single-host run, named step by step so it can be seen and tested.

The order is fixed: stop the runtime, unmount the terminal view, drain the worker pool,
stop the server, close the issue store (tracker), close the claim store, release the lease.
Each step depends on the ones before it: runs must be aborted before their pool goes away; the
server keeps answering (``lorenz status`` during a slow drain) until runs and pool are done; the
claim store records the runs' final state before it closes; and the lease is given back only
when nothing of this process can touch the workflow any more, so a successor never overlaps it.

The composition root logs every step (``shutdown step=<name>``) at info level on the
``lorenz.daemon`` logger, whether or not there was anything to do in it.
"""

from __future__ import annotations

import logging

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
