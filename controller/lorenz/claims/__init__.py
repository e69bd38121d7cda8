"""Claim stores: where the orchestrator persists slot claims (memory, sqlite, turso, Claims),
and beside them the spend ledger of budgets (:mod:`lorenz.claims.spend`).

NB: the SQL stores are loaded on first use (PEP 562), and :func:`open_claim_store` imports only
the backend it opens: a controller with the memory store holds neither ``sqlite3`` (and
libsqlite3) nor the SQL store's modules and tenacity's retries (issue #35). Type checkers read
the imports under ``TYPE_CHECKING``; ``_LAZY`` says where each lazy name lives at run time
(tests/test_lean_imports.py checks that the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorenz.claims.errors import (
    ClaimGenerationStale,
    ClaimOwnerLost,
    ClaimRebindTooLarge,
    ClaimRecoveryTooLarge,
    ClaimStoreBusy,
    ClaimStoreError,
    ClaimStoreSchemaUnsupported,
    ClaimStoreUnreadable,
    ClaimStoreWriteFailed,
)
from lorenz.claims.memory import MemoryClaimStore
from lorenz.claims.opening import (
    default_store_path,
    open_claim_store,
    sql_store_of,
    store_path,
    workflow_digest,
)
from lorenz.claims.owners import default_owner_id
from lorenz.claims.spend import (
    DAY_SPEND_KEPT,
    ISSUE_SPEND_KEPT,
    IssueSpend,
    SpendCharge,
    SpendLedger,
    SpendTotal,
)
from lorenz.lazy_names import lazy_attributes

if TYPE_CHECKING:
    from lorenz.claims.sql import DEFAULT_OWNER_STALE_MS as DEFAULT_OWNER_STALE_MS
    from lorenz.claims.sql import SCHEMA_VERSION as SCHEMA_VERSION
    from lorenz.claims.sql import SqlClaimStore as SqlClaimStore
    from lorenz.claims.sql import StoreEvent as StoreEvent
    from lorenz.claims.sqlite import SqliteClaimStore as SqliteClaimStore
    from lorenz.claims.turso import TursoClaimStore as TursoClaimStore

_LAZY: dict[str, str] = {
    "DEFAULT_OWNER_STALE_MS": "sql",
    "SCHEMA_VERSION": "sql",
    "SqlClaimStore": "sql",
    "StoreEvent": "sql",
    "SqliteClaimStore": "sqlite",
    "TursoClaimStore": "turso",
}

if not TYPE_CHECKING:
    # NB: hidden from type checkers (lorenz.lazy_names): they read the imports above.
    __getattr__, __dir__ = lazy_attributes(
        package=__name__, homes=_LAZY, namespace=globals()
    )


__all__ = [
    "DAY_SPEND_KEPT",
    "DEFAULT_OWNER_STALE_MS",
    "ISSUE_SPEND_KEPT",
    "SCHEMA_VERSION",
    "ClaimGenerationStale",
    "ClaimOwnerLost",
    "ClaimRebindTooLarge",
    "ClaimRecoveryTooLarge",
    "ClaimStoreBusy",
    "ClaimStoreError",
    "ClaimStoreSchemaUnsupported",
    "ClaimStoreUnreadable",
    "ClaimStoreWriteFailed",
    "IssueSpend",
    "MemoryClaimStore",
    "SpendCharge",
    "SpendLedger",
    "SpendTotal",
    "SqlClaimStore",
    "SqliteClaimStore",
    "StoreEvent",
    "TursoClaimStore",
    "default_owner_id",
    "default_store_path",
    "open_claim_store",
    "sql_store_of",
    "store_path",
    "workflow_digest",
]
