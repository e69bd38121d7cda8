"""The state directory of a run, and what it proves about the run's worker.

``<state root>/<handle>/`` (0700) holds ``spec.json`` (0600, the run spec), ``journal.jsonl``
(0600, the records), ``worker.json`` (pid and process start time), ``worker.log`` (the worker's
own stderr) and ``control.sock`` (0600). The handle is deterministic, so a controller that
knows (workflow, issue, slot, attempt, generation) knows where to look — also after it crashed
before it could write down that it had started the worker.

A probe answers with one of four states (the table in ``docs/runs.md``):

``alive``    the socket answers: adopt (attach after the last collected seq);
``final``    the journal ends with a final record: settle from it;
``gone``     no socket, no live pid, no final record: the run died, retry as a failure;
``unknown``  the pid lives but the socket does not answer (or, remotely, the host does not):
             neither adopt nor retry — quarantine until it resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import psutil

from lorenz.codes import ErrorCode
from lorenz.leadership.processes import same_start_time
from lorenz.model import LorenzError
from lorenz.workers.journal import (
    JOURNAL_NAME,
    JournalCorrupt,
    Record,
    last_record,
    read_journal,
)
from lorenz.workers.protocol import SOCKET_NAME, SOCKET_PATH_LIMIT, ProtocolError, read_message
from lorenz.workers.spec import RunSpec, encode_spec, is_handle

logger = logging.getLogger(__name__)

SPEC_NAME: Final = "spec.json"
STATUS_NAME: Final = "worker.json"
LOG_NAME: Final = "worker.log"
COLLECTED_NAME: Final = "collected"
"""Marker written into a state directory once a controller collected the final record.

Only its existence counts (:func:`mark_collected` makes it a hard link of ``spec.json``)."""

PROBE_TIMEOUT_S: Final = 5.0

STATE_ROOT_ENV: Final = "LORENZ_WORKER_STATE"
"""Names the state root (default ``~/.lorenz/workers``)."""

HANDLE_ENV: Final = "LORENZ_WORKER_HANDLE"
"""Set in the environment of the worker itself, its agent and its hooks: the run's handle. A
process carrying it belongs to a worker — adopt or cancel it through the handle, never kill it
as an orphan."""


class WorkerStateError(LorenzError):
    """A state directory or its spec cannot be used; ``code`` says why."""

    code = ErrorCode.WORKER_STATE_ERROR


class ProbeState(enum.StrEnum):
    ALIVE = "alive"
    FINAL = "final"
    GONE = "gone"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    state: ProbeState
    final: Record | None = None
    last_seq: int = 0
    """The newest seq in the journal (local probes) or the worker's hello (socket probes)."""
    pid: int | None = None
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "final": self.final.to_json() if self.final else None,
            "last_seq": self.last_seq,
            "pid": self.pid,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, raw: object) -> Probe:
        if not isinstance(raw, dict):
            raise ValueError("a probe is an object")
        final = raw.get("final")
        pid = raw.get("pid")
        last_seq = raw.get("last_seq")
        return cls(
            state=ProbeState(str(raw.get("state"))),
            final=Record.from_json(final) if final is not None else None,
            last_seq=last_seq if isinstance(last_seq, int) else 0,
            pid=pid if isinstance(pid, int) else None,
            detail=str(raw.get("detail") or ""),
        )


HANDLE_BUDGET_BYTES: Final = 61
"""The longest handle a state root is sized for: a 24-character identifier, a two-digit slot,
a three-digit attempt, a six-digit generation and a run ordinal (``lzw-…-s12-a123-g123456-r1-
<12 hex>``)."""

ROOT_BUDGET_BYTES: Final = SOCKET_PATH_LIMIT - len(f"/{'h' * HANDLE_BUDGET_BYTES}/{SOCKET_NAME}")
"""The longest state root whose sockets fit in ``SOCKET_PATH_LIMIT`` for every such handle
(32 bytes). A longer one is reached through a short link (:func:`reachable_state_root`)."""

LINK_PARENT_PREFIX: Final = "/tmp/lorenz-"
"""``/tmp/lorenz-<uid>/`` (0700, this user's) holds the short links to long state roots."""


class StateRootUnreachable(WorkerStateError):
    """A state root too long for its sockets, and no safe short link to it."""

    code = ErrorCode.WORKER_STATE_ROOT_TOO_LONG


def default_state_root() -> Path:
    """``$LORENZ_WORKER_STATE`` or ``~/.lorenz/workers`` (see :func:`state_root_of`)."""
    return state_root_of(os.environ)


