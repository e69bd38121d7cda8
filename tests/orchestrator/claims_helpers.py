"""Small steps most core tests repeat: claim a slot, expecting a start."""

from __future__ import annotations

from lorenz.model import Issue, RetryEntry, RunningEntry, slot_key
from lorenz.orchestrator import DispatchCandidate, Finished, Orchestrator, Started


async def start(orchestrator: Orchestrator, candidate: DispatchCandidate) -> Started:
    result = await orchestrator.claim(candidate)
    assert isinstance(result, Started), result
    return result


async def run(orchestrator: Orchestrator, issue: Issue, *, slot: int = 0) -> RunningEntry:
    """Make one slot of ``issue`` run, consuming its retry if there is one.

    NB: builds the candidate directly instead of calling ``eligible_issues([issue])``: that
    would prune the retries of every issue missing from the one-issue list.
    """
    key = slot_key(issue.id, slot)
    retry = orchestrator.state.retry_attempts.get(key)
    candidate = DispatchCandidate(issue, slot, key, retry)
    return (await start(orchestrator, candidate)).entry


def retry_of(finished: Finished | None) -> RetryEntry | None:
    """The retry a ``finish()`` wrote (``None`` when nothing was running or it released)."""
    return finished.retry if finished is not None else None
