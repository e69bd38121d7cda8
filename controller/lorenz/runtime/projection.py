"""Bounded projections of what happened, for people: recent events and run history.

The orchestrator keeps only what scheduling needs; the dashboard, API and TUI also want "what
just happened". These ring buffers hold the last few of each, in memory, with hard caps so a
long-lived daemon's memory stays flat however many runs it has seen. Events and records are
frozen, so a snapshot shares them instead of copying.
"""

from __future__ import annotations

import collections

from lorenz.model import RunRecord, RuntimeEvent

RECENT_EVENTS_CAP = 20
RUN_HISTORY_CAP = 50


class Projection:
    """The last :data:`RECENT_EVENTS_CAP` events and :data:`RUN_HISTORY_CAP` finished runs."""

    def __init__(self) -> None:
        self._events: collections.deque[RuntimeEvent] = collections.deque(
            maxlen=RECENT_EVENTS_CAP
        )
        self._history: collections.deque[RunRecord] = collections.deque(maxlen=RUN_HISTORY_CAP)
        self.events_seen = 0
        self.runs_seen = 0

    def record_event(self, event: RuntimeEvent) -> None:
        self._events.append(event)
        self.events_seen += 1

    def record_run(self, record: RunRecord) -> None:
        self._history.append(record)
        self.runs_seen += 1

    def recent_events(self) -> tuple[RuntimeEvent, ...]:
        """Newest first."""
        return tuple(reversed(self._events))

    def run_history(self) -> tuple[RunRecord, ...]:
        """Newest first."""
        return tuple(reversed(self._history))
