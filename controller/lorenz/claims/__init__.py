"""Claim stores: where the orchestrator persists slot claims (memory, sqlite, turso, Claims),
and beside them the spend ledger of budgets (:mod:`lorenz.claims.spend`)."""

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
from lorenz.claims.sql import DEFAULT_OWNER_STALE_MS, SCHEMA_VERSION, SqlClaimStore, StoreEvent
from lorenz.claims.sqlite import SqliteClaimStore
from lorenz.claims.turso import TursoClaimStore

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
    "store_path",
    "workflow_digest",
]
