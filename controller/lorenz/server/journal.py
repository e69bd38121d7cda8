"""Per-issue trails of what happened, for the issue detail route.

The runtime keeps the last 20 events and 50 finished runs for the whole workflow; on a busy
daemon one issue's story falls out of those rings within seconds. The detail view wants more:
that issue's own recent events, the last messages its agent sent, and the tokens its runs used
— including runs that ended long ago. This journal listens to the runtime's events and keeps a
small bounded trail per issue, and a bounded number of issues (least recently active dropped
first), so a long-lived process stays flat in memory however many issues pass through it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from lorenz.model import EventType, RuntimeEvent, SlotKey, TokenUsage, slot_key

EVENTS_PER_ISSUE = 30
AGENT_UPDATES_PER_ISSUE = 20
ISSUES_KEPT = 1000

_RUN_ENDS = frozenset(
    {
        EventType.RUN_FINISHED,
        EventType.RUN_FAILED,
        EventType.RUN_STALLED,
        EventType.RUN_CANCELED,
    }
)


@dataclasses.dataclass(slots=True)
class IssueTrail:
    """What the journal remembers about one issue."""

    issue_id: str
    identifier: str
    events: collections.deque[RuntimeEvent] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=EVENTS_PER_ISSUE)
    )
    agent_updates: collections.deque[dict[str, Any]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=AGENT_UPDATES_PER_ISSUE)
    )
    finished_usage: TokenUsage = dataclasses.field(default_factory=TokenUsage)
    """Tokens of this issue's runs that ended while the journal listened."""
    live_usage: dict[SlotKey, TokenUsage] = dataclasses.field(default_factory=dict)
    """Tokens of runs in flight, as last seen (folded into ``finished_usage`` at their end)."""
    last_messages: dict[SlotKey, str | None] = dataclasses.field(default_factory=dict)
    runs_started: int = 0
    last_error: str | None = None


class IssueJournal:
    """Feeds on one runtime's events; answers "what do we know about this issue?"."""

    def __init__(self, *, capacity: int = ISSUES_KEPT):
        self._capacity = capacity
        self._trails: collections.OrderedDict[str, IssueTrail] = collections.OrderedDict()
        self._by_identifier: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._trails)

    def find(self, identifier_or_id: str) -> IssueTrail | None:
        """The trail of an issue by identifier (exact, then case-insensitive) or by id."""
        issue_id = self._by_identifier.get(identifier_or_id)
        if issue_id is None and identifier_or_id in self._trails:
            issue_id = identifier_or_id
        if issue_id is None:
            folded = identifier_or_id.casefold()
            issue_id = next(
                (iid for ident, iid in self._by_identifier.items() if ident.casefold() == folded),
                None,
            )
        return self._trails.get(issue_id) if issue_id is not None else None

    def on_event(self, event: RuntimeEvent) -> None:
        """The runtime event listener (never raises into the runtime: it guards us anyway)."""
        kind = event.type
        if kind is EventType.RUN_UPDATE:
            self._on_agent_update(event)
            return
        issue_id, identifier = event.issue_id, event.identifier
        if issue_id is None or identifier is None:
            return
        trail = self._trail(issue_id, identifier)
        trail.events.append(event)
        key = slot_key(issue_id, event.slot) if event.slot is not None and event.slot >= 0 else None
        if kind is EventType.RUN_STARTED:
            trail.runs_started += 1
            if key is not None:
                trail.live_usage[key] = TokenUsage()
                trail.last_messages.pop(key, None)
        elif kind in _RUN_ENDS and key is not None:
            usage = trail.live_usage.pop(key, None)
            trail.last_messages.pop(key, None)
            if usage is not None:
                trail.finished_usage = trail.finished_usage + usage
            if kind in (EventType.RUN_FAILED, EventType.RUN_STALLED):
                trail.last_error = event.message or trail.last_error
        elif kind is EventType.RETRY_SCHEDULED and event.error:
            trail.last_error = event.error

    def _on_agent_update(self, event: RuntimeEvent) -> None:
        if event.slot_key is None:
            return
        if event.issue_id is None or event.identifier is None or event.run_usage is None:
            return  # the slot was no longer running when its update arrived
        slot = SlotKey(event.slot_key)
        trail = self._trail(event.issue_id, event.identifier)
        trail.live_usage[slot] = event.run_usage
        # NB: the orchestrator keeps the previous message when an update carries none, so a
        # message is attributed to an update only when it changed.
        message = None
        if event.message != trail.last_messages.get(slot):
            message = event.message
        trail.last_messages[slot] = event.message
        trail.agent_updates.append(
            {
                "at": event.agent_at.isoformat() if event.agent_at else None,
                "slot_key": event.slot_key,
                "event": event.agent_event,
                "message": message,
            }
        )

    def _trail(self, issue_id: str, identifier: str) -> IssueTrail:
        trail = self._trails.get(issue_id)
        if trail is None:
            trail = IssueTrail(issue_id=issue_id, identifier=identifier)
            self._trails[issue_id] = trail
            while len(self._trails) > self._capacity:
                _, dropped = self._trails.popitem(last=False)
                if self._by_identifier.get(dropped.identifier) == dropped.issue_id:
                    del self._by_identifier[dropped.identifier]
        else:
            self._trails.move_to_end(issue_id)
            if trail.identifier != identifier:
                # An identifier can change (an issue moved between projects): follow it.
                if self._by_identifier.get(trail.identifier) == issue_id:
                    del self._by_identifier[trail.identifier]
                trail.identifier = identifier
        self._by_identifier[identifier] = issue_id
        return trail
