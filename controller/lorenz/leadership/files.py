"""The same-host leadership lease: one JSON file beside WORKFLOW.md.

``<workflow dir>/.lorenz/daemon/<sha256 of canonical workflow path>.lock.json`` records the
holder's pid, process start time, host, endpoint and heartbeat. Two properties carry the design:

* **Readers never lock, and never see half a file.** Every write goes to a temp file that is
  fsynced, renamed over the lock and followed by an fsync of the directory; a writer killed at
  any point leaves either the old lock or the new one, both whole.
* **Deciding is serialized.** Read-check-replace (acquire, heartbeat, release) runs under an
  exclusive ``flock`` on a sibling guard file, so of any number of racers exactly one sees the
  lock free and writes it. The kernel drops a flock when its process dies, so a crash can never
  leave the guard held.

Who may replace an existing lock: see :meth:`FileLeaseProvider.acquire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import tenacity

from lorenz.leadership.base import (
    DaemonAlreadyRunning,
    DaemonLockBusy,
    DaemonLockStale,
    DaemonLockUnreadable,
    LeadershipLost,
    LeaseRecord,
    LeaseStoreKind,
)
from lorenz.leadership.processes import (
    Liveness,
    ProcessIdentity,
    current_process,
    local_liveness,
)
from lorenz.model import Clock, SystemClock

LEASE_DIR = Path(".lorenz") / "daemon"
DEFAULT_STALE_MS = 30_000
"""Heartbeat age after which an unverifiable holder is stale (``daemon.stale_ms``)."""
GUARD_WAIT_S = 5.0
"""How long to wait for another process's read-check-replace before ``daemon_lock_busy``."""


def canonical_workflow_path(workflow_path: Path) -> Path:
    """Absolute, symlinks resolved: two spellings of one WORKFLOW.md share one lease."""
    return Path(os.path.abspath(workflow_path)).resolve()


def workflow_digest(workflow_path: Path) -> str:
    """sha256 hex of the canonical workflow path (the same key the claim store's path uses)."""
    return hashlib.sha256(str(canonical_workflow_path(workflow_path)).encode("utf-8")).hexdigest()


def lease_path(workflow_path: Path) -> Path:
    """``<workflow dir>/.lorenz/daemon/<sha256>.lock.json`` for ``workflow_path``."""
    canonical = canonical_workflow_path(workflow_path)
    return canonical.parent / LEASE_DIR / f"{workflow_digest(canonical)}.lock.json"


