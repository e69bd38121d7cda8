"""The workspace manager in directory mode: hook semantics,
removal, listing for the start-up sweep."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorenz.workspaces import (
    HOOK_FAILED_PREFIX,
    WorkspaceError,
    WorkspaceHookError,
    WorkspaceManager,
    workspace_key,
)
from lorenz.workspaces.markers import WorkspaceMarker
from tests.waiting import wait_until_async
from tests.workspaces.conftest import lexists, make_issue, make_settings


def manager_for(root: Path, **kwargs: object) -> WorkspaceManager:
    secrets = kwargs.pop("secrets", ())
    base_env = kwargs.pop("base_env", None)
    return WorkspaceManager(
        settings=make_settings(root, **kwargs),  # type: ignore[arg-type]
        secrets=secrets,  # type: ignore[arg-type]
        base_env=base_env,  # type: ignore[arg-type]
    )


# -- paths and creation -------------------------------------------------------------------------


def test_path_is_deterministic_and_under_the_canonical_root(root: Path) -> None:
    manager = manager_for(root)
    issue = make_issue("ABC-1")
    assert manager.path_for(issue, slot_index=0) == root / "ABC-1"
    assert manager.path_for(issue, slot_index=0) == manager_for(root).path_for(issue, slot_index=0)
    hashed = make_issue("A/B")
    assert manager.path_for(hashed, slot_index=0) == root / workspace_key("A/B")


def test_ensemble_slots_get_subdirectories(root: Path) -> None:
    manager = manager_for(root, ensemble_size=3)
    issue = make_issue("ABC-1")
    assert manager.path_for(issue, slot_index=0) == root / "ABC-1" / "slot-0"
    assert manager.path_for(issue, slot_index=2) == root / "ABC-1" / "slot-2"


def test_default_root_is_in_the_system_temp_dir(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    manager = WorkspaceManager(settings=make_settings(tmp_path).model_copy(
        update={"workspace": make_settings(tmp_path).workspace.model_copy(update={"root": None})}
    ))
    assert manager.root == tmp_path / "lorenz_workspaces"


async def test_missing_workspace_is_created(root: Path) -> None:
    manager = manager_for(root)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert workspace.created_now is True
    assert workspace.path == root / "ABC-1"
    assert workspace.path.is_dir()
    assert workspace.key == "ABC-1"
    assert workspace.slot_index == 0


async def test_existing_workspace_is_reused_and_never_wiped(root: Path) -> None:
    manager = manager_for(root)
    issue = make_issue("ABC-1")
    first = await manager.prepare(issue, slot_index=0, attempt=None)
    (first.path / "work.txt").write_text("keep me")
    second = await manager.prepare(issue, slot_index=0, attempt=1)
    assert second.created_now is False
    assert (second.path / "work.txt").read_text() == "keep me"


async def test_file_at_the_workspace_path_is_replaced(existing_root: Path) -> None:
    root = existing_root
    (root / "ABC-1").write_text("not a directory")
    workspace = await manager_for(root).prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert workspace.created_now is True
    assert workspace.path.is_dir()


async def test_symlink_inside_the_root_is_replaced_but_its_target_kept(
    existing_root: Path,
) -> None:
    root = existing_root
    (root / "other").mkdir()
    (root / "other" / "data.txt").write_text("someone else's")
    (root / "ABC-1").symlink_to(root / "other")
    workspace = await manager_for(root).prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert workspace.created_now is True
    assert not workspace.path.is_symlink()
    assert (root / "other" / "data.txt").read_text() == "someone else's"


async def test_symlink_out_of_the_root_is_refused_and_left_alone(
    existing_root: Path, tmp_path: Path
) -> None:
    root = existing_root
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "ABC-1").symlink_to(outside)
    with pytest.raises(WorkspaceError) as info:
        await manager_for(root).prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "workspace_symlink_escape"
    assert (root / "ABC-1").is_symlink()
    assert outside.is_dir()


async def test_path_like_identifiers_stay_inside_the_root(root: Path) -> None:
    manager = manager_for(root)
    for identifier in ("../escape", "/etc/passwd", "..", ".", ".lorenz"):
        workspace = await manager.prepare(make_issue(identifier), slot_index=0, attempt=None)
        assert workspace.path.parent == root
        assert workspace.path.name != ".lorenz"
    assert not (root.parent / "escape").exists()


async def test_symlinked_root_is_canonicalized(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    (tmp_path / "root-link").symlink_to(real)
    manager = manager_for(tmp_path / "root-link")
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert workspace.path == real / "ABC-1"


async def test_root_link_swapped_after_first_use_sends_nothing_through_the_new_link(
        tmp_path: Path) -> None:
    # The canonical root is walked once per settings; a later swap of the root's symlink must
    # not put workspaces under the new target, and the old root keeps working.
    real, other = tmp_path / "real-root", tmp_path / "other-root"
    real.mkdir()
    other.mkdir()
    link = tmp_path / "root-link"
    link.symlink_to(real)
    manager = manager_for(link)
    first = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    link.unlink()
    link.symlink_to(other)
    second = await manager.prepare(make_issue("ABC-2"), slot_index=0, attempt=None)
    assert (first.path, second.path) == (real / "ABC-1", real / "ABC-2")
    assert list(other.iterdir()) == []
    manager.update_settings(make_settings(link))
    assert manager.root == other


async def test_root_that_is_a_file_is_a_coded_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkspaceError) as info:
        await manager_for(tmp_path / "file").prepare(make_issue("A"), slot_index=0, attempt=None)
    assert info.value.code == "workspace_create_failed"
    assert "workspace.root" in info.value.message


async def test_ensemble_workspaces_are_created_per_slot(root: Path) -> None:
    manager = manager_for(root, ensemble_size=2)
    issue = make_issue("ABC-1")
    slots = await asyncio.gather(
        manager.prepare(issue, slot_index=0, attempt=None),
        manager.prepare(issue, slot_index=1, attempt=None),
    )
    assert [w.path for w in slots] == [root / "ABC-1" / "slot-0", root / "ABC-1" / "slot-1"]
    assert all(w.created_now for w in slots)


# -- hooks ----------------------------------------------------------------------------------


async def test_after_create_runs_only_for_new_workspaces(root: Path) -> None:
    manager = manager_for(root, hooks={"after_create": "echo x >> ../created.log"})
    issue = make_issue("ABC-1")
    await manager.prepare(issue, slot_index=0, attempt=None)
    await manager.prepare(issue, slot_index=0, attempt=1)
    await manager.prepare(issue, slot_index=0, attempt=2)
    assert (root / "created.log").read_text() == "x\n"


async def test_after_create_can_clone_into_the_empty_workspace(root: Path, repo: Path) -> None:
    # The marker lives outside the workspace, so `git clone <url> .` finds an empty directory.
    manager = manager_for(root, hooks={"after_create": f"git clone -q {repo} ."})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert (workspace.path / "README.md").read_text() == "hello\n"


async def test_failed_after_create_removes_the_new_workspace_and_runs_again(root: Path) -> None:
    gate = root.parent / "allow"
    script = f"echo run >> ../runs.log; test -e {gate}"
    manager = manager_for(root, hooks={"after_create": script})
    issue = make_issue("ABC-1")
    with pytest.raises(WorkspaceHookError) as info:
        await manager.prepare(issue, slot_index=0, attempt=None)
    assert info.value.code == "workspace_hook_failed"
    assert info.value.message.startswith(f"{HOOK_FAILED_PREFIX}1")
    assert not (root / "ABC-1").exists()
    gate.write_text("")
    workspace = await manager.prepare(issue, slot_index=0, attempt=1)
    assert workspace.created_now is True
    assert (root / "runs.log").read_text() == "run\nrun\n"


async def test_after_create_timeout_removes_the_new_workspace(root: Path) -> None:
    manager = manager_for(root, hooks={"after_create": "sleep 30", "timeout_ms": 300})
    with pytest.raises(WorkspaceHookError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "workspace_hook_timeout"
    assert not (root / "ABC-1").exists()


async def test_cancelled_after_create_removes_the_new_workspace(root: Path) -> None:
    manager = manager_for(root, hooks={"after_create": "touch ../started; sleep 30"})
    task = asyncio.create_task(manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None))
    await wait_until_async(
        lambda: (root / "started").exists(),
        timeout=5.0,
        what='(root / "started").exists()',
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (root / "ABC-1").exists()


async def test_hook_environment(root: Path) -> None:
    manager = manager_for(
        root,
        hooks={"before_run": "env > ../env.txt"},
        api_key="tok-123",
        secrets=("LINEAR_API_KEY",),
        base_env={"PATH": os.environ["PATH"], "KEEP_ME": "yes", "LINEAR_API_KEY": "lin",
                  "ALIAS_OF_KEY": "tok-123"},
    )
    issue = make_issue("ABC-1", issue_id="uuid-1", title="Fix it", state="Todo")
    workspace = await manager.prepare(issue, slot_index=0, attempt=None)
    await manager.before_run(workspace, attempt=None)
    env = dict(line.split("=", 1) for line in (root / "env.txt").read_text().splitlines()
               if "=" in line)
    assert env["LORENZ_ISSUE_ID"] == "uuid-1"
    assert env["LORENZ_ISSUE_IDENTIFIER"] == "ABC-1"
    assert env["LORENZ_ISSUE_TITLE"] == "Fix it"
    assert env["LORENZ_ISSUE_STATE"] == "Todo"
    assert env["LORENZ_ATTEMPT"] == ""
    assert env["LORENZ_SLOT"] == "0"
    assert env["LORENZ_WORKSPACE"] == str(workspace.path)
    assert env["LORENZ_HOOK"] == "before_run"
    assert env["KEEP_ME"] == "yes"
    assert "LINEAR_API_KEY" not in env
    assert "ALIAS_OF_KEY" not in env
    assert "tok-123" not in (root / "env.txt").read_text()
    await manager.before_run(workspace, attempt=3)
    assert "LORENZ_ATTEMPT=3\n" in (root / "env.txt").read_text()


async def test_before_run_runs_before_each_attempt_and_failure_is_fatal(root: Path) -> None:
    manager = manager_for(root, hooks={"before_run": "echo $LORENZ_ATTEMPT >> ../before.log; "
                                                     "test \"$LORENZ_ATTEMPT\" != 2"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    await manager.before_run(workspace, attempt=None)
    await manager.before_run(workspace, attempt=1)
    with pytest.raises(WorkspaceHookError) as info:
        await manager.before_run(workspace, attempt=2)
    assert info.value.code == "workspace_hook_failed"
    assert (root / "before.log").read_text() == "\n1\n2\n"
    assert workspace.path.is_dir()  # a failing before_run never deletes anything


async def test_before_run_timeout_is_fatal(root: Path) -> None:
    manager = manager_for(root, hooks={"before_run": "sleep 30", "timeout_ms": 300})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    with pytest.raises(WorkspaceHookError) as info:
        await manager.before_run(workspace, attempt=None)
    assert info.value.code == "workspace_hook_timeout"


async def test_before_run_refuses_a_workspace_that_vanished(root: Path) -> None:
    manager = manager_for(root)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    workspace.path.rmdir()
    with pytest.raises(WorkspaceError) as info:
        await manager.before_run(workspace, attempt=None)
    assert info.value.code == "workspace_missing"


async def test_before_run_refuses_a_workspace_swapped_for_an_escaping_symlink(
    root: Path, tmp_path: Path
) -> None:
    manager = manager_for(root, hooks={"before_run": "touch ran"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    workspace.path.rmdir()
    (tmp_path / "elsewhere").mkdir()
    workspace.path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(WorkspaceError) as info:
        await manager.before_run(workspace, attempt=None)
    assert info.value.code == "workspace_symlink_escape"
    assert not (tmp_path / "elsewhere" / "ran").exists()


async def test_after_run_failure_and_timeout_are_ignored(root: Path) -> None:
    failing = manager_for(root, hooks={"after_run": "echo ran >> ../after.log; exit 9"})
    workspace = await failing.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    await failing.after_run(workspace, attempt=None)  # no exception
    slow = manager_for(root, hooks={"after_run": "sleep 30", "timeout_ms": 300})
    await slow.after_run(workspace, attempt=None)
    assert (root / "after.log").read_text() == "ran\n"


async def test_after_run_survives_cancellation_of_the_run(root: Path) -> None:
    manager = manager_for(root, hooks={"after_run": "echo $LORENZ_ATTEMPT > ../after.log"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    started = asyncio.Event()

    async def run() -> None:
        try:
            await manager.before_run(workspace, attempt=4)
            started.set()
            await asyncio.sleep(3600)  # the "agent"
        finally:
            await manager.after_run(workspace, attempt=4)

    task = asyncio.create_task(run())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (root / "after.log").read_text() == "4\n"


async def test_after_run_completes_even_when_cancelled_again_while_running(root: Path) -> None:
    script = "touch ../hook-started; sleep 0.3; echo finished > ../after.log"
    manager = manager_for(root, hooks={"after_run": script})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    task = asyncio.create_task(manager.after_run(workspace, attempt=None))
    await wait_until_async(
        lambda: (root / "hook-started").exists(),
        timeout=5.0,
        what='(root / "hook-started").exists()',
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task  # the cancellation is delivered, but only after the hook finished
    assert (root / "after.log").read_text() == "finished\n"


async def test_after_run_is_skipped_when_the_workspace_is_gone(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = manager_for(root, hooks={"after_run": "touch ../ran"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    workspace.path.rmdir()
    with caplog.at_level(logging.INFO, logger="lorenz"):
        await manager.after_run(workspace, attempt=None)
    assert not (root / "ran").exists()
    # Skipped on purpose, not attempted and failed (a missing working directory fails a spawn).
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("after_run skipped, workspace is gone") for m in messages), messages
    assert not [m for m in messages if "after_run hook failed" in m or ("hook" in m and
                "failed" in m)]


# -- removal ----------------------------------------------------------------------------------


async def test_remove_issue_runs_before_remove_then_deletes(root: Path) -> None:
    manager = manager_for(root, hooks={
        "before_remove": "cat note.txt > ../removed.log; echo $LORENZ_ISSUE_ID >> ../removed.log"
    })
    workspace = await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0,
                                      attempt=None)
    (workspace.path / "note.txt").write_text("bye\n")
    assert await manager.remove_issue("ABC-1") == [workspace.path]
    assert not workspace.path.exists()
    assert (root / "removed.log").read_text() == "bye\nu-1\n"


async def test_before_remove_failure_and_timeout_do_not_stop_deletion(root: Path) -> None:
    for hooks in ({"before_remove": "exit 3"}, {"before_remove": "sleep 30", "timeout_ms": 300}):
        manager = manager_for(root, hooks=hooks)
        workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
        assert await manager.remove_issue("ABC-1") == [workspace.path]
        assert not workspace.path.exists()


async def test_a_before_remove_hook_that_swaps_in_a_symlink_is_caught(
    root: Path, tmp_path: Path
) -> None:
    """The containment check runs again after the hook (arbitrary code) and before deleting."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    manager = manager_for(root, hooks={
        "before_remove": f"cd .. && rm -rf ABC-1 && ln -s {outside} ABC-1"
    })
    await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    with pytest.raises(WorkspaceError) as caught:
        await manager.remove_issue("ABC-1")
    assert caught.value.code == "workspace_symlink_escape"
    assert (outside / "keep.txt").read_text() == "mine\n"


