"""Active-run handles: the runtime's grip on each detached run, from reservation to settle.

A dispatched run is a detached asyncio task; the poll never waits for it. The handle is
registered before the run starts acquiring a worker, so that stop() and reconciliation can abort
a run at any point of its life, and it carries *why* a run was aborted: a run that was finished
externally (stalled, canceled by reconciliation, stopped for shutdown, superseded) must not
record a result of its own — the party that aborted it already did.
"""

from __future__ import annotations

import asyncio
import dataclasses

from lorenz.model import AbortReason, Issue, SlotKey
from lorenz.model.questions import AgentQuestion


@dataclasses.dataclass(slots=True)
class ActiveRun:
    key: SlotKey
    issue_id: str
    identifier: str
    task: asyncio.Task[None] | None = None
    reason: AbortReason | None = None
    """Set when the run was finished externally."""
    superseded: bool = False
    started: bool = False
    """The slot is bound and its agent run under way (not just reserving a worker)."""
    exited: bool = False
    """The agent run is over; the slot is being settled (no turn is in progress)."""
    launching: bool = False
    """Its worker is being launched: the launch's own bound applies, not the stall timeout."""
    launched_at_ms: float | None = None
    """When its worker's launch answered (monotonic ms): the stall clock starts again there."""
    question: AgentQuestion | None = None
    """The run ended because its agent asked this: the slot waits for an answer."""
    placing: bool = False
    """The slot is reserved and its worker being placed (a Pod of its own, bound once it
    serves): the worker, and its agent, may already run, named by the Claim's spawn intent."""

    @property
    def is_active(self) -> bool:
        """Whether this run may still record its own result."""
        return self.reason is None and not self.superseded

    def finish_externally(self, reason: AbortReason) -> None:
        """Mark the run as settled by someone else and cancel its task."""
        if self.reason is None:
            self.reason = reason
        if self.task is not None and not self.task.done():
            self.task.cancel()


@dataclasses.dataclass(slots=True)
class TerminalGrace:
    """An issue that turned terminal while some of its runs were in a turn.

    Those runs may finish the turn (no new one starts); whichever comes first ends the grace:
    the last of them settling, or the deadline timer, which cancels what is still going.
    """

    issue: Issue
    """The terminal issue as the tracker returned it."""
    keys: set[SlotKey]
    """Running slots still finishing their turn."""
    timer: asyncio.TimerHandle | None = None


@dataclasses.dataclass(slots=True)
class PendingExit:
    """A run whose agent exited cleanly, waiting for the by-id read that decides its slot.

    The decision (continuation retry while the issue stays active, release otherwise) is made
    by the next dispatch pass or tick, which batches every pending exit with the revalidation
    of the candidates it is about to start into one tracker read; then ``decided`` is set.
    """

    run: ActiveRun
    decided: asyncio.Future[None]

    @property
    def key(self) -> SlotKey:
        return self.run.key

    @property
    def issue_id(self) -> str:
        return self.run.issue_id


class ActiveRuns:
    """The handles by slot key."""

    def __init__(self) -> None:
        self._runs: dict[SlotKey, ActiveRun] = {}

    def register(self, run: ActiveRun) -> None:
        previous = self._runs.get(run.key)
        if previous is not None and previous is not run:
            previous.superseded = True
        self._runs[run.key] = run

    def get(self, key: SlotKey) -> ActiveRun | None:
        return self._runs.get(key)

    def discard(self, run: ActiveRun) -> None:
        if self._runs.get(run.key) is run:
            del self._runs[run.key]

    def of_issue(self, issue_id: str) -> list[ActiveRun]:
        return [run for run in self._runs.values() if run.issue_id == issue_id]

    def all(self) -> list[ActiveRun]:
        return list(self._runs.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._runs.values() if r.task is not None and not r.task.done()]

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, key: object) -> bool:
        return key in self._runs
