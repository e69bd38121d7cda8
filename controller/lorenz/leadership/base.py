"""Leadership: which one process may run a workflow's scheduler, behind one interface.

A single-host daemon proves it with a lease file beside WORKFLOW.md; an operator replica with a
``coordination.k8s.io/v1`` Lease. The daemon and the runtime only see
:class:`LeadershipProvider` — acquire before doing anything, heartbeat on a cadence, stop at the
first :class:`LeadershipLost`, release on a graceful stop — so the scheduling path is the same
whichever provider is composed in.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from pathlib import Path
from typing import Any, Protocol

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError
from lorenz.model.clocks import as_utc


class LeaseStoreKind(enum.StrEnum):
    """Where a lease lives (reported by ``GET /api/v1/daemon`` as the leadership store)."""

    FILE = "file"
    KUBERNETES = "kubernetes"


LEASE_FORMAT = 1
"""Version of the serialized :class:`LeaseRecord` (the ``format`` key)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseRecord:
    """Who holds a workflow's leadership, and how to reach it."""

    holder: str
    """The holder's identity: ``<host>:<pid>:<process start time>`` for a process."""
    pid: int | None
    """The holder's pid (on ``host``), when it is a local process."""
    process_started_at: float | None
    """The holder's process start time, epoch seconds (psutil ``create_time``): with ``pid``
    it proves whether the holder still runs, defeating pid reuse."""
    host: str
    """The hostname the holder runs on."""
    endpoint: str | None
    """Where its control routes answer: an ``http://`` URL or a unix socket path."""
    heartbeat_at: datetime.datetime
    """Last renewal, wall clock (UTC)."""
    acquired_at: datetime.datetime
    """When this holder took the lease."""
    workflow_path: str
    """The canonical WORKFLOW.md path the lease is for."""
    store: LeaseStoreKind
    """The provider that keeps the lease."""
    transitions: int = 0
    """How many times the lease passed from one holder to another."""
    generation: int = 0
    """The controller generation of this holding: strictly increasing across acquisitions
    (0 in a lease written before generations existed). Claim writes are fenced with it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": LEASE_FORMAT,
            "holder": self.holder,
            "pid": self.pid,
            "process_started_at": self.process_started_at,
            "host": self.host,
            "endpoint": self.endpoint,
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "acquired_at": self.acquired_at.isoformat(),
            "workflow_path": self.workflow_path,
            "store": self.store.value,
            "transitions": self.transitions,
            "generation": self.generation,
        }

    @classmethod
    def from_dict(cls, data: Any) -> LeaseRecord:
        """Parse a serialized lease; ``ValueError`` (or ``KeyError``/``TypeError``) if malformed."""
        if not isinstance(data, dict):
            raise ValueError("a lease must be a JSON object")
        if data.get("format") != LEASE_FORMAT:
            raise ValueError(f"unknown lease format {data.get('format')!r}")
        pid = data.get("pid")
        started = data.get("process_started_at")
        return cls(
            holder=str(data["holder"]),
            pid=int(pid) if pid is not None else None,
            process_started_at=float(started) if started is not None else None,
            host=str(data["host"]),
            endpoint=str(data["endpoint"]) if data.get("endpoint") is not None else None,
            heartbeat_at=as_utc(datetime.datetime.fromisoformat(data["heartbeat_at"])),
            acquired_at=as_utc(datetime.datetime.fromisoformat(data["acquired_at"])),
            workflow_path=str(data["workflow_path"]),
            store=LeaseStoreKind(data["store"]),
            transitions=int(data.get("transitions") or 0),
            generation=int(data.get("generation") or 0),
        )


class LeadershipProvider(Protocol):
    """Acquire, read, heartbeat, judge staleness of, and release one workflow's lease."""

    @property
    def kind(self) -> LeaseStoreKind: ...

    @property
    def generation(self) -> int | None:
        """The controller generation of our current holding; ``None`` while not leading.

        Strictly increasing across acquisitions (by anyone, a re-acquisition by the same process
        after a release included); unchanged by heartbeats. Every claim mutation is fenced with
        it (``GenerationFence``), so a deposed holder's writes are refused by the store.
        """
        ...

    async def acquire(self) -> LeaseRecord:
        """Take the lease, or raise :class:`DaemonAlreadyRunning` / :class:`DaemonLockStale`."""
        ...

    async def read(self) -> LeaseRecord | None:
        """The current lease, whoever holds it; ``None`` when nobody does."""
        ...

    async def heartbeat(self) -> None:
        """Renew our lease; raise :class:`LeadershipLost` if someone else holds it now."""
        ...

    async def set_endpoint(self, endpoint: str | None) -> None:
        """Record where our control routes answer (the server starts after the lease)."""
        ...

    def is_stale(self, record: LeaseRecord, *, now: datetime.datetime) -> bool:
        """Whether ``record``'s holder has not renewed for longer than the provider allows."""
        ...

    async def release(self) -> None:
        """Give the lease up if it is still ours (a no-op otherwise)."""
        ...


