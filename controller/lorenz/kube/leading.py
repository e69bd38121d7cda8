"""The Lease campaign of one Workflow: win the Lease, keep renewing it, give it back.

A term of leadership starts when :meth:`Campaign.win` returns ``True`` and ends in one of two
ways: the renewer finds the Lease lost (``term.lost`` is set; nothing may be written any more)
or the leader halts the renewer on purpose, before releasing the Lease or cleaning up.

NB: the renewer must be halted before any release: a renewal racing the release re-acquires
the just-released Lease, and then nobody ever releases it again. :meth:`Term.halt` is that
step, and it is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib

from lorenz.kube.leases import KubernetesLeaseProvider


class Term:
    """One term of leadership: a renewer running until the Lease is lost or it is halted."""

    def __init__(self, lease: KubernetesLeaseProvider) -> None:
        self.lost = asyncio.Event()
        """Set when the renewer found the Lease lost (never when it was halted)."""
        self._halted = asyncio.Event()
        self._lease = lease
        self._task = asyncio.get_running_loop().create_task(
            self._renew(), name=f"lorenz-lease:{lease.name}"
        )

    async def _renew(self) -> None:
        await self._lease.renew_until_lost(stop=self._halted)
        if not self._halted.is_set():
            self.lost.set()

    async def halt(self) -> None:
        """Stop renewing (before a release); returns once the renewer has stopped."""
        self._halted.set()
        # NB: how a cancelled task ended (cancelled or failing) is not ours to report.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class Campaign:
    """Campaign for one Workflow's Lease, one term at a time."""

    def __init__(self, *, lease: KubernetesLeaseProvider) -> None:
        self.lease = lease

    async def win(self, *, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (``True``) or ``stop`` is set (``False``)."""
        return await self.lease.wait_for_leadership(stop=stop)

    def begin_term(self) -> Term:
        """Start renewing: the term lasts until ``term.lost`` or ``term.halt()``."""
        return Term(self.lease)

    async def release(self) -> None:
        """Give the Lease back so a follower takes over at its next retry."""
        await self.lease.release()
