"""Path containment: a workspace is strictly inside the workspace root, for real.

This is the one filesystem rule that is not negotiable: the agent's working directory, and
anything Lorenz deletes, must be under the root. A lexical check is not enough -- a symlink
inside the root can point anywhere -- so both the root and the workspace are canonicalized by
resolving symlinks one path segment at a time (the way the kernel walks a path), keeping a
non-existent tail exactly as written (it cannot be a symlink yet, and it is what ``mkdir -p``
will create). The check runs before a workspace is created, before an agent is launched in it,
and before anything is deleted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lorenz.codes import ErrorCode
from lorenz.workspaces.errors import WorkspaceError


def _absolute(path: Path) -> Path:
    # NB: not os.path.abspath(): it collapses ".." lexically, and "link/.." is the parent of
    # the link's *target*, not the directory holding the link.
    return path if path.is_absolute() else Path.cwd() / path


def resolve_segments(path: Path) -> Path:
    """``path`` with every existing symlink resolved, segment by segment; a missing tail is
    kept as written. Raises ``workspace_path_unreadable`` when a segment cannot be examined
    (permissions, a symlink loop)."""
    parts = _absolute(path).parts
    # NB: the walk joins strings, not Path objects: building a Path per segment was most of
    # the cost of every containment check (several per run), and the result is the same.
    current = parts[0]
    for part in parts[1:]:
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        try:
            mode = os.lstat(candidate).st_mode
        except (FileNotFoundError, NotADirectoryError):
            # Missing (or under a regular file): nothing there can redirect us; creating it
            # will fail later with its own error if a parent is not a directory.
            current = candidate
            continue
        except OSError as exc:
            raise _unreadable(path, Path(candidate), exc) from exc
        if not stat.S_ISLNK(mode):
            current = candidate
            continue
        try:
            current = os.path.realpath(candidate, strict=True)
        except FileNotFoundError:
            # A dangling link: follow it as far as it goes, the tail of its target is missing.
            current = os.path.realpath(candidate)
        except OSError as exc:
            raise _unreadable(path, Path(candidate), exc) from exc
    return Path(current)


def _unreadable(path: Path, segment: Path, exc: OSError) -> WorkspaceError:
    return WorkspaceError(
        f"cannot examine {segment} while checking workspace path {path} ({exc.strerror}); "
        "fix its permissions or remove the symlink loop",
        code=ErrorCode.WORKSPACE_PATH_UNREADABLE,
        path=path,
    )


def canonical_root(root: Path) -> Path:
    """The workspace root, absolute and with symlinks resolved."""
    return resolve_segments(root)


def check_inside_root(workspace: Path, *, root: Path, root_resolved: bool = False) -> Path:
    """Prove ``workspace`` lies strictly inside ``root``; return its canonical form.

    ``root_resolved``: ``root`` is already canonical (as :func:`canonical_root` returned it),
    so it is not walked again. That is as strict as walking it: a root segment swapped for a
    symlink since then sends the workspace's own walk elsewhere, out of the old root.

    Raises :class:`WorkspaceError` with ``workspace_equals_root``, ``workspace_symlink_escape``
    (lexically under the root, really elsewhere), ``workspace_outside_root`` or
    ``workspace_path_unreadable``.
    """
    root_canonical = root if root_resolved else canonical_root(root)
    canonical = resolve_segments(workspace)
    if canonical == root_canonical:
        raise WorkspaceError(
            f"workspace path {workspace} is the workspace root itself; "
            "a workspace must be a directory inside workspace.root",
            code=ErrorCode.WORKSPACE_EQUALS_ROOT,
            path=workspace,
        )
    if canonical.is_relative_to(root_canonical):
        return canonical
    lexical = Path(os.path.normpath(_absolute(workspace)))
    root_lexical = Path(os.path.normpath(_absolute(root)))
    if lexical.is_relative_to(root_lexical) or lexical.is_relative_to(root_canonical):
        raise WorkspaceError(
            f"workspace path {workspace} leads out of the workspace root {root_canonical} "
            f"through a symlink (really {canonical}); remove the symlink",
            code=ErrorCode.WORKSPACE_SYMLINK_ESCAPE,
            path=workspace,
        )
    raise WorkspaceError(
        f"workspace path {workspace} is outside the workspace root {root_canonical}; "
        "workspaces must stay under workspace.root",
        code=ErrorCode.WORKSPACE_OUTSIDE_ROOT,
        path=workspace,
    )
