"""Claim stores: where the orchestrator persists slot claims (memory, sqlite, turso, Claims)."""

from lorenz.claims.errors import (
    ClaimGenerationStale,
    ClaimOwnerLost,
    ClaimRebindTooLarge,
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
from lorenz.claims.sql import DEFAULT_OWNER_STALE_MS, SCHEMA_VERSION, SqlClaimStore, StoreEvent
from lorenz.claims.sqlite import SqliteClaimStore
from lorenz.claims.turso import TursoClaimStore

__all__ = [
    "DEFAULT_OWNER_STALE_MS",
    "SCHEMA_VERSION",
    "ClaimGenerationStale",
    "ClaimOwnerLost",
    "ClaimRebindTooLarge",
    "ClaimStoreBusy",
    "ClaimStoreError",
    "ClaimStoreSchemaUnsupported",
    "ClaimStoreUnreadable",
    "ClaimStoreWriteFailed",
    "MemoryClaimStore",
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
