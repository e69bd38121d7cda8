"""The per-process index of a state root finds a slot's uncollected runs as a full walk would.

It remembers only what never changes (a collected mark, the slot a spec names), so a run that
appears after the index first read the root, or one that is collected later, is seen.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from lorenz.workers.runner import COLLECTED_NAME, _StateRootIndex
from lorenz.workers.spec import HANDLE_PREFIX
from lorenz.workers.states import SPEC_NAME, list_handles, mark_collected


def _run(root: Path, name: str, *, issue_id: str, slot: int = 0, workflow: str = "wf") -> str:
    handle = f"{HANDLE_PREFIX}-{name}"
    (root / handle).mkdir()
    spec = {"workflow": workflow, "issue": {"id": issue_id}, "slot_index": slot}
    (root / handle / SPEC_NAME).write_text(json.dumps(spec), encoding="utf-8")
    return handle


def test_index_sees_new_runs_and_later_collected_marks(tmp_path: Path) -> None:
    index = _StateRootIndex(tmp_path)
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == []
    first = _run(tmp_path, "a", issue_id="i1")
    _run(tmp_path, "b", issue_id="i1", slot=1)
    _run(tmp_path, "c", issue_id="i1", workflow="other")
    (tmp_path / "not-a-handle").mkdir()
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == [first]
    # A run that appears after the index read the root (a predecessor's late worker).
    second = _run(tmp_path, "d", issue_id="i1")
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == [first, second]
    (tmp_path / first / COLLECTED_NAME).touch()
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == [second]
    # A run directory whose spec is not written yet is looked at again next time.
    late = f"{HANDLE_PREFIX}-e"
    (tmp_path / late).mkdir()
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == [second]
    (tmp_path / late / SPEC_NAME).write_text(
        json.dumps({"workflow": "wf", "issue": {"id": "i1"}, "slot_index": 0}), encoding="utf-8"
    )
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == [second, late]


def test_index_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert _StateRootIndex(tmp_path / "missing").uncollected(
        workflow="wf", issue_id="i1", slot=0) == []


def test_the_collected_mark_links_the_spec_and_is_seen_by_the_index(tmp_path: Path) -> None:
    index = _StateRootIndex(tmp_path)
    linked = _run(tmp_path, "a", issue_id="i1")
    bare = f"{HANDLE_PREFIX}-b"
    (tmp_path / bare).mkdir()  # no spec to link: the mark is an empty file
    for handle in (linked, bare, linked):  # twice: idempotent
        mark_collected(tmp_path / handle)
    spec, mark = tmp_path / linked / SPEC_NAME, tmp_path / linked / COLLECTED_NAME
    assert mark.stat().st_ino == spec.stat().st_ino  # a link, no new inode
    assert json.loads(mark.read_text())["issue"] == {"id": "i1"}  # the spec stays as it was
    assert (tmp_path / bare / COLLECTED_NAME).read_bytes() == b""
    assert index.uncollected(workflow="wf", issue_id="i1", slot=0) == []



@pytest.mark.parametrize("broken", ["file", "unreadable"])
def test_a_broken_state_root_holds_no_handle_and_says_so(
    tmp_path: Path, broken: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state root that is a file (or cannot be listed) used to crash a daemon's start-up with
    a raw NotADirectoryError from the worker inheritance; it holds no handle, with a coded
    warning, and the launches then fail as host-side failures (issue #32 point 2)."""
    root = tmp_path / "state"
    if broken == "file":
        root.write_text("not a directory")
    else:
        root.mkdir()
        real_listdir = os.listdir

        def refuse(path: str | os.PathLike[str]) -> list[str]:
            if Path(path) == root:
                raise PermissionError(13, "Permission denied", str(root))
            return real_listdir(path)

        # NB: root reads every mode, so the refusal an unprivileged daemon meets is staged.
        monkeypatch.setattr(os, "listdir", refuse)
    with caplog.at_level(logging.WARNING, logger="lorenz.workers.states"):
        assert list_handles(root) == []
    assert "worker_state_error" in caplog.text
    assert str(root) in caplog.text
