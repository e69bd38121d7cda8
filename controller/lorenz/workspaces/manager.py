"""The workspace manager: one isolated directory per issue slot, its hooks, and its removal.

The runtime drives every run through the same four calls::

    workspace = await manager.prepare(issue, slot_index=slot, attempt=attempt)
    try:
        await manager.before_run(workspace, attempt=attempt)    # raises: the attempt fails
        ...                                                   # launch the agent in workspace.path
    finally:
        await manager.after_run(workspace, attempt=attempt)     # never raises an error

and removes workspaces only when an issue became terminal (``remove_issue``) or for the
disk-driven start-up sweep (``list_workspaces`` + ``remove_issue``). Successful runs never
delete anything.

Layout: ``<root>/<key>`` for a one-slot issue; with ``agent.ensemble_size > 1`` every slot gets
``<root>/<key>/slot-<n>`` (so slot 0 of a size-1 ensemble is ``<root>/<key>`` itself). Lorenz's
own records live in ``<root>/.lorenz/`` (markers: :mod:`lorenz.workspaces.markers`; worktree
manifests: :mod:`lorenz.workspaces.worktrees`). Every path is checked for containment
(:mod:`lorenz.workspaces.safety`) before it is created, entered by a hook or agent, or deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lorenz.codes import ErrorCode
from lorenz.config import WorkspaceKind
from lorenz.model import Issue
from lorenz.model.variables import run_variables
from lorenz.tasks import run_to_completion
from lorenz.workspaces.errors import WorkspaceCleanupError, WorkspaceError
from lorenz.workspaces.hooks import HookName, hook_environment, run_hook
from lorenz.workspaces.keys import (
    STATE_DIR_NAME,
    branch_name,
    identifier_from_key,
    parse_slot_dir_name,
    slot_dir_name,
    workspace_key,
)
from lorenz.workspaces.markers import (
    Layout,
    WorkspaceMarker,
    delete_marker,
    now_iso,
    read_marker,
    write_marker,
)
from lorenz.workspaces.safety import canonical_root, check_inside_root, resolve_segments
from lorenz.workspaces.worktrees import (
    GitRepository,
    WorktreeManifest,
    canonical_text,
    delete_manifest,
    manifest_path,
    manifests_for_key,
    new_manifest,
    ownership_problem,
    read_manifest,
    workspace_of_manifest,
    worktree_status,
    write_manifest,
)

if TYPE_CHECKING:
    # NB: annotations only: the worker imports this package (hooks) and must not load the
    # settings (lorenz.config).
    from lorenz.config import WorkflowSettings

logger = logging.getLogger(__name__)

DEFAULT_ROOT_NAME = "lorenz_workspaces"
"""``workspace.root`` when unset: ``<system temp>/lorenz_workspaces``."""


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A prepared workspace of one issue slot."""

    path: Path
    """Absolute, under the canonical root; the agent's cwd."""
    key: str
    """The sanitized directory name of the issue (``workspace_key(identifier)``)."""
    created_now: bool
    """Whether :meth:`WorkspaceManager.prepare` created it (and ran ``after_create``)."""
    issue: Issue
    slot_index: int
    branch: str | None = None
    """The worktree's branch (``workspace.kind: worktree`` only)."""


