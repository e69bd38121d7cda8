"""The per-issue journal behind the issue detail: bounded, follows identifiers, sums tokens."""

from __future__ import annotations

from lorenz.claims import MemoryClaimStore
from lorenz.config import WorkflowSettings
from lorenz.model import AgentUpdate, ManualClock, TokenUsage
from lorenz.orchestrator import Orchestrator, Started
from lorenz.server import IssueJournal
from lorenz.server.journal import EVENTS_PER_ISSUE
from tests.server.helpers import issue


def _event(kind: str, n: int, **fields: object) -> dict[str, object]:
    return {"type": kind, "at": "2026-01-01T00:00:00+00:00", "issue_id": f"id-{n}",
            "identifier": f"T-{n}", **fields}


def _orchestrator() -> Orchestrator:
    settings = WorkflowSettings.model_validate({"tracker": {"kind": "memory"}})
    return Orchestrator(settings=settings, store=MemoryClaimStore(owner="t"), clock=ManualClock())


def test_only_the_most_recently_active_issues_are_kept() -> None:
    orchestrator = _orchestrator()
    journal = IssueJournal(orchestrator=lambda: orchestrator, capacity=3)
    for n in range(1, 5):
        journal.on_event(_event("run_started", n, slot=0))
    journal.on_event(_event("retry_scheduled", 2, slot=0, error="boom"))  # 2 is active again
    journal.on_event(_event("run_started", 5, slot=0))

    assert len(journal) == 3
    assert journal.find("T-1") is None
    assert journal.find("T-3") is None
    kept = journal.find("T-2")
    assert kept is not None
    assert kept.last_error == "boom"
    assert journal.find("T-5") is not None


def test_events_per_issue_are_bounded_and_identifiers_followed() -> None:
    orchestrator = _orchestrator()
    journal = IssueJournal(orchestrator=lambda: orchestrator)
    for _ in range(EVENTS_PER_ISSUE + 10):
        journal.on_event(_event("dispatch_skipped", 1, slot=0))
    renamed = {**_event("run_started", 1, slot=0), "identifier": "NEW-1"}
    journal.on_event(renamed)

    trail = journal.find("NEW-1")
    assert trail is not None
    assert len(trail.events) == EVENTS_PER_ISSUE
    assert journal.find("T-1") is None
    assert journal.find("id-1") is trail
    assert journal.find("new-1") is trail
    journal.on_event({"type": "poll_completed", "at": "2026-01-01T00:00:00+00:00"})  # no issue
    journal.on_event({"type": "run_update", "slot_key": "unknown#0", "event": "x"})
    assert len(journal) == 1


async def test_tokens_of_ended_runs_are_kept_and_live_ones_tracked() -> None:
    orchestrator = _orchestrator()
    journal = IssueJournal(orchestrator=lambda: orchestrator)
    (candidate,) = await orchestrator.eligible_issues([issue(1)])
    result = await orchestrator.claim(candidate)
    assert isinstance(result, Started)
    key = result.entry.key

    journal.on_event(_event("run_started", 1, slot=0))
    await orchestrator.apply_update(key, AgentUpdate(
        event="turn", message="working", usage=TokenUsage(10, 4, 14)))
    journal.on_event({"type": "run_update", "slot_key": key, "event": "turn"})
    await orchestrator.apply_update(key, AgentUpdate(event="delta"))
    journal.on_event({"type": "run_update", "slot_key": key, "event": "delta"})
    trail = journal.find("T-1")
    assert trail is not None
    assert trail.live_usage[key] == TokenUsage(10, 4, 14)
    assert [u["message"] for u in trail.agent_updates] == ["working", None]

    journal.on_event(_event("run_failed", 1, slot=0, message="agent exited 3"))

    assert trail.finished_usage == TokenUsage(10, 4, 14)
    assert trail.live_usage == {}
    assert trail.last_error == "agent exited 3"
    assert trail.runs_started == 1
