"""A tracker made of Markdown files (``tracker.kind: files``), one issue per file.

It lets Lorenz run end to end on one machine with no account anywhere: a folder of ``*.md``
files is the board, and editing a file's ``state:`` line is how a person (or the demo agent)
moves an issue. Each file is YAML front matter followed by the description::

    ---
    id: DEMO-1            # optional; defaults to the identifier
    identifier: DEMO-1    # optional; defaults to the file name without ``.md``
    title: Add a greeting
    state: Todo
    priority: 2           # optional; integers only
    labels: [demo]        # optional
    blocked_by: [DEMO-0]  # optional; identifiers or ids of other files
    assignee: alice       # optional
    created_at: 2026-01-02T03:04:05Z
    updated_at: 2026-01-02T03:04:05Z   # optional; defaults to the file's mtime
    ---
    The description, in Markdown.

An agent's question (:mod:`lorenz.trackers.questions`) is written into the issue file as a
comment under a ``## Comments`` section, and a person answers by adding one below it::

    ## Comments

    ### Lorenz · 2026-01-02T03:04:05Z

    <!-- lorenz-question: lz-0123abcd -->
    Which database should the migration target?

    ### alice · 2026-01-02T04:00:00Z

    Postgres, please.

Each comment is a ``### <author>`` heading (`` · <ISO time>`` or `` - <ISO time>`` optional;
without it the file's modification time stands in) followed by its text, up to the next
``###`` heading or the end of the section (the next ``#``/``##`` heading, or the end of the
file).

The folder is re-read on every call, so an edit is seen by the next tick; a parsed file is
cached by its ``stat`` stamp, so an unchanged folder costs one ``stat`` per file. Writes made
here (:func:`set_issue_state`) are atomic (temp file + rename) and touch only the lines they
change, so a concurrent reader never sees half a file and hand edits survive.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import getpass
import json
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers.base import TrackerError, tracker_settings_of
from lorenz.trackers.questions import (
    ReadComment,
    TrackerReply,
    bounded_question,
    has_question_marker,
    question_marker,
    replies_after,
)
from lorenz.trackers.writes import has_marker, with_marker

logger = logging.getLogger(__name__)

ISSUE_SUFFIX = ".md"
FENCE = "---"
FENCE_ENDINGS = ("---", "...")
IGNORED_NAMES = frozenset({"readme.md"})


try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _FrontMatterLoader(_SafeLoader):
    """PyYAML's safe loader (libyaml's parser when available: a cold read of a large folder is
    several times faster) with YAML 1.2 booleans: only ``true``/``false`` are booleans.

    NB: YAML 1.1 turns ``yes``, ``no``, ``on`` and ``off`` into booleans, so a title "No" or a
    state "On" would silently become ``False``/``True``.
    """


_FrontMatterLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_FrontMatterLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def load_front_matter_yaml(text: str) -> Any:
    """Parse front matter YAML the way the files tracker does."""
    return yaml.load(text, Loader=_FrontMatterLoader)  # a SafeLoader subclass


# -- parsing ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class IssueFile:
    """One parsed issue file: either an issue (with unresolved blocker references) or the
    reason it is malformed."""

    path: Path
    key: str
    """The id the file stands for, as far as it can be told (malformed files included)."""
    issue: Issue | None
    blocker_refs: tuple[str, ...] = ()
    problem: str | None = None


def split_front_matter(text: str) -> tuple[str, str] | None:
    """``(yaml, body)``, or ``None`` when the text has no closed front matter block."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != FENCE:
        return None
    for index in range(1, len(lines)):
        if lines[index].strip() in FENCE_ENDINGS:
            return "".join(lines[1:index]), "".join(lines[index + 1 :])
    return None


