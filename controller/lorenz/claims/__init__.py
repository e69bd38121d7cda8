"""Claim stores: where the orchestrator persists slot claims (memory, sqlite, turso, Claims)."""

from lorenz.claims.memory import MemoryClaimStore

__all__ = ["MemoryClaimStore"]
