"""Leadership: one process per workflow runs the scheduler (file lease; Kubernetes Lease).

NB: the names are loaded on first use (PEP 562), each from its own module: a process that
needs only :mod:`lorenz.leadership.processes` (the launcher and every worker, to tell a live
pid from a reused one) does not hold the file lease and its retries (tenacity; issue #35).
Type checkers read the imports under ``TYPE_CHECKING``; ``_LAZY`` says where each name lives
at run time (tests/test_lean_imports.py checks that the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorenz.lazy_names import lazy_attributes

if TYPE_CHECKING:
    from lorenz.leadership.base import LEASE_FORMAT as LEASE_FORMAT
    from lorenz.leadership.base import DaemonAlreadyRunning as DaemonAlreadyRunning
    from lorenz.leadership.base import DaemonLockBusy as DaemonLockBusy
    from lorenz.leadership.base import DaemonLockStale as DaemonLockStale
    from lorenz.leadership.base import DaemonLockUnreadable as DaemonLockUnreadable
    from lorenz.leadership.base import LeadershipError as LeadershipError
    from lorenz.leadership.base import LeadershipLost as LeadershipLost
    from lorenz.leadership.base import LeadershipProvider as LeadershipProvider
    from lorenz.leadership.base import LeaseRecord as LeaseRecord
    from lorenz.leadership.base import LeaseStoreKind as LeaseStoreKind
    from lorenz.leadership.files import DEFAULT_STALE_MS as DEFAULT_STALE_MS
    from lorenz.leadership.files import FileLeaseProvider as FileLeaseProvider
    from lorenz.leadership.files import canonical_workflow_path as canonical_workflow_path
    from lorenz.leadership.files import lease_path as lease_path
    from lorenz.leadership.files import read_lease_file as read_lease_file
    from lorenz.leadership.files import workflow_digest as workflow_digest
    from lorenz.leadership.processes import Liveness as Liveness
    from lorenz.leadership.processes import ProcessIdentity as ProcessIdentity
    from lorenz.leadership.processes import current_process as current_process
    from lorenz.leadership.processes import local_liveness as local_liveness

_LAZY: dict[str, str] = {
    "LEASE_FORMAT": "base",
    "DaemonAlreadyRunning": "base",
    "DaemonLockBusy": "base",
    "DaemonLockStale": "base",
    "DaemonLockUnreadable": "base",
    "LeadershipError": "base",
    "LeadershipLost": "base",
    "LeadershipProvider": "base",
    "LeaseRecord": "base",
    "LeaseStoreKind": "base",
    "DEFAULT_STALE_MS": "files",
    "FileLeaseProvider": "files",
    "canonical_workflow_path": "files",
    "lease_path": "files",
    "read_lease_file": "files",
    "workflow_digest": "files",
    "Liveness": "processes",
    "ProcessIdentity": "processes",
    "current_process": "processes",
    "local_liveness": "processes",
}

if not TYPE_CHECKING:
    # NB: hidden from type checkers (lorenz.lazy_names): they read the imports above.
    __getattr__, __dir__ = lazy_attributes(
        package=__name__, homes=_LAZY, namespace=globals()
    )


__all__ = sorted(_LAZY)
"""NB: derived from ``_LAZY``; type checkers read the explicit ``X as X`` imports above."""
