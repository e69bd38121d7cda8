"""What the operator writes into the cluster: Workflow status, Claim spec and status, as models.

These models are the single source of three things: the ``status`` schemas of the CRDs
(converted by :mod:`lorenz.kube.api.schemas`), the dicts the operator sends (``model_dump`` by
alias, so camelCase on the wire), and the parsing of what it reads back. A Claim is the
persisted form of one :class:`~lorenz.model.ClaimRecord`: its immutable identity (which slot)
is the spec, everything that changes is the status; the split is checked against the record's
fields by a test, so a field added to the record cannot be forgotten here.

Conditions follow ``metav1.Condition``: ``lastTransitionTime`` moves only when ``status``
flips, and the list is keyed by ``type``. Only the leading replica writes any of this.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pydantic
from pydantic import Field

from lorenz.config import PASSTHROUGH_KEY
from lorenz.kube.api.casing import camel
from lorenz.model import (
    ClaimPhase,
    ClaimRecord,
    RetryKind,
    RuntimeSnapshot,
    SlotKey,
    SpawnIntent,
    SpawnPhase,
    TokenUsage,
)

ConditionStatus = Literal["True", "False", "Unknown"]

READY = "Ready"
LEADING = "Leading"
DEGRADED = "Degraded"
NETWORK_POLICY_ENFORCED = "NetworkPolicyEnforced"
"""Whether the run Pods' NetworkPolicy is enforced, as a probe Pod found (only where runs go
to Pods and the probe is on: :mod:`lorenz.kube.controller.enforcement`)."""
CONDITION_TYPES = (READY, LEADING, DEGRADED, NETWORK_POLICY_ENFORCED)

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class WireModel(pydantic.BaseModel):
    """Base of every object part the operator writes: camelCase on the wire, docstrings kept."""

    model_config = pydantic.ConfigDict(
        alias_generator=camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-safe camelCase form (``None`` values kept: a merge patch deletes them)."""
        return self.model_dump(mode="json", by_alias=True)


# -- Workflow status --------------------------------------------------------------------------


class Condition(WireModel):
    """One ``metav1.Condition``."""

    type: str = Field(max_length=316)
    """``Ready``, ``Leading``, ``Degraded`` or ``NetworkPolicyEnforced``."""
    status: ConditionStatus
    """``True``, ``False`` or ``Unknown``."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The Workflow generation the condition was computed from."""
    last_transition_time: datetime.datetime
    """When ``status`` last changed."""
    reason: str = Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)
    """Machine-readable reason: a CamelCase word, or a stable error code (``Degraded``, a
    ``NetworkPolicyEnforced`` that is not ``True``)."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details."""


class PollStatus(WireModel):
    """The runtime's poll loop as last seen by the leader."""

    last_poll_at: datetime.datetime | None = None
    """When the last tick ended."""
    next_poll_at: datetime.datetime | None = None
    """When the next tick is due (earlier if a retry, a refresh or freed capacity wakes it)."""
    interval_ms: int = 0
    """``polling.intervalMs`` in force."""
    candidates: int = 0
    """Issues the tracker returned on the last tick."""
    eligible: int = 0
    """Slots that were eligible for dispatch on the last tick."""
    count: int = 0
    """Ticks since this leader started."""
    last_error: str | None = None
    """The last tick's error (``<code>: <message>``), cleared by a successful tick."""


class LaneCounts(WireModel):
    """How many slots are in each lane."""

    running: int = 0
    """Slots with a live agent run."""
    reserving: int = 0
    """Slots waiting for a worker host."""
    retrying: int = 0
    """Slots waiting for their retry to be due."""
    blocked: int = 0
    """Slots waiting for operator input."""


PLACEMENTS_SHOWN = 50
"""At most this many runs are listed in ``status.placements`` (the Claims hold every one)."""


class RunPlacement(WireModel):
    """Where one running slot's run is placed."""

    identifier: str
    """The issue (``ABC-123``)."""
    slot: int = Field(ge=0)
    """The slot of the issue's ensemble."""
    host: str
    """The run's Pod (``worker.kind: pod``) or its ``worker.sshHosts`` entry."""
    node: str | None = None
    """The node the run's Pod is scheduled on (``worker.kind: pod``)."""


