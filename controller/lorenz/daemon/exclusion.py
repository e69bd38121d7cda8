"""A workflow that has a live daemon runs in that daemon only: every other ``lorenz`` refuses.

A daemon (feature ``daemon``) takes the workflow's lease; a run without the feature, and every
``--once``, takes none. Beside a live daemon such a run would poll the same tracker, claim in a
store of its own (the memory store, or the same durable store under another owner) and start a
second agent on every issue the daemon already runs — in the same workspace. Worse, with
workers it would find the daemon's live workers in the shared state root, take them for a lost
controller's, follow them and cancel them when it stops.

So before anything else opens (the same place a daemon takes its lease), a run that does not
take the lease reads it: if a process that is alive — or, on another host, one whose heartbeat
is fresh — holds it, the run refuses with ``daemon_running`` (exit 2), naming the daemon and
pointing to ``lorenz refresh`` (a poll *by the daemon*, which is what ``--once`` beside it was
for) and ``lorenz status``. A lease whose holder is provably dead, or another host's lease that
went stale, does not stop it (that daemon is gone; the log says so).

A weaker cousin is warned about at start-up (``workflow_shares_tracker_project``): two
workflow *files* in one folder that name the same tracker project and workspace root. Their
leases and stores are keyed by file, so nothing stops both from leading.

NB: ``--dry-run`` is exempt: it dispatches, claims and adopts nothing, and previewing what a
running daemon would do next is its use.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from lorenz.codes import ErrorCode
from lorenz.daemon.errors import DaemonRunning
from lorenz.leadership import (
    DaemonLockUnreadable,
    LeaseRecord,
    Liveness,
    lease_path,
    local_liveness,
    read_lease_file,
)
from lorenz.model import LorenzError
from lorenz.workflow import LoadedWorkflow, load_workflow

logger = logging.getLogger("lorenz.daemon")


def live_daemon_lease(
    workflow_path: Path, *, stale_ms: int, host: str | None = None
) -> LeaseRecord | None:
    """The workflow's lease if a daemon that is (or may be) alive holds it, else ``None``.

    Alive: on this host, its pid runs with the recorded start time (a hung daemon with a stale
    heartbeat included: it still owns its workers); on another host (or not inspectable), its
    heartbeat is younger than ``stale_ms``.
    """
    path = lease_path(workflow_path)
    try:
        record = read_lease_file(path)
    except DaemonLockUnreadable as exc:
        logger.warning("daemon lease not readable, not checked code=%s: %s", exc.code, exc)
        return None
    if record is None:
        return None
    here = host or socket.gethostname()
    liveness = (
        local_liveness(record.pid, record.process_started_at)
        if record.host == here
        else Liveness.UNKNOWN
    )
    if liveness is Liveness.ALIVE:
        return record
    if liveness is Liveness.DEAD:
        logger.info("daemon lease left by a dead daemon pid=%s; not in the way", record.pid)
        return None
    age_ms = (datetime.datetime.now(datetime.UTC) - record.heartbeat_at).total_seconds() * 1000
    if age_ms <= stale_ms:
        return record
    logger.warning(
        "daemon lease of pid=%s on host=%s is stale (%.0f s) and cannot be verified; "
        "running beside it",
        record.pid,
        record.host,
        age_ms / 1000.0,
    )
    return None


def refuse_beside_daemon(
    workflow_path: Path, *, shown_as: str | None, stale_ms: int, host: str | None = None
) -> None:
    """Raise :class:`DaemonRunning` when a live daemon holds ``workflow_path``'s lease."""
    record = live_daemon_lease(workflow_path, stale_ms=stale_ms, host=host)
    if record is None:
        return
    raise DaemonRunning(
        workflow=shown_as or workflow_path,
        pid=record.pid,
        host=record.host,
        endpoint=record.endpoint,
        lease_path=lease_path(workflow_path),
    )


SHARED_PROJECT_CODE = ErrorCode.WORKFLOW_SHARES_TRACKER_PROJECT
"""The start-up warning: another workflow file beside this one runs the same project."""

MAX_SIBLINGS = 32
"""Sibling ``.md`` files looked at, at most (a docs folder must not slow a start down)."""


def tracker_identity(loaded: LoadedWorkflow) -> tuple[str, ...] | None:
    """What names the issues a workflow runs: tracker kind, endpoint and project (or repository,
    or folder of issue files); ``None`` when no tracker is configured."""
    tracker = loaded.settings.tracker
    if tracker.kind is None:
        return None
    folder = (
        os.path.abspath(loaded.base_dir / tracker.path) if tracker.path is not None else ""
    )
    return (
        str(tracker.kind),
        tracker.endpoint or "",
        tracker.project_slug or "",
        tracker.repository or "",
        folder,
    )


def workspace_identity(loaded: LoadedWorkflow) -> str:
    """The workspace root as an absolute path (relative roots are the workflow folder's)."""
    return os.path.abspath(loaded.base_dir / (loaded.settings.workspace.root or "."))


def sibling_workflows_sharing_project(
    loaded: LoadedWorkflow, *, environ: Mapping[str, str] | None = None
) -> list[Path]:
    """Other workflow files in ``loaded``'s folder naming the same tracker project and the same
    workspace root.

    Two such files, each run by its own ``lorenz``, both lead and both run every issue — in the
    same workspaces: nothing ties their leases or claim stores together (each is keyed by its
    own file). Only ``*.md`` files that open with front matter are loaded (with their own
    settings, no command-line flags); one that does not load is not a workflow to compare.
    """
    mine = tracker_identity(loaded)
    if mine is None:
        return []
    root = workspace_identity(loaded)
    here = loaded.canonical_path
    found: list[Path] = []
    candidates = sorted(p for p in loaded.path.parent.glob("*.md") if p.is_file())
    for path in candidates[:MAX_SIBLINGS]:
        if Path(os.path.realpath(path)) == here or not _opens_with_front_matter(path):
            continue
        try:
            other = load_workflow(path, environ=environ)
        except LorenzError:
            continue
        if tracker_identity(other) == mine and workspace_identity(other) == root:
            found.append(path)
    return found


def warn_about_siblings(loaded: LoadedWorkflow, *, environ: Mapping[str, str] | None) -> None:
    """Log the coded :data:`SHARED_PROJECT_CODE` warning for each sibling sharing the project."""
    for path in sibling_workflows_sharing_project(loaded, environ=environ):
        logger.warning(
            "%s: %s and %s name the same tracker project and workspace root %s; run by two "
            "lorenz processes, every issue runs twice — keep one of them, or give each its "
            "own project or workspace.root",
            SHARED_PROJECT_CODE,
            loaded.path.name,
            path.name,
            workspace_identity(loaded),
        )


def _opens_with_front_matter(path: Path) -> bool:
    try:
        with open(path, "rb") as stream:
            head = stream.read(8)
    except OSError:
        return False
    return head.lstrip(b"\xef\xbb\xbf").startswith(b"---")