def parse_issue_file(text: str, *, path: Path, mtime: float | None = None) -> IssueFile:
    """Turn a file's text into an :class:`IssueFile` (never raises for bad content)."""
    stem_key = path.name.removesuffix(ISSUE_SUFFIX)
    parts = split_front_matter(text)
    if parts is None:
        return IssueFile(path=path, key=stem_key, issue=None, problem="no front matter block")
    raw_yaml, body = parts
    try:
        meta = load_front_matter_yaml(raw_yaml)
    except yaml.YAMLError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return IssueFile(path=path, key=stem_key, issue=None, problem=f"bad YAML: {detail}")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        return IssueFile(
            path=path, key=stem_key, issue=None, problem="front matter is not a mapping"
        )

    identifier = _text(meta.get("identifier")) or stem_key
    issue_id = _text(meta.get("id")) or identifier
    title = _text(meta.get("title"))
    state = _text(meta.get("state"))
    if title is None or state is None:
        missing = " and ".join(n for n, v in (("title", title), ("state", state)) if v is None)
        return IssueFile(path=path, key=issue_id, issue=None, problem=f"missing {missing}")

    updated_at = _timestamp(meta.get("updated_at"))
    if updated_at is None and mtime is not None:
        updated_at = datetime.datetime.fromtimestamp(mtime, tz=datetime.UTC)
    description = body.strip() or None
    issue = Issue(
        id=issue_id,
        identifier=identifier,
        title=title,
        state=state,
        description=description,
        priority=_priority(meta.get("priority")),
        branch_name=_text(meta.get("branch_name")),
        url=path.absolute().as_uri(),
        labels=tuple(_strings(meta.get("labels"))),
        created_at=_timestamp(meta.get("created_at")),
        updated_at=updated_at,
        assignee_id=_text(meta.get("assignee")),
        native_ref={"path": str(path)},
    )
    return IssueFile(path=path, key=issue_id, issue=issue, blocker_refs=_blocker_refs(meta))


def _text(value: Any) -> str | None:
    """A scalar as trimmed text; ``None`` for missing, blank or structured values."""
    if value is None or isinstance(value, bool | dict | list):
        return None
    text = str(value).strip()
    return text or None