async def test_removing_a_missing_workspace_is_not_an_error(root: Path) -> None:
    manager = manager_for(root, hooks={"before_remove": "touch ../ran"})
    assert await manager.remove_issue("NEVER-1") == []
    assert await manager.remove_path(root / "NEVER-1") is False
    assert not (root / "ran").exists()
    assert await manager.remove_issue("") == []


async def test_remove_issue_removes_every_slot(root: Path) -> None:
    log = root.parent / "slots.log"
    manager = manager_for(root, ensemble_size=3, hooks={
        "before_remove": f"echo $LORENZ_SLOT >> {log}"
    })
    issue = make_issue("ABC-1")
    made = [await manager.prepare(issue, slot_index=n, attempt=None) for n in range(3)]
    removed = await manager.remove_issue("ABC-1")
    assert removed == [w.path for w in made] + [root / "ABC-1"]
    assert not (root / "ABC-1").exists()
    assert sorted(log.read_text().split()) == ["0", "1", "2"]


async def test_remove_path_refuses_the_root_and_paths_outside(
    existing_root: Path, tmp_path: Path
) -> None:
    root = existing_root
    manager = manager_for(root)
    victim = tmp_path / "victim"
    victim.mkdir()
    (root / "link").symlink_to(victim)
    cases = {
        root: "workspace_equals_root",
        root / ".." / "victim": "workspace_outside_root",
        victim: "workspace_outside_root",
        root / "link" / "x": "workspace_symlink_escape",
    }
    for path, code in cases.items():
        with pytest.raises(WorkspaceError) as info:
            await manager.remove_path(path)
        assert info.value.code == code, path
    assert lexists(victim / ".." / "victim")
    assert lexists(root)


