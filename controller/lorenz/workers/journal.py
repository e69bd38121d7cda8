"""The run journal: numbered records, append-only JSON lines, the one truth about a run.

Whatever a controller saw of a run, it can see again from here: the worker writes every agent
update and run event before it tells anybody, so a client that re-attaches "after sequence N"
gets exactly the records it missed. The file is synced (``fdatasync``) at turn boundaries and
after the final record, the points a restarted controller must not lose; in between, a crash
of the *machine* can cost the newest updates, never a crash of the worker or the controller
(each record is one ``write(2)``, in the page cache before anyone hears of it). A sync per
record was I/O wait on every update of every run for nothing a controller could use.

A writer killed mid-``write`` leaves a torn last line. Readers skip it (it never completed, so
nobody saw it); a writer reopening the file cuts it off before appending, so the file stays a
sequence of whole records. A malformed line anywhere else is corruption and is reported.

The file is bounded (``worker.journal_max_bytes``): when the next record would pass the cap, the
writer keeps the *head* (the records of the first half of the cap: the run's start, its hooks,
the session) and the *tail* (the newest quarter of the cap), and puts one ``journal_dropped``
record between them that counts what went (``from_seq``, ``records``, ``bytes``). That record
carries the seq of the last record it replaces, so seqs still only grow and a reader accepts the
one jump it announces. Records are never dropped before they were written and sent: a controller
that was attached saw them all; one that catches up later gets the marker instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError

JOURNAL_NAME: Final = "journal.jsonl"

RECORD_LIMIT_BYTES: Final = 256 * 1024
"""A record larger than this is journaled without its ``payload`` (a marker says so)."""

DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024
"""Default cap of one journal (``worker.journal_max_bytes``)."""

MIN_MAX_BYTES: Final = 4 * RECORD_LIMIT_BYTES
"""The smallest cap: the kept tail (a quarter of the cap) must hold the largest record."""

DROPPED: Final = "journal_dropped"
"""Kind of the record that stands for the records dropped between the head and the tail."""

FINAL: Final = "final"
"""Kind of the last record of every finished run."""

SYNC_KINDS: Final = frozenset({"turn_completed", "session_started", FINAL})
"""Record kinds after which the journal is synced: turn boundaries and the run's end.

NB: not ``run_started``: a machine crash kills the worker with it, and a run whose journal
lost its start is retried exactly like one whose journal kept it (no final record either way);
the session's start, a moment later, syncs it along."""


