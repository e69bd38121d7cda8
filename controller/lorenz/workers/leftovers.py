"""What a dead worker leaves behind, killed before its run is settled as ``gone``.

A worker killed with ``kill -9`` (or by the OOM killer) leaves its agent and any hook it was
running alive: they run in process groups of their own under the worker, and nothing signals
them. An agent notices only when it next writes to its lost stdout or reads its lost stdin; one
that is silent for a while — a long tool call, a model thinking, a test suite running — goes on
working on the issue. The controller meanwhile probes the worker, finds it ``gone`` and retries
the run as a failure: a second agent on the same issue beside the first, the one thing a run
must never do (found by ``tests/daemon/test_chaos_workers.py``).

The same holds for a launch in flight: a controller killed while its ``lorenz worker --detach``
command was still starting leaves that command running (it has a session of its own); a
successor that probes the handle meanwhile finds no worker yet — ``gone`` — and retries, and
then the launch command starts the old attempt's worker beside the retry.

So before a ``gone`` run is settled (a failure retry, or a fresh worker for the slot), every
process that carries the run's handle in its environment is killed with its process group, and
waited for: ``LORENZ_WORKER_HANDLE`` is set on the launch command (the worker it forks inherits
it), and the worker gives it to its agent and hooks, whose children inherit it. A handle names
one run only (a retry is a new attempt and a new handle), so the mark cannot hit another run's
processes. ``gone`` leads here, and so does a run the controller cancels (a stall, a stopped
issue) whose worker did not end it: a frozen worker (SIGSTOP, wedged) reads no cancel while its
agent goes on working, and the slot's retry must not start beside that agent. A worker that is
merely ``unknown`` while nobody asked it to stop is quarantined, never touched.

This sees the processes of this host only. For a worker placed over SSH the same kill runs on
the worker's host: ``lorenz worker --state-dir DIR --kill`` over the transport's ssh settings
(:func:`end_run` there, answering which processes survived). The slot is settled only once that
command confirms the run's processes are gone; a host that cannot be reached keeps the slot held
(``worker_kill_unconfirmed``) and the kill is tried again — never given up on the controller's
clock alone, since the agent may be working on over there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Final

import psutil

from lorenz.workers.states import HANDLE_ENV, worker_pid

logger = logging.getLogger(__name__)

KILL_WAIT_S: Final = 10.0


def find_leftovers(handle: str, *, worker: int | None = None) -> list[psutil.Process]:
    """The processes of this user that carry ``handle`` as their worker's mark, and the
    ``worker`` pid itself if it still runs (a worker forked by the warm launcher carries the
    launcher's environment, not the mark)."""
    me = os.getpid()
    found: list[psutil.Process] = []
    if worker is not None and worker != me:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(worker)
            if process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            if process.environ().get(HANDLE_ENV) == handle and process not in found:
                found.append(process)
        except (psutil.Error, OSError):
            continue  # gone meanwhile, another user's, a kernel thread
    return found


def kill_leftovers(
    handle: str, *, wait_s: float = KILL_WAIT_S, worker: int | None = None
) -> list[int]:
    """SIGKILL every process (and the group it leads) marked with ``handle``, and the
    ``worker`` pid (see :func:`find_leftovers`); wait for them.

    Scans again until a scan finds nothing: a launch command killed here may have forked its
    worker just before (the child carries the mark too). Returns the pids killed. NB: blocking
    (a scan of every process's environment): call it from a thread. Processes still alive
    after ``wait_s`` (stuck in the kernel) are logged.
    """
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    alive: list[psutil.Process] = []
    while True:
        leftovers = find_leftovers(handle, worker=worker)
        if not leftovers:
            alive = []
            break
        if time.monotonic() > deadline:
            alive = leftovers
            break
        for process in leftovers:
            with contextlib.suppress(OSError, psutil.Error):
                # NB: only a group the process leads (agents and hooks are started with
                # start_new_session): some other group it merely belongs to is not ours.
                if os.getpgid(process.pid) == process.pid:
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                process.kill()
            if process.pid not in killed:
                killed.append(process.pid)
        _wait_dead(leftovers, until=min(deadline, time.monotonic() + 1.0))
    if killed:
        logger.warning(
            "killed what the gone worker left running handle=%s pids=%s", handle, killed
        )
    if alive:
        logger.error(
            "processes of the gone worker survived SIGKILL handle=%s pids=%s",
            handle,
            sorted(p.pid for p in alive),
        )
    return killed


def end_run(state_dir: Path, *, wait_s: float = KILL_WAIT_S) -> list[int]:
    """Kill every process of the run whose state directory is ``state_dir`` (its handle is
    the directory's name; its worker's pid is read before anything is killed: a dead
    worker's is no proof) and answer the pids still alive afterwards (empty: proven gone).

    What ``lorenz worker --state-dir DIR --kill`` runs on a worker's host. NB: blocking.
    """
    handle = state_dir.name
    worker = worker_pid(state_dir)
    kill_leftovers(handle, wait_s=wait_s, worker=worker)
    return sorted(p.pid for p in find_leftovers(handle, worker=worker) if _running(p))


def _wait_dead(processes: list[psutil.Process], *, until: float) -> None:
    """Until every process is dead or a zombie, or ``until`` (monotonic) has passed.

    NB: not ``psutil.wait_procs``: these are not our children, and the process that inherits
    them (PID 1 of a container, a subreaper) may be slow to reap them; a zombie waits for its
    reaper, not for us, and does no harm.
    """
    while time.monotonic() < until and any(_running(p) for p in processes):
        time.sleep(0.01)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
