"""The questions example (examples/questions/WORKFLOW.md) loads, validates and renders an
answer; the ``input`` section's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorenz.config import ApprovalMode, WorkflowSettings
from lorenz.model import Issue
from lorenz.workflow import dispatch_problems, load_workflow
from lorenz.workflow.answers import render_answer
from lorenz.workflow.errors import TemplateRenderError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "questions" / "WORKFLOW.md"


def test_the_questions_example_loads_and_renders_an_answer() -> None:
    loaded = load_workflow(EXAMPLE, environ={"LINEAR_API_KEY": "lin_test"})
    assert loaded.warnings == ()
    assert dispatch_problems(loaded.settings) == []
    assert loaded.prompt.problems() == []
    settings = loaded.settings
    assert settings.agent_kind().approvals is ApprovalMode.ASK
    assert settings.input.waiting_state == "Needs Input"
    assert settings.input.answer_authors == ("alice@example.com", "bob@example.com")
    text = render_answer(
        settings.input.answer_template,
        answer="Use Postgres.",
        question="Which database?",
        issue=Issue(id="1", identifier="ABC-1", title="t", state="Needs Input"),
    )
    assert text == (
        'A maintainer answered your question ("Which database?"):\n\nUse Postgres.\n\n'
        "Go on from where you stopped.\n"
    )


def test_the_default_answer_template_and_a_strict_one() -> None:
    settings = WorkflowSettings()
    issue = Issue(id="1", identifier="ABC-1", title="t", state="Todo")
    assert render_answer(
        settings.input.answer_template, answer="yes", question="q?", issue=issue
    ) == "The answer to your question: yes"
    assert render_answer(
        "{{ issue.identifier }}: {{ answer | upcase }}", answer="yes", question="q", issue=issue
    ) == "ABC-1: YES"
    with pytest.raises(TemplateRenderError) as caught:
        render_answer("{{ answr }}", answer="yes", question="q", issue=issue)
    assert caught.value.code == "template_render_error"
    assert caught.value.key_path == "input.answer_template"


def test_a_waiting_state_outside_the_active_states_is_refused() -> None:
    with pytest.raises(ValueError, match="input_waiting_state_inactive"):
        WorkflowSettings.model_validate(
            {
                "tracker": {"kind": "memory", "active_states": ["Todo"]},
                "input": {"waiting_state": "Needs Input"},
            }
        )
    settings = WorkflowSettings.model_validate(
        {
            "tracker": {"kind": "memory", "active_states": ["Todo", "needs input"]},
            "input": {"waiting_state": "Needs Input", "waiting_label": "  "},
        }
    )
    assert settings.input.waiting_state == "Needs Input"
    assert settings.input.waiting_label is None
