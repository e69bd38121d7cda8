"""``agent.max_continuation_runs`` in WORKFLOW.md's front matter: read, bounded and defaulted
(how the orchestrator applies it, reloads included: tests/policies/test_continuations.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorenz.workflow import (
    InvalidWorkflowConfig,
    load_workflow,
    settings_from_mapping,
)
from tests.workflow.conftest import WriteWorkflow

TRACKER = "tracker:\n  kind: memory\n"


def test_the_front_matter_sets_the_limit(write_workflow: WriteWorkflow) -> None:
    path = write_workflow(TRACKER + "agent:\n  max_continuation_runs: 3\n")
    assert load_workflow(path).settings.agent.max_continuation_runs == 3


def test_unset_is_ten_and_zero_turns_it_off(write_workflow: WriteWorkflow) -> None:
    assert load_workflow(write_workflow(TRACKER)).settings.agent.max_continuation_runs == 10
    path = write_workflow(TRACKER + "agent:\n  max_continuation_runs: 0\n")
    assert load_workflow(path).settings.agent.max_continuation_runs == 0


@pytest.mark.parametrize("value", [-1, 10001, "many"])
def test_a_bad_limit_is_reported_under_its_key(value: object) -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {"tracker": {"kind": "memory"}, "agent": {"max_continuation_runs": value}},
            base_dir=Path("/"),
            environ={},
        )
    assert caught.value.code == "invalid_workflow_config"
    assert [p.key_path for p in caught.value.problems()] == ["agent.max_continuation_runs"]