class LeadershipError(LorenzError):
    """Base of every leadership error."""

    code = ErrorCode.LEADERSHIP_ERROR

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path
        """The lease file (or Lease object name) the error is about."""


def _owner_text(record: LeaseRecord) -> str:
    where = f"pid {record.pid} on {record.host}" if record.pid is not None else record.host
    endpoint = record.endpoint or "no endpoint yet"
    return f"{where}, endpoint {endpoint}"


class DaemonAlreadyRunning(LeadershipError):
    """A live daemon holds the workflow's lease."""

    code = ErrorCode.DAEMON_ALREADY_RUNNING

    def __init__(
        self,
        *,
        path: Path,
        record: LeaseRecord | None,
        heartbeat_age_s: float | None = None,
    ) -> None:
        if record is None:
            message = (
                f"another Lorenz daemon is writing the lock {path} right now; "
                f"use `lorenz status` against that daemon or retry in a moment"
            )
        else:
            hung = (
                f" (its heartbeat is {heartbeat_age_s:.0f} s old: stop it if it hangs)"
                if heartbeat_age_s is not None
                else ""
            )
            message = (
                f"a Lorenz daemon already runs this workflow ({_owner_text(record)}){hung}; "
                f"attach with `lorenz status` or stop it with `lorenz stop`"
            )
        super().__init__(message, path=path)
        self.record = record
        self.pid = record.pid if record is not None else None
        self.endpoint = record.endpoint if record is not None else None


class DaemonLockStale(LeadershipError):
    """The lease's holder cannot be proven dead, and it stopped renewing."""

    code = ErrorCode.DAEMON_LOCK_STALE

    def __init__(self, *, path: Path, record: LeaseRecord | None, age_s: float) -> None:
        who = _owner_text(record) if record is not None else "an unreadable lock"
        super().__init__(
            f"the daemon lock {path} ({who}) was last renewed {age_s:.0f} s ago and its owner "
            f"cannot be verified dead from here; if no daemon runs it, start with `--force` for "
            f"a generation-fenced takeover (rather than remove {path} by hand)",
            path=path,
        )
        self.record = record
        self.age_s = age_s


class LeadershipLost(LeadershipError):
    """Our lease is gone or held by someone else: stop before mutating anything."""

    code = ErrorCode.LEADERSHIP_LOST

    def __init__(self, *, path: Path | None, holder: str | None) -> None:
        now_held = f"it is now held by {holder}" if holder else "it was removed"
        super().__init__(
            f"this process lost the leadership lease {path} ({now_held}); it stops — "
            f"start it again once the other daemon is stopped",
            path=path,
        )
        self.holder = holder


class DaemonLockUnreadable(LeadershipError):
    """The lease file exists but does not parse."""

    code = ErrorCode.DAEMON_LOCK_UNREADABLE

    def __init__(self, *, path: Path, reason: str) -> None:
        super().__init__(
            f"the daemon lock {path} cannot be read ({reason}); "
            f"if no daemon is running, remove {path}",
            path=path,
        )
        self.reason = reason


class DaemonLockBusy(LeadershipError):
    """Another process kept the lease's guard locked past the bounded wait."""

    code = ErrorCode.DAEMON_LOCK_BUSY

    def __init__(self, *, path: Path, waited_s: float) -> None:
        super().__init__(
            f"the guard of daemon lock {path} stayed locked for {waited_s:.0f} s; "
            f"a stopped or hung lorenz process holds it — find it (fuser {path}) and stop it",
            path=path,
        )
        self.waited_s = waited_s
