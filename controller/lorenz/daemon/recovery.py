"""Recovery passes while running: the claims of owners that die after we started come back.

Start-up hydration takes over every owner that is stale or dead at that moment. An owner that
dies *later* — a plain ``lorenz --feature durable_claims`` run sharing the store, a daemon
killed while another process runs — would otherwise keep its slots for as long as we live:
``acquire`` refuses a stale owner's row by design (its run must come back as a failure retry,
not be overwritten as new work), so every tick would skip them as ``claimed_elsewhere``.

So a process with a durable store runs a pass every ``claim_store.recovery_interval_ms``:

1. prove leadership, when it holds a lease (a process that lost it mutates nothing);
2. ask the store which other owners are stale or dead *now* (``stale_owners``: one read
   transaction; an owner on this host is proven dead or alive by pid and start time);
3. kill the agents of those proven dead (the orphan sweep, :mod:`lorenz.daemon.orphans`) — if
   some survive, the pass gives up and the next one tries again: no slot may be dispatched
   while an old agent still works on it;
4. have the orchestrator take their claims over (re-checked inside the store's transaction)
   and turn them into retries, exactly as hydration does;
5. ask the runtime for a poll, so a retry that is already due is dispatched now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from lorenz.daemon.orphans import kill_orphans
from lorenz.orchestrator import HydrationReport, Orchestrator

logger = logging.getLogger("lorenz.daemon")


class StaleOwnerSource(Protocol):
    """The part of a durable claim store a pass reads (:class:`~lorenz.claims.SqlClaimStore`)."""

    async def stale_owners(self) -> frozenset[str]: ...


class RecoveryPasses:
    """Periodic takeover of stale and dead owners' claims, for one running orchestrator."""

    def __init__(
        self,
        *,
        store: StaleOwnerSource,
        orchestrator: Orchestrator,
        interval_ms: int,
        prove_leadership: Callable[[], Awaitable[None]] | None = None,
        on_recovered: Callable[[], object] | None = None,
        sweep: Callable[[Collection[str]], list[int]] = kill_orphans,
    ) -> None:
        self._store = store
        self._orchestrator = orchestrator
        self._interval_s = interval_ms / 1000.0
        self._prove_leadership = prove_leadership
        self._on_recovered = on_recovered
        self._sweep = sweep
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        """Passes completed (for diagnostics and tests)."""

    async def run_once(self) -> HydrationReport | None:
        """One pass; ``None`` when no other owner was stale or dead."""
        if self._prove_leadership is not None:
            await self._prove_leadership()
        stale = await self._store.stale_owners()
        if not stale:
            self.passes += 1
            return None
        # NB: first no agent of a dead owner may still run, then its slots may become ours.
        killed = await asyncio.to_thread(self._sweep, stale)
        report = await self._orchestrator.take_over(stale)
        self.passes += 1
        if report.interrupted or report.adopting or report.restored_retries:
            logger.info(
                "claims recovered from=%s interrupted=%s adopting=%s restored_retries=%s "
                "agents_killed=%s",
                ",".join(sorted(report.taken_over_from)),
                len(report.interrupted),
                len(report.adopting),
                len(report.restored_retries),
                len(killed),
            )
            if self._on_recovered is not None:
                self._on_recovered()
        for problem in report.problems:
            logger.warning("recovered claim skipped code=%s: %s", problem.code, problem.message)
        return report

    def start(self) -> None:
        """Run a pass every interval until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="lorenz-claim-recovery"
            )

    async def stop(self) -> None:
        """Stop the passes (a pass in flight is cancelled; the store commits or not, whole)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - surviving orphans, a busy store: retried
                logger.warning(
                    "claim recovery pass failed (retrying) code=%s: %s",
                    getattr(exc, "code", type(exc).__name__),
                    exc,
                )
