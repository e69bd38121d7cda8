"""Small JSON records that map workspace directories back to the issues they belong to.

After a restart there is no memory of which directory belongs to which issue, and the start-up
clean-up is disk-driven: it lists the directories under the root and asks the tracker about
their issues. A hashed key (``A_B--1f2e...``) cannot be turned back into an identifier, let alone
an issue id, so every workspace key gets a marker recording both.

NB: markers live under ``<root>/.lorenz/workspaces/<key>.json``, *not* inside the workspace.
A file inside would make ``git clone <url> .`` in ``after_create`` fail ("destination path
already exists and is not an empty directory"), would show up as an untracked file the agent
might commit, and would make a worktree look dirty.

Writes are atomic (temporary file + rename), so a crash leaves the old record or the new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from lorenz.workspaces.keys import STATE_DIR_NAME

MARKER_VERSION = 1
MARKERS_DIR = "workspaces"

Layout = Literal["flat", "slots"]
"""``flat``: the key directory is slot 0's workspace; ``slots``: it holds ``slot-<n>`` dirs."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkspaceMarker:
    """What Lorenz knows about one workspace key directory."""

    key: str
    issue_id: str
    identifier: str
    layout: Layout
    created_at: str

    def to_json(self) -> dict[str, Any]:
        # NB: spelled out, not dataclasses.asdict(): that recurses and copies every value.
        return {"version": MARKER_VERSION, "key": self.key, "issue_id": self.issue_id,
                "identifier": self.identifier, "layout": self.layout,
                "created_at": self.created_at}

    @classmethod
    def from_json(cls, data: Any) -> WorkspaceMarker | None:
        """The marker, or ``None`` when ``data`` is not a marker this version understands."""
        if not isinstance(data, dict) or data.get("version") != MARKER_VERSION:
            return None
        fields = ("key", "issue_id", "identifier", "layout", "created_at")
        if not all(isinstance(data.get(f), str) for f in fields):
            return None
        if data["layout"] not in ("flat", "slots"):
            return None
        return cls(**{f: data[f] for f in fields})


def state_dir(root: Path) -> Path:
    return root / STATE_DIR_NAME


def marker_path(root: Path, key: str) -> Path:
    return state_dir(root) / MARKERS_DIR / f"{key}.json"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    directory = path.parent
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except FileNotFoundError:
        # NB: made only when missing: a mkdir per write (an EEXIST and a stat) ran on the
        # event loop for every new workspace.
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            # NB: one line, not indented: with ``indent`` json falls back from its C encoder to
            # the pure-Python one, and this runs on the event loop for every new workspace.
            handle.write(json.dumps(data, sort_keys=True) + "\n")
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_json_exclusively(path: Path, data: dict[str, Any]) -> None:
    """Write a file that does not exist yet; atomically replace it when it does after all.

    NB: a new file needs no temporary name and rename (~120 us of the loop per new workspace
    against ~75 us): until it is complete its content is not JSON, which every reader takes as
    "no record" (:func:`read_json`) — the same answer as before it existed. A crash mid-write
    leaves such a file; the next write finds it (``FileExistsError``) and replaces it
    atomically.
    """
    payload = (json.dumps(data, sort_keys=True) + "\n").encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o644)
    except FileExistsError:
        write_json_atomically(path, data)
        return
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)


def read_json(path: Path) -> Any:
    """Parsed JSON, or ``None`` when the file is missing or not JSON."""
    try:
        # NB: unbuffered bytes: a buffered text file asks whether it is a terminal and where
        # it stands first (two syscalls more per read, on the event loop, twice a run).
        with open(path, "rb", buffering=0) as handle:
            content = handle.read()
        return json.loads(content.decode("utf-8"))
    except (OSError, ValueError):
        return None


def read_marker(root: Path, key: str) -> WorkspaceMarker | None:
    return WorkspaceMarker.from_json(read_json(marker_path(root, key)))


def write_marker(root: Path, marker: WorkspaceMarker, *, new: bool = False) -> None:
    """Record ``marker``; ``new``: no marker was readable for its key just before."""
    path = marker_path(root, marker.key)
    if new:
        write_json_exclusively(path, marker.to_json())
    else:
        write_json_atomically(path, marker.to_json())


def delete_marker(root: Path, key: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        marker_path(root, key).unlink()
