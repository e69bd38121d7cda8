"""One lifecycle module (``lorenz.model.lifecycle``): every phase, kind, outcome and reason of a
run lives there, the old homes hand out the same objects, the wire values stay, and the events
carry the enums."""

from __future__ import annotations

import datetime
import enum
import importlib
from typing import Any

import pytest

import lorenz.model
from lorenz.model import EventType, RuntimeEvent, lifecycle

AT = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)

WIRE_VALUES: dict[type[enum.StrEnum], set[str]] = {
    lifecycle.ClaimPhase: {"Reserved", "Running", "RetryPending"},
    lifecycle.SpawnPhase: {
        "provisioning", "spawn_requested", "probing", "running", "compensated", "quarantined",
    },
    lifecycle.RetryKind: {"continuation", "failure", "adoption", "placement"},
    lifecycle.RunOutcome: {"success", "failed", "stalled", "canceled"},
    lifecycle.ActionOutcome: {"applied", "failed"},
    lifecycle.StopReason: {"terminal", "unrouted", "blocked", "inactive", "missing"},
    lifecycle.BlockReason: {
        "retry_budget_exhausted", "input_required", "approval_required", "continuation_limit",
        "budget_exhausted",  # NB: added with spend control (#36); the others are unchanged
    },
    lifecycle.AbortReason: {
        "stalled", "canceled", "shutdown", "leadership_lost", "handed_over",
    },
    lifecycle.WorkerPhase: {"starting", "preparing", "agent", "cleanup", "final"},
}
"""NB: written to claim rows, checkpoints, events and Claim resources: a value never changes."""


def test_the_persisted_values_are_the_released_ones() -> None:
    for kind, values in WIRE_VALUES.items():
        assert {member.value for member in kind} == values, kind.__name__
    assert set(WIRE_VALUES) == {
        value for value in vars(lifecycle).values()
        if isinstance(value, type) and issubclass(value, enum.Enum)
    }


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("lorenz.model", "ClaimPhase"),
        ("lorenz.model", "SpawnPhase"),
        ("lorenz.model", "SETTLED_SPAWN_PHASES"),
        ("lorenz.model", "RetryKind"),
        ("lorenz.model", "RunOutcome"),
        ("lorenz.model", "StopReason"),
        ("lorenz.model", "BlockReason"),
        ("lorenz.model.entries", "RetryKind"),
        ("lorenz.policies.retries", "BlockReason"),
        # NB: the runtime and the worker import these from the model now (their copies are gone).
        ("lorenz.runtime", "AbortReason"),
        ("lorenz.runtime.runs", "AbortReason"),
        ("lorenz.workers.worker", "WorkerPhase"),
    ],
)
def test_the_remaining_import_locations_hand_out_the_lifecycle_objects(
    module: str, name: str
) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(lifecycle, name)


def wire(**fields: Any) -> dict[str, Any]:
    """Fields as the runtime hands them in (its ``event()`` spreads an untyped mapping)."""
    return fields


def test_event_fields_are_the_enums_whatever_the_caller_passed() -> None:
    event = RuntimeEvent(
        type=EventType.RETRY_SCHEDULED, at=AT, **wire(retry_kind="continuation", outcome="success")
    )
    assert event.retry_kind is lifecycle.RetryKind.CONTINUATION
    assert event.outcome is lifecycle.RunOutcome.SUCCESS
    action = RuntimeEvent(type=EventType.TERMINAL_ACTION, at=AT, **wire(outcome="applied"))
    assert action.outcome is lifecycle.ActionOutcome.APPLIED
    typed = RuntimeEvent(type=EventType.RUN_FINISHED, at=AT, outcome=lifecycle.RunOutcome.FAILED)
    assert typed.outcome is lifecycle.RunOutcome.FAILED
    document = event.to_dict()
    assert document["retry_kind"] == "continuation"
    assert type(document["retry_kind"]) is str
    assert type(document["outcome"]) is str


def test_an_unknown_outcome_or_retry_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="nonsense"):
        RuntimeEvent(type=EventType.RUN_FINISHED, at=AT, **wire(outcome="nonsense"))
    with pytest.raises(ValueError, match="nonsense"):
        RuntimeEvent(type=EventType.RETRY_SCHEDULED, at=AT, **wire(retry_kind="nonsense"))


def test_the_transitions_are_drawn_in_the_module_docstring() -> None:
    doc = lifecycle.__doc__ or ""
    for phase in ("Reserved", "Running", "RetryPending", "blocked", "provisioning",
                  "spawn_requested", "probing", "compensated", "quarantined", "preparing"):
        assert phase in doc, phase
    assert lorenz.model.ClaimPhase is lifecycle.ClaimPhase
