"""The coded errors of workspace preparation, hooks and removal.

Workspace faults are user-caused far more often than not (a root pointing at a file, a hook
that exits 1, a hand-edited worktree), so each one carries a stable ``code`` the runtime can put
into events and a one-line message that says what to change. Two contracts matter outside this
package:

* the codes are what the runtime decides on (a ``workspace_hook_failed`` run poisons its worker
  host, see :mod:`lorenz.policies.outcomes`); messages are for people and may improve;
* preserved worktrees (dirty or foreign) are reported as errors rather than silently skipped, so
  a clean-up that leaves something behind is always visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError

HOOK_FAILED_PREFIX = "workspace hook failed with status "
"""How the message of a non-zero hook exit starts (for people; decisions read the code)."""

PRESERVING_CODES: frozenset[str] = frozenset({ErrorCode.WORKTREE_DIRTY, ErrorCode.WORKTREE_FOREIGN})
"""Codes meaning "this path was deliberately kept": nothing is wrong with Lorenz itself."""


class WorkspaceError(LorenzError):
    """A workspace could not be made, checked, entered or removed; ``code`` says why.

    Codes: ``workspace_equals_root``, ``workspace_symlink_escape``, ``workspace_outside_root``,
    ``workspace_path_unreadable``, ``workspace_identifier_blank``, ``workspace_create_failed``,
    ``workspace_missing``, ``workspace_remove_failed``, ``worktree_repo_invalid``,
    ``worktree_base_ref_invalid``, ``worktree_git_failed``, ``worktree_dirty``,
    ``worktree_foreign`` (and the hook codes of :class:`WorkspaceHookError`).
    """

    code = ErrorCode.WORKSPACE_ERROR

    def __init__(self, message: str, *, code: str | None = None, path: Path | None = None):
        super().__init__(message, code=code)
        self.path = path
        """The path the error is about, when there is one."""


class WorkspaceHookError(WorkspaceError):
    """A hook exited non-zero (``workspace_hook_failed``) or ran too long
    (``workspace_hook_timeout``)."""

    code = ErrorCode.WORKSPACE_HOOK_FAILED

    def __init__(
        self,
        message: str,
        *,
        code: str,
        hook: str,
        path: Path,
        status: int | None = None,
        output: str = "",
        timeout_ms: int | None = None,
    ):
        super().__init__(message, code=code, path=path)
        self.hook = hook
        """``after_create``, ``before_run``, ``after_run`` or ``before_remove``."""
        self.status = status
        """Exit status (``128 + signal`` when killed by a signal); ``None`` on timeout."""
        self.output = output
        """Merged stdout and stderr, cut to 2048 bytes with a truncation marker."""
        self.timeout_ms = timeout_ms
        """The limit that was exceeded (timeouts only)."""


class WorkspaceCleanupError(WorkspaceError):
    """Removing an issue's workspaces left some of them behind.

    ``code`` is the code of the first failure (``worktree_dirty`` and ``worktree_foreign`` mean
    the path was preserved on purpose). Everything that could be removed was removed first.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        removed: Sequence[Path],
        failures: Sequence[WorkspaceError],
    ):
        super().__init__(message, code=code)
        self.removed = list(removed)
        """Paths that were removed before (or after) the failures."""
        self.failures = list(failures)
        """One coded error per path left behind."""
