"""Git-worktree workspaces, and the ownership proof that guards every reuse and removal.

In worktree mode a workspace is a linked worktree of ``workspace.repo`` on its own branch. The
risk is the reverse of directory mode: the path may hold a human's work -- a worktree someone
made by hand, or one the agent left with uncommitted changes -- and ``rm -rf`` of that is
unrecoverable. So Lorenz only touches a worktree it can prove it made:

* when it creates one it first writes a manifest, ``<root>/.lorenz/worktrees/<rel>.json``
  (``<rel>`` = the path relative to the root, e.g. ``ABC-1`` or ``ABC-1/slot-2``), binding the
  path to the repository's common git dir, the branch, the base ref and commit, and the issue;
* a path is reused or removed only when that manifest *and* the live git state agree: the
  repository lists the path as a worktree (``git worktree list --porcelain -z``), on the
  manifest's branch, not locked, and the worktree's own ``.git`` points back to that repository;
* a path that fails the proof is *foreign* (``worktree_foreign``) and one with uncommitted or
  untracked changes (``git status --porcelain``) is *dirty* (``worktree_dirty``): both are
  preserved and reported, never deleted.

The manifest lives outside the worktree so it never shows up in ``git status``. Branches are
never deleted on removal (they hold the work); the one exception is rolling back a worktree
whose ``after_create`` failed, whose brand-new branch is deleted only if it still points at the
base commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lorenz.codes import ErrorCode
from lorenz.workspaces.errors import WorkspaceError
from lorenz.workspaces.markers import now_iso, read_json, state_dir, write_json_atomically

MANIFEST_VERSION = 1
MANIFESTS_DIR = "worktrees"

GIT_TIMEOUT_S = 300.0
"""Limit for one git command. NB: generous on purpose: ``worktree add`` checks out the whole
tree, which takes a while on big repositories; the limit only exists so a git process stuck on
a lock cannot hang a run forever."""

# NB: a Lorenz started from inside a git hook (or a shell that exported these) would otherwise
# point every command at the wrong repository.
_GIT_ENV_OVERRIDES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorktreeManifest:
    """The ownership record of one worktree Lorenz made."""

    path: str
    """Canonical absolute path of the worktree."""
    repo: str
    """The repository it was made from (``workspace.repo`` at the time, canonical)."""
    git_common_dir: str
    """That repository's common git directory (canonical)."""
    branch: str
    """Short branch name, ``lorenz/<key>`` or ``lorenz/<key>+slot-<n>``."""
    base_ref: str
    """``workspace.base_ref`` at creation (or the branch itself when it already existed)."""
    base_commit: str
    """The commit the worktree was checked out at."""
    created_branch: bool
    """Whether Lorenz created the branch (rather than reusing an existing one)."""
    issue_id: str
    identifier: str
    slot_index: int
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> WorktreeManifest | None:
        """The manifest, or ``None`` when ``data`` is not one this version understands."""
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            return None
        text_fields = (
            "path", "repo", "git_common_dir", "branch", "base_ref", "base_commit",
            "issue_id", "identifier", "created_at",
        )
        if not all(isinstance(data.get(f), str) for f in text_fields):
            return None
        if not isinstance(data.get("created_branch"), bool):
            return None
        slot = data.get("slot_index")
        if not isinstance(slot, int) or isinstance(slot, bool):
            return None
        return cls(
            **{f: data[f] for f in text_fields},
            created_branch=data["created_branch"],
            slot_index=slot,
        )


def manifest_path(root: Path, workspace: Path) -> Path:
    """Where the manifest of ``workspace`` (a path inside ``root``) lives."""
    relative = workspace.relative_to(root)
    return state_dir(root) / MANIFESTS_DIR / relative.parent / f"{relative.name}.json"


def manifests_for_key(root: Path, key: str) -> list[Path]:
    """Manifest files of every worktree under ``<root>/<key>`` (flat or per slot)."""
    base = state_dir(root) / MANIFESTS_DIR
    found = [base / f"{key}.json"] if (base / f"{key}.json").is_file() else []
    nested = base / key
    if nested.is_dir():
        found.extend(sorted(p for p in nested.glob("*.json") if p.is_file()))
    return found


def workspace_of_manifest(root: Path, manifest_file: Path) -> Path:
    relative = manifest_file.relative_to(state_dir(root) / MANIFESTS_DIR)
    return root / relative.parent / relative.name.removesuffix(".json")