@dataclasses.dataclass(frozen=True)
class WorkspaceInfo:
    """A workspace key directory found on disk."""

    key: str
    path: Path
    issue_id: str | None
    """From the marker; ``None`` when the directory has none (made by hand or by an old run)."""
    identifier: str | None
    """From the marker, or the key itself when it is unhashed; ``None`` when unknown."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Identity:
    """What the hook environment says about the issue a path belongs to."""

    issue_id: str
    identifier: str
    title: str = ""
    state: str = ""


class WorkspaceManager:
    """Creates, checks, hooks and removes the per-issue workspaces under ``workspace.root``."""

    def __init__(
        self,
        *,
        settings: WorkflowSettings,
        secrets: Collection[str] = (),
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        """``secrets``: names of environment variables hooks must not see (the tracker
        adapter's, e.g. ``LINEAR_API_KEY``); variables whose value equals
        ``tracker.api_key`` are stripped as well. ``base_env``: the environment hooks inherit
        (default: this process's, read at each hook)."""
        self._settings = settings
        self._secrets = frozenset(secrets)
        self._base_env = base_env
        self._known_roots: list[Path] = []
        self._repo_locks: dict[str, asyncio.Lock] = {}
        self._root_cache: tuple[WorkflowSettings, Path] | None = None
        self._remember_root(self._root(settings))

    # -- settings and paths -----------------------------------------------------------------

    def update_settings(self, settings: WorkflowSettings) -> None:
        """Use new settings from now on. Workspaces under earlier roots stay removable."""
        self._settings = settings
        self._root_cache = None
        self._remember_root(self._root(settings))

    @property
    def root(self) -> Path:
        """The canonical workspace root of the current settings."""
        return self._root(self._settings)

    def path_for(self, issue: Issue, *, slot_index: int) -> Path:
        """Where the workspace of this issue slot is (whether or not it exists)."""
        settings = self._settings
        return self._slot_path(self._root(settings), workspace_key(issue.identifier),
                               slot_index=slot_index, settings=settings)

    def check_path(self, path: Path) -> Path:
        """Prove ``path`` is strictly inside a workspace root (the current one, or one used
        earlier in this process); return its canonical form. Call it before launching an agent.
        Raises :class:`WorkspaceError` (``workspace_outside_root`` and friends)."""
        _, canonical = self._locate(path)
        return canonical

    def _root(self, settings: WorkflowSettings) -> Path:
        # NB: the canonical root is walked once per settings object and only kept once it
        # exists as a directory (a missing tail could still appear as a symlink). Keeping it is
        # safe against a later symlink swap of a root segment: every workspace path is still
        # walked segment by segment and must land strictly inside this canonical root
        # (check_inside_root), so a swapped segment sends that walk out of the root and it is
        # refused; nothing is ever created through the new link. Walking it again on every
        # call was ~300 lstat walks per 100 runs on the controller's loop.
        cached = self._root_cache
        if cached is not None and cached[0] is settings:
            return cached[1]
        configured = settings.workspace.root
        if configured:
            root = canonical_root(Path(configured).expanduser())
        else:
            root = canonical_root(Path(tempfile.gettempdir()) / DEFAULT_ROOT_NAME)
        if os.path.isdir(root):
            self._root_cache = (settings, root)
        return root

    def _remember_root(self, root: Path) -> None:
        if root not in self._known_roots:
            self._known_roots.append(root)

    @staticmethod
    def _nested(settings: WorkflowSettings, slot_index: int) -> bool:
        return settings.agent.ensemble_size > 1 or slot_index > 0

    def _slot_path(
        self, root: Path, key: str, *, slot_index: int, settings: WorkflowSettings
    ) -> Path:
        if self._nested(settings, slot_index):
            return root / key / slot_dir_name(slot_index)
        return root / key

    def _locate(self, path: Path) -> tuple[Path, Path]:
        """(root, canonical path) for the first known root that contains ``path``."""
        current = self._root(self._settings)
        roots = [current, *(r for r in self._known_roots if r != current)]
        first_error: WorkspaceError | None = None
        for root in roots:
            try:
                return root, check_inside_root(path, root=root, root_resolved=True)
            except WorkspaceError as exc:
                if exc.code == ErrorCode.WORKSPACE_PATH_UNREADABLE:
                    raise
                first_error = first_error or exc
        assert first_error is not None
        raise first_error

    @staticmethod
    def _operational_path(path: Path, *, root: Path, canonical: Path) -> Path:
        """The path to act on: its parent canonicalized, its last segment as given.

        NB: deleting ``canonical`` would delete a symlink's *target*; the link itself is what
        sits at the workspace path and what must go.
        """
        if path.name in ("", ".", ".."):
            return canonical
        parent = resolve_segments(path.parent)
        if parent != root and not parent.is_relative_to(root):
            raise WorkspaceError(
                f"{path} reaches into the workspace root {root} through a symlink outside it; "
                "use the path under the root",
                code=ErrorCode.WORKSPACE_OUTSIDE_ROOT,
                path=path,
            )
        return parent / path.name

    # -- environment ------------------------------------------------------------------------

    def _environment(
        self,
        *,
        hook: HookName,
        workspace: Path,
        identity: _Identity,
        attempt: int | None,
        slot_index: int,
    ) -> dict[str, str]:
        return hook_environment(
            base=self._base_env if self._base_env is not None else os.environ,
            strip_names=self._secrets,
            strip_values=self._secret_values(),
            variables={
                **run_variables(
                    issue_id=identity.issue_id,
                    identifier=identity.identifier,
                    title=identity.title,
                    state=identity.state,
                    attempt=attempt,
                    slot_index=slot_index,
                    workspace=workspace,
                ),
                "LORENZ_HOOK": hook,
            },
        )

    def _secret_values(self) -> frozenset[str]:
        """The tracker's secrets by value: the API key and the webhook signing secret (either
        may be a literal in the workflow, so no variable name gives it away)."""
        tracker = self._settings.tracker
        return frozenset(value for value in (tracker.api_key, tracker.webhook_secret) if value)

    def _plain_env(self) -> dict[str, str]:
        """The environment for git commands: the parent's, minus tracker secrets."""
        return hook_environment(
            base=self._base_env if self._base_env is not None else os.environ,
            strip_names=self._secrets,
            strip_values=self._secret_values(),
            variables={},
        )

    async def _hook(
        self,
        hook: HookName,
        *,
        workspace: Path,
        identity: _Identity,
        attempt: int | None,
        slot_index: int,
    ) -> bool:
        """Run the configured script of ``hook``; ``False`` when none is configured."""
        hooks = self._settings.hooks
        script: str | None = getattr(hooks, hook)
        if not script:
            return False
        await run_hook(
            name=hook,
            script=script,
            cwd=workspace,
            env=self._environment(
                hook=hook, workspace=workspace, identity=identity,
                attempt=attempt, slot_index=slot_index,
            ),
            timeout_ms=hooks.timeout_ms,
            log_context={"issue_id": identity.issue_id,
                         "issue_identifier": identity.identifier},
        )
        return True

    @staticmethod
    def _identity_of(issue: Issue) -> _Identity:
        return _Identity(issue_id=issue.id, identifier=issue.identifier,
                         title=issue.title, state=issue.state)

    # -- prepare ------------------------------------------------------------------------------

    async def prepare(self, issue: Issue, *, slot_index: int, attempt: int | None) -> Workspace:
        """Create or reuse the workspace of an issue slot; run ``after_create`` if it is new.

        An existing directory is reused as it is (never wiped); a non-directory in its place is
        replaced (directory mode). If ``after_create`` fails, times out or is cancelled, the new
        workspace is deleted again, so the next attempt starts over and runs the hook again.
        """
        settings = self._settings
        root = self._root(settings)
        self._remember_root(root)
        key = workspace_key(issue.identifier)
        nested = self._nested(settings, slot_index)
        path = self._slot_path(root, key, slot_index=slot_index, settings=settings)
        check_inside_root(path, root=root, root_resolved=True)
        self._ensure_root(root)

        branch: str | None = None
        if settings.workspace.kind is WorkspaceKind.WORKTREE:
            if nested:
                self._ensure_directory(root / key)
            created_now, branch = await self._prepare_worktree(
                settings, root=root, path=path, key=key, issue=issue,
                slot_index=slot_index, nested=nested,
            )
        else:
            created_now = self._ensure_directory_chain(root, path)

        previous = read_marker(root, key)
        layout: Layout = "slots" if nested else "flat"
        if previous is None or (previous.issue_id, previous.identifier, previous.layout) != (
            issue.id, issue.identifier, layout
        ):
            # NB: a marker that already says all this is left as it is (every continuation
            # and retry of an issue prepares its workspace again).
            write_marker(root, WorkspaceMarker(
                key=key, issue_id=issue.id, identifier=issue.identifier, layout=layout,
                created_at=previous.created_at if previous else now_iso(),
            ), new=previous is None)
        workspace = Workspace(path=path, key=key, created_now=created_now, issue=issue,
                              slot_index=slot_index, branch=branch)
        logger.info(
            "workspace ready issue_id=%s issue_identifier=%s workspace=%s created_now=%s",
            issue.id, issue.identifier, path, created_now,
        )
        if created_now:
            try:
                await self._hook("after_create", workspace=path,
                                 identity=self._identity_of(issue),
                                 attempt=attempt, slot_index=slot_index)
            except BaseException:
                await run_to_completion(self._discard_new_quietly(workspace, root=root))
                raise
        return workspace

    @staticmethod
    def _create_failed(path: Path, exc: OSError) -> WorkspaceError:
        return WorkspaceError(
            f"cannot create workspace directory {path} ({exc.strerror or exc}); "
            "check that workspace.root is a writable directory",
            code=ErrorCode.WORKSPACE_CREATE_FAILED,
            path=path,
        )

    def _ensure_root(self, root: Path) -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._create_failed(root, exc) from exc

    def _ensure_directory_chain(self, root: Path, path: Path) -> bool:
        created = False
        current = root
        for part in path.relative_to(root).parts:
            current = current / part
            created = self._ensure_directory(current)
        return created

    def _ensure_directory(self, path: Path) -> bool:
        """Make ``path`` a real directory; ``True`` if it had to be created.

        A file, symlink or other non-directory there is unlinked first. NB: ``unlink`` removes a
        symlink itself and never its target, so nothing outside the root can be touched.
        """
        try:
            mode: int | None = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise self._create_failed(path, exc) from exc
        if mode is not None and stat.S_ISDIR(mode):
            return False
        try:
            if mode is not None:
                logger.warning("replacing a non-directory at workspace path workspace=%s", path)
                os.unlink(path)
            os.mkdir(path)
        except FileExistsError:
            # Another slot of the same issue made it at the same moment.
            if os.path.isdir(path) and not os.path.islink(path):
                return False
            raise self._create_failed(path, FileExistsError(f"{path} exists")) from None
        except OSError as exc:
            raise self._create_failed(path, exc) from exc
        return True

    def _repo_lock(self, common_dir: Path | str) -> asyncio.Lock:
        return self._repo_locks.setdefault(str(common_dir), asyncio.Lock())

    async def _prepare_worktree(
        self,
        settings: WorkflowSettings,
        *,
        root: Path,
        path: Path,
        key: str,
        issue: Issue,
        slot_index: int,
        nested: bool,
    ) -> tuple[bool, str]:
        assert settings.workspace.repo is not None  # the settings model requires it
        repo_path = _absolute_repo(settings.workspace.repo)
        env = self._plain_env()
        repo = GitRepository(repo_path, env=env)
        common = await repo.common_dir()
        manifest_file = manifest_path(root, path)
        async with self._repo_lock(common):
            manifest = read_manifest(manifest_file)
            if _exists(path):
                if _is_empty_real_dir(path) and not await _is_registered(repo, path):
                    _remove_empty_dir(path)  # an empty directory holds nothing worth keeping
                else:
                    problem = await ownership_problem(
                        path=path, manifest=manifest, env=env,
                        expect_issue_id=issue.id, expect_common_dir=common,
                    )
                    if problem is not None or manifest is None:
                        raise _foreign(path, problem or "it has no Lorenz manifest")
                    return False, manifest.branch

            branch = branch_name(key, slot_index=slot_index if nested else None)
            await repo.check_branch_name(branch)
            await repo.prune()
            existing = await repo.branch_commit(branch)
            if existing is not None:
                base_ref, base_commit = branch, existing
            else:
                base_ref = settings.workspace.base_ref
                base_commit = await repo.resolve_commit(base_ref)
            manifest = new_manifest(
                path=path, repo=repo_path, git_common_dir=common, branch=branch,
                base_ref=base_ref, base_commit=base_commit, created_branch=existing is None,
                issue_id=issue.id, identifier=issue.identifier, slot_index=slot_index,
            )
            # NB: the manifest is written *before* the worktree exists: a crash in between
            # leaves a manifest with no worktree (harmless, overwritten next time) rather than
            # a worktree nobody can prove is ours (preserved forever).
            write_manifest(manifest_file, manifest)
            try:
                await repo.add(path, branch=branch, commit=base_commit,
                               new_branch=existing is None)
            except BaseException:
                delete_manifest(manifest_file)
                raise
        logger.info("worktree created workspace=%s branch=%s base=%s", path, branch, base_commit)
        return True, branch

    async def _discard_new_quietly(self, workspace: Workspace, *, root: Path) -> None:
        # NB: never let the clean-up mask the hook error the caller must see.
        try:
            await self._discard_new(workspace, root=root)
        except Exception:
            logger.exception("could not remove new workspace workspace=%s", workspace.path)

    async def _discard_new(self, workspace: Workspace, *, root: Path) -> None:
        """Undo a creation whose ``after_create`` did not succeed."""
        path = workspace.path
        logger.warning("removing new workspace after failed after_create workspace=%s", path)
        manifest_file = manifest_path(root, path)
        manifest = read_manifest(manifest_file)
        if manifest is not None:
            repo = GitRepository(Path(manifest.repo), env=self._plain_env())
            async with self._repo_lock(manifest.git_common_dir):
                try:
                    await repo.remove(path, force=True)
                except WorkspaceError as exc:
                    logger.warning("git worktree remove failed, deleting workspace=%s: %s",
                                   path, exc)
                    await asyncio.to_thread(shutil.rmtree, path, True)
                    with contextlib.suppress(WorkspaceError):
                        await repo.prune()
                if manifest.created_branch:
                    await repo.delete_branch_if_at(manifest.branch, manifest.base_commit)
            delete_manifest(manifest_file)
        else:
            await asyncio.to_thread(shutil.rmtree, path, True)
        if not _exists(root / workspace.key):
            delete_marker(root, workspace.key)

    # -- around each attempt -------------------------------------------------------------------

    async def before_run(self, workspace: Workspace, *, attempt: int | None) -> None:
        """Check the workspace (containment, existence) and run ``before_run``.

        Raises :class:`WorkspaceError`: the attempt must not start.
        """
        self.check_path(workspace.path)
        if not _is_real_dir(workspace.path):
            raise WorkspaceError(
                f"workspace {workspace.path} disappeared before the run; "
                "it will be recreated on the next attempt",
                code=ErrorCode.WORKSPACE_MISSING,
                path=workspace.path,
            )
        await self._hook("before_run", workspace=workspace.path,
                         identity=self._identity_of(workspace.issue),
                         attempt=attempt, slot_index=workspace.slot_index)

    async def after_run(self, workspace: Workspace, *, attempt: int | None) -> None:
        """Run ``after_run``; failures and timeouts are logged and ignored.

        Safe to call from a ``finally`` of a cancelled task: the hook runs to completion (or its
        timeout) in a task of its own, and the cancellation is re-raised afterwards.
        """
        if not self._settings.hooks.after_run:
            return
        await run_to_completion(self._after_run_quietly(workspace, attempt=attempt))

    async def _after_run_quietly(self, workspace: Workspace, *, attempt: int | None) -> None:
        try:
            self.check_path(workspace.path)
            if not _is_real_dir(workspace.path):
                logger.info("after_run skipped, workspace is gone workspace=%s", workspace.path)
                return
            await self._hook("after_run", workspace=workspace.path,
                             identity=self._identity_of(workspace.issue),
                             attempt=attempt, slot_index=workspace.slot_index)
        except WorkspaceError as exc:
            logger.warning("after_run hook failed, ignored workspace=%s: %s", workspace.path, exc)
        except Exception:
            logger.exception("after_run hook crashed, ignored workspace=%s", workspace.path)

    # -- removal ------------------------------------------------------------------------------

    async def remove_issue(self, identifier: str, *, issue: Issue | None = None) -> list[Path]:
        """Remove every workspace of ``identifier`` (all slots); return the removed paths.

        Missing workspaces are not an error. Dirty or foreign worktrees are preserved; when
        anything is left behind, :class:`WorkspaceCleanupError` is raised after everything
        removable was removed. ``issue`` (optional) fills the hook environment's title/state.
        """
        if not isinstance(identifier, str) or not identifier:
            return []
        settings = self._settings
        root = self._root(settings)
        key = workspace_key(identifier)
        container = root / key
        check_inside_root(container, root=root, root_resolved=True)
        marker = read_marker(root, key)
        identity = (
            self._identity_of(issue) if issue is not None
            else _Identity(issue_id=marker.issue_id if marker else "", identifier=identifier)
        )
        targets = self._removal_targets(root, key, marker=marker, settings=settings)
        removed: list[Path] = []
        failures: list[WorkspaceError] = []
        for path, slot_index in targets:
            try:
                # NB: the holder itself (a flat workspace) was checked just above, and nothing
                # ran since (no hook, no await): its check stands.
                if await self._remove_one(path, root=root, identity=identity,
                                          slot_index=slot_index, checked=path == container):
                    removed.append(path)
            except WorkspaceError as exc:
                failures.append(exc)
        holder_left = (
            not failures and container not in {p for p, _ in targets} and _exists(container)
        )
        if holder_left and await self._remove_container(container, root=root, key=key):
            removed.append(container)
        if not _exists(container):
            delete_marker(root, key)
        if failures:
            first = failures[0]
            raise WorkspaceCleanupError(
                f"{len(failures)} workspace(s) of {identifier} were left in place: "
                f"{first.message}",
                code=first.code,
                removed=removed,
                failures=failures,
            )
        return removed

    def _removal_targets(
        self, root: Path, key: str, *, marker: WorkspaceMarker | None, settings: WorkflowSettings
    ) -> list[tuple[Path, int]]:
        container = root / key
        targets: dict[Path, int] = {}
        for manifest_file in manifests_for_key(root, key):
            manifest = read_manifest(manifest_file)
            path = workspace_of_manifest(root, manifest_file)
            targets[path] = (
                manifest.slot_index if manifest else (parse_slot_dir_name(path.name) or 0)
            )
        layout: Layout = marker.layout if marker else (
            "slots" if settings.agent.ensemble_size > 1 else "flat"
        )
        if _is_real_dir(container) and layout == "slots":
            for child in sorted(container.iterdir()):
                slot = parse_slot_dir_name(child.name)
                if slot is not None:
                    targets.setdefault(child, slot)
        elif _exists(container):
            targets.setdefault(container, 0)
        return sorted(targets.items(), key=lambda item: (item[1], str(item[0])))

    async def _remove_container(self, container: Path, *, root: Path, key: str) -> bool:
        """Remove the ``<root>/<key>`` holder of slot directories once every slot is gone."""
        check_inside_root(container, root=root, root_resolved=True)
        if not _is_real_dir(container):
            os.unlink(container)
            return True
        if manifests_for_key(root, key) or self._settings.workspace.kind is WorkspaceKind.WORKTREE:
            # NB: in worktree mode only an empty holder goes; anything left in it is not ours.
            try:
                _remove_empty_dir(container)
            except OSError:
                logger.warning("workspace holder not empty, kept workspace=%s", container)
                return False
            return True
        await self._rmtree(container)
        return True

    async def remove_path(self, path: Path) -> bool:
        """Remove one workspace path (``before_remove`` first); ``False`` if it did not exist.

        The path must be inside the current root or one used earlier by this manager. Raises
        :class:`WorkspaceError` (containment codes, ``worktree_dirty``, ``worktree_foreign``,
        ``workspace_remove_failed``).
        """
        root, canonical = self._locate(path)
        target = self._operational_path(path, root=root, canonical=canonical)
        relative = target.relative_to(root).parts
        key = relative[0]
        marker = read_marker(root, key)
        slot_index = parse_slot_dir_name(target.name) if len(relative) > 1 else 0
        identity = _Identity(
            issue_id=marker.issue_id if marker else "",
            identifier=marker.identifier if marker else (identifier_from_key(key) or key),
        )
        removed = await self._remove_one(target, root=root, identity=identity,
                                         slot_index=slot_index or 0)
        if not _exists(root / key):
            delete_marker(root, key)
        return removed

    async def _remove_one(
        self, path: Path, *, root: Path, identity: _Identity, slot_index: int,
        checked: bool = False,
    ) -> bool:
        """``checked``: ``path`` was proven inside ``root`` right before, with nothing between."""
        if not checked:
            check_inside_root(path, root=root, root_resolved=True)
        manifest_file = manifest_path(root, path)
        if (_exists(manifest_file)
                or self._settings.workspace.kind is WorkspaceKind.WORKTREE):
            return await self._remove_worktree(path, root=root, manifest_file=manifest_file,
                                               identity=identity, slot_index=slot_index)
        return await self._remove_directory(path, root=root, identity=identity,
                                            slot_index=slot_index)

    async def _before_remove(self, path: Path, *, identity: _Identity, slot_index: int) -> bool:
        """Run ``before_remove``; ``True`` if a hook ran (it may have changed anything)."""
        try:
            return await self._hook("before_remove", workspace=path, identity=identity,
                                    attempt=None, slot_index=slot_index)
        except WorkspaceError as exc:
            logger.warning("before_remove hook failed, removing anyway workspace=%s: %s",
                           path, exc)
            return True

    async def _rmtree(self, path: Path) -> None:
        try:
            # NB: rmtree never follows symlinks inside the tree (it unlinks them), and the
            # path itself was checked to be a real directory under the root.
            await asyncio.to_thread(shutil.rmtree, path)
        except FileNotFoundError:
            return  # already gone: removing a missing workspace is not an error
        except OSError as exc:
            raise WorkspaceError(
                f"cannot remove workspace {path} ({exc.strerror or exc}); "
                "check permissions and remove it by hand",
                code=ErrorCode.WORKSPACE_REMOVE_FAILED,
                path=path,
            ) from exc

    async def _remove_directory(
        self, path: Path, *, root: Path, identity: _Identity, slot_index: int
    ) -> bool:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            os.unlink(path)
            return True
        if await self._before_remove(path, identity=identity, slot_index=slot_index):
            # The hook is arbitrary code: check again that what we delete is still ours to
            # delete. NB: without a hook nothing ran since the checks above, so they stand.
            check_inside_root(path, root=root, root_resolved=True)
            if not _exists(path):
                return True
            if not _is_real_dir(path):
                os.unlink(path)
                return True
        await self._rmtree(path)
        # NB: DEBUG: the runtime's workspace_cleanup event names what was removed, one line
        # per issue instead of two (every finished run removes its workspace).
        logger.debug("workspace removed issue_identifier=%s workspace=%s",
                     identity.identifier, path)
        return True

    async def _remove_worktree(
        self,
        path: Path,
        *,
        root: Path,
        manifest_file: Path,
        identity: _Identity,
        slot_index: int,
    ) -> bool:
        manifest = read_manifest(manifest_file)
        env = self._plain_env()
        if not _exists(path):
            if manifest is not None:
                with contextlib.suppress(WorkspaceError):
                    await GitRepository(Path(manifest.repo), env=env).prune()
            delete_manifest(manifest_file)
            return False
        if manifest is None and _is_empty_real_dir(path):
            _remove_empty_dir(path)
            return True

        if manifest is None:
            raise _foreign(path, "it has no Lorenz manifest")
        await _prove_removable(path, manifest=manifest, env=env)
        if await self._before_remove(path, identity=identity, slot_index=slot_index):
            await _prove_removable(path, manifest=manifest, env=env)  # the hook may change anything
        repo = GitRepository(Path(manifest.repo), env=env)
        async with self._repo_lock(manifest.git_common_dir):
            await repo.remove(path, force=False)
        delete_manifest(manifest_file)
        logger.info("worktree removed issue_identifier=%s workspace=%s",
                    identity.identifier, path)
        return True

    # -- listing ------------------------------------------------------------------------------

    def list_workspaces(self) -> list[WorkspaceInfo]:
        """Workspace key directories under the current root, with the issue each belongs to
        when its marker says so. Lorenz's own ``.lorenz`` directory is never listed."""
        root = self._root(self._settings)
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise WorkspaceError(
                f"cannot list workspace root {root} ({exc.strerror}); fix its permissions",
                code=ErrorCode.WORKSPACE_PATH_UNREADABLE,
                path=root,
            ) from exc
        found: list[WorkspaceInfo] = []
        for entry in entries:
            if entry.name == STATE_DIR_NAME or not entry.is_dir(follow_symlinks=False):
                continue
            marker = read_marker(root, entry.name)
            found.append(WorkspaceInfo(
                key=entry.name,
                path=root / entry.name,
                issue_id=marker.issue_id if marker else None,
                identifier=marker.identifier if marker else identifier_from_key(entry.name),
            ))
        return found


async def _prove_removable(
    path: Path, *, manifest: WorktreeManifest, env: Mapping[str, str]
) -> None:
    """Ownership (manifest + live git state) and cleanliness, or a preserving error."""
    problem = await ownership_problem(path=path, manifest=manifest, env=env)
    if problem is not None:
        raise _foreign(path, problem)
    changes = await worktree_status(path, env=env)
    if changes.strip():
        raise _dirty(path, changes)


# NB: the helpers below are single metadata syscalls on local paths; coroutines call them
# inline (only tree deletion, which can take seconds, goes to a thread).


def _exists(path: Path) -> bool:
    """Something (even a dangling symlink) is at ``path``."""
    return os.path.lexists(path)


def _remove_empty_dir(path: Path) -> None:
    os.rmdir(path)


def _absolute_repo(configured: str) -> Path:
    repo = Path(configured).expanduser()
    return repo if repo.is_absolute() else Path.cwd() / repo


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_empty_real_dir(path: Path) -> bool:
    if not _is_real_dir(path):
        return False
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


async def _is_registered(repo: GitRepository, path: Path) -> bool:
    canonical = canonical_text(path)
    return any(canonical_text(w.path) == canonical for w in await repo.worktrees())


def _foreign(path: Path, problem: str) -> WorkspaceError:
    return WorkspaceError(
        f"{path} was preserved: it is not a worktree Lorenz can prove it made ({problem}); "
        "move it away or remove it by hand",
        code=ErrorCode.WORKTREE_FOREIGN,
        path=path,
    )


def _dirty(path: Path, changes: str) -> WorkspaceError:
    count = len(changes.strip().splitlines())
    return WorkspaceError(
        f"{path} was preserved: the worktree has {count} uncommitted change(s); "
        "commit, stash or discard them, then remove it",
        code=ErrorCode.WORKTREE_DIRTY,
        path=path,
    )
