"""Choosing and opening a claim store from the ``claim_store.*`` settings."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorenz.claims import (
    MemoryClaimStore,
    SqliteClaimStore,
    TursoClaimStore,
    default_owner_id,
    default_store_path,
    open_claim_store,
    store_path,
    workflow_digest,
)
from lorenz.config.settings import ClaimStoreBackend, ClaimStoreSettings
from lorenz.leadership import workflow_digest as lease_digest
from tests.claims.records import claim


@pytest.fixture
def workflow(tmp_path: Path) -> Path:
    path = tmp_path / "repo" / "WORKFLOW.md"
    path.parent.mkdir()
    path.write_text("---\n---\nprompt\n")
    return path


def test_digest_is_sha256_of_the_canonical_path(
    workflow: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = tmp_path / "link.md"
    link.symlink_to(workflow)
    expected = hashlib.sha256(str(workflow.resolve()).encode()).hexdigest()
    assert workflow_digest(workflow) == expected
    assert workflow_digest(link) == expected  # symlinks resolve
    monkeypatch.chdir(workflow.parent)
    assert workflow_digest(Path("WORKFLOW.md")) == expected  # relative paths too
    assert lease_digest(workflow) == expected  # the lease finds the same workflow


def test_default_path_layout(workflow: Path, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    path = default_store_path(workspace_root=root, workflow_path=workflow)
    assert path == root / ".lorenz" / "claim-store" / workflow_digest(workflow) / "claims.db"


def test_two_workflows_in_one_root_get_two_stores(workflow: Path, tmp_path: Path) -> None:
    other = workflow.with_name("OTHER.md")
    root = tmp_path / "ws"
    assert default_store_path(workspace_root=root, workflow_path=workflow) != default_store_path(
        workspace_root=root, workflow_path=other
    )


def test_explicit_path_relative_to_the_workflow_folder(workflow: Path, tmp_path: Path) -> None:
    settings = ClaimStoreSettings(backend=ClaimStoreBackend.SQLITE, path="state/c.db")
    assert store_path(settings, workspace_root=tmp_path, workflow_path=workflow) == (
        workflow.parent / "state" / "c.db"
    )
    absolute = ClaimStoreSettings(backend=ClaimStoreBackend.SQLITE, path=str(tmp_path / "x.db"))
    assert store_path(absolute, workspace_root=tmp_path, workflow_path=workflow) == (
        tmp_path / "x.db"
    )


async def test_memory_is_the_default(workflow: Path, tmp_path: Path) -> None:
    store = await open_claim_store(
        ClaimStoreSettings(), workspace_root=tmp_path / "ws", workflow_path=workflow, owner="me"
    )
    assert isinstance(store, MemoryClaimStore)
    assert store.owner == "me"
    assert not store.durable
    assert not (tmp_path / "ws").exists()  # nothing on disk


@pytest.mark.parametrize(
    ("backend", "cls"),
    [(ClaimStoreBackend.SQLITE, SqliteClaimStore), (ClaimStoreBackend.TURSO, TursoClaimStore)],
)
async def test_durable_backend_at_the_default_path(
    backend: ClaimStoreBackend,
    cls: type[SqliteClaimStore] | type[TursoClaimStore],
    workflow: Path,
    tmp_path: Path,
) -> None:
    root = tmp_path / "ws"
    store = await open_claim_store(
        ClaimStoreSettings(backend=backend),
        workspace_root=root,
        workflow_path=workflow,
        owner="me",
    )
    try:
        assert isinstance(store, cls)
        assert store.durable
        assert store.path == default_store_path(workspace_root=root, workflow_path=workflow)
        assert store.path.is_file()  # parents were created
        assert store.owner_stale_ms == 30_000
        assert await store.acquire(claim("1"))
    finally:
        await store.close()


async def test_owner_stale_ms_is_passed_through(workflow: Path, tmp_path: Path) -> None:
    store = await open_claim_store(
        ClaimStoreSettings(backend=ClaimStoreBackend.SQLITE, owner_stale_ms=4500),
        workspace_root=tmp_path,
        workflow_path=workflow,
        owner="me",
    )
    try:
        assert isinstance(store, SqliteClaimStore)
        assert store.owner_stale_ms == 4500
    finally:
        await store.close()


def test_default_owner_id_names_one_process_incarnation() -> None:
    import psutil

    host, pid, started = default_owner_id().rsplit(":", 2)
    assert int(pid) == os.getpid()
    assert abs(float(started) - psutil.Process().create_time()) < 0.01
    assert host
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lorenz.claims import default_owner_id; print(default_owner_id())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert child != default_owner_id()
    assert child.rsplit(":", 2)[0] == host
