"""Which pages a forked worker wrote, and what was on them: copy-on-write, measured.

A worker is a fork of the launcher (:mod:`lorenz.workers.forkserver`): it shares the launcher's
pages until it writes one, and then owns a copy. What a live run costs in memory is those
copies, and what they hold says what to cut: the interpreter's own writes into code objects,
reference counts raised and lowered again, objects changed, or memory the worker allocated.

At a worker's end, :func:`written_pages` takes each page of its anonymous and heap mappings
that is its own (``/proc/self/pagemap``: present, mapped once), reads the same page in the
launcher (``/proc/<launcher>/mem``), and files the page under the first of these that its
differing words show: a code object changed (``code``), another object's fields (``objects``),
only reference counts or the collector's links (``counts``), words in no object known to the
collector (``other``: memory allocated after the fork, the allocator's own state). A page equal
to the launcher's (``unchanged``) was written and written back — a count raised and lowered.
Writable pages of shared libraries (``libraries``: the interpreter's static data) are counted,
not compared.

A page can also be a fork's own without the fork writing it after it started to watch: the
launcher wrote its copy after the fork and the original was left to the fork, or the fork
wrote it before it took note (the interpreter's own after-fork work). :func:`remember_frames`,
called first thing in the fork's Python, notes each page's frame; at the end a page still in
that frame is counted ``inherited``. Measured (bench/README.md, sixth round): ~1.1 MiB a
worker, most of it the fork's after-fork work, not the launcher's writes.

For ``bench/cli_bench.py --pages`` only (through :mod:`lorenz.workers.profiling`): it walks every
object of the process and reads another process's memory (root, or ptrace rights over the
launcher), which no run otherwise does.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import os
import struct
import sys
import types
from collections.abc import Iterator

PAGE = os.sysconf("SC_PAGE_SIZE")
_WORDS = PAGE // 8
_PRESENT = 1 << 63
_EXCLUSIVE = 1 << 56
_FRAME = (1 << 55) - 1
"""The page frame number bits of a pagemap entry (read as root; zero otherwise)."""
_GC_HEAD = 16
"""Bytes of the collector's links before a tracked object (CPython 3.11's ``PyGC_Head``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class WrittenPages:
    """A process's own pages, filed by what changed on them (module docstring)."""

    own: int
    """Pages of its anonymous and heap mappings that are its own (present, mapped once)."""
    unchanged: int
    """Of those, pages equal to the launcher's: written and written back."""
    code: int
    """Pages where a word of a code object changed (the interpreter's counters and caches)."""
    objects: int
    """Pages where a field of another object changed (and no code object)."""
    counts: int
    """Pages where only reference counts or the collector's links changed."""
    other: int
    """Pages whose changed words lie in no object the collector knows."""
    libraries: int
    """Writable pages of shared libraries that are its own (not compared)."""
    inherited: int
    """Own pages still in the page frame they had when :func:`remember_frames` noted them: the
    parent wrote its copy after the fork and left the original to this process, or this process
    wrote them before the note. Zero when frames cannot be read (not root)."""

    def line(self, *, kind: str, pid: int) -> str:
        fields = " ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))
        return f"{kind} {pid} {fields}\n"


_entries_at_fork: list[tuple[int, bytes]] = []
"""``(first page, pagemap entries)`` of each anonymous and heap mapping at the fork: raw bytes,
not a decoded table (a dict of every page would be a megabyte of this process's own pages)."""


