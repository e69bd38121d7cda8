"""Path containment: lexical escapes, symlinks, the root itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lorenz.workspaces import WorkspaceError, check_inside_root
from lorenz.workspaces.safety import canonical_root, resolve_segments


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    return tmp_path


def code_of(path: Path, root: Path) -> str:
    with pytest.raises(WorkspaceError) as info:
        check_inside_root(path, root=root)
    return info.value.code


def test_path_inside_root_is_accepted_even_if_missing(base: Path) -> None:
    root = base / "root"
    assert check_inside_root(root / "ABC-1", root=root) == root / "ABC-1"
    assert check_inside_root(root / "ABC-1" / "slot-2", root=root) == root / "ABC-1" / "slot-2"


def test_dot_dot_escape_is_outside_root(base: Path) -> None:
    root = base / "root"
    assert code_of(root / ".." / "outside", root) == "workspace_outside_root"
    assert code_of(root / "missing" / ".." / ".." / "outside", root) == "workspace_outside_root"


def test_absolute_path_elsewhere_is_outside_root(base: Path) -> None:
    assert code_of(Path("/etc/passwd"), base / "root") == "workspace_outside_root"


def test_root_itself_is_refused(base: Path) -> None:
    root = base / "root"
    assert code_of(root, root) == "workspace_equals_root"
    assert code_of(root / "x" / "..", root) == "workspace_equals_root"
    assert code_of(root / ".", root) == "workspace_equals_root"


def test_symlink_out_of_the_root_is_an_escape(base: Path) -> None:
    root = base / "root"
    (root / "link").symlink_to(base / "outside")
    assert code_of(root / "link", root) == "workspace_symlink_escape"
    assert code_of(root / "link" / "deeper", root) == "workspace_symlink_escape"


def test_dot_dot_after_a_symlink_follows_the_target(base: Path) -> None:
    root = base / "root"
    (base / "outside" / "sub").mkdir()
    (root / "link").symlink_to(base / "outside" / "sub")
    # Lexically root/link/.. is the root; physically it is <base>/outside.
    assert code_of(root / "link" / "..", root) == "workspace_symlink_escape"


def test_dangling_symlink_out_of_the_root_is_an_escape(base: Path) -> None:
    root = base / "root"
    (root / "dangling").symlink_to(base / "nowhere" / "at-all")
    assert code_of(root / "dangling", root) == "workspace_symlink_escape"


def test_symlink_that_stays_inside_is_accepted(base: Path) -> None:
    root = base / "root"
    (root / "real").mkdir()
    (root / "alias").symlink_to(root / "real")
    assert check_inside_root(root / "alias", root=root) == root / "real"


def test_symlinked_root_is_canonicalized_first(base: Path) -> None:
    (base / "root-link").symlink_to(base / "root")
    assert canonical_root(base / "root-link") == base / "root"
    # A workspace given through the real path is inside the symlinked root, and vice versa.
    assert check_inside_root(base / "root" / "A", root=base / "root-link") == base / "root" / "A"
    assert check_inside_root(base / "root-link" / "A", root=base / "root") == base / "root" / "A"
    assert code_of(base / "root", base / "root-link") == "workspace_equals_root"


def test_symlink_loop_is_unreadable(base: Path) -> None:
    root = base / "root"
    (root / "loop-a").symlink_to(root / "loop-b")
    (root / "loop-b").symlink_to(root / "loop-a")
    assert code_of(root / "loop-a" / "x", root) == "workspace_path_unreadable"


def test_relative_paths_resolve_against_cwd(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(base)
    assert check_inside_root(Path("root/ABC"), root=Path("root")) == base / "root" / "ABC"


def test_resolve_segments_keeps_missing_tail_as_written(base: Path) -> None:
    (base / "root" / "link").symlink_to(base / "outside")
    resolved = resolve_segments(base / "root" / "link" / "new" / "tail")
    assert resolved == base / "outside" / "new" / "tail"
    assert not os.path.lexists(resolved)