class UsageStatus(WireModel):
    """Token and time totals across every run of this Workflow (ended and running)."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    total_tokens: int = 0
    """All tokens."""
    seconds_running: float = 0.0
    """Agent wall time, summed over runs."""
    cost_usd: float = 0.0
    """Cost reported by agents that report it."""


class SpendStatus(WireModel):
    """Spend control (docs/budgets.md): the UTC day's spend against its cap, and the durable
    ledger a new leader continues the count from."""

    day: str | None = None
    """The UTC day counted (``2026-12-07``)."""
    usd_today: float = 0.0
    """USD spent by the Workflow's runs this UTC day."""
    tokens_today: int = 0
    """Tokens spent this UTC day."""
    max_usd_per_day: float = 0.0
    """``budget.maxUsdPerDay`` (``0``: no daily cap)."""
    held: int = 0
    """Issues held back at a cap (the ``budget`` lane)."""
    summary: str | None = None
    """What ``kubectl get workflows`` shows (``0.42/5.00 USD``)."""
    ledger: dict[str, Any] | None = Field(default=None, json_schema_extra={PASSTHROUGH_KEY: True})
    """Spend per issue and per day (written by the leader's claim store, read by the next
    leader's): ``{"days": {day: {tokens, usd}}, "issues": {id: {identifier, tokens, usd,
    at}}}``, bounded."""


class LeaderStatus(WireModel):
    """The replica that runs this Workflow (the Lease holder)."""

    identity: str | None = None
    """The holder identity (``<pod or host>_<id>``)."""
    acquired_at: datetime.datetime | None = None
    """When it took the Lease."""
    transitions: int = 0
    """``leaseTransitions`` of the Lease: how often leadership moved."""
    endpoint: str | None = None
    """Where that replica serves the snapshot API and metrics."""


class WorkflowStatus(WireModel):
    """``status`` of a Workflow, written by its leader."""

    observed_generation: int | None = Field(default=None, ge=0)
    """The newest spec generation the leader has processed (applied or rejected)."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    """``Ready``, ``Leading`` and ``Degraded``."""
    poll: PollStatus = Field(default_factory=PollStatus)
    """The poll loop."""
    lanes: LaneCounts = Field(default_factory=LaneCounts)
    """Slots per lane."""
    usage: UsageStatus = Field(default_factory=UsageStatus)
    """Usage totals."""
    placements: list[RunPlacement] = Field(default_factory=list, max_length=PLACEMENTS_SHOWN)
    """Where the running slots' runs are placed (their Pods), oldest first; runs in the
    operator's own Pod are not listed, and at most 50 are (``kubectl get claims`` has all)."""
    leader: LeaderStatus = Field(default_factory=LeaderStatus)
    """The current leader."""
    checkpoint: dict[str, Any] | None = Field(
        default=None, json_schema_extra={PASSTHROUGH_KEY: True}
    )
    """The orchestrator's checkpoint (usage totals) that survives a failover."""
    spend: SpendStatus | None = None
    """Spend control, while a ``budget`` cap is set; its ``ledger`` survives a failover."""


