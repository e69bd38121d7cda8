"""Running a script under test so that a timeout leaves no process behind.

``subprocess.run(..., timeout=...)`` kills only the direct child on timeout: a shell script's
background ``lorenz`` and the agents it started keep running, hold ports and files, and load the
machine for every later test. :func:`run_bounded` starts the script in a session of its own and,
on timeout, stops the whole tree: SIGTERM to the process group (a graceful stop for Lorenz),
then SIGKILL to every process of the tree that is still there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

STOP_GRACE_S = 30.0
"""How long the tree gets to stop after SIGTERM before it is killed."""


@dataclasses.dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def run_bounded(
    command: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Finished:
    """Run ``command`` to completion or until ``timeout``; either way nothing is left running."""
    process = subprocess.Popen(
        list(command),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        stop_tree(process)
        out, err = process.communicate()
        timed_out = True
    return Finished(process.returncode, out, err, timed_out)


def stop_tree(process: subprocess.Popen[str]) -> None:
    """SIGTERM the process group, wait up to :data:`STOP_GRACE_S`, SIGKILL the survivors."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    # NB: agents run in sessions of their own, outside the script's process group: they are
    # reached through the tree collected above, before their parents exit and they reparent.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
    for survivor in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line or working directory contains ``text``."""
    found: list[psutil.Process] = []
    for candidate in psutil.process_iter(["cmdline", "cwd", "status"]):
        info = candidate.info
        if info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(info.get("cmdline") or ())
        if text in cmdline or text in (info.get("cwd") or ""):
            found.append(candidate)
    return found


def processes_marked(key: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has ``key=value`` (a detached worker and its agent
    carry the environment of the ``lorenz`` that started them, wherever they run)."""
    found: list[psutil.Process] = []
    for candidate in psutil.process_iter(["status"]):
        if candidate.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if candidate.environ().get(key) == value:
                found.append(candidate)
    return found