async def test_remove_path_unlinks_a_symlink_not_its_target(existing_root: Path) -> None:
    root = existing_root
    manager = manager_for(root)
    (root / "real").mkdir()
    (root / "real" / "keep.txt").write_text("x")
    (root / "alias").symlink_to(root / "real")
    assert await manager.remove_path(root / "alias") is True
    assert not lexists(root / "alias")
    assert (root / "real" / "keep.txt").exists()


async def test_workspaces_under_an_earlier_root_stay_removable(tmp_path: Path) -> None:
    manager = manager_for(tmp_path / "old")
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    manager.update_settings(make_settings(tmp_path / "new"))
    assert manager.path_for(make_issue("ABC-1"), slot_index=0) == tmp_path / "new" / "ABC-1"
    assert manager.check_path(workspace.path) == workspace.path
    assert await manager.remove_path(workspace.path) is True
    assert not workspace.path.exists()
    fresh = manager_for(tmp_path / "new")
    with pytest.raises(WorkspaceError) as info:
        fresh.check_path(tmp_path / "old" / "ABC-2")
    assert info.value.code == "workspace_outside_root"


@pytest.fixture
def undeletable(root: Path) -> Iterator[Path]:
    """A directory whose contents cannot be deleted (immutable as root, read-only otherwise)."""
    locked = root / "ABC-1" / "locked"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(locked)], check=True)
        yield locked
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    else:
        locked.chmod(0o500)
        yield locked
        locked.chmod(0o700)
    shutil.rmtree(root, ignore_errors=True)


