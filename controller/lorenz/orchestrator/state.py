"""The single authoritative scheduling state, as plain data.

:class:`OrchestratorState` is what the orchestrator writes and everybody else reads (the runtime
for dispatch and timers, the snapshot for the UIs). It is deliberately dumb: maps keyed by slot
key, no behaviour beyond counting. The invariants that make it meaningful are kept by
:class:`~lorenz.orchestrator.Orchestrator`:

* ``claimed`` is exactly ``running`` plus ``reserved`` — never a retrying slot;
* no slot key is both claimed and in ``retry_attempts``;
* occupancy (running plus reserved) never grows past a cap.

NB: the blocked-for-input lane some Symphony implementations keep is not kept: a run that
asks for operator input fails and retries with backoff (Symphony's first-draft behaviour; see
docs/architecture.md for what Symphony is), so
there is no ``blocked`` map and the snapshot's ``blocked`` lane is always empty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from lorenz.model import ReservationRecord, RetryEntry, RunningEntry, SlotKey, UsageTotals


@dataclasses.dataclass(slots=True)
class ForeignClaim:
    """A slot another owner holds: we do not try to claim it again before ``recheck_at_ms``."""

    owner: str | None
    """The holder, when known (from hydration); ``None`` when only a failed acquire told us."""
    recheck_at_ms: float
    """Monotonic time after which a claim attempt may go to the store again."""


@dataclasses.dataclass(slots=True)
class OrchestratorState:
    """Everything in flight, keyed by slot key."""

    running: dict[SlotKey, RunningEntry] = dataclasses.field(default_factory=dict)
    reserved: dict[SlotKey, ReservationRecord] = dataclasses.field(default_factory=dict)
    claimed: set[SlotKey] = dataclasses.field(default_factory=set)
    """Running and reserved slot keys, never retrying ones."""
    retry_attempts: dict[SlotKey, RetryEntry] = dataclasses.field(default_factory=dict)
    completed: set[str] = dataclasses.field(default_factory=set)
    """Issue ids that finished at least one run (bookkeeping only, never gates dispatch)."""
    usage_totals: UsageTotals = dataclasses.field(default_factory=UsageTotals)
    """Usage of *ended* runs; live runs are added on top by the snapshot."""
    rate_limits: Mapping[str, Any] | None = None
    """The latest rate-limit payload any agent reported."""
    foreign: dict[SlotKey, ForeignClaim] = dataclasses.field(default_factory=dict)
    """Slots held by other live owners of the same claim store."""

    def occupied(self) -> int:
        """Running plus reserved slots: what every cap counts."""
        return len(self.running) + len(self.reserved)

    def occupied_in_state(self, state_key: str) -> int:
        """Occupied slots whose issue is currently in the normalized state ``state_key``."""
        count = 0
        for entry in self.running.values():
            if entry.issue.state_key == state_key:
                count += 1
        for reservation in self.reserved.values():
            if reservation.issue.state_key == state_key:
                count += 1
        return count

    def host_load(self) -> dict[str, int]:
        """Running slots per worker host (local runs, host ``None``, are not counted)."""
        load: dict[str, int] = {}
        for entry in self.running.values():
            if entry.host is not None:
                load[entry.host] = load.get(entry.host, 0) + 1
        return load

    def tracked_issue_ids(self) -> set[str]:
        """Issues with a slot reserving, running or waiting to retry."""
        ids = {entry.issue.id for entry in self.running.values()}
        ids.update(reservation.issue.id for reservation in self.reserved.values())
        ids.update(retry.issue_id for retry in self.retry_attempts.values())
        return ids
