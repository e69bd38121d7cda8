"""What a Workflow's status says, as a pure function of what its leader knows.

The controller gathers the facts (is a runtime running, which generation is applied, which was
rejected and why, the runtime's last snapshot, the Lease record) into :class:`StatusInputs`;
:func:`workflow_status` turns them into the status body. Keeping it pure means every rule of
the conditions (Ready, Leading, Degraded, NetworkPolicyEnforced) is tested without a cluster,
a runtime or a clock, and that the status a leader would write is the same whatever order the
facts arrived in.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from lorenz.kube.api.statuses import (
    DEGRADED,
    LEADING,
    NETWORK_POLICY_ENFORCED,
    READY,
    Condition,
    ConditionStatus,
    LeaderStatus,
    condition,
    reason_from_code,
    status_from_snapshot,
)
from lorenz.model import DispatchPause, RuntimeSnapshot, SlotKey


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Degradation:
    """Why the Workflow is degraded: a rejected spec or a runtime that failed to start."""

    code: str
    """The stable error code (also the condition's reason)."""
    message: str
    """The one-line message saying what to do."""
    generation: int
    """The generation it concerns."""
    stage: str = "rejected"
    """What happened to that generation (``rejected``, ``failed to start``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StatusInputs:
    """Everything the status of one Workflow depends on, at one moment."""

    generation: int
    """``metadata.generation`` of the newest object seen."""
    applied_generation: int | None
    """The generation the running runtime was built from (``None``: none applied yet)."""
    candidate_generation: int = 0
    """The newest generation that was loaded (successfully or not)."""
    degraded: Degradation | None = None
    running: bool = False
    """A runtime exists (it may still be starting)."""
    snapshot: RuntimeSnapshot | None = None
    """The runtime's last snapshot."""
    nodes: Mapping[SlotKey, str] = dataclasses.field(default_factory=dict)
    """The node of each slot's run Pod, where the Pod watch saw one (``status.placements``)."""
    releasing: bool = False
    """The leader is handing the Workflow over (shutdown)."""
    identity: str
    """This replica's identity."""
    lease_name: str
    acquired_at: datetime.datetime | None = None
    transitions: int = 0
    endpoint: str | None = None
    """Where this replica serves the API."""
    network_policy: tuple[ConditionStatus, str, str] | None = None
    """The ``NetworkPolicyEnforced`` condition's status, reason and message (``None``: no probe
    answered, or the probe is off: the condition is left out)."""


STARTING_REASON = "Starting"
"""``Ready``'s reason while the runtime has neither polled nor failed yet."""


def ready_condition(inputs: StatusInputs) -> tuple[ConditionStatus, str, str]:
    """``Ready``: the runtime polls successfully."""
    if inputs.releasing:
        return ("False", "NoLeader", "the leader released the Lease; a follower takes over")
    if not inputs.running and inputs.degraded is not None:
        return ("False", reason_from_code(inputs.degraded.code), inputs.degraded.message)
    if not inputs.running or inputs.snapshot is None:
        return ("Unknown", STARTING_REASON, "the runtime is starting")
    poll = inputs.snapshot.poll
    if poll.last_error:
        return ("False", "PollFailed", poll.last_error)
    if poll.last_poll_at is None:
        return ("Unknown", STARTING_REASON, "waiting for the first poll")
    return (
        "True",
        "Polling",
        f"last poll: {poll.candidates} candidates, {poll.eligible} eligible",
    )


def dispatch_pause_of(inputs: StatusInputs) -> DispatchPause | None:
    """Why the running runtime pauses dispatch, from its last snapshot (``None``: it does not)."""
    if not inputs.running or inputs.snapshot is None:
        return None
    return inputs.snapshot.poll.dispatch_paused


def workflow_status(
    inputs: StatusInputs, previous: Sequence[Condition], now: datetime.datetime
) -> dict[str, Any]:
    """The status body (wire form); conditions keep their transition times from ``previous``."""
    applied = inputs.applied_generation
    ready = ready_condition(inputs)
    leading: tuple[ConditionStatus, str, str]
    if inputs.releasing:
        leading = ("False", "LeaseReleased", f"{inputs.identity} released the Lease")
    else:
        leading = ("True", "LeaseHeld", f"{inputs.identity} holds Lease {inputs.lease_name}")
    degradation = inputs.degraded
    degraded: tuple[ConditionStatus, str, str]
    if degradation is not None:
        kept = f" (running generation {applied})" if applied is not None else ""
        degraded = (
            "True",
            reason_from_code(degradation.code),
            f"generation {degradation.generation} {degradation.stage}{kept}: "
            f"{degradation.message}",
        )
        degraded_generation = degradation.generation
    elif (paused := dispatch_pause_of(inputs)) is not None:
        # NB: the spec is fine, the host is not (the claim store refuses writes, run Pods
        # cannot be placed or started): runs under way go on, nothing new starts until a
        # probe succeeds; the reason is the fault's code.
        degraded = (
            "True",
            reason_from_code(paused.code),
            f"dispatch paused since {paused.since.isoformat()}: {paused.message}",
        )
        degraded_generation = applied if applied is not None else inputs.generation
    else:
        degraded = ("False", "SpecApplied", f"generation {applied} applied")
        degraded_generation = applied if applied is not None else inputs.generation
    conditions = [
        condition(
            READY, ready[0], reason=ready[1], message=ready[2],
            generation=applied if applied is not None else inputs.generation,
            now=now, previous=previous,
        ),
        condition(
            LEADING, leading[0], reason=leading[1], message=leading[2],
            generation=inputs.generation, now=now, previous=previous,
        ),
        condition(
            DEGRADED, degraded[0], reason=degraded[1], message=degraded[2],
            generation=degraded_generation, now=now, previous=previous,
        ),
    ]
    if inputs.network_policy is not None:
        enforced, reason, message = inputs.network_policy
        conditions.append(condition(
            NETWORK_POLICY_ENFORCED, enforced, reason=reason_from_code(reason), message=message,
            generation=applied if applied is not None else inputs.generation,
            now=now, previous=previous,
        ))
    observed = max(
        applied or 0,
        inputs.candidate_generation,
        degradation.generation if degradation is not None else 0,
    )
    status: dict[str, Any] = {
        "observedGeneration": observed or None,
        "conditions": [c.wire() for c in conditions],
        "leader": LeaderStatus(
            identity=None if inputs.releasing else inputs.identity,
            acquired_at=None if inputs.releasing else inputs.acquired_at,
            transitions=inputs.transitions,
            endpoint=None if inputs.releasing else inputs.endpoint,
        ).wire(),
    }
    if inputs.snapshot is not None:
        status.update(status_from_snapshot(inputs.snapshot, nodes=inputs.nodes))
    return status


BOOKKEEPING = ("lastPollAt", "nextPollAt", "count")
"""Keys of ``status.poll`` that move on every tick while nothing else does: a status that differs
from the last one written only in these is not written, except as a heartbeat once per
``idle_status_interval_seconds`` (an hour by default); they are always current in the operator's
API and in ``lorenz_poll_duration_seconds_count``."""


def only_bookkeeping_changed(status: Mapping[str, Any], previous: Mapping[str, Any]) -> bool:
    """Whether ``status`` differs from ``previous`` only in the poll bookkeeping."""

    def without(body: Mapping[str, Any]) -> dict[str, Any]:
        stripped = dict(body)
        poll = dict(stripped.get("poll") or {})
        for key in BOOKKEEPING:
            poll.pop(key, None)
        stripped["poll"] = poll
        return stripped

    # NB: the first poll (``lastPollAt`` appearing) also flips Ready, so it is never deferred.
    first_poll = bool((status.get("poll") or {}).get("lastPollAt")) != bool(
        (previous.get("poll") or {}).get("lastPollAt")
    )
    return not first_poll and without(status) == without(previous)