async def test_failed_deletion_is_a_coded_error(root: Path, undeletable: Path) -> None:
    manager = manager_for(root)
    with pytest.raises(WorkspaceError) as info:
        await manager.remove_path(root / "ABC-1")
    assert info.value.code == "workspace_remove_failed"
    with pytest.raises(WorkspaceError) as cleanup:
        await manager.remove_issue("ABC-1")
    assert cleanup.value.code == "workspace_remove_failed"


# -- listing ---------------------------------------------------------------------------------


async def test_list_workspaces_maps_directories_back_to_issues(root: Path) -> None:
    manager = manager_for(root)
    await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0, attempt=None)
    await manager.prepare(make_issue("A/B", issue_id="u-2"), slot_index=0, attempt=None)
    (root / "HANDMADE-9").mkdir()
    (root / "stray-file").write_text("")
    listed = {info.key: info for info in manager.list_workspaces()}
    assert set(listed) == {"ABC-1", workspace_key("A/B"), "HANDMADE-9"}
    assert (listed["ABC-1"].issue_id, listed["ABC-1"].identifier) == ("u-1", "ABC-1")
    hashed = listed[workspace_key("A/B")]
    assert (hashed.issue_id, hashed.identifier, hashed.path) == ("u-2", "A/B",
                                                                  root / workspace_key("A/B"))
    assert (listed["HANDMADE-9"].issue_id, listed["HANDMADE-9"].identifier) == (None,
                                                                                "HANDMADE-9")


