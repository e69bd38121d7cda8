"""Leadership: one process per workflow runs the scheduler (file lease; Kubernetes Lease)."""

from lorenz.leadership.base import (
    LEASE_FORMAT,
    DaemonAlreadyRunning,
    DaemonLockBusy,
    DaemonLockStale,
    DaemonLockUnreadable,
    LeadershipError,
    LeadershipLost,
    LeadershipProvider,
    LeaseRecord,
    LeaseStoreKind,
)
from lorenz.leadership.files import (
    DEFAULT_STALE_MS,
    FileLeaseProvider,
    canonical_workflow_path,
    lease_path,
    read_lease_file,
    workflow_digest,
)
from lorenz.leadership.processes import Liveness, ProcessIdentity, current_process, local_liveness

__all__ = [
    "DEFAULT_STALE_MS",
    "LEASE_FORMAT",
    "DaemonAlreadyRunning",
    "DaemonLockBusy",
    "DaemonLockStale",
    "DaemonLockUnreadable",
    "FileLeaseProvider",
    "LeadershipError",
    "LeadershipLost",
    "LeadershipProvider",
    "LeaseRecord",
    "LeaseStoreKind",
    "Liveness",
    "ProcessIdentity",
    "canonical_workflow_path",
    "current_process",
    "lease_path",
    "local_liveness",
    "read_lease_file",
    "workflow_digest",
]