def remember_frames() -> None:
    """In a process just forked: note the page frame of each of its anonymous and heap pages,
    to tell at its end which pages it owns without having written them (``inherited``)."""
    _entries_at_fork.clear()
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for start, end, anonymous in _writable_mappings():
            if anonymous:
                pagemap.seek(start // PAGE * 8)
                _entries_at_fork.append((start // PAGE, pagemap.read((end - start) // PAGE * 8)))


def _frame_at_fork(page: int) -> int:
    for first, entries in _entries_at_fork:
        if first <= page < first + len(entries) // 8:
            (entry,) = struct.unpack_from("<Q", entries, (page - first) * 8)
            return int(entry & _FRAME) if entry & _PRESENT else 0
    return 0


def written_pages(*, parent: int) -> WrittenPages:
    """Compare this process's own pages with ``parent``'s (the process it was forked from)."""
    own: list[int] = []
    libraries = 0
    inherited = 0
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for start, end, anonymous in _writable_mappings():
            pagemap.seek(start // PAGE * 8)
            entries = pagemap.read((end - start) // PAGE * 8)
            for index, (entry,) in enumerate(struct.iter_unpack("<Q", entries)):
                if entry & _PRESENT and entry & _EXCLUSIVE:
                    if anonymous:
                        own.append(start // PAGE + index)
                        inherited += _frame_at_fork(start // PAGE + index) == entry & _FRAME != 0
                    else:
                        libraries += 1
    changed: dict[int, list[int]] = {}
    unchanged = 0
    with open("/proc/self/mem", "rb", buffering=0) as mine, \
            open(f"/proc/{parent}/mem", "rb", buffering=0) as theirs:
        for page in own:
            mine.seek(page * PAGE)
            ours = mine.read(PAGE)
            try:
                theirs.seek(page * PAGE)
                before = theirs.read(PAGE)
            except OSError:
                before = b""
            if len(before) != PAGE:
                changed[page] = []  # NB: not in the parent (mapped after the fork)
                continue
            words = [
                page * PAGE + 8 * i
                for i, (a, b) in enumerate(
                    zip(struct.unpack(f"<{_WORDS}Q", ours), struct.unpack(f"<{_WORDS}Q", before),
                        strict=True)
                )
                if a != b
            ]
            if words:
                changed[page] = words
            else:
                unchanged += 1
    tally = dict.fromkeys(("code", "objects", "counts", "other"), 0)
    objects = _objects()
    starts = sorted(objects)
    for words in changed.values():
        tally[_cause(words, objects=objects, starts=starts)] += 1
    return WrittenPages(
        own=len(own), unchanged=unchanged, libraries=libraries, inherited=inherited, **tally
    )


def _writable_mappings() -> Iterator[tuple[int, int, bool]]:
    """``(start, end, anonymous)`` of each private writable mapping (heap and anonymous, or a
    file's)."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split()
            if "w" not in fields[1] or fields[1].endswith("s"):
                continue
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if name in ("[stack]", "[vvar]", "[vdso]"):
                continue
            yield start, end, name in ("", "[heap]")


def _objects() -> dict[int, object]:
    """Every object the collector tracks, and what they refer to directly (strings, code)."""
    # NB: frozen objects (the launcher's gc.freeze) are not listed until unfrozen; this process
    # ends right after, so moving them back changes nothing that matters (and the pages were
    # compared before).
    gc.unfreeze()
    found: dict[int, object] = {}
    for tracked in gc.get_objects():
        found[id(tracked)] = tracked
        for referent in gc.get_referents(tracked):
            found.setdefault(id(referent), referent)
            if isinstance(referent, types.CodeType):
                for constant in referent.co_consts:
                    found.setdefault(id(constant), constant)
    return found


def _cause(words: list[int], *, objects: dict[int, object], starts: list[int]) -> str:
    causes = set()
    for address in words:
        index = bisect.bisect_right(starts, address + _GC_HEAD) - 1
        if index < 0:
            causes.add("other")
            continue
        start = starts[index]
        owner = objects[start]
        offset = address - start
        if offset >= sys.getsizeof(owner, 0):
            causes.add("other")
        elif offset in (0, -_GC_HEAD, -_GC_HEAD // 2):
            causes.add("counts")
        elif isinstance(owner, types.CodeType):
            causes.add("code")
        else:
            causes.add("objects")
    for cause in ("code", "objects", "counts"):
        if cause in causes:
            return cause
    return "other"