async def test_marker_is_outside_the_workspace(root: Path) -> None:
    manager = manager_for(root)
    workspace = await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0,
                                      attempt=None)
    assert list(workspace.path.iterdir()) == []
    marker = json.loads((root / ".lorenz" / "workspaces" / "ABC-1.json").read_text())
    assert marker["issue_id"] == "u-1"
    assert marker["identifier"] == "ABC-1"
    # to_json is spelled out (for speed): every field of the record, and the version
    assert set(marker) == {"version", *(f.name for f in dataclasses.fields(WorkspaceMarker))}
    await manager.remove_issue("ABC-1")
    assert not (root / ".lorenz" / "workspaces" / "ABC-1.json").exists()
    assert manager.list_workspaces() == []


async def test_a_marker_that_already_says_it_all_is_not_written_again(root: Path) -> None:
    # Every continuation and retry prepares its workspace again: the marker stays as it was
    # (same file, same content); a changed identity is written over it (a new file).
    manager = manager_for(root)
    marker_file = root / ".lorenz" / "workspaces" / "ABC-1.json"
    await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0, attempt=None)
    first = marker_file.stat()
    await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0, attempt=1)
    again = marker_file.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    created = json.loads(marker_file.read_text())["created_at"]
    await manager.prepare(make_issue("ABC-1", issue_id="u-9"), slot_index=0, attempt=None)
    moved = json.loads(marker_file.read_text())
    assert (moved["issue_id"], moved["created_at"]) == ("u-9", created)
    assert marker_file.stat().st_ino != first.st_ino