def read_manifest(path: Path) -> WorktreeManifest | None:
    return WorktreeManifest.from_json(read_json(path))


def write_manifest(path: Path, manifest: WorktreeManifest) -> None:
    write_json_atomically(path, manifest.to_json())


def delete_manifest(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # only succeeds when it was the last manifest of a slot layout


@dataclasses.dataclass(frozen=True, slots=True)
class LiveWorktree:
    """One entry of ``git worktree list --porcelain``."""

    path: str
    head: str | None
    branch: str | None
    """Short branch name, ``None`` when detached."""
    locked: bool
    prunable: bool


class GitCommandError(WorkspaceError):
    """A git command exited non-zero (``worktree_git_failed`` unless the caller says more)."""

    code = ErrorCode.WORKTREE_GIT_FAILED

    def __init__(self, message: str, *, code: str | None = None, stderr: str = ""):
        super().__init__(message, code=code)
        self.stderr = stderr


def canonical_text(path: Path | str) -> str:
    """``realpath`` as a string. NB: a few local metadata calls, cheap enough to make inline
    in coroutines (the linter's blocking-call rule is about real I/O waits)."""
    return os.path.realpath(path)


def git_environment(base: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _GIT_ENV_OVERRIDES}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"
    return env


async def run_git(
    *args: str, cwd: Path, env: Mapping[str, str], check: bool = True
) -> tuple[int, str, str]:
    """Run ``git -C cwd <args>``; return (status, stdout, stderr). ``check`` raises on non-zero."""
    try:
        process = await asyncio.create_subprocess_exec(
            "git", "-C", str(cwd), *args,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise GitCommandError(
            f"cannot run git ({exc}); install git to use workspace.kind: worktree"
        ) from exc
    try:
        async with asyncio.timeout(GIT_TIMEOUT_S):
            out, err = await process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await asyncio.shield(process.wait())
        raise
    status = process.returncode if process.returncode is not None else -1
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if check and status != 0:
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"status {status}"
        raise GitCommandError(
            f"git {' '.join(args[:2])} failed in {cwd}: {detail}", stderr=stderr
        )
    return status, stdout, stderr


def parse_worktree_list(output: str) -> list[LiveWorktree]:
    """Parse ``git worktree list --porcelain -z``."""
    entries: list[LiveWorktree] = []
    fields: dict[str, str] = {}

    def flush() -> None:
        if "worktree" in fields:
            branch = fields.get("branch")
            entries.append(
                LiveWorktree(
                    path=fields["worktree"],
                    head=fields.get("HEAD"),
                    branch=branch.removeprefix("refs/heads/") if branch else None,
                    locked="locked" in fields,
                    prunable="prunable" in fields,
                )
            )
        fields.clear()

    for item in output.split("\0"):
        if not item:
            flush()
            continue
        name, _, value = item.partition(" ")
        fields[name] = value
    flush()
    return entries


class GitRepository:
    """The repository worktrees are made from; every method runs real git."""

    def __init__(self, path: Path, *, env: Mapping[str, str]) -> None:
        self.path = path
        self._env = git_environment(env)

    async def common_dir(self) -> Path:
        """The canonical common git dir; ``worktree_repo_invalid`` when this is no repository."""
        try:
            _, out, _ = await run_git(
                "rev-parse", "--path-format=absolute", "--git-common-dir",
                cwd=self.path, env=self._env,
            )
        except GitCommandError as exc:
            raise WorkspaceError(
                f"workspace.repo {self.path} is not a git repository ({exc.message}); "
                "point workspace.repo at a clone",
                code=ErrorCode.WORKTREE_REPO_INVALID,
                path=self.path,
            ) from exc
        return Path(canonical_text(out.strip()))

    async def resolve_commit(self, ref: str) -> str:
        status, out, _ = await run_git(
            "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}",
            cwd=self.path, env=self._env, check=False,
        )
        if status != 0 or not out.strip():
            raise WorkspaceError(
                f"workspace.base_ref {ref!r} does not name a commit in {self.path}; "
                "set it to an existing branch, tag or commit",
                code=ErrorCode.WORKTREE_BASE_REF_INVALID,
                path=self.path,
            )
        return out.strip()

    async def branch_commit(self, branch: str) -> str | None:
        status, out, _ = await run_git(
            "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}",
            cwd=self.path, env=self._env, check=False,
        )
        return out.strip() if status == 0 and out.strip() else None

    async def check_branch_name(self, branch: str) -> None:
        await run_git("check-ref-format", "--branch", branch, cwd=self.path, env=self._env)

    async def worktrees(self) -> list[LiveWorktree]:
        _, out, _ = await run_git(
            "worktree", "list", "--porcelain", "-z", cwd=self.path, env=self._env
        )
        return parse_worktree_list(out)

    async def prune(self) -> None:
        """Forget worktrees whose directories are gone (only those)."""
        await run_git("worktree", "prune", cwd=self.path, env=self._env)

    async def add(self, path: Path, *, branch: str, commit: str, new_branch: bool) -> None:
        args: tuple[str, ...]
        if new_branch:
            args = ("worktree", "add", "-b", branch, "--", str(path), commit)
        else:
            args = ("worktree", "add", "--", str(path), branch)
        await run_git(*args, cwd=self.path, env=self._env)

    async def remove(self, path: Path, *, force: bool) -> None:
        # NB: without --force git itself refuses a dirty worktree: a second line of defence
        # behind our own status check.
        extra: Sequence[str] = ("--force", "--force") if force else ()
        await run_git("worktree", "remove", *extra, "--", str(path), cwd=self.path, env=self._env)

    async def delete_branch_if_at(self, branch: str, commit: str) -> None:
        """Delete ``branch`` only if it still points at ``commit`` (compare-and-delete)."""
        await run_git(
            "update-ref", "-d", f"refs/heads/{branch}", commit,
            cwd=self.path, env=self._env, check=False,
        )


async def worktree_status(path: Path, *, env: Mapping[str, str]) -> str:
    """``git status --porcelain`` of a worktree: empty means clean (ignored files don't count)."""
    _, out, _ = await run_git(
        "status", "--porcelain", "--untracked-files=all", cwd=path, env=git_environment(env)
    )
    return out


async def worktree_common_dir(path: Path, *, env: Mapping[str, str]) -> Path | None:
    """The common git dir the worktree at ``path`` belongs to, or ``None`` if it is not one."""
    status, out, _ = await run_git(
        "rev-parse", "--path-format=absolute", "--git-common-dir",
        cwd=path, env=git_environment(env), check=False,
    )
    return Path(canonical_text(out.strip())) if status == 0 and out.strip() else None


async def ownership_problem(
    *,
    path: Path,
    manifest: WorktreeManifest | None,
    env: Mapping[str, str],
    expect_issue_id: str | None = None,
    expect_common_dir: Path | None = None,
) -> str | None:
    """Why ``path`` is not provably a worktree Lorenz made -- or ``None`` when it is."""
    if manifest is None:
        return "it has no Lorenz manifest"
    canonical = canonical_text(path)
    if manifest.path != canonical:
        return f"its manifest is for {manifest.path}"
    if expect_issue_id is not None and manifest.issue_id != expect_issue_id:
        return f"its manifest is for issue {manifest.issue_id} ({manifest.identifier})"
    if expect_common_dir is not None and manifest.git_common_dir != str(expect_common_dir):
        return f"it belongs to repository {manifest.repo}, not the configured one"
    repo = GitRepository(Path(manifest.repo), env=env)
    try:
        live = await repo.worktrees()
    except GitCommandError as exc:
        return f"its repository {manifest.repo} cannot be read ({exc.message})"
    entry = next((w for w in live if canonical_text(w.path) == canonical), None)
    if entry is None:
        return f"repository {manifest.repo} does not list it as a worktree"
    if entry.locked:
        return "the worktree is locked (git worktree unlock it first)"
    if entry.branch != manifest.branch:
        return f"it is on {entry.branch or 'a detached HEAD'}, not on {manifest.branch}"
    common = await worktree_common_dir(path, env=env)
    if common is None or str(common) != manifest.git_common_dir:
        return f"its .git does not point to {manifest.git_common_dir}"
    return None


def new_manifest(
    *,
    path: Path,
    repo: Path,
    git_common_dir: Path,
    branch: str,
    base_ref: str,
    base_commit: str,
    created_branch: bool,
    issue_id: str,
    identifier: str,
    slot_index: int,
) -> WorktreeManifest:
    return WorktreeManifest(
        path=canonical_text(path),
        repo=canonical_text(repo),
        git_common_dir=str(git_common_dir),
        branch=branch,
        base_ref=base_ref,
        base_commit=base_commit,
        created_branch=created_branch,
        issue_id=issue_id,
        identifier=identifier,
        slot_index=slot_index,
        created_at=now_iso(),
    )