def condition(
    type_: str,
    status: ConditionStatus,
    *,
    reason: str,
    message: str = "",
    generation: int | None,
    now: datetime.datetime,
    previous: Sequence[Condition] = (),
) -> Condition:
    """A condition, keeping the previous ``lastTransitionTime`` when ``status`` did not flip."""
    before = next((c for c in previous if c.type == type_), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(
        type=type_,
        status=status,
        observed_generation=generation,
        last_transition_time=since,
        reason=reason,
        message=message[:32768],
    )


def reason_from_code(code: str) -> str:
    """A condition reason from an error code: the code itself when valid, else ``Error``."""
    import re

    return code if re.fullmatch(REASON_PATTERN, code) else "Error"


def status_from_snapshot(
    snapshot: RuntimeSnapshot, *, nodes: Mapping[SlotKey, str] | None = None
) -> dict[str, Any]:
    """The poll block, lanes and usage totals of a runtime snapshot, in wire form (``nodes``:
    the node of each slot's run Pod, for ``placements``).

    The snapshot is read typed; only the status body it becomes is a dict (the Kubernetes
    edge)."""
    poll = snapshot.poll
    lanes = snapshot.lanes
    usage = lanes.usage_totals
    return {
        "poll": PollStatus(
            last_poll_at=poll.last_poll_at,
            next_poll_at=poll.next_poll_at,
            interval_ms=poll.interval_ms,
            candidates=poll.candidates,
            eligible=poll.eligible,
            count=poll.count,
            last_error=poll.last_error,
        ).wire(),
        "lanes": LaneCounts(
            running=len(lanes.running),
            reserving=len(lanes.reserving),
            retrying=len(lanes.retrying),
            blocked=len(lanes.blocked),
        ).wire(),
        "usage": UsageStatus(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            # NB: rounded so that a status that changes only in the far decimals of a running
            # clock is not "changed" on every snapshot.
            seconds_running=round(usage.seconds_running, 1),
            cost_usd=round(usage.cost_usd, 6),
        ).wire(),
        "placements": [
            RunPlacement(
                identifier=row.identifier,
                slot=row.slot_index,
                host=row.host,
                node=(nodes or {}).get(SlotKey(row.slot_key)),
            ).wire()
            for row in sorted(lanes.running, key=lambda row: (row.started_at, row.slot_key))
            if row.host
        ][:PLACEMENTS_SHOWN],
        **_spend_status(snapshot),
    }


def _spend_status(snapshot: RuntimeSnapshot) -> dict[str, Any]:
    """``spend`` (without its ledger, which the claim store writes) while a cap is set."""
    budget = snapshot.budget
    if budget is None:
        return {}
    usd = round(budget.day_spend.usd, 6)
    cap = budget.max_usd_per_day
    spend = SpendStatus(
        day=budget.day,
        usd_today=usd,
        tokens_today=budget.day_spend.tokens,
        max_usd_per_day=cap,
        held=len(budget.held),
        summary=f"{usd:.2f}/{cap:.2f} USD" if cap > 0 else f"{usd:.2f} USD",
    ).wire()
    # NB: the ledger is the claim store's to write; a null here would delete it (merge patch).
    del spend["ledger"]
    return {"spend": spend}


# -- Claim ----------------------------------------------------------------------------------


class ClaimUsage(WireModel):
    """Tokens the slot's current run has used."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens."""
    total_tokens: int = 0
    """All tokens."""


class ClaimIntent(WireModel):
    """The spawn intent of the slot's worker: recorded before the worker starts, updated as its
    journal is collected, so a new leader re-attaches to it instead of running the agent again
    (docs/runs.md, *Spawn phases and adoption*)."""

    handle: str = Field(min_length=1)
    """The worker's deterministic handle (workflow, issue, slot, attempt, generation)."""
    phase: SpawnPhase
    """``provisioning``, ``spawn_requested``, ``probing``, ``running``, ``compensated`` or
    ``quarantined``."""
    generation: int | None = None
    """The leader generation that recorded the intent."""
    last_seq: int = Field(default=0, ge=0)
    """The newest journal record the leader collected (a successor re-attaches after it)."""
    placement: str | None = None
    """Where the worker runs: blank for the operator's own host, else the
    ``worker.ssh_hosts`` entry."""
    updated_at: datetime.datetime | None = None
    """When the intent was last written."""


class ClaimSpec(WireModel):
    """Which slot a Claim holds: set at creation, immutable afterwards."""

    workflow: str = Field(min_length=1)
    """The Workflow's name (same namespace)."""
    slot_key: str = Field(min_length=1)
    """``<issue id>#<slot index>``."""
    issue_id: str = Field(min_length=1)
    """The tracker's issue id."""
    identifier: str
    """The human identifier (``ABC-123``)."""
    slot_index: int = Field(ge=0)
    """Which slot of the issue's ensemble."""


class ClaimStatusPhase(enum.StrEnum):
    """A Claim's ``status.phase``: the record's :class:`~lorenz.model.ClaimPhase`, or
    ``WaitingForInput`` for a slot whose agent asked a question (docs/questions.md).

    NB: a waiting slot is a ``RetryPending`` row to every claim store (it keeps the slot ours);
    the Claim shows it as waiting, and :func:`record_from_claim` reads it back as
    ``RetryPending``."""

    RESERVED = "Reserved"
    RUNNING = "Running"
    RETRY_PENDING = "RetryPending"
    WAITING_FOR_INPUT = "WaitingForInput"


QUESTION_STATUS_LIMIT = 1000
"""Characters of a waiting slot's question shown in its Claim's status (the rest is cut)."""


class ClaimQuestion(WireModel):
    """The question a waiting slot's agent asked (docs/questions.md), as its Claim shows it."""

    text: str = Field(max_length=QUESTION_STATUS_LIMIT + 1)
    """The question, cut to 1000 characters (and an ellipsis)."""
    options: list[str] = Field(default_factory=list, max_length=20)
    """The options the agent offered (at most 20, each cut to 200 characters)."""
    session_id: str | None = None
    """The agent session the answer resumes."""
    asked_at: datetime.datetime | None = None
    """When the agent asked."""
    posted: bool = False
    """Whether the question is on the tracker."""


class ClaimStatus(WireModel):
    """The claimed slot's state, as the leader's orchestrator last persisted it."""

    phase: ClaimStatusPhase
    """``Reserved`` (waiting for a worker), ``Running``, ``RetryPending`` or
    ``WaitingForInput`` (its agent asked a question; it holds no concurrency)."""
    owner: str
    """The identity of the replica that holds the slot."""
    attempt: int | None = None
    """Retry attempt number (``None`` for a first run)."""
    retry_kind: RetryKind | None = None
    """``continuation`` (after a clean exit), ``failure`` (after a fault), ``adoption`` (a
    lost controller's worker is re-attached) or ``placement`` (a first run whose Pod could not
    be placed waits to be placed again; no attempt counted)."""
    due_at: datetime.datetime | None = None
    """When a pending retry is due (wall clock)."""
    retry_in: str | None = None
    """The backoff of a pending retry as a duration (``45s``, ``5m0s``), from the time it was
    scheduled (``updatedAt``); blank otherwise."""
    reservation_token: str | None = None
    """ABA guard of a reservation."""
    host: str | None = None
    """Where the run is placed: the run's Pod (``worker.kind: pod``), the ``worker.ssh_hosts``
    entry, or blank for the operator's own Pod."""
    workspace_path: str | None = None
    """The slot's workspace on the operator's volume."""
    started_at: datetime.datetime | None = None
    """When the run (or the reservation) started."""
    last_agent_at: datetime.datetime | None = None
    """When the agent last reported anything."""
    turn_count: int = 0
    """Agent sessions (turns) so far."""
    usage: ClaimUsage = Field(default_factory=ClaimUsage)
    """Tokens used by the current run."""
    last_error: str | None = None
    """Why the last run failed, or why it could not be placed (a ``placement`` wait)."""
    session_id: str | None = None
    """The agent session id."""
    updated_at: datetime.datetime | None = None
    """When this status was written."""
    generation: int | None = None
    """The leader generation of the last write (the shard Lease's ``leaseTransitions`` of its
    term). A replica of an older generation may not write this Claim any more."""
    intent: ClaimIntent | None = None
    """The spawn intent of the slot's worker, while one is recorded."""
    pod_phase: str | None = None
    """The phase of the run's Pod (``worker.kind: pod``) as the operator's watch of its run
    Pods last saw it: ``Pending``, ``Running``, ``Succeeded`` or ``Failed``; blank for other
    workers."""
    node: str | None = None
    """The node the run's Pod is scheduled on (``worker.kind: pod``)."""
    question: ClaimQuestion | None = None
    """The agent's question while the slot waits for an answer (phase ``WaitingForInput``)."""


CLAIM_SPEC_FIELDS = ("slot_key", "issue_id", "identifier", "slot_index")
"""The ClaimRecord fields that live in a Claim's spec; all others live in its status."""

CLAIM_POD_FIELDS = ("pod_phase", "node")
"""Claim status fields the operator's Pod watch fills in (not part of the claim record)."""

CLAIM_DISPLAY_FIELDS = ("retry_in", "question")
"""Claim status fields derived for people (printer columns), never read back."""


def claim_spec(record: ClaimRecord, *, workflow: str) -> dict[str, Any]:
    """The spec of the Claim for ``record`` (wire form)."""
    return ClaimSpec(
        workflow=workflow,
        slot_key=record.slot_key,
        issue_id=record.issue_id,
        identifier=record.identifier,
        slot_index=record.slot_index,
    ).wire()


def claim_status(record: ClaimRecord, *, question: ClaimQuestion | None = None) -> dict[str, Any]:
    """The status of the Claim for ``record`` (wire form); with the ``question`` of a waiting
    slot (a ``RetryPending`` record), phase ``WaitingForInput``."""
    data = record.to_dict()
    values = {name: data[name] for name in ClaimStatus.model_fields if name in data}
    # NB: a first run is attempt 0 on the wire (so ``kubectl get clm`` shows it); the record
    # says ``None``, and :func:`record_from_claim` maps 0 back.
    if values.get("attempt") is None:
        values["attempt"] = 0
    status = ClaimStatus.model_validate(values)
    if question is not None and record.phase is ClaimPhase.RETRY_PENDING:
        status.phase = ClaimStatusPhase.WAITING_FOR_INPUT
        status.question = question
    elif status.due_at is not None:
        # NB: not for a waiting slot: it is due when answered (``dueAt`` stays, read back).
        since = status.updated_at or datetime.datetime.now(datetime.UTC)
        status.retry_in = go_duration((status.due_at - since).total_seconds())
    return status.wire()


def go_duration(seconds: float) -> str:
    """``45s``, ``5m0s``, ``1h2m3s``: how kubectl prints durations."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def record_from_claim(obj: Mapping[str, Any]) -> ClaimRecord:
    """The record a Claim object holds; a Claim without status yet reads as ownerless.

    NB: a Claim is created first and gets its status in a second write; a creator that died in
    between leaves a Claim with no status. It reads as ``Reserved`` by owner ``""``, which is
    never the Lease holder, so the next leader takes it over like any stale claim.
    """
    spec = ClaimSpec.model_validate(obj.get("spec") or {})
    raw_status = obj.get("status") or {}
    if not raw_status.get("phase"):
        status = ClaimStatus(phase=ClaimStatusPhase.RESERVED, owner="")
    else:
        status = ClaimStatus.model_validate(raw_status)
    phase = (
        ClaimPhase.RETRY_PENDING
        if status.phase is ClaimStatusPhase.WAITING_FOR_INPUT
        else ClaimPhase(status.phase.value)
    )
    return ClaimRecord(
        slot_key=SlotKey(spec.slot_key),
        issue_id=spec.issue_id,
        identifier=spec.identifier,
        slot_index=spec.slot_index,
        phase=phase,
        owner=status.owner,
        attempt=status.attempt or None,
        retry_kind=status.retry_kind,
        due_at=status.due_at,
        reservation_token=status.reservation_token,
        host=status.host,
        workspace_path=status.workspace_path,
        started_at=status.started_at,
        last_agent_at=status.last_agent_at,
        turn_count=status.turn_count,
        usage=TokenUsage(
            input_tokens=status.usage.input_tokens,
            output_tokens=status.usage.output_tokens,
            total_tokens=status.usage.total_tokens,
        ),
        last_error=status.last_error,
        session_id=status.session_id,
        updated_at=status.updated_at,
        generation=status.generation,
        intent=_intent_of(status.intent),
    )


def _intent_of(wire: ClaimIntent | None) -> SpawnIntent | None:
    if wire is None:
        return None
    return SpawnIntent(
        handle=wire.handle,
        phase=wire.phase,
        generation=wire.generation,
        last_seq=wire.last_seq,
        placement=wire.placement,
        updated_at=wire.updated_at,
    )