async def test_a_marker_left_half_written_is_replaced(root: Path) -> None:
    # A crash in the middle of a new marker's write leaves a file that is not JSON: it reads as
    # no marker, and the next prepare writes a whole one over it.
    manager = manager_for(root)
    marker_file = root / ".lorenz" / "workspaces" / "ABC-1.json"
    marker_file.parent.mkdir(parents=True)
    marker_file.write_text('{"version": 1, "key": "AB')
    await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0, attempt=None)
    marker = json.loads(marker_file.read_text())
    assert (marker["key"], marker["issue_id"], marker["layout"]) == ("ABC-1", "u-1", "flat")
    assert [p.name for p in marker_file.parent.iterdir()] == ["ABC-1.json"]  # no temporaries


def test_list_workspaces_of_a_missing_root_is_empty(root: Path) -> None:
    assert manager_for(root).list_workspaces() == []


async def test_markers_come_back_when_their_directory_was_removed(root: Path) -> None:
    # NB: the markers' directory is made only when a write finds it missing.
    manager = manager_for(root)
    await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0, attempt=None)
    shutil.rmtree(root / ".lorenz")
    await manager.prepare(make_issue("ABC-2", issue_id="u-2"), slot_index=0, attempt=None)
    marker = json.loads((root / ".lorenz" / "workspaces" / "ABC-2.json").read_text())
    assert marker["issue_id"] == "u-2"
    listed = {info.key: info.issue_id for info in manager.list_workspaces()}
    assert listed == {"ABC-1": None, "ABC-2": "u-2"}  # the lost marker reads as none
    assert await manager.remove_issue("ABC-1") == [root / "ABC-1"]
    assert await manager.remove_issue("ABC-2") == [root / "ABC-2"]
    assert manager.list_workspaces() == []
    assert list((root / ".lorenz" / "workspaces").iterdir()) == []


async def test_a_flat_workspace_swapped_for_an_escaping_symlink_is_unlinked_not_followed(
    root: Path, tmp_path: Path
) -> None:
    # The one containment check of a flat removal sees the swap: the link goes, its target
    # outside the root stays.
    manager = manager_for(root)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    workspace.path.rmdir()
    workspace.path.symlink_to(outside)
    with pytest.raises(WorkspaceError) as caught:
        await manager.remove_issue("ABC-1")
    assert caught.value.code == "workspace_symlink_escape"
    assert (outside / "keep.txt").read_text() == "keep"
