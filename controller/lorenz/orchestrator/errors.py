"""Coded problems the scheduling core can report about persisted state.

A claim store is written by Lorenz, but it is a file (or a set of ``Claim`` resources) that a
person can edit, copy between versions or corrupt. Hydration never crashes on one bad row: it
skips what it cannot read and reports each problem with a stable code, so the runtime can log it
and the operator knows what to fix.
"""

from __future__ import annotations

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError


class OrchestratorError(LorenzError):
    """Base of the core's coded errors."""

    code = ErrorCode.ORCHESTRATOR_ERROR


class ClaimRecordInvalid(OrchestratorError):
    """A stored claim cannot be used (its slot key does not match its issue and slot)."""

    code = ErrorCode.CLAIM_RECORD_INVALID


class CheckpointInvalid(OrchestratorError):
    """The stored checkpoint is not the shape this version writes."""

    code = ErrorCode.CLAIM_CHECKPOINT_INVALID


class AlreadyStarted(OrchestratorError):
    """``hydrate()`` was called after the orchestrator already holds scheduling state."""

    code = ErrorCode.ORCHESTRATOR_ALREADY_STARTED
