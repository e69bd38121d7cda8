"""The per-issue journal behind the issue detail: bounded, follows identifiers, sums tokens."""

from __future__ import annotations

import datetime
from typing import Any

from lorenz.claims import MemoryClaimStore
from lorenz.config import WorkflowSettings
from lorenz.model import AgentUpdate, EventType, ManualClock, RuntimeEvent, TokenUsage
from lorenz.orchestrator import AgentProgress, Orchestrator, Started
from lorenz.server import IssueJournal
from lorenz.server.journal import EVENTS_PER_ISSUE
from tests.server.helpers import issue

AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _event(kind: str, n: int, **fields: Any) -> RuntimeEvent:
    fields.setdefault("identifier", f"T-{n}")
    return RuntimeEvent(type=EventType(kind), at=AT, issue_id=f"id-{n}", **fields)


def _update(key: str, agent_event: str, progress: AgentProgress | None = None) -> RuntimeEvent:
    """A ``run_update`` as the runtime emits it after ``apply_update()`` answered ``progress``."""
    return RuntimeEvent(
        type=EventType.RUN_UPDATE,
        at=AT,
        slot_key=key,
        agent_event=agent_event,
        issue_id=progress.issue_id if progress is not None else None,
        identifier=progress.identifier if progress is not None else None,
        message=progress.message if progress is not None else None,
        run_usage=progress.usage if progress is not None else None,
        agent_at=progress.at if progress is not None else None,
    )


def _orchestrator() -> Orchestrator:
    settings = WorkflowSettings.model_validate({"tracker": {"kind": "memory"}})
    return Orchestrator(settings=settings, store=MemoryClaimStore(owner="t"), clock=ManualClock())


def test_only_the_most_recently_active_issues_are_kept() -> None:
    journal = IssueJournal(capacity=3)
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
    journal = IssueJournal()
    for _ in range(EVENTS_PER_ISSUE + 10):
        journal.on_event(_event("dispatch_skipped", 1, slot=0))
    renamed = _event("run_started", 1, slot=0, identifier="NEW-1")
    journal.on_event(renamed)

    trail = journal.find("NEW-1")
    assert trail is not None
    assert len(trail.events) == EVENTS_PER_ISSUE
    assert journal.find("T-1") is None
    assert journal.find("id-1") is trail
    assert journal.find("new-1") is trail
    journal.on_event(RuntimeEvent(type=EventType.POLL_COMPLETED, at=AT))  # no issue
    journal.on_event(_update("unknown#0", "x"))
    assert len(journal) == 1


async def test_tokens_of_ended_runs_are_kept_and_live_ones_tracked() -> None:
    orchestrator = _orchestrator()
    journal = IssueJournal()
    (candidate,) = await orchestrator.eligible_issues([issue(1)])
    result = await orchestrator.claim(candidate)
    assert isinstance(result, Started)
    key = result.entry.key

    journal.on_event(_event("run_started", 1, slot=0))
    progress = await orchestrator.apply_update(key, AgentUpdate(
        event="turn", message="working", usage=TokenUsage(10, 4, 14)))
    journal.on_event(_update(key, "turn", progress))
    progress = await orchestrator.apply_update(key, AgentUpdate(event="delta"))
    journal.on_event(_update(key, "delta", progress))
    trail = journal.find("T-1")
    assert trail is not None
    assert trail.live_usage[key] == TokenUsage(10, 4, 14)
    assert [u["message"] for u in trail.agent_updates] == ["working", None]

    journal.on_event(_event("run_failed", 1, slot=0, message="agent exited 3"))

    assert trail.finished_usage == TokenUsage(10, 4, 14)
    assert trail.live_usage == {}
    assert trail.last_error == "agent exited 3"
    assert trail.runs_started == 1
