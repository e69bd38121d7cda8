"""Strict prompt rendering."""

from __future__ import annotations

import datetime

import pytest

from lorenz.model import BlockerRef, Issue, RetryKind
from lorenz.workflow import (
    DEFAULT_PROMPT_TEMPLATE,
    MissingWorkflowFile,
    PromptTemplate,
    TemplateParseError,
    TemplateRenderError,
    WorkflowParseError,
    continuation_prompt,
    load_workflow,
    render_prompt,
)
from tests.workflow.conftest import WriteWorkflow


def _issue(**overrides: object) -> Issue:
    fields: dict[str, object] = {
        "id": "lin-1",
        "identifier": "LOR-42",
        "title": "Fix the flux capacitor",
        "state": "In Progress",
        "description": "It only works at 88 mph.",
        "priority": 2,
        "url": "https://tracker.example/LOR-42",
        "labels": ("Bug", " backend "),
        "blocked_by": (BlockerRef(id="lin-0", identifier="LOR-41", state="Done"),),
        "created_at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    }
    fields.update(overrides)
    return Issue(**fields)  # type: ignore[arg-type]


# -- inputs ---------------------------------------------------------------------


def test_renders_issue_and_attempt() -> None:
    template = PromptTemplate("{{ issue.identifier }} / {{ issue.title }} / attempt={{ attempt }}")
    assert template.render(issue=_issue(), attempt=3) == (
        "LOR-42 / Fix the flux capacitor / attempt=3"
    )


def test_attempt_is_always_defined_and_null_on_a_first_run() -> None:
    template = PromptTemplate("{% if attempt %}retry {{ attempt }}{% else %}first run{% endif %}")
    assert template.render(issue=_issue()) == "first run"
    assert template.render(issue=_issue(), attempt=None) == "first run"
    assert template.render(issue=_issue(), attempt=1) == "retry 1"


def test_retry_kind_is_always_defined() -> None:
    template = PromptTemplate(
        "[{{ retry_kind }}]{% if retry_kind == 'failure' %} after a failure{% endif %}"
    )
    assert template.render(issue=_issue()) == "[]"
    assert template.render(issue=_issue(), attempt=2, retry_kind=RetryKind.FAILURE) == (
        "[failure] after a failure"
    )
    assert template.render(issue=_issue(), attempt=1, retry_kind=RetryKind.CONTINUATION) == (
        "[continuation]"
    )


def test_nested_labels_and_blockers_can_be_looped() -> None:
    template = PromptTemplate(
        "{{ issue.labels | join: ',' }}|"
        "{% for b in issue.blocked_by %}{{ b.identifier }}={{ b.state }};{% endfor %}"
    )
    assert template.render(issue=_issue()) == "bug,backend|LOR-41=Done;"


def test_datetimes_render_as_iso_strings() -> None:
    template = PromptTemplate("{{ issue.created_at }} {{ issue.updated_at }}")
    assert template.render(issue=_issue()) == "2026-01-02T03:04:05+00:00 "


def test_every_normalized_field_is_available() -> None:
    source = " ".join(f"{{{{ issue.{key} }}}}" for key in _issue().to_template_dict())
    assert "LOR-42" in PromptTemplate(source).render(issue=_issue())


def test_null_fields_are_defined() -> None:
    template = PromptTemplate("{% if issue.branch_name %}b{% else %}no branch{% endif %}")
    assert template.render(issue=_issue(branch_name=None)) == "no branch"


# -- strictness -----------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "{{ nope }}",
        "{{ issue.titel }}",
        "{% if nope %}x{% endif %}",
        "{{ nope | default: 'x' }}",
        "{{ issue.blocked_by[0].nope }}",
    ],
)
def test_unknown_variables_fail_to_render(source: str) -> None:
    with pytest.raises(TemplateRenderError) as caught:
        PromptTemplate(source).render(issue=_issue())
    assert caught.value.code == "template_render_error"
    assert "LOR-42" in caught.value.message
    assert "undefined" in caught.value.message


def test_unknown_filters_fail_to_render() -> None:
    with pytest.raises(TemplateRenderError) as caught:
        PromptTemplate("{{ issue.title | shout }}").render(issue=_issue())
    assert "unknown filter 'shout'" in caught.value.message


def test_bad_filter_arguments_fail_to_render() -> None:
    with pytest.raises(TemplateRenderError):
        PromptTemplate("{{ issue.priority | divided_by: 0 }}").render(issue=_issue())