def _priority(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _strings(value: Any) -> Iterable[str]:
    if not isinstance(value, list):
        return ()
    return [text for text in (_text(item) for item in value) if text]


def _blocker_refs(meta: dict[Any, Any]) -> tuple[str, ...]:
    value = meta.get("blocked_by")
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = [value]
    return tuple(dict.fromkeys(_strings(value)))


def _timestamp(value: Any) -> datetime.datetime | None:
    """YAML gives datetimes or dates for unquoted timestamps and strings for quoted ones."""
    if isinstance(value, datetime.datetime):
        moment = value
    elif isinstance(value, datetime.date):
        moment = datetime.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    # NB: a timestamp without a zone is taken as UTC, so every issue compares with every other.
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


# -- the folder -----------------------------------------------------------------------------------


def is_issue_file_name(name: str) -> bool:
    """``*.md``, except dot files (editors' and our temp files), ``_*`` and ``README.md``."""
    return (
        name.endswith(ISSUE_SUFFIX)
        and not name.startswith((".", "_"))
        and name.lower() not in IGNORED_NAMES
    )


_Stamp = tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class FolderScan:
    """One read of the folder: well-formed issues (blockers resolved) and malformed files."""

    issues: tuple[Issue, ...]
    malformed: tuple[IssueFile, ...]

    def malformed_by_key(self) -> dict[str, IssueFile]:
        return {record.key: record for record in self.malformed}


class IssueFolder:
    """Reads a folder of issue files, re-parsing only files whose ``stat`` stamp changed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, tuple[_Stamp, IssueFile]] = {}
        self._lock = threading.Lock()

    def scan(self) -> FolderScan:
        with self._lock:
            return self._scan()

    def _scan(self) -> FolderScan:
        try:
            entries = sorted(
                (entry for entry in os.scandir(self.folder) if is_issue_file_name(entry.name)),
                key=lambda entry: entry.name,
            )
        except FileNotFoundError:
            raise TrackerError(
                f"issue folder {self.folder} does not exist; create it or fix tracker.path",
                code=ErrorCode.FILES_FOLDER_MISSING,
                key_path="tracker.path",
            ) from None
        except NotADirectoryError:
            raise TrackerError(
                f"tracker.path {self.folder} is not a folder; point it at the issues folder",
                code=ErrorCode.FILES_FOLDER_MISSING,
                key_path="tracker.path",
            ) from None
        except OSError as exc:
            raise TrackerError(
                f"cannot read issue folder {self.folder}: {exc.strerror}; check permissions",
                code=ErrorCode.FILES_FOLDER_UNREADABLE,
                key_path="tracker.path",
                retryable=True,
            ) from exc

        records: list[IssueFile] = []
        seen_names: set[str] = set()
        for entry in entries:
            record = self._read(entry)
            if record is not None:
                records.append(record)
                seen_names.add(entry.name)
        for name in set(self._cache) - seen_names:
            del self._cache[name]
        return _resolve(records)

    def _read(self, entry: os.DirEntry[str]) -> IssueFile | None:
        try:
            st = entry.stat()
        except FileNotFoundError:
            return None  # removed between listing and stat
        if not entry.is_file():
            return None
        # NB: the inode is part of the stamp: an atomic rewrite (ours, ``sed -i``, most editors)
        # always makes a new inode, so an edit is noticed even when it keeps the size and lands
        # within the filesystem's timestamp granularity.
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        cached = self._cache.get(entry.name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        path = Path(entry.path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            record = IssueFile(
                path=path,
                key=entry.name.removesuffix(ISSUE_SUFFIX),
                issue=None,
                problem=f"unreadable: {exc}",
            )
        else:
            record = parse_issue_file(text, path=path, mtime=st.st_mtime)
        self._cache[entry.name] = (stamp, record)
        return record


def _resolve(records: list[IssueFile]) -> FolderScan:
    """Drop duplicate ids and fill in each blocker's id, identifier and state."""
    good: dict[str, IssueFile] = {}
    malformed: list[IssueFile] = []
    for record in records:
        if record.issue is None:
            malformed.append(record)
        elif record.key in good:
            malformed.append(
                dataclasses.replace(
                    record,
                    issue=None,
                    problem=f"duplicate id {record.key!r} (also in {good[record.key].path.name})",
                )
            )
        else:
            good[record.key] = record
    by_identifier = {r.issue.identifier: r.issue for r in good.values() if r.issue is not None}
    issues: list[Issue] = []
    for record in good.values():
        assert record.issue is not None
        if not record.blocker_refs:
            issues.append(record.issue)
            continue
        blockers = []
        for ref in record.blocker_refs:
            found = good[ref].issue if ref in good else by_identifier.get(ref)
            if found is None:
                blockers.append(BlockerRef(identifier=ref))
            else:
                blockers.append(
                    BlockerRef(id=found.id, identifier=found.identifier, state=found.state)
                )
        issues.append(dataclasses.replace(record.issue, blocked_by=tuple(blockers)))
    return FolderScan(issues=tuple(issues), malformed=tuple(malformed))


# -- the tracker ---------------------------------------------------------------------------------


class FilesTracker:
    """The ``files`` tracker over one folder."""

    def __init__(self, *, settings: WorkflowSettings | TrackerSettings, folder: Path) -> None:
        self._settings = tracker_settings_of(settings)
        self._folder = IssueFolder(folder)
        self._reported_malformed: frozenset[tuple[str, str]] = frozenset()
        assignee = (self._settings.assignee or "").strip()
        if assignee.lower() == "me":
            assignee = getpass.getuser()
        self._assignee = assignee.casefold() or None

    @property
    def folder(self) -> Path:
        return self._folder.folder

    def scan(self) -> FolderScan:
        """One synchronous read of the folder (what every fetch does)."""
        return self._folder.scan()

    async def fetch_candidate_issues(self) -> list[Issue]:
        return await self.fetch_issues_by_states(self._settings.active_states)

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        if not states:
            return []
        scan = await asyncio.to_thread(self._folder.scan)
        self._report_malformed(scan)
        keys = {normalize_state(s) for s in states}
        return [self._routed(issue) for issue in scan.issues if issue.state_key in keys]

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        if not ids:
            return []
        scan = await asyncio.to_thread(self._folder.scan)
        by_id = {issue.id: issue for issue in scan.issues}
        malformed = scan.malformed_by_key()
        found: list[Issue] = []
        for issue_id in dict.fromkeys(ids):
            if issue_id in by_id:
                found.append(self._routed(by_id[issue_id]))
            elif issue_id in malformed:
                record = malformed[issue_id]
                raise TrackerError(
                    f"issue file {record.path} is malformed ({record.problem}); fix the file",
                    code=ErrorCode.FILES_MALFORMED_ISSUE,
                )
        return found

    async def close(self) -> None:
        """Nothing to release."""

    def set_issue_state(self, id_or_identifier: str, new_state: str) -> Path:
        """Move an issue of this folder to ``new_state``; returns the file written."""
        return set_issue_state(id_or_identifier, new_state, folder=self.folder)

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """Append ``comment`` under a ``## Lorenz`` note at the end of the issue file (once per
        ``key``) and add ``label`` to its ``labels:`` (see :mod:`lorenz.trackers.writes`)."""
        return await asyncio.to_thread(
            escalate_issue_file, self._issue_path(issue), key=key, comment=comment, label=label
        )

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """Set the issue file's ``state:`` (the ``retry.terminal_action: cancel`` write)."""
        await asyncio.to_thread(set_issue_state, self._issue_path(issue), state)

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """Add the question as a comment by ``Lorenz`` under the file's ``## Comments``
        (made at the end when missing), unless the file already carries ``key``'s marker."""
        return await asyncio.to_thread(
            post_question_to_file, self._issue_path(issue), key=key, body=body
        )

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The comments below the question in the file's ``## Comments``, in file order,
        without Lorenz's own (author ``Lorenz``, or any Lorenz marker)."""
        path = self._issue_path(issue)
        return await asyncio.to_thread(read_replies_in_file, path, key=key)

    def _issue_path(self, issue: Issue) -> Path:
        return find_issue_file(self.folder, issue.id)

    def _routed(self, issue: Issue) -> Issue:
        if self._assignee is None:
            return issue
        mine = (issue.assignee_id or "").casefold() == self._assignee
        return issue if mine else dataclasses.replace(issue, dispatchable=False)

    def _report_malformed(self, scan: FolderScan) -> None:
        current = frozenset((str(r.path), r.problem or "") for r in scan.malformed)
        if not current:
            self._reported_malformed = current
            return
        summary = "; ".join(f"{Path(p).name}: {problem}" for p, problem in sorted(current))
        # NB: the same set of broken files is reported at warning level once, then at debug
        # level on every later tick, so a standing problem does not flood the log.
        level = logging.DEBUG if current == self._reported_malformed else logging.WARNING
        logger.log(
            level,
            "dropped malformed issue files folder=%s count=%d files=[%s]",
            self.folder,
            len(current),
            summary,
        )
        self._reported_malformed = current


# -- writing -------------------------------------------------------------------------------------


def find_issue_file(folder: Path, id_or_identifier: str) -> Path:
    """The file in ``folder`` whose id or identifier (or file stem) is ``id_or_identifier``."""
    wanted = id_or_identifier.strip()
    records = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        raise TrackerError(
            f"issue folder {folder} cannot be read; check the path",
            code=ErrorCode.FILES_FOLDER_MISSING,
        ) from None
    for entry in entries:
        if not is_issue_file_name(entry.name) or not entry.is_file():
            continue
        path = Path(entry.path)
        records.append(parse_issue_file(path.read_text(encoding="utf-8"), path=path))
    # Ids first, then identifiers, then file stems: an id is the most specific name.
    for record in records:
        if record.key == wanted:
            return record.path
    for record in records:
        if record.issue is not None and record.issue.identifier == wanted:
            return record.path
    for record in records:
        if record.path.name.removesuffix(ISSUE_SUFFIX) == wanted:
            return record.path
    raise TrackerError(
        f"no issue {wanted!r} in {folder}; pass a file path or an existing id/identifier",
        code=ErrorCode.FILES_ISSUE_NOT_FOUND,
    )


def _read_for_edit(path: Path) -> tuple[str, tuple[str, str]]:
    """An issue file's text and its split front matter, before one of the writers edits it.

    Shared by the state change, the escalation and the question, which all refuse a file
    without a front matter block alike.
    """
    # NB: newline="" keeps CRLF files CRLF: only the changed lines may differ afterwards.
    with path.open(encoding="utf-8", newline="") as handle:
        text = handle.read()
    parts = split_front_matter(text)
    if parts is None:
        raise TrackerError(
            f"issue file {path} has no front matter block; add one starting with '---'",
            code=ErrorCode.FILES_MALFORMED_ISSUE,
        )
    return text, parts


def set_issue_state(
    target: str | os.PathLike[str],
    new_state: str,
    *,
    folder: Path | None = None,
    now: datetime.datetime | None = None,
) -> Path:
    """Set the ``state:`` of one issue file and bump its ``updated_at:`` (when it has one).

    ``target`` is a path to the file, or (with ``folder``) an id or identifier. Only the
    ``state`` and ``updated_at`` lines change; the rest of the file is kept byte for byte.
    The write is atomic. Returns the path written.
    """
    if not new_state.strip():
        raise TrackerError("the new state must not be blank", code=ErrorCode.FILES_INVALID_STATE)
    path = Path(target)
    if not path.is_file():
        if folder is None:
            raise TrackerError(
                f"{target} is not a file; pass a path, or an id together with the folder",
                code=ErrorCode.FILES_ISSUE_NOT_FOUND,
            )
        path = find_issue_file(folder, str(target))
    text, _ = _read_for_edit(path)
    text = replace_front_matter_value(text, "state", yaml_scalar(new_state.strip()))
    stamp = (now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds")
    text = replace_front_matter_value(
        text, "updated_at", stamp.replace("+00:00", "Z"), add_if_missing=False
    )
    write_atomically(path, text)
    return path


_WRITE_LOCK = threading.Lock()
"""NB: serializes this process's read-modify-write of issue files (escalations and state moves
from several runs); a person editing the file at the same moment can still lose to the rename,
as with any editor."""


def escalate_issue_file(
    path: Path,
    *,
    key: str,
    comment: str | None,
    label: str | None,
    now: datetime.datetime | None = None,
) -> bool:
    """Write an escalation into one issue file; ``True`` when the file changed.

    The comment goes at the end of the description, after its marker; a file that already
    carries the marker gets no second comment. The label is added to the front matter's
    ``labels:`` (written as a flow list) unless the issue has it. ``updated_at:`` is bumped when
    the file has one.
    """
    with _WRITE_LOCK:
        text, parts = _read_for_edit(path)
        changed = False
        if label is not None:
            meta = load_front_matter_yaml(parts[0])
            current = list(_strings(meta.get("labels"))) if isinstance(meta, dict) else []
            if normalize_state(label) not in {normalize_state(name) for name in current}:
                names = ", ".join(yaml_scalar(name) for name in [*current, label.strip()])
                text = replace_front_matter_value(text, "labels", f"[{names}]")
                changed = True
        if comment is not None and not has_marker(text, key=key):
            newline = "\r\n" if "\r\n" in text else "\n"
            body = with_marker(comment, key=key).replace("\n", newline)
            text = text.rstrip("\r\n") + f"{newline}{newline}## Lorenz{newline}{newline}{body}"
            text += newline
            changed = True
        if changed:
            stamp = (now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds")
            text = replace_front_matter_value(
                text, "updated_at", stamp.replace("+00:00", "Z"), add_if_missing=False
            )
            write_atomically(path, text)
        return changed


COMMENTS_HEADING = "## Comments"
"""The section of an issue file that holds comments (questions and their answers)."""
FILES_OWN_AUTHOR = "Lorenz"
"""The author Lorenz writes on its comments (a person's comment by that name counts as its)."""
MAX_FILE_COMMENTS = 1000
"""Comments read from one file at most (the first ones; a question further down is not seen)."""
_SECTION_RE = re.compile(r"^#{1,2}\s+\S")
_COMMENTS_RE = re.compile(r"^##\s+comments\s*$", re.IGNORECASE)
_COMMENT_RE = re.compile(r"^###\s+(?P<heading>\S.*?)\s*$")
_FENCE_RE = re.compile(r"^\s{0,3}(```|~~~)")


@dataclasses.dataclass(frozen=True, slots=True)
class _CommentsSection:
    start: int
    """Index of the ``## Comments`` line."""
    end: int
    """Index of the first line after the section (the next section's heading, or the end)."""


def _body_lines(text: str) -> tuple[list[str], int]:
    """The file's lines (ends kept) and the index of the first body line after the front
    matter (0 when there is none)."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].removeprefix("\ufeff").strip() == FENCE:
        for index in range(1, len(lines)):
            if lines[index].strip() in FENCE_ENDINGS:
                return lines, index + 1
    return lines, 0


def _comments_section(lines: list[str], first: int) -> _CommentsSection | None:
    """Where the first ``## Comments`` section is (headings inside code fences do not count)."""
    fenced = False
    start: int | None = None
    for index in range(first, len(lines)):
        line = lines[index].rstrip("\r\n")
        if _FENCE_RE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if start is None:
            if _COMMENTS_RE.match(line):
                start = index
        elif _SECTION_RE.match(line):
            return _CommentsSection(start=start, end=index)
    return None if start is None else _CommentsSection(start=start, end=len(lines))


def _comment_heading(heading: str, *, fallback: datetime.datetime) -> tuple[str, datetime.datetime]:
    """``alice · 2026-01-02T04:00:00Z`` (or ``alice - …``) → the author and the time (the
    fallback when there is none, or it does not parse)."""
    for separator in ("·", " - "):
        author, _, stamp = heading.rpartition(separator)
        if author.strip():
            moment = _timestamp(stamp.strip())
            if moment is not None:
                return author.strip(), moment
    return heading.strip(), fallback


def parse_file_comments(text: str, *, fallback_time: datetime.datetime) -> list[ReadComment]:
    """The comments of an issue file's ``## Comments`` section, in file order (at most
    :data:`MAX_FILE_COMMENTS`); ``fallback_time`` stands in for a heading without a time."""
    lines, first = _body_lines(text)
    section = _comments_section(lines, first)
    if section is None:
        return []
    comments: list[ReadComment] = []
    heading: str | None = None
    body: list[str] = []
    fenced = False

    def flush() -> None:
        if heading is None or len(comments) >= MAX_FILE_COMMENTS:
            return
        author, moment = _comment_heading(heading, fallback=fallback_time)
        comments.append(
            ReadComment(
                comment_id=f"comment-{len(comments) + 1}",
                body="".join(body).strip(),
                author=author,
                author_id=author,
                created_at=moment,
            )
        )

    for line in lines[section.start + 1 : section.end]:
        bare = line.rstrip("\r\n")
        if _FENCE_RE.match(bare):
            fenced = not fenced
        match = None if fenced else _COMMENT_RE.match(bare)
        if match is not None:
            flush()
            heading, body = match.group("heading"), []
        elif heading is not None:
            body.append(line)
    flush()
    return comments


def read_replies_in_file(path: Path, *, key: str) -> list[TrackerReply] | None:
    """The replies below the question ``key`` in one issue file (see :func:`parse_file_comments`
    and :func:`~lorenz.trackers.questions.replies_after`)."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            text = handle.read()
        mtime = path.stat().st_mtime
    except (OSError, UnicodeDecodeError) as exc:
        raise TrackerError(
            f"issue file {path} cannot be read ({exc}); check the file",
            code=ErrorCode.FILES_MALFORMED_ISSUE,
        ) from exc
    fallback = datetime.datetime.fromtimestamp(mtime, tz=datetime.UTC)
    comments = parse_file_comments(text, fallback_time=fallback)
    return replies_after(comments, key=key, own_ids=[FILES_OWN_AUTHOR], by_time=False)


def _escaped_headings(text: str) -> str:
    """``text`` with a backslash before each heading line outside code fences, so that a
    question's own headings neither start a comment nor end the section; a code fence left open
    is closed."""
    fence: str | None = None
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        opening = _FENCE_RE.match(line)
        if opening is not None:
            fence = None if fence is not None else opening.group(1)
        elif fence is None and line.lstrip(" ").startswith("#"):
            line = "\\" + line.lstrip(" ")
        lines.append(line)
    if fence is not None:
        lines.append(fence)
    return "\n".join(lines)


def post_question_to_file(
    path: Path, *, key: str, body: str, now: datetime.datetime | None = None
) -> bool:
    """Write the question ``key`` into one issue file as a comment; ``True`` when it wrote.

    The comment goes at the end of the ``## Comments`` section (before the next section's
    heading), or in a new section at the end of the file; a file that already carries the
    marker is left alone. ``updated_at:`` is bumped when the file has one.
    """
    with _WRITE_LOCK:
        text, _ = _read_for_edit(path)
        if has_question_marker(text, key=key):
            return False
        moment = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
        stamp = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
        newline = "\r\n" if "\r\n" in text else "\n"
        comment = (
            f"### {FILES_OWN_AUTHOR} · {stamp}{newline}{newline}"
            + f"{question_marker(key)}\n{_escaped_headings(bounded_question(body))}"
            .replace("\r\n", "\n")
            .replace("\n", newline)
            + newline
        )
        lines, first = _body_lines(text)
        section = _comments_section(lines, first)
        if section is None:
            text = text.rstrip("\r\n") + f"{newline}{newline}{COMMENTS_HEADING}{newline}{newline}"
            text += comment
        else:
            before = "".join(lines[: section.end]).rstrip("\r\n")
            after = "".join(lines[section.end :])
            text = f"{before}{newline}{newline}{comment}"
            if after:
                text += newline + after
        text = replace_front_matter_value(
            text, "updated_at", stamp, add_if_missing=False
        )
        write_atomically(path, text)
        return True


_PLAIN_SCALAR = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _./()-]*")


def yaml_scalar(value: str) -> str:
    """``value`` as a YAML scalar: plain when that reads back as the same string, else quoted."""
    if _PLAIN_SCALAR.fullmatch(value) and not value.endswith(" "):
        with contextlib.suppress(yaml.YAMLError):
            if load_front_matter_yaml(value) == value:
                return value
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def replace_front_matter_value(
    text: str, key: str, value: str, *, add_if_missing: bool = True
) -> str:
    """Replace the top-level ``key:`` line of the front matter (and any indented continuation
    lines of its old value) with ``key: value``; add it before the closing fence if missing."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    lines = text.removeprefix("\ufeff").splitlines(keepends=True)
    end = next(
        (i for i in range(1, len(lines)) if lines[i].strip() in FENCE_ENDINGS),
        None,
    )
    if not lines or lines[0].strip() != FENCE or end is None:
        raise ValueError("text has no front matter block")
    newline = "\r\n" if lines[0].endswith("\r\n") else "\n"
    pattern = re.compile(rf"^{re.escape(key)}\s*:(\s|$)")
    for index in range(1, end):
        if pattern.match(lines[index]):
            stop = index + 1
            while stop < end and lines[stop][:1] in (" ", "\t") and lines[stop].strip():
                stop += 1
            ending = "\r\n" if lines[index].endswith("\r\n") else newline
            lines[index:stop] = [f"{key}: {value}{ending}"]
            return bom + "".join(lines)
    if not add_if_missing:
        return bom + "".join(lines)
    lines.insert(end, f"{key}: {value}{newline}")
    return bom + "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see either the old or the new file, never a mix."""
    try:
        mode: int | None = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    # NB: the temp file is a dot file in the same folder: same filesystem (so the rename is
    # atomic) and invisible to the folder scan.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


# -- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lorenz.trackers set-state <file|id> <state> [--folder DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m lorenz.trackers", description="Edit issue files of the files tracker."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    set_state = commands.add_parser("set-state", help="move an issue to another state")
    set_state.add_argument("target", help="issue file path, or id/identifier with --folder")
    set_state.add_argument("state", help="the new state, e.g. Done")
    set_state.add_argument("--folder", type=Path, default=None, help="the issues folder")
    args = parser.parse_args(argv)
    try:
        path = set_issue_state(args.target, args.state, folder=args.folder)
    except TrackerError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(path)
    return 0
