"""Fixtures for the durable claim stores: every contract test runs on sqlite and on turso."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.claims import SqlClaimStore
from tests.claims.records import BACKENDS, OpenStore


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "claims.db"


@pytest.fixture
async def open_store(backend: str, store_path: Path) -> AsyncIterator[OpenStore]:
    """Open stores (any owner, clock, limits) on one file; all are closed at teardown."""
    opened: list[SqlClaimStore] = []

    async def _open(owner: str, **kwargs: Any) -> SqlClaimStore:
        store = await BACKENDS[backend].open(store_path, owner=owner, **kwargs)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        await store.close()
