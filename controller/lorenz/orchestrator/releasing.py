"""Forgetting slots: what a slot leaves behind when it is released without a retry.

Why a module of its own: a slot's state is spread over several maps (running, reserved, the
pending retry, the block, and the streaks and budgets kept per slot), and a release that
missed one would leave a slot half-remembered: counted against a cap, or deciding a later
streak with an old budget. The one list of what a slot holds is here; the
:class:`~lorenz.orchestrator.scheduling.Orchestrator` releases the rows and adds the runs to
the totals.
"""

from __future__ import annotations

import dataclasses

from lorenz.model import ReservationRecord, RetryEntry, RunningEntry, SlotKey
from lorenz.orchestrator.state import BlockedEntry, OrchestratorState


def forget_streaks(state: OrchestratorState, key: SlotKey) -> None:
    """Drop the slot's failure and continuation streaks and its retry budgets."""
    state.failure_streaks.pop(key, None)
    state.retry_budgets.pop(key, None)
    state.restored_budgets.pop(key, None)
    state.continuation_streaks.pop(key, None)


@dataclasses.dataclass(frozen=True, slots=True)
class ForgottenSlot:
    """What one slot held when it was forgotten (each ``None`` when it held no such thing)."""

    run: RunningEntry | None
    reservation: ReservationRecord | None
    retry: RetryEntry | None
    blocked: BlockedEntry | None

    @property
    def empty(self) -> bool:
        """The slot held nothing."""
        return (
            self.run is None
            and self.reservation is None
            and self.retry is None
            and self.blocked is None
        )


def forget_slot(state: OrchestratorState, key: SlotKey) -> ForgottenSlot:
    """Remove the slot's run, reservation, retry and block, and its streaks; ``claimed`` is
    left to the caller (what a release discards from it differs)."""
    gone = ForgottenSlot(
        run=state.running.pop(key, None),
        reservation=state.reserved.pop(key, None),
        retry=state.retry_attempts.pop(key, None),
        blocked=state.blocked.pop(key, None),
    )
    forget_streaks(state, key)
    return gone