@pytest.mark.parametrize("source", ["{% bogus %}", "{% if attempt %}open", "{{ issue.title"])
def test_syntax_errors_are_parse_errors_raised_at_render(source: str) -> None:
    template = PromptTemplate(source)  # NB: does not raise: only the run attempt fails
    assert isinstance(template.parse_error, TemplateParseError)
    with pytest.raises(TemplateParseError) as caught:
        template.render(issue=_issue())
    assert caught.value.code == "template_parse_error"


def test_error_lines_are_file_lines(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: memory", body="\nline one\n{{ missing }}\n")
    loaded = load_workflow(path, environ={})
    # file: 1 ---, 2 tracker, 3 kind, 4 ---, 5 (blank), 6 line one, 7 {{ missing }}
    with pytest.raises(TemplateRenderError, match="line 7"):
        loaded.render_prompt(issue=_issue())


# -- default template -------------------------------------------------------------------


def test_blank_body_uses_the_default_template(write_workflow: WriteWorkflow) -> None:
    loaded = load_workflow(write_workflow("tracker:\n  kind: memory", body="  \n\n"), environ={})
    assert loaded.prompt_template == ""
    assert loaded.prompt.is_default
    assert loaded.prompt.text == DEFAULT_PROMPT_TEMPLATE
    text = loaded.render_prompt(issue=_issue())
    assert "LOR-42" in text
    assert "Fix the flux capacitor" in text
    assert "It only works at 88 mph." in text


def test_default_template_handles_a_missing_description() -> None:
    text = PromptTemplate("").render(issue=_issue(description=None))
    assert "No description provided." in text
    assert "LOR-42" in text


def test_unterminated_front_matter_gives_the_default_prompt(write_workflow: WriteWorkflow) -> None:
    path = write_workflow(None, body="---\ntracker:\n  kind: memory\n")
    loaded = load_workflow(path, environ={})
    assert loaded.settings.tracker.kind == "memory"
    assert loaded.prompt.is_default


# -- load failures differ from template failures --------------------------------


def test_a_workflow_load_failure_differs_from_a_template_parse_error(
    write_workflow: WriteWorkflow,
) -> None:
    broken_yaml = write_workflow("tracker: [", body="fine {{ issue.title }}", name="a.md")
    with pytest.raises(WorkflowParseError) as load_failure:
        load_workflow(broken_yaml, environ={})
    with pytest.raises(MissingWorkflowFile) as missing:
        load_workflow(broken_yaml.with_name("zzz.md"), environ={})
    broken_template = write_workflow("", body="{% if %}", name="b.md")
    loaded = load_workflow(broken_template, environ={})  # loads: the template fails per run
    with pytest.raises(TemplateParseError) as template_failure:
        loaded.render_prompt(issue=_issue())
    codes = {load_failure.value.code, missing.value.code, template_failure.value.code}
    assert codes == {"workflow_parse_error", "missing_workflow_file", "template_parse_error"}


def test_render_prompt_function_matches_the_method(write_workflow: WriteWorkflow) -> None:
    loaded = load_workflow(
        write_workflow("", body="{{ issue.identifier }}#{{ attempt }}"), environ={}
    )
    assert render_prompt(loaded, issue=_issue(), attempt=4) == "LOR-42#4"


# -- static checks (lorenz validate) -----------------------------------------------------------


def test_static_problems_find_what_would_fail_at_render() -> None:
    template = PromptTemplate(
        "{{ issue.titel }} {{ who }} {{ issue.title | shout }}\n"
        "{% assign x = issue.title %}{{ x }}"
        "{% for b in issue.blocked_by %}{{ b.identifier }}{% endfor %}{{ attempt }}",
        first_line=10,
    )
    messages = [p.message for p in template.problems()]
    assert len(messages) == 3, messages
    assert any("unknown issue field 'titel' at line 10" in m for m in messages)
    assert any("unknown variable 'who'" in m for m in messages)
    assert any("unknown filter 'shout'" in m for m in messages)
    assert all(p.code == "template_render_error" for p in template.problems())


def test_static_problems_of_a_clean_template_are_empty() -> None:
    assert PromptTemplate("{{ issue.title }} {{ retry_kind }} {{ attempt }}").problems() == []
    assert PromptTemplate("").problems() == []


def test_static_problems_report_a_parse_error() -> None:
    (problem,) = PromptTemplate("{% nope %}").problems()
    assert problem.code == "template_parse_error"


# -- continuation turns -----------------------------------------------------------------


def test_continuation_prompt_names_the_turn_and_is_not_the_original() -> None:
    first = PromptTemplate("Fix {{ issue.identifier }}").render(issue=_issue())
    second = continuation_prompt(2, 20)
    third = continuation_prompt(3, 20)
    assert "Continuation turn 2 of 20" in second
    assert "Continuation turn 3 of 20" in third
    assert second != first
    assert "LOR-42" not in second
    assert "workspace" in second
