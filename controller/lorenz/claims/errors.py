"""The coded errors a claim store raises when the file it is pointed at cannot be used.

Each one names the file, because the fix is always about that file: upgrade Lorenz, point
``claim_store.path`` elsewhere, or stop the process that holds it.
"""

from __future__ import annotations

from pathlib import Path

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError


class ClaimStoreError(LorenzError):
    """Base of every claim-store error."""

    code = ErrorCode.CLAIM_STORE_ERROR

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message, key_path="claim_store.path" if path is not None else None)
        self.path = path


class ClaimStoreSchemaUnsupported(ClaimStoreError):
    """The file holds a schema this Lorenz does not know; nothing was read or written."""

    code = ErrorCode.CLAIM_STORE_SCHEMA_UNSUPPORTED

    def __init__(self, *, path: Path, version: str | None) -> None:
        if version is None:
            what = "has tables but no claim_store_meta table (not a Lorenz claim store)"
        else:
            what = f"has schema_version {version!r}, this Lorenz supports 1 to 4"
        super().__init__(
            f"claim store {path} {what}; upgrade Lorenz or set claim_store.path to another file",
            path=path,
        )
        self.version = version


class ClaimStoreUnreadable(ClaimStoreError):
    """The file exists but is not a database, or cannot be opened at all."""

    code = ErrorCode.CLAIM_STORE_UNREADABLE

    def __init__(self, *, path: Path, reason: str) -> None:
        super().__init__(
            f"claim store {path} cannot be opened ({reason}); "
            f"fix its permissions or set claim_store.path to another file",
            path=path,
        )
        self.reason = reason


class ClaimStoreBusy(ClaimStoreError):
    """Another process kept the store's write lock for longer than the bounded retry."""

    code = ErrorCode.CLAIM_STORE_BUSY

    def __init__(self, *, path: Path, waited_s: float) -> None:
        super().__init__(
            f"claim store {path} stayed locked for {waited_s:.0f} s; "
            f"find the process holding a write transaction on it and stop it",
            path=path,
        )
        self.waited_s = waited_s


class ClaimStoreWriteFailed(ClaimStoreError):
    """The file system refused a write: full, read-only, or failing (``ENOSPC``, ``EROFS``, EIO).

    Nothing was changed: the transaction was rolled back whole, and the file stays consistent.
    The store keeps its connection; the next write that succeeds (space came back) clears the
    condition (see :attr:`lorenz.claims.SqlClaimStore.write_failure`).
    """

    code = ErrorCode.CLAIM_STORE_WRITE_FAILED

    def __init__(self, *, path: Path, reason: str) -> None:
        super().__init__(
            f"claim store {path} cannot be written ({reason}); free space on its file system "
            f"or make it writable again: dispatch resumes by itself once writes succeed",
            path=path,
        )
        self.reason = reason


class ClaimOwnerLost(ClaimStoreError):
    """Our heartbeat went stale and another process took our claims over (or dropped our row).

    The runs this process still has for those slots are now someone else's to retry: the
    runtime must stop them rather than finish them twice.
    """

    code = ErrorCode.CLAIM_OWNER_LOST

    def __init__(self, *, path: Path, owner: str) -> None:
        super().__init__(
            f"claim owner {owner} was declared stale in {path} and its claims were taken over; "
            f"stop this process's runs and restart it (keep heartbeats well under "
            f"claim_store.owner_stale_ms)",
            path=path,
        )
        self.owner = owner


class ClaimGenerationStale(ClaimStoreError):
    """A newer leader generation fenced the store: this process may not write it any more.

    Raised before anything is changed (the fence is compared inside the write's transaction),
    so a deposed controller that has not noticed its loss yet cannot overwrite its successor.
    """

    code = ErrorCode.CLAIM_GENERATION_STALE

    def __init__(
        self, *, path: Path | None, generation: int | None, current: int, holder: str | None
    ) -> None:
        where = f"claim store {path}" if path is not None else "the claim store"
        by = f" by {holder}" if holder else ""
        super().__init__(
            f"{where} is fenced at generation {current}{by}; this process leads generation "
            f"{generation} and stops without writing (another controller took over) — leave "
            f"it stopped, or restart it to compete for leadership again",
            path=path,
        )
        self.generation = generation
        self.current = current
        self.holder = holder


MAX_REBIND = 1_000
"""Claims one take-over may move to us at most; above it the take-over fails closed
(``claim_rebind_too_large``) and moves nothing — recovery is bounded, never a broad sweep."""


class ClaimRebindTooLarge(ClaimStoreError):
    """Taking over other owners' claims would rebind more than the bound; nothing was moved."""

    code = ErrorCode.CLAIM_REBIND_TOO_LARGE

    def __init__(self, *, path: Path, owners: list[str], count: int, limit: int) -> None:
        super().__init__(
            f"claim store {path}: recovering owners {', '.join(owners)} would rebind {count} "
            f"claims, more than {limit}; nothing was taken over (fail closed) — a workflow "
            f"never holds that many, so look at the store (an owner id reused by many "
            f"processes, a copied file) before starting again",
            path=path,
        )
        self.owners = owners
        self.count = count
        self.limit = limit


class ClaimRecoveryTooLarge(ClaimRebindTooLarge):
    """A bounded recovery read found more claims than the bound; nothing was recovered.

    A kind of :class:`ClaimRebindTooLarge` (same code, same rule: recovery is bounded and
    fails closed), raised by a bounded read (``load(bound=...)``, the owners a start-up
    reads) before any row is moved, released or retried, so whoever handles a too-large
    take-over handles this one too.
    """

    def __init__(self, *, path: Path | None, where: str, limit: int, what: str = "claims") -> None:
        # NB: not the parent's constructor (no owners were named yet); its fields are set below.
        ClaimStoreError.__init__(
            self,
            f"{where} holds more than {limit} {what} of this workflow; recovery reads at most "
            f"{limit} and recovered nothing (fail closed) — a workflow never holds that many, "
            f"so look at the store (an owner id reused by many processes, a copied file, "
            f"leftover Claims) before starting again",
            path=path,
        )
        self.owners: list[str] = []
        self.count = limit + 1
        """At least this many (the read stops one past the bound)."""
        self.limit = limit
