"""Worktree mode against real git repositories: creation, reuse, ownership proof, preservation
of dirty and foreign worktrees, removal after a match."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lorenz.workspaces import (
    PRESERVING_CODES,
    WorkspaceCleanupError,
    WorkspaceError,
    WorkspaceHookError,
    WorkspaceManager,
)
from lorenz.workspaces.worktrees import parse_worktree_list
from tests.workspaces.conftest import git, lexists, make_issue, make_settings


def worktree_manager(root: Path, repo: Path, **kwargs: object) -> WorkspaceManager:
    workspace = {"kind": "worktree", "repo": str(repo), **kwargs.pop("workspace", {})}  # type: ignore[dict-item]
    return WorkspaceManager(settings=make_settings(root, workspace=workspace, **kwargs))  # type: ignore[arg-type]


def branches(repo: Path) -> set[str]:
    return set(git("branch", "--format=%(refname:short)", cwd=repo).split())


def manifest_of(root: Path, relative: str) -> dict[str, object]:
    manifest: dict[str, object] = json.loads(
        (root / ".lorenz" / "worktrees" / f"{relative}.json").read_text()
    )
    return manifest


async def test_new_worktree_on_its_own_branch_with_a_manifest(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1", issue_id="u-1"), slot_index=0,
                                      attempt=None)
    assert workspace.created_now is True
    assert workspace.branch == "lorenz/ABC-1"
    assert (workspace.path / "README.md").read_text() == "hello\n"
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace.path).strip() == "lorenz/ABC-1"
    head = git("rev-parse", "HEAD", cwd=repo).strip()
    manifest = manifest_of(root, "ABC-1")
    assert manifest["path"] == str(workspace.path)
    assert manifest["branch"] == "lorenz/ABC-1"
    assert manifest["base_commit"] == head
    assert manifest["base_ref"] == "HEAD"
    assert manifest["issue_id"] == "u-1"
    assert manifest["identifier"] == "ABC-1"
    assert manifest["created_branch"] is True
    assert manifest["git_common_dir"] == str(repo / ".git")
    assert git("status", "--porcelain", cwd=workspace.path) == ""  # nothing of ours inside


async def test_worktree_starts_at_base_ref(root: Path, repo: Path) -> None:
    first = git("rev-parse", "HEAD", cwd=repo).strip()
    git("tag", "v1", cwd=repo)
    (repo / "later.txt").write_text("later")
    git("add", "later.txt", cwd=repo)
    git("commit", "-q", "-m", "later", cwd=repo)
    manager = worktree_manager(root, repo, workspace={"base_ref": "v1"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert git("rev-parse", "HEAD", cwd=workspace.path).strip() == first
    assert not (workspace.path / "later.txt").exists()


async def test_owned_worktree_is_reused_even_with_changes(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo, hooks={"after_create": "echo x >> ../created.log"})
    issue = make_issue("ABC-1")
    first = await manager.prepare(issue, slot_index=0, attempt=None)
    (first.path / "wip.txt").write_text("agent work in progress")
    second = await manager.prepare(issue, slot_index=0, attempt=1)
    assert second.created_now is False
    assert second.branch == "lorenz/ABC-1"
    assert (second.path / "wip.txt").read_text() == "agent work in progress"
    assert (root / "created.log").read_text() == "x\n"


async def test_existing_branch_is_reused(root: Path, repo: Path) -> None:
    git("branch", "lorenz/ABC-1", cwd=repo)
    git("checkout", "-q", "lorenz/ABC-1", cwd=repo)
    (repo / "branch-only.txt").write_text("on the branch")
    git("add", "branch-only.txt", cwd=repo)
    git("commit", "-q", "-m", "branch work", cwd=repo)
    tip = git("rev-parse", "HEAD", cwd=repo).strip()
    git("checkout", "-q", "main", cwd=repo)
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert (workspace.path / "branch-only.txt").read_text() == "on the branch"
    manifest = manifest_of(root, "ABC-1")
    assert manifest["created_branch"] is False
    assert manifest["base_commit"] == tip


async def test_foreign_path_without_manifest_is_preserved(root: Path, repo: Path) -> None:
    (root / "ABC-1").mkdir(parents=True)
    (root / "ABC-1" / "human.txt").write_text("someone's notes")
    manager = worktree_manager(root, repo)
    with pytest.raises(WorkspaceError) as prepared:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert prepared.value.code == "worktree_foreign"
    assert "no Lorenz manifest" in prepared.value.message
    with pytest.raises(WorkspaceCleanupError) as removed:
        await manager.remove_issue("ABC-1")
    assert removed.value.code == "worktree_foreign"
    assert removed.value.removed == []
    assert (root / "ABC-1" / "human.txt").read_text() == "someone's notes"


async def test_hand_made_worktree_at_the_path_is_preserved(root: Path, repo: Path) -> None:
    git("worktree", "add", "-q", "-b", "mine", str(root / "ABC-1"), cwd=repo)
    manager = worktree_manager(root, repo)
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "worktree_foreign"
    with pytest.raises(WorkspaceCleanupError):
        await manager.remove_issue("ABC-1")
    assert (root / "ABC-1" / "README.md").exists()


async def test_worktree_on_another_branch_is_foreign(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    git("checkout", "-q", "-b", "switched", cwd=workspace.path)
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=1)
    assert info.value.code == "worktree_foreign"
    assert "switched" in info.value.message
    with pytest.raises(WorkspaceCleanupError) as cleanup:
        await manager.remove_issue("ABC-1")
    assert cleanup.value.code == "worktree_foreign"
    assert workspace.path.is_dir()


async def test_manifest_of_another_issue_is_foreign(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    await manager.prepare(make_issue("ABC-1", issue_id="old"), slot_index=0, attempt=None)
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1", issue_id="new"), slot_index=0, attempt=None)
    assert info.value.code == "worktree_foreign"
    assert "issue old" in info.value.message


async def test_manifest_that_does_not_match_the_path_is_foreign(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    manifest_file = root / ".lorenz" / "worktrees" / "ABC-1.json"
    data = json.loads(manifest_file.read_text())
    data["path"] = str(root / "SOMEWHERE-ELSE")
    manifest_file.write_text(json.dumps(data))
    with pytest.raises(WorkspaceError) as info:
        await manager.remove_path(workspace.path)
    assert info.value.code == "worktree_foreign"
    manifest_file.write_text("{not json")
    with pytest.raises(WorkspaceError) as broken:
        await manager.remove_path(workspace.path)
    assert broken.value.code == "worktree_foreign"
    assert workspace.path.is_dir()


async def test_dirty_worktree_is_preserved_on_removal(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo, hooks={"before_remove": "touch ../hook-ran"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    (workspace.path / "README.md").write_text("uncommitted edit\n")
    with pytest.raises(WorkspaceCleanupError) as info:
        await manager.remove_issue("ABC-1")
    assert info.value.code == "worktree_dirty"
    assert info.value.code in PRESERVING_CODES
    assert "1 uncommitted change" in info.value.failures[0].message
    assert (workspace.path / "README.md").read_text() == "uncommitted edit\n"
    assert not (root / "hook-ran").exists()  # proof comes before the hook


async def test_untracked_files_make_a_worktree_dirty(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    (workspace.path / "new-file.txt").write_text("not yet added")
    with pytest.raises(WorkspaceError) as info:
        await manager.remove_path(workspace.path)
    assert info.value.code == "worktree_dirty"
    assert (workspace.path / "new-file.txt").exists()


async def test_before_remove_that_dirties_the_worktree_stops_removal(root: Path,
                                                                     repo: Path) -> None:
    manager = worktree_manager(root, repo, hooks={"before_remove": "echo late > late.txt"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    with pytest.raises(WorkspaceError) as info:
        await manager.remove_path(workspace.path)
    assert info.value.code == "worktree_dirty"
    assert (workspace.path / "late.txt").exists()


async def test_clean_owned_worktree_is_removed_and_its_branch_kept(root: Path,
                                                                  repo: Path) -> None:
    log = root.parent / "before-remove.log"
    manager = worktree_manager(root, repo, hooks={"before_remove": f"pwd > {log}"})
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    (workspace.path / "done.txt").write_text("finished")
    git("add", "done.txt", cwd=workspace.path)
    git("commit", "-q", "-m", "agent work", cwd=workspace.path)
    assert await manager.remove_issue("ABC-1") == [workspace.path]
    assert not lexists(workspace.path)
    assert log.read_text().strip() == str(workspace.path)
    assert "lorenz/ABC-1" in branches(repo)  # the work survives on its branch
    live = parse_worktree_list(git("worktree", "list", "--porcelain", "-z", cwd=repo))
    assert [w.path for w in live] == [str(repo)]
    assert not (root / ".lorenz" / "worktrees" / "ABC-1.json").exists()
    # A new run of the same issue picks the branch (and its commit) up again.
    again = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert (again.path / "done.txt").read_text() == "finished"


async def test_deleted_worktree_directory_is_pruned_and_recreated(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    shutil.rmtree(workspace.path)
    again = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=1)
    assert again.created_now is True
    assert (again.path / "README.md").exists()


async def test_removing_a_vanished_worktree_forgets_it(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    shutil.rmtree(workspace.path)
    assert await manager.remove_issue("ABC-1") == []
    live = parse_worktree_list(git("worktree", "list", "--porcelain", "-z", cwd=repo))
    assert [w.path for w in live] == [str(repo)]
    assert not (root / ".lorenz" / "worktrees" / "ABC-1.json").exists()


async def test_locked_worktree_is_preserved(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    git("worktree", "lock", str(workspace.path), cwd=repo)
    with pytest.raises(WorkspaceError) as info:
        await manager.remove_path(workspace.path)
    assert info.value.code == "worktree_foreign"
    assert "locked" in info.value.message
    assert workspace.path.is_dir()


async def test_empty_directory_at_the_path_is_reclaimed(root: Path, repo: Path) -> None:
    (root / "ABC-1").mkdir(parents=True)
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert workspace.created_now is True
    assert (workspace.path / "README.md").exists()


async def test_failed_after_create_rolls_the_worktree_and_new_branch_back(root: Path,
                                                                         repo: Path) -> None:
    manager = worktree_manager(root, repo, hooks={"after_create": "touch junk; exit 4"})
    with pytest.raises(WorkspaceHookError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.status == 4
    assert not lexists(root / "ABC-1")
    assert "lorenz/ABC-1" not in branches(repo)
    assert not (root / ".lorenz" / "worktrees" / "ABC-1.json").exists()
    live = parse_worktree_list(git("worktree", "list", "--porcelain", "-z", cwd=repo))
    assert len(live) == 1


async def test_ensemble_slots_get_their_own_worktrees_and_branches(root: Path,
                                                                  repo: Path) -> None:
    manager = worktree_manager(root, repo, ensemble_size=2)
    issue = make_issue("ABC-1")
    slots = [await manager.prepare(issue, slot_index=n, attempt=None) for n in range(2)]
    assert [w.branch for w in slots] == ["lorenz/ABC-1+slot-0", "lorenz/ABC-1+slot-1"]
    assert [w.path for w in slots] == [root / "ABC-1" / "slot-0", root / "ABC-1" / "slot-1"]
    assert manifest_of(root, "ABC-1/slot-1")["slot_index"] == 1
    removed = await manager.remove_issue("ABC-1")
    assert removed == [w.path for w in slots] + [root / "ABC-1"]
    assert not lexists(root / "ABC-1")


async def test_ensemble_removal_keeps_the_dirty_slot_and_removes_the_clean_one(
    root: Path, repo: Path
) -> None:
    manager = worktree_manager(root, repo, ensemble_size=2)
    issue = make_issue("ABC-1")
    clean, dirty = [await manager.prepare(issue, slot_index=n, attempt=None) for n in range(2)]
    (dirty.path / "wip.txt").write_text("x")
    with pytest.raises(WorkspaceCleanupError) as info:
        await manager.remove_issue("ABC-1")
    assert info.value.removed == [clean.path]
    assert [f.code for f in info.value.failures] == ["worktree_dirty"]
    assert not lexists(clean.path)
    assert (dirty.path / "wip.txt").exists()
    assert manager.list_workspaces()[0].identifier == "ABC-1"


async def test_worktrees_stay_protected_after_switching_to_directory_mode(root: Path,
                                                                         repo: Path) -> None:
    manager = worktree_manager(root, repo)
    workspace = await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    (workspace.path / "wip.txt").write_text("x")
    manager.update_settings(make_settings(root))  # kind: directory now
    with pytest.raises(WorkspaceCleanupError) as info:
        await manager.remove_issue("ABC-1")
    assert info.value.code == "worktree_dirty"
    assert (workspace.path / "wip.txt").exists()


async def test_repo_that_is_not_a_repository_is_a_coded_error(root: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    manager = worktree_manager(root, tmp_path / "plain")
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "worktree_repo_invalid"
    assert "workspace.repo" in info.value.message


async def test_unknown_base_ref_is_a_coded_error(root: Path, repo: Path) -> None:
    manager = worktree_manager(root, repo, workspace={"base_ref": "no-such-ref"})
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "worktree_base_ref_invalid"
    assert not (root / ".lorenz" / "worktrees" / "ABC-1.json").exists()


async def test_branch_checked_out_elsewhere_is_a_coded_git_error(root: Path, repo: Path) -> None:
    git("checkout", "-q", "-b", "lorenz/ABC-1", cwd=repo)
    manager = worktree_manager(root, repo)
    with pytest.raises(WorkspaceError) as info:
        await manager.prepare(make_issue("ABC-1"), slot_index=0, attempt=None)
    assert info.value.code == "worktree_git_failed"
    assert not (root / ".lorenz" / "worktrees" / "ABC-1.json").exists()


def test_worktree_list_parsing() -> None:
    output = (
        "worktree /r\0HEAD abc\0branch refs/heads/main\0\0"
        "worktree /w\0HEAD def\0detached\0locked reason\0\0"
        "worktree /gone\0HEAD 123\0branch refs/heads/x\0prunable gitdir file points nowhere\0\0"
    )
    parsed = parse_worktree_list(output)
    assert [(w.path, w.branch, w.locked, w.prunable) for w in parsed] == [
        ("/r", "main", False, False),
        ("/w", None, True, False),
        ("/gone", "x", False, True),
    ]