def state_root_of(environ: Mapping[str, str]) -> Path:
    """The state root ``environ`` names — its ``LORENZ_WORKER_STATE``, else
    ``$HOME/.lorenz/workers`` (this user's home when ``environ`` has no ``HOME``) — as the
    path workers and controllers use: itself, or a short link to it when it is too long for
    its sockets (:func:`reachable_state_root`)."""
    configured = environ.get(STATE_ROOT_ENV)
    if configured:
        return reachable_state_root(Path(configured))
    home = environ.get("HOME")
    return reachable_state_root((Path(home) if home else Path.home()) / ".lorenz" / "workers")


def reachable_state_root(root: Path, *, link_parent: Path | None = None) -> Path:
    """``root`` when its sockets fit, else ``/tmp/lorenz-<uid>/<8 hex of root>``, a symbolic
    link to it (made or mended here; the directory 0700 and this user's). ``link_parent``
    replaces ``/tmp/lorenz-<uid>`` (tests).

    Why a link and not a shorter home for the state: a unix socket's path (``sun_path``) is
    limited to 107 bytes, but the kernel follows links inside it, so every path through the
    link is short while the journals, specs and logs stay where the user put them. The link's
    name is a hash of the root, so every controller and worker of one root, before and after a
    restart, reaches it by the same path (adoption finds its workers there), and two roots never
    share a link. NB: ``/tmp`` is emptied at boot; the link is made again at the next start (the
    workers did not survive the boot either).
    """
    absolute = root.absolute()
    if len(os.fsencode(str(absolute))) <= ROOT_BUDGET_BYTES:
        return root
    parent = link_parent or Path(f"{LINK_PARENT_PREFIX}{os.getuid()}")
    what_to_do = (
        f"set {STATE_ROOT_ENV} to a directory of at most {ROOT_BUDGET_BYTES} bytes (the worker "
        f"state root {absolute} is too long for unix socket paths)"
    )
    try:
        absolute.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            parent.mkdir(mode=0o700)
        info = parent.lstat()
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.getuid()
            or info.st_mode & 0o077
        ):
            # NB: anyone may create /tmp/lorenz-<uid> first; a link in a directory of another
            # user (or one others may write) could be turned to their directory.
            raise StateRootUnreachable(
                f"{parent} is not a private directory of this user; remove it, or {what_to_do}"
            )
        link = parent / hashlib.sha256(os.fsencode(str(absolute))).hexdigest()[:8]
        try:
            current = os.readlink(link)
        except OSError:
            current = None
        if current != str(absolute):
            staging = parent / f".{link.name}.{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                staging.unlink()
            os.symlink(absolute, staging)
            os.replace(staging, link)  # NB: atomic: a reader sees the old link or the new one
    except OSError as exc:
        raise StateRootUnreachable(
            f"no short link to the worker state root can be made in {parent} "
            f"({exc.strerror or exc}): {what_to_do}"
        ) from exc
    return link


def create_state_dir(root: Path, handle: str) -> Path:
    """``root/handle`` with mode 0700 (and ``root`` too, when it is created here)."""
    if not is_handle(handle):
        raise WorkerStateError(
            f"{handle!r} is not a worker handle",
            code=ErrorCode.WORKER_HANDLE_INVALID,
        )
    state_dir = root.absolute() / handle
    socket_path = os.fsencode(str(state_dir / SOCKET_NAME))
    if len(socket_path) > SOCKET_PATH_LIMIT:
        raise WorkerStateError(
            f"the control socket path {state_dir / SOCKET_NAME} would be longer than "
            f"{SOCKET_PATH_LIMIT} bytes; use a shorter worker state directory",
            code=ErrorCode.WORKER_SOCKET_PATH_TOO_LONG,
        )
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        state_dir.mkdir(mode=0o700)
    info = state_dir.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise WorkerStateError(
            f"{state_dir} is not a directory owned by this user; remove it or pick another "
            "worker state directory",
            code=ErrorCode.WORKER_STATE_DIR_FOREIGN,
        )
    os.chmod(state_dir, 0o700)
    return state_dir


def mark_collected(state_dir: Path) -> None:
    """Write the run's collected mark; idempotent, and a mark that cannot be written is no
    error (the run is then only looked at again: its final record settles nothing twice).

    NB: a hard link of the run's spec, not a new empty file: creating an inode cost ~0.3 ms of
    the controller's loop per run on ext4 (a link ~0.03 ms), and nothing reads the mark's
    content. ``spec.json`` is only ever replaced, never rewritten in place, so the link keeps
    the spec it was made from. Where there is no spec to link (or no hard links), the mark is
    an empty file as before.
    """
    directory = os.fspath(state_dir)
    mark = os.path.join(directory, COLLECTED_NAME)
    try:
        os.link(os.path.join(directory, SPEC_NAME), mark)
    except FileExistsError:
        return
    except OSError:
        with contextlib.suppress(OSError):
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT, 0o600))