class JournalCorrupt(LorenzError):
    code = ErrorCode.WORKER_JOURNAL_CORRUPT


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One journal entry."""

    seq: int
    """1, 2, 3, … without gaps."""
    kind: str
    """``run_started``, ``hook``, ``agent_update``, ``tool_call``, ``cancel``, ``final``, …"""
    time_ms: int
    """Wall-clock time of writing, in ms since the epoch."""
    data: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "t": self.time_ms, "data": dict(self.data)}

    @classmethod
    def from_json(cls, raw: Any) -> Record:
        if not isinstance(raw, Mapping):
            raise ValueError("a record is an object")
        seq, kind, at, data = raw.get("seq"), raw.get("kind"), raw.get("t"), raw.get("data")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise ValueError("seq must be a positive integer")
        if not isinstance(kind, str) or not isinstance(at, int) or not isinstance(data, Mapping):
            raise ValueError("kind, t and data are required")
        return cls(seq=seq, kind=kind, time_ms=at, data=data)

    @property
    def is_final(self) -> bool:
        return self.kind == FINAL


def _encode_whole(record: Record) -> bytes:
    return json.dumps(record.to_json(), separators=(",", ":"), default=str).encode()


def encode_record(record: Record) -> bytes:
    line = _encode_whole(record)
    if len(line) > RECORD_LIMIT_BYTES:
        data = {k: v for k, v in record.data.items() if k != "payload"}
        data["payload_dropped_bytes"] = len(line)
        slim = dataclasses.replace(record, data=data)
        line = json.dumps(slim.to_json(), separators=(",", ":"), default=str).encode()
        if len(line) > RECORD_LIMIT_BYTES:
            data = {"payload_dropped_bytes": len(line), "event": record.data.get("event")}
            line = json.dumps(dataclasses.replace(record, data=data).to_json()).encode()
    return line + b"\n"


class JournalWriter:
    """Appends records to one journal; the only writer of its file.

    ``max_bytes`` bounds the file (see the module's docstring): past it, the middle records
    are replaced by one ``journal_dropped`` record. Only the final record may pass the cap
    (by at most :data:`RECORD_LIMIT_BYTES`): it is never dropped.
    """

    def __init__(self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"a journal cap must be at least {MIN_MAX_BYTES} bytes")
        self.path = path
        self.max_bytes = max_bytes
        records, good_bytes = _scan(path)
        self._last_seq = records[-1].seq if records else 0
        self._final = next((r for r in records if r.is_final), None)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        # NB: cut a torn tail off before appending, or the next record would be glued to it.
        os.ftruncate(fd, good_bytes)
        os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        self._size = good_bytes
        self._unsynced = False
        self.last_line: bytes | None = None
        """The line of the newest record this writer appended, when it is the whole record
        (``None``: none yet, or its payload was dropped to fit)."""
        self.syncs = 0
        """How many times the file was synced to disk (for tests and diagnostics)."""
        self.compactions = 0
        """How many times the middle of the journal was dropped (for tests and diagnostics)."""

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def final(self) -> Record | None:
        return self._final

    def append(self, kind: str, data: Mapping[str, Any], *, sync: bool | None = None) -> Record:
        """Write one record (``write(2)`` at once: visible to readers when this returns)."""
        if self._final is not None:
            raise JournalCorrupt(
                f"journal {self.path} already holds its final record; nothing may follow it",
            )
        record = Record(
            seq=self._last_seq + 1, kind=kind, time_ms=int(time.time() * 1000), data=data
        )
        line = _encode_whole(record)
        whole = len(line) <= RECORD_LIMIT_BYTES
        line = line + b"\n" if whole else encode_record(record)
        if self._size + len(line) > self.max_bytes and not record.is_final:
            self._drop_middle()
        view = memoryview(line)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(line)
        self._last_seq = record.seq
        self.last_line = line if whole else None
        if record.is_final:
            self._final = record
        self._unsynced = True
        if sync is None:
            sync = kind in SYNC_KINDS or record.data.get("event") in SYNC_KINDS
        if sync:
            self._sync()
        return record

    def _sync(self) -> None:
        # NB: fdatasync, not fsync: the size (which a record changes) is flushed either way,
        # only the timestamps are not.
        os.fdatasync(self._fd)
        self._unsynced = False
        self.syncs += 1

    def _drop_middle(self) -> None:
        """Rewrite the file as head + one ``journal_dropped`` record + tail (atomically)."""
        lines = self.path.read_bytes().splitlines(keepends=True)
        head_end = 0
        head_size = 0
        for line in lines:
            if _kind_of(line) == DROPPED or head_size + len(line) > self.max_bytes // 2:
                break
            head_size += len(line)
            head_end += 1
        tail_start = len(lines)
        tail_size = 0
        while tail_start > head_end:
            size = len(lines[tail_start - 1])
            if tail_size + size > self.max_bytes // 4:
                break
            tail_size += size
            tail_start -= 1
        middle = lines[head_end:tail_start]
        if not middle:
            return  # NB: nothing between head and tail (records near the cap's size): grow
        parsed = [Record.from_json(json.loads(line)) for line in middle]
        previous = parsed[0] if parsed[0].kind == DROPPED else None
        dropped_records = sum(1 for r in parsed if r.kind != DROPPED)
        dropped_bytes = sum(
            len(line) for line, r in zip(middle, parsed, strict=True) if r.kind != DROPPED
        )
        if previous is not None:
            dropped_records += int(previous.data.get("records", 0))
            dropped_bytes += int(previous.data.get("bytes", 0))
        marker = Record(
            seq=parsed[-1].seq,
            kind=DROPPED,
            time_ms=int(time.time() * 1000),
            data={
                "from_seq": int(previous.data["from_seq"]) if previous else parsed[0].seq,
                "records": dropped_records,
                "bytes": dropped_bytes,
            },
        )
        body = b"".join([*lines[:head_end], encode_record(marker), *lines[tail_start:]])
        scratch = self.path.with_name(self.path.name + ".compact")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            scratch.unlink(missing_ok=True)
            raise
        # NB: readers open the path anew for every read, so each sees the old file or the new
        # one whole; the new one is appended to from here on.
        os.replace(scratch, self.path)
        os.close(self._fd)
        self._fd = fd
        os.lseek(fd, 0, os.SEEK_END)
        self._size = len(body)
        self._unsynced = False
        self.compactions += 1

    def close(self) -> None:
        if self._fd >= 0:
            if self._unsynced:
                self._sync()  # NB: after the final record (synced) there is nothing left
            os.close(self._fd)
            self._fd = -1


def read_journal(path: Path, *, after_seq: int = 0) -> list[Record]:
    """Every whole record with ``seq > after_seq``; a torn last line is skipped.

    Raises :class:`JournalCorrupt` for a malformed line before the last one, or for sequence
    numbers that do not count up by one.
    """
    records, _ = _scan(path)
    return [r for r in records if r.seq > after_seq]


def last_record(path: Path) -> Record | None:
    """The last whole record, reading only the file's tail (probes of long journals).

    A torn last line is skipped, as :func:`read_journal` does; the rest of the file is not
    checked (that is :func:`read_journal`'s job).
    """
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - 2 * RECORD_LIMIT_BYTES)
            handle.seek(start)
            tail = handle.read()
    except FileNotFoundError:
        return None
    lines = tail.split(b"\n")
    if start > 0:
        lines = lines[1:]  # NB: the first piece may be the end of a longer line.
    for line in reversed(lines[:-1]):  # the piece after the last newline is torn or empty
        try:
            return Record.from_json(json.loads(line))
        except (ValueError, RecursionError):
            continue
    return None


def iter_lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """``(end offset, line, complete)`` for each line of ``data``."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            yield len(data), data[start:], False
            return
        yield end + 1, data[start:end], True
        start = end + 1


def _kind_of(line: bytes) -> str | None:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    kind = raw.get("kind") if isinstance(raw, dict) else None
    return kind if isinstance(kind, str) else None


def _announces_jump(record: Record, expected: int) -> bool:
    """Whether ``record`` is the ``journal_dropped`` record standing for seqs from ``expected``."""
    return (
        record.kind == DROPPED
        and record.data.get("from_seq") == expected
        and record.seq >= expected
    )


def accepts_after(record: Record, last_seq: int) -> bool:
    """Whether a reader that has everything up to ``last_seq`` may take ``record`` next: the
    next seq, or a ``journal_dropped`` record that covers the seqs in between."""
    return record.seq == last_seq + 1 or (
        record.kind == DROPPED
        and isinstance(record.data.get("from_seq"), int)
        and record.data["from_seq"] <= last_seq + 1 <= record.seq
    )


def _scan(path: Path) -> tuple[list[Record], int]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    records: list[Record] = []
    good = 0
    for end, line, complete in iter_lines(data):
        try:
            record = Record.from_json(json.loads(line))
        except (ValueError, RecursionError) as exc:
            if not complete or (end == len(data) and not line.strip()):
                break  # the torn last line of a writer that died mid-write
            if end == len(data):
                break  # NB: a complete but garbled last line is a torn write too (a page lost)
            raise JournalCorrupt(
                f"journal {path} has a malformed record at byte {good} ({exc}); the run's "
                "history cannot be trusted, inspect or remove the state directory",
            ) from None
        if not complete:
            break  # valid JSON but no newline: the write may not have ended, treat as torn
        expected = records[-1].seq + 1 if records else 1
        if record.seq != expected and not _announces_jump(record, expected):
            raise JournalCorrupt(
                f"journal {path} jumps from seq {expected - 1} to {record.seq}; inspect or "
                "remove the state directory",
            )
        records.append(record)
        good = end
    return records, good
