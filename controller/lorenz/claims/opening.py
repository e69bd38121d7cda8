"""Choosing and opening the claim store a composition root asked for (``claim_store.*`` flags).

Only layer 8 (the CLI daemon, the operator) decides *which* store to use; this is the one place
that turns those settings into an open store, so the default path rule lives once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lorenz.claims.memory import MemoryClaimStore
from lorenz.model import ClaimStore, Clock

if TYPE_CHECKING:
    from lorenz.claims.sql import SqlClaimStore

    # NB: only for typing: the settings module pulls in pydantic, which processes that merely
    # touch a store (`lorenz status`, tests' child processes) should not pay for.
    from lorenz.config.settings import ClaimStoreSettings

STORE_DIR = Path(".lorenz") / "claim-store"
STORE_FILE = "claims.db"


def workflow_digest(workflow_path: Path) -> str:
    """sha256 hex of the canonical (absolute, symlinks resolved) workflow path.

    NB: :func:`lorenz.leadership.files.workflow_digest` must give the same value (a test pins it):
    the store and the lease of one workflow are found by the same key.
    """
    canonical = Path(os.path.abspath(workflow_path)).resolve()
    return hashlib.sha256(str(canonical).encode("utf-8")).hexdigest()


def default_store_path(*, workspace_root: Path, workflow_path: Path) -> Path:
    """``<workspace.root>/.lorenz/claim-store/<sha256 of workflow path>/claims.db``."""
    return workspace_root / STORE_DIR / workflow_digest(workflow_path) / STORE_FILE


def store_path(settings: ClaimStoreSettings, *, workspace_root: Path, workflow_path: Path) -> Path:
    """The file a durable store uses: ``claim_store.path`` if set, else the default.

    A relative ``claim_store.path`` is relative to the folder of WORKFLOW.md, like every other
    path in the workflow; ``~`` and ``$VAR`` are expanded.
    """
    if not settings.path.strip():
        return default_store_path(workspace_root=workspace_root, workflow_path=workflow_path)
    given = Path(os.path.expanduser(os.path.expandvars(settings.path.strip())))
    if not given.is_absolute():
        given = Path(os.path.abspath(workflow_path)).parent / given
    return given


async def open_claim_store(
    settings: ClaimStoreSettings,
    *,
    workspace_root: Path,
    workflow_path: Path,
    owner: str,
    clock: Clock | None = None,
) -> ClaimStore:
    """Open the configured backend (``memory``, ``sqlite`` or ``turso``) for ``owner``.

    Durable backends create the parent folders of their file. Raises the coded
    :mod:`lorenz.claims.errors` for a file that cannot be used.
    """
    backend = str(settings.backend)  # a StrEnum: compare by value
    if backend == "memory":
        return MemoryClaimStore(owner=owner)
    path = store_path(settings, workspace_root=workspace_root, workflow_path=workflow_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        from lorenz.claims.sqlite import SqliteClaimStore

        return await SqliteClaimStore.open(
            path, owner=owner, owner_stale_ms=settings.owner_stale_ms, clock=clock
        )
    if backend != "turso":
        raise ValueError(f"unknown claim_store.backend {backend!r}")
    from lorenz.claims.turso import TursoClaimStore

    return await TursoClaimStore.open(
        path, owner=owner, owner_stale_ms=settings.owner_stale_ms, clock=clock
    )


def sql_store_of(store: ClaimStore) -> SqlClaimStore | None:
    """``store`` when it is a SQL claim store (``sqlite``, ``turso``), else ``None``.

    NB: the SQL store's module is imported only for a durable store, the only kind that can be
    one: a process with the memory store never loads it (issue #35).
    """
    if not store.durable:
        return None
    from lorenz.claims.sql import SqlClaimStore

    return store if isinstance(store, SqlClaimStore) else None