def read_lease_file(path: Path) -> LeaseRecord | None:
    """Parse the lease at ``path`` without any lock; ``None`` if there is none.

    Raises :class:`DaemonLockUnreadable` for a file that does not parse. Synchronous, so a CLI
    attach command (``lorenz status``) can find the daemon without an event loop.
    """
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DaemonLockUnreadable(path=path, reason=exc.strerror or str(exc)) from exc
    try:
        return LeaseRecord.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise DaemonLockUnreadable(path=path, reason=f"not a lease record: {exc}") from exc


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory.

    NB: a crash before the rename leaves the old file untouched (plus a stray temp file that
    the next acquire removes); after it, the new file is complete.
    """
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    _fsync_directory(path.parent)


class FileLeaseProvider:
    """The ``file`` leadership store for one workflow on this host."""

    def __init__(
        self,
        *,
        workflow_path: Path,
        endpoint: str | None = None,
        stale_ms: int = DEFAULT_STALE_MS,
        clock: Clock | None = None,
        guard_wait_s: float = GUARD_WAIT_S,
        identity: ProcessIdentity | None = None,
        force: bool = False,
    ) -> None:
        self._force = force
        self.forced_from: LeaseRecord | None = None
        """The holding a forced acquire replaced although its holder was not proven dead."""
        self._workflow_path = canonical_workflow_path(workflow_path)
        self._path = lease_path(self._workflow_path)
        self._guard_path = self._path.with_name(self._path.name.removesuffix(".json") + ".guard")
        self._endpoint = endpoint
        self._stale_ms = stale_ms
        self._clock: Clock = clock or SystemClock()
        self._guard_wait_s = guard_wait_s
        self._me = identity or current_process()
        self._record: LeaseRecord | None = None

    @property
    def kind(self) -> LeaseStoreKind:
        return LeaseStoreKind.FILE

    @property
    def path(self) -> Path:
        """The lock file."""
        return self._path

    @property
    def holder(self) -> str:
        """Our holder identity."""
        return self._me.holder

    @property
    def record(self) -> LeaseRecord | None:
        """The lease as we last wrote it, while we hold it."""
        return self._record

    @property
    def generation(self) -> int | None:
        """Our holding's generation (see :class:`~lorenz.leadership.LeadershipProvider`)."""
        return self._record.generation if self._record is not None else None

    # -- the LeadershipProvider interface -----------------------------------------------------

    async def acquire(self) -> LeaseRecord:
        """Take the lease.

        * no lock → take it;
        * ours already (same pid and start time) → renew it;
        * same host, owner verifiably dead (pid gone, zombie, or reused by a process with another
          start time) → replace it at once, whatever its heartbeat;
        * same host, owner alive → :class:`DaemonAlreadyRunning` (even with a stale heartbeat:
          a hung daemon must be stopped, not shadowed);
        * owner unverifiable (another host, permission denied, unreadable file) and heartbeat
          (or, for an unreadable file, mtime) stale → :class:`DaemonLockStale` naming the file;
        * otherwise → :class:`DaemonAlreadyRunning`.

        With ``force`` (``lorenz --feature daemon --force``) a holder that cannot be verified
        either way (another host, not inspectable, unreadable file), stale or not, is replaced
        too — a generation-fenced takeover: the observed record is re-read under the guard
        (the compare of the compare-and-swap), the new holding gets the next generation, and
        a claim store fenced with it refuses every later write of the old holder. A holder on
        this host that is verifiably alive is never replaced: stop it.
        """
        return await asyncio.to_thread(self._acquire_sync)

    async def read(self) -> LeaseRecord | None:
        return await asyncio.to_thread(read_lease_file, self._path)

    async def heartbeat(self) -> None:
        await asyncio.to_thread(self._rewrite_ours_sync)

    async def set_endpoint(self, endpoint: str | None) -> None:
        self._endpoint = endpoint
        await asyncio.to_thread(self._rewrite_ours_sync)

    def is_stale(self, record: LeaseRecord, *, now: datetime.datetime) -> bool:
        return (now - record.heartbeat_at).total_seconds() * 1000.0 > self._stale_ms

    async def release(self) -> None:
        await asyncio.to_thread(self._release_sync)

    # -- blocking parts ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self) -> Iterator[int]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._guard_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # NB: the guard file is never deleted: unlinking a file others may have open and
            # flocked would let two processes lock two different inodes at once.
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception(
                    lambda exc: (
                        isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.EACCES)
                    )
                ),
                wait=tenacity.wait_random_exponential(multiplier=0.002, max=0.05),
                stop=tenacity.stop_after_delay(self._guard_wait_s),
                reraise=True,
            )
            try:
                retrying(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise DaemonLockBusy(path=self._path, waited_s=self._guard_wait_s) from exc
                raise
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _remove_stray_temp_files(self) -> None:
        # Under the guard nobody is mid-write, so any temp file is a killed writer's leftover.
        for stray in self._path.parent.glob(f"{self._path.name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()

    def _next_generation(self, fd: int, current: LeaseRecord | None) -> int:
        """One more than any generation handed out for this lease, persisted before use.

        The counter lives in the guard file, which is never deleted (the lock file is removed
        on release, and by hand to force a takeover), and is written under the guard's flock.
        NB: written in place at offset 0 and fsynced: numbers only grow, so a new value is never
        shorter than the old one and a torn write cannot leave a smaller number behind.
        """
        raw = os.pread(fd, 32, 0).split(b"\0", 1)[0].strip()
        counted = int(raw) if raw.isdigit() else 0
        generation = max(counted, current.generation if current is not None else 0) + 1
        os.pwrite(fd, str(generation).encode("ascii"), 0)
        os.fsync(fd)
        return generation

    def _new_record(
        self, *, now: datetime.datetime, transitions: int, generation: int
    ) -> LeaseRecord:
        return LeaseRecord(
            holder=self._me.holder,
            pid=self._me.pid,
            process_started_at=self._me.started_at,
            host=self._me.host,
            endpoint=self._endpoint,
            heartbeat_at=now,
            acquired_at=now,
            workflow_path=str(self._workflow_path),
            store=LeaseStoreKind.FILE,
            transitions=transitions,
            generation=generation,
        )

    def _write(self, record: LeaseRecord) -> LeaseRecord:
        data = json.dumps(record.to_dict(), indent=2, sort_keys=True).encode("utf-8") + b"\n"
        write_atomically(self._path, data)
        self._record = record
        return record

    def _age_s(self, since: datetime.datetime, now: datetime.datetime) -> float:
        return max((now - since).total_seconds(), 0.0)

    def _acquire_sync(self) -> LeaseRecord:
        with self._guard() as guard:
            self._remove_stray_temp_files()
            now = self._clock.now()
            try:
                current = read_lease_file(self._path)
            except DaemonLockUnreadable:
                # NB: writes are atomic, so a file that does not parse was not written by a
                # Lorenz in the middle of a write; judge it by its age alone.
                mtime = datetime.datetime.fromtimestamp(self._path.stat().st_mtime, datetime.UTC)
                age_s = self._age_s(mtime, now)
                if self._force:
                    return self._write(
                        self._new_record(
                            now=now, transitions=1, generation=self._next_generation(guard, None)
                        )
                    )
                if age_s * 1000.0 > self._stale_ms:
                    raise DaemonLockStale(path=self._path, record=None, age_s=age_s) from None
                raise DaemonAlreadyRunning(path=self._path, record=None) from None
            if current is None:
                generation = self._next_generation(guard, None)
                return self._write(self._new_record(now=now, transitions=0, generation=generation))
            if current.holder == self._me.holder:
                # NB: our own lease (acquire called twice): the same holding, the same generation.
                renewed = dataclasses.replace(current, heartbeat_at=now, endpoint=self._endpoint)
                return self._write(renewed)
            if current.host == self._me.host:
                liveness = local_liveness(current.pid, current.process_started_at)
            else:
                liveness = Liveness.UNKNOWN
            age_s = self._age_s(current.heartbeat_at, now)
            if liveness is Liveness.DEAD:
                generation = self._next_generation(guard, current)
                return self._write(
                    self._new_record(
                        now=now, transitions=current.transitions + 1, generation=generation
                    )
                )
            if liveness is Liveness.ALIVE:
                stale = self.is_stale(current, now=now)
                raise DaemonAlreadyRunning(
                    path=self._path, record=current, heartbeat_age_s=age_s if stale else None
                )
            if self._force:
                # NB: under the guard: ``current`` is exactly what we replace (no other Lorenz
                # can write between this read and our rename), and the generation we take is
                # higher than any handed out for this lease, the old holder's included.
                self.forced_from = current
                generation = self._next_generation(guard, current)
                return self._write(
                    self._new_record(
                        now=now, transitions=current.transitions + 1, generation=generation
                    )
                )
            if self.is_stale(current, now=now):
                raise DaemonLockStale(path=self._path, record=current, age_s=age_s)
            raise DaemonAlreadyRunning(path=self._path, record=current)

    def _rewrite_ours_sync(self) -> None:
        with self._guard():
            try:
                current = read_lease_file(self._path)
            except DaemonLockUnreadable:
                current = None
            if current is None or current.holder != self._me.holder:
                self._record = None
                raise LeadershipLost(
                    path=self._path, holder=current.holder if current is not None else None
                )
            self._write(
                dataclasses.replace(
                    current, heartbeat_at=self._clock.now(), endpoint=self._endpoint
                )
            )

    def _release_sync(self) -> None:
        with self._guard():
            try:
                current = read_lease_file(self._path)
            except DaemonLockUnreadable:
                current = None
            self._record = None
            if current is None or current.holder != self._me.holder:
                return
            self._path.unlink()
            _fsync_directory(self._path.parent)
