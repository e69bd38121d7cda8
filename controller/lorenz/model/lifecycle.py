"""The run's lifecycle in one place: every phase, kind, outcome and reason a slot or its run
passes through, and (here) how one leads to the next.

These enums were spread over five modules (claims, events, reconciliation, the runtime's run
handles, the worker); each doc that drew a part of the lifecycle drew it from a different one.
They are all plain string enums whose values are written to claim rows, checkpoints, events and
``Claim`` resources, so a value never changes once released.

The slot (one issue slot, as the orchestrator keeps it; :class:`ClaimPhase` is what the claim
row stores)::

    unclaimed ──claim──▶ Reserved ──bind──▶ Running ──finish──▶ RetryPending ──due──▶ unclaimed
         │                  │ cancel / expire (no backoff, consumed retry restored)   ▲
         │                  │ give back (not placed: a ``placement`` retry) ──────────┤
         └──claim (static path, no pool)───────▶ Running                              │
    Running ──finish (budget used up, a question, the continuation limit)──▶ blocked   │
    blocked ──unblock (refresh, the issue changed)──▶ RetryPending ────────────────────┘
    any ──cleanup (reconciliation: a :class:`StopReason`) / release──▶ released (no row)

A run ends with a :class:`RunOutcome`; the retry it leaves is of a :class:`RetryKind`:
``success`` → ``continuation`` (after :data:`~lorenz.policies.backoff.CONTINUATION_DELAY_MS`),
``failed`` / ``stalled`` → ``failure`` (backoff) or blocked (:class:`BlockReason`), a lost
controller → ``adoption`` (re-attach to the worker), an unplaced first run → ``placement``. A
run stopped from outside carries an :class:`AbortReason` and records no result of its own.

The spawn of a slot's worker, as the claim records it (:class:`SpawnPhase`, written *before*
the step it names)::

    provisioning ──▶ spawn_requested ──▶ probing ──▶ running
         │                 │                │           └──(run settled)──▶ compensated
         └─────────────────┴────────────────┴──(worker never started)──▶ compensated
                           └────────────────┴──(probe answers unknown)──▶ quarantined

The worker process itself (:class:`WorkerPhase`)::

    starting ──▶ preparing (hooks) ──▶ agent ──▶ cleanup (after_run) ──▶ final

docs/scheduling.md and docs/runs.md describe each step; they link here for the names.
"""

from __future__ import annotations

import enum


class ClaimPhase(enum.StrEnum):
    """Where a claimed slot is in its lifecycle (also the ``Claim`` resource's phase)."""

    RESERVED = "Reserved"
    RUNNING = "Running"
    RETRY_PENDING = "RetryPending"


class SpawnPhase(enum.StrEnum):
    """Where the spawn of a slot's worker is, as the claim records it (see docs/runs.md).

    Written *before* each step it names, so a successor that finds the claim knows which
    process work may have happened and probes the handle instead of guessing.
    """

    PROVISIONING = "provisioning"
    """The claim is taken and the handle computed; no process was started yet."""
    SPAWN_REQUESTED = "spawn_requested"
    """``lorenz worker`` is about to be (or was) run for the handle."""
    PROBING = "probing"
    """The launch answered; the controller checks that the worker serves."""
    RUNNING = "running"
    """The worker serves; ``last_seq`` is what the controller collected of its journal."""
    COMPENSATED = "compensated"
    """The run failed and was settled (a failure retry was written); nothing to probe."""
    QUARANTINED = "quarantined"
    """The worker could not be probed (``unknown``): neither adopted nor retried; it counts
    against concurrency until the fence expires by the store's clock."""


SETTLED_SPAWN_PHASES = frozenset({SpawnPhase.COMPENSATED})
"""Phases that leave nothing for a successor to probe."""


class RetryKind(enum.StrEnum):
    """Why a slot waits before it may run again."""

    CONTINUATION = "continuation"
    """The last run ended cleanly; check back shortly in case the issue is still active."""
    FAILURE = "failure"
    """The last run failed, stalled or could not start; back off exponentially."""
    ADOPTION = "adoption"
    """The last run's controller was lost but its worker may live on: due at once, the run
    re-attaches to that worker (see :attr:`~lorenz.model.RetryEntry.resume`); no failure is
    counted."""
    PLACEMENT = "placement"
    """A first run could not be placed (no node fits its Pod, its image cannot be pulled, a
    quota refused it): the reservation was given back. Due after a short wait, as a first run
    again (attempt 0 stands for none); no attempt and no failure is counted. A run that was
    already a retry gets its own retry back instead, with the placement's reason."""


class RunOutcome(enum.StrEnum):
    """How a run ended (the ``outcome`` of its events and of the run history)."""

    SUCCESS = "success"
    FAILED = "failed"
    STALLED = "stalled"
    CANCELED = "canceled"
    """Reconciliation (or a deleted Claim) stopped the run; recorded in the run history like any
    other end."""


class ActionOutcome(enum.StrEnum):
    """How a blocked slot's terminal action went (the ``outcome`` of a ``terminal_action``
    event)."""

    APPLIED = "applied"
    FAILED = "failed"
    """Tried again on the next poll."""


class StopReason(enum.StrEnum):
    """Why a tracked run is stopped (the runtime's ``run_reconciled`` reason)."""

    TERMINAL = "terminal"
    UNROUTED = "unrouted"
    BLOCKED = "blocked"
    INACTIVE = "inactive"
    MISSING = "missing"


class BlockReason(enum.StrEnum):
    """Why a slot sits in the ``blocked`` lane."""

    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
    """``retry.max_attempts`` consecutive failures."""
    INPUT_REQUIRED = "input_required"
    """The agent asked a question nobody is there to answer."""
    APPROVAL_REQUIRED = "approval_required"
    """The agent asked for an approval the configured policy does not give."""
    CONTINUATION_LIMIT = "continuation_limit"
    """``agent.max_continuation_runs`` clean runs in a row left the issue active: the agent
    ends without moving it, and running it again would only repeat that."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The run crossed a spend cap (``budget``) and was stopped; ``budget.on_exhausted`` is its
    terminal action."""


class AbortReason(enum.StrEnum):
    """Why the runtime finished a run from outside (the run records no result of its own)."""

    STALLED = "stalled"
    CANCELED = "canceled"
    """Reconciliation (or a deleted Claim) stopped the run."""
    SHUTDOWN = "shutdown"
    """The runtime is stopping; the abort counts as a clean shutdown, not a failure."""
    LEADERSHIP_LOST = "leadership_lost"
    HANDED_OVER = "handed_over"
    """The runtime stops and leaves the run's detached worker to the next controller: nothing
    is recorded (its claim stays ``running`` with its spawn intent, for adoption) and no
    ``after_run`` hook runs here (the adopting controller runs it when the run ends)."""


class WorkerPhase(enum.StrEnum):
    """Where a ``lorenz worker`` process is in its one run."""

    STARTING = "starting"
    PREPARING = "preparing"
    """Workspace creation (remote placement) and ``before_run``."""
    AGENT = "agent"
    CLEANUP = "cleanup"
    """``after_run``."""
    FINAL = "final"
    """The final record is written; the worker waits for its ack, then exits."""


__all__ = [
    "SETTLED_SPAWN_PHASES",
    "AbortReason",
    "ActionOutcome",
    "BlockReason",
    "ClaimPhase",
    "RetryKind",
    "RunOutcome",
    "SpawnPhase",
    "StopReason",
    "WorkerPhase",
]
