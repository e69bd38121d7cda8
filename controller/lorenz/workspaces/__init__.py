"""Per-issue workspaces: isolated directories (or git worktrees) under ``workspace.root``.

The runtime prepares a workspace for every run, runs the lifecycle hooks around it, and removes
it when its issue is done. Everything here keeps one promise: nothing outside the root is ever
created, entered or deleted, and nothing Lorenz cannot prove it made is ever deleted.
"""

from lorenz.workspaces.errors import (
    HOOK_FAILED_PREFIX,
    PRESERVING_CODES,
    WorkspaceCleanupError,
    WorkspaceError,
    WorkspaceHookError,
)
from lorenz.workspaces.hooks import OUTPUT_LIMIT_BYTES, HookName, HookResult, run_hook
from lorenz.workspaces.keys import branch_name, workspace_key
from lorenz.workspaces.manager import Workspace, WorkspaceInfo, WorkspaceManager
from lorenz.workspaces.safety import canonical_root, check_inside_root

__all__ = [
    "HOOK_FAILED_PREFIX",
    "OUTPUT_LIMIT_BYTES",
    "PRESERVING_CODES",
    "HookName",
    "HookResult",
    "Workspace",
    "WorkspaceCleanupError",
    "WorkspaceError",
    "WorkspaceHookError",
    "WorkspaceInfo",
    "WorkspaceManager",
    "branch_name",
    "canonical_root",
    "check_inside_root",
    "run_hook",
    "workspace_key",
]
