"""The ``retry`` settings: defaults, ranges, the ``agent.max_retry_backoff_ms`` alias, and the
coded errors a user can cause with them (as ``lorenz validate`` reports them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lorenz.config import TerminalAction, WorkflowSettings
from lorenz.workflow.errors import InvalidWorkflowConfig
from lorenz.workflow.loading import settings_from_mapping


def _problems(front_matter: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(front_matter, base_dir=Path("/"), environ={})
    return [(problem.code, problem.key_path) for problem in caught.value.problems()]


def test_defaults_keep_the_old_backoff_and_block_after_three_failures() -> None:
    retry = WorkflowSettings().retry
    assert retry.max_attempts == 3
    assert (retry.backoff.initial_ms, retry.backoff.multiplier, retry.backoff.max_ms) == (
        10000, 2, 300000,
    )
    assert retry.terminal_action is TerminalAction.BLOCK
    assert retry.escalate.comment is True
    assert retry.escalate.label == "lorenz-blocked"


def test_the_seed_profile_loads() -> None:
    resolved = settings_from_mapping(
        {
            "retry": {
                "max_attempts": 5,
                "backoff": {"initial_ms": 60000, "multiplier": 5, "max_ms": 3600000},
                "terminal_action": "escalate",
            }
        },
        base_dir=Path("/"),
        environ={},
    )
    retry = resolved.settings.retry
    assert retry.max_attempts == 5
    assert retry.backoff.multiplier == 5
    assert retry.terminal_action is TerminalAction.ESCALATE


@pytest.mark.parametrize("value", [0, 101, -1])
def test_max_attempts_outside_1_to_100_is_refused(value: int) -> None:
    assert _problems({"retry": {"max_attempts": value}}) == [
        ("invalid_workflow_config", "retry.max_attempts")
    ]


def test_the_old_key_is_an_alias_of_the_cap() -> None:
    settings = WorkflowSettings.model_validate({"agent": {"max_retry_backoff_ms": 15000}})
    assert settings.retry.backoff.max_ms == 15000
    same = WorkflowSettings.model_validate(
        {"agent": {"max_retry_backoff_ms": 15000}, "retry": {"backoff": {"max_ms": 15000}}}
    )
    assert same.retry.backoff.max_ms == 15000


def test_the_alias_and_the_new_key_disagreeing_is_a_coded_error() -> None:
    assert _problems(
        {"agent": {"max_retry_backoff_ms": 15000}, "retry": {"backoff": {"max_ms": 20000}}}
    ) == [("retry_backoff_alias_conflict", "")]


def test_cancel_without_a_state_is_a_coded_error() -> None:
    assert _problems({"retry": {"terminal_action": "cancel"}}) == [
        ("retry_cancel_state_missing", "retry")
    ]


def test_cancel_into_an_active_state_is_a_coded_error() -> None:
    assert _problems(
        {"retry": {"terminal_action": "cancel", "cancel_state": " todo "}}
    ) == [("retry_cancel_state_active", "")]


def test_an_escalation_that_says_nothing_is_a_coded_error() -> None:
    assert _problems({"retry": {"escalate": {"comment": False, "label": " "}}}) == [
        ("retry_escalation_empty", "retry.escalate")
    ]


def test_an_escalation_label_that_gates_dispatch_is_a_coded_error() -> None:
    assert _problems(
        {"tracker": {"required_labels": ["Lorenz-Blocked"]}}
    ) == [("retry_escalation_label_required", "")]


def test_unknown_terminal_action_is_refused() -> None:
    assert _problems({"retry": {"terminal_action": "explode"}}) == [
        ("invalid_workflow_config", "retry.terminal_action")
    ]
