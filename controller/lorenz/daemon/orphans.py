"""Agents that outlived their Lorenz: found by a mark in their environment, killed before reuse.

Each agent runs in a process group of its own (so a stop can kill the whole tree), which also
means that ``kill -9`` of the Lorenz process leaves its agents running. Their claims are then
recovered and the interrupted slots dispatched again — while the old agent may still be working
on the same issue. That is the one thing the product must never do.

So every process Lorenz starts (agents and workspace hooks) carries ``LORENZ_OWNER=<claim owner
id>`` in its environment, and children inherit it. Before a restarted Lorenz dispatches anything
it looks for processes whose mark names an owner that is *verifiably dead* on this host (its pid
is gone or belongs to a process that started at another time — owner ids are
``<host>:<pid>:<start time>``), kills their process groups with SIGKILL, and waits until they
are gone. A live owner's processes are never touched, whatever its heartbeat says.

NB: a mark is only as good as the environment: an agent that scrubs its environment *and*
detaches into a new session (``env -i setsid ...``) escapes the sweep. PR_SET_PDEATHSIG was
considered and rejected: it fires when the spawning *thread* exits and reaches only the direct
child (``bash``), never the agent bash started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection, Iterable, Mapping

import psutil

from lorenz.claims.owners import Liveness, OwnerId, owner_liveness
from lorenz.daemon.errors import DaemonOrphansAlive
from lorenz.workers.states import HANDLE_ENV

__all__ = [
    "OWNER_ENV",
    "WORKFLOW_ENV",
    "OwnerId",
    "dead_owners_of",
    "find_orphans",
    "kill_orphans",
    "marked_environment",
    "owner_is_dead",
]

logger = logging.getLogger("lorenz.daemon")

OWNER_ENV = "LORENZ_OWNER"
"""The claim owner id of the Lorenz process that started this process (or an ancestor of it)."""
KILL_WAIT_S = 10.0


def owner_is_dead(owner: str, *, host: str | None = None) -> bool:
    """Whether ``owner`` is provably gone: same host, and its pid died or was reused.

    Another host's owner, or one we may not inspect, is never dead from here.
    """
    return owner_liveness(owner, host=host) is Liveness.DEAD


WORKFLOW_ENV = "LORENZ_WORKFLOW_KEY"
"""The sha256 of the canonical WORKFLOW.md path the marked process works for."""


def marked_environment(
    base: Mapping[str, str], *, owner: str, workflow_key: str | None = None
) -> dict[str, str]:
    """``base`` plus the owner mark (and the workflow's key), for the agents and hooks of the
    process ``owner`` names."""
    marks = (
        {OWNER_ENV: owner}
        if workflow_key is None
        else {
            OWNER_ENV: owner,
            WORKFLOW_ENV: workflow_key,
        }
    )
    return {**base, **marks}


def dead_owners_of(workflow_key: str, *, host: str | None = None) -> set[str]:
    """Owners marked on live processes of this workflow that are verifiably dead.

    NB: the store alone cannot answer this: a process that took a dead owner's claims over and
    died before sweeping its agents leaves agents whose owner no longer appears in the store.
    The marks on the processes themselves always can.
    """
    owners: set[str] = set()
    for process in psutil.process_iter():
        try:
            environ = process.environ()
        except (psutil.Error, OSError):
            continue
        if HANDLE_ENV in environ or environ.get(WORKFLOW_ENV) != workflow_key:
            continue
        owner = environ.get(OWNER_ENV)
        if owner:
            owners.add(owner)
    return {owner for owner in owners if owner_is_dead(owner, host=host)}


def find_orphans(owners: Collection[str]) -> list[psutil.Process]:
    """Processes of this user whose owner mark is one of ``owners``."""
    if not owners:
        return []
    me = os.getpid()
    found: list[psutil.Process] = []
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            environ = process.environ()
        except (psutil.Error, OSError):
            continue  # gone, another user's, a kernel thread
        # NB: a detached worker's processes (the worker, its agent and hooks) carry the run's
        # handle: the next controller adopts them; killing them would lose the run in flight.
        if HANDLE_ENV in environ:
            continue
        if environ.get(OWNER_ENV) in owners:
            found.append(process)
    return found


def kill_orphans(
    owners: Iterable[str], *, wait_s: float = KILL_WAIT_S, host: str | None = None
) -> list[int]:
    """SIGKILL every process (and its group) marked with a verifiably dead owner; wait for them.

    Owners that are not provably dead are skipped. Returns the pids killed. Raises
    :class:`DaemonOrphansAlive` if some survive ``wait_s`` (stuck in the kernel).
    """
    dead = {owner for owner in owners if owner_is_dead(owner, host=host)}
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        orphans = [p for p in find_orphans(dead) if _is_running(p)]
        if not orphans:
            break
        if time.monotonic() > deadline:
            raise DaemonOrphansAlive(pids=sorted(p.pid for p in orphans), waited_s=wait_s)
        for process in orphans:
            _kill_tree(process)
            if process.pid not in killed:
                killed.append(process.pid)
        psutil.wait_procs(orphans, timeout=max(min(1.0, deadline - time.monotonic()), 0.01))
    if killed:
        logger.warning(
            "killed agents of a dead lorenz process owners=%s pids=%s", sorted(dead), killed
        )
    return killed


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_tree(process: psutil.Process) -> None:
    with contextlib.suppress(OSError, psutil.Error):
        pgid = os.getpgid(process.pid)
        # NB: only a group the orphan leads (agents are spawned with start_new_session): killing
        # some other group it merely belongs to could hit an innocent shell.
        if pgid == process.pid:
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(psutil.Error):
        process.kill()