def write_spec(state_dir: Path, spec: RunSpec, *, encoded: bytes | None = None) -> Path:
    """Write ``spec.json`` (0600) atomically.

    ``encoded``: the JSON document ``spec`` was just read from (a launch request), written as
    it is. NB: it is the spec already (it was read and checked whole), and encoding the spec
    again in a launcher's fork cost each worker ~0.25 MiB of pages of its own (issue #35).
    """
    path = state_dir / SPEC_NAME
    tmp = state_dir / f".{SPEC_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(encode_spec(spec) if encoded is None else encoded)
    os.replace(tmp, path)
    return path


def worker_pid(state_dir: Path) -> int | None:
    """The worker's pid if that process still runs (pid reuse is ruled out by start time)."""
    try:
        status = json.loads((state_dir / STATUS_NAME).read_text())
        pid = int(status["pid"])
        created = float(status["create_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        process = psutil.Process(pid)
        if not same_start_time(process.create_time(), created):
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return pid


async def probe_local(state_dir: Path, *, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """What ``state_dir`` proves about its worker (see the module docstring)."""
    last = last_record(state_dir / JOURNAL_NAME)
    last_seq = last.seq if last else 0
    if last is not None and last.is_final:
        return _final_probe(state_dir)
    pid = worker_pid(state_dir)
    hello = await socket_hello(state_dir / SOCKET_NAME, timeout_s=timeout_s)
    if hello is not None:
        seq = hello.get("last_seq")
        return Probe(
            state=ProbeState.ALIVE,
            last_seq=seq if isinstance(seq, int) else last_seq,
            pid=pid,
        )
    # The worker may have written its final record between the two reads.
    last = last_record(state_dir / JOURNAL_NAME)
    if last is not None and last.is_final:
        return _final_probe(state_dir)
    if pid is not None:
        return Probe(
            state=ProbeState.UNKNOWN,
            last_seq=last_seq,
            pid=pid,
            detail=f"worker pid {pid} lives but its control socket does not answer",
        )
    try:
        read_journal(state_dir / JOURNAL_NAME)
    except JournalCorrupt as exc:
        return Probe(state=ProbeState.UNKNOWN, last_seq=last_seq, detail=str(exc))
    return Probe(state=ProbeState.GONE, last_seq=last_seq, detail="no worker and no final record")


def _final_probe(state_dir: Path) -> Probe:
    """``final`` — once the whole journal checks out (a final record after a corrupt middle
    proves nothing)."""
    try:
        records = read_journal(state_dir / JOURNAL_NAME)
    except JournalCorrupt as exc:
        return Probe(state=ProbeState.UNKNOWN, detail=str(exc))
    final = records[-1]
    return Probe(state=ProbeState.FINAL, final=final, last_seq=final.seq)


async def socket_hello(path: Path, *, timeout_s: float) -> dict[str, object] | None:
    """The worker's ``hello`` on a fresh connection, or ``None`` when nobody answers."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(str(path))
            try:
                message = await read_message(reader)
            finally:
                writer.close()
                # NB: the peer may be gone already: closing is best effort.
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except (OSError, TimeoutError, ProtocolError):
        return None
    if message is None or message.get("op") != "hello":
        return None
    return message


DEFAULT_RETENTION_S: Final = 7 * 24 * 3600.0


def prune_state_dirs(
    root: Path, *, older_than_s: float = DEFAULT_RETENTION_S, now: float | None = None
) -> list[str]:
    """Remove the state directories of runs that ended more than ``older_than_s`` ago.

    Only a directory whose journal ends with a final record, whose worker no longer runs and
    whose journal was last written before the cutoff goes; anything else (live, unknown, died
    without a final record) is evidence and stays. Returns the removed handles.
    """
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = []
    for handle in list_handles(root):
        state_dir = root / handle
        journal = state_dir / JOURNAL_NAME
        try:
            if journal.stat().st_mtime > cutoff:
                continue
        except FileNotFoundError:
            continue
        last = last_record(journal)
        if last is None or not last.is_final or worker_pid(state_dir) is not None:
            continue
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(handle)
    return removed


def list_handles(root: Path) -> list[str]:
    """Every run handle with a state directory under ``root`` (sorted).

    A root that is missing, not a directory or unreadable holds no handle this process can
    follow: ``[]``, with a warning for the last two (NB: not an error, so that a daemon whose
    state root is broken still starts; its launches then fail with ``worker_state_error``, a
    host-side failure that is retried without spending the retry budget, and run once the
    root is usable again).
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except (NotADirectoryError, PermissionError) as exc:
        logger.warning(
            "worker state root unusable code=%s root=%s error=%s",
            ErrorCode.WORKER_STATE_ERROR, root, exc,
        )
        return []
    return sorted(name for name in names if is_handle(name) and (root / name).is_dir())
