"""Front matter splitting and YAML decoding."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorenz.workflow import (
    WorkflowFrontMatterNotAMap,
    WorkflowParseError,
    load_workflow,
    parse_front_matter,
    split_front_matter,
)
from tests.workflow.conftest import WriteWorkflow


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_front_matter_split_on_every_newline_convention(newline: str) -> None:
    text = newline.join(["---", "polling:", "  interval_ms: 5", "---", "", "Body line", ""])
    doc = split_front_matter(text)
    assert doc.front_matter == "polling:\n  interval_ms: 5"
    assert doc.body == "Body line"
    assert parse_front_matter(doc.front_matter) == {"polling": {"interval_ms": 5}}


def test_mixed_newlines_split_too() -> None:
    doc = split_front_matter("---\r\na: 1\n---\rbody")
    assert doc.front_matter == "a: 1"
    assert doc.body == "body"


def test_no_front_matter_means_whole_file_is_body() -> None:
    doc = split_front_matter("  Hello {{ issue.title }}\n\n")
    assert doc.front_matter is None
    assert doc.body == "Hello {{ issue.title }}"
    assert parse_front_matter(doc.front_matter) == {}


def test_first_line_must_be_exactly_three_dashes() -> None:
    for text in ("--- \na: 1\n---\nbody", " ---\na: 1\n---\nbody", "----\na: 1\n---\nbody"):
        assert split_front_matter(text).front_matter is None


def test_closing_fence_must_be_exactly_three_dashes() -> None:
    doc = split_front_matter("---\na: 1\n--- \nb: 2\n---\nbody")
    # "--- " is not a fence, so the YAML runs on to the real closing line.
    assert doc.front_matter == "a: 1\n--- \nb: 2"
    assert doc.body == "body"


def test_unterminated_front_matter_is_all_yaml_with_empty_body() -> None:
    doc = split_front_matter("---\ntracker:\n  kind: memory\nagent:\n  max_turns: 3\n")
    assert doc.body == ""
    assert parse_front_matter(doc.front_matter) == {
        "tracker": {"kind": "memory"},
        "agent": {"max_turns": 3},
    }


@pytest.mark.parametrize("yaml_text", ["", "   ", "\n\n", "# only a comment"])
def test_empty_front_matter_is_an_empty_map(yaml_text: str) -> None:
    assert parse_front_matter(yaml_text) == {}


def test_body_is_trimmed_and_its_first_line_counted() -> None:
    doc = split_front_matter("---\na: 1\n---\n\n\n   Hello\n  world  \n\n")
    assert doc.body == "Hello\n  world"
    assert doc.body_line == 6


def test_separator_inside_body_stays_in_body() -> None:
    doc = split_front_matter("---\na: 1\n---\nabove\n---\nbelow")
    assert doc.body == "above\n---\nbelow"


@pytest.mark.parametrize(
    ("yaml_text", "kind"),
    [("- a\n- b", "list"), ("just a string", "string"), ("42", "number"), ("true", "boolean")],
)
def test_non_map_front_matter_is_a_typed_error(yaml_text: str, kind: str) -> None:
    with pytest.raises(WorkflowFrontMatterNotAMap) as caught:
        parse_front_matter(yaml_text)
    assert caught.value.code == "workflow_front_matter_not_a_map"
    assert kind in caught.value.message


def test_invalid_yaml_is_a_typed_error_naming_the_file_line(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: linear\n   bad: 1")
    with pytest.raises(WorkflowParseError) as caught:
        load_workflow(path, environ={})
    assert caught.value.code == "workflow_parse_error"
    # The YAML starts on line 2 of the file; the error is reported in file lines.
    assert "line 4, column 7: mapping values are not allowed here" in caught.value.message
    assert str(path) in caught.value.message


def test_non_map_front_matter_through_the_loader(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("- tracker\n- agent")
    with pytest.raises(WorkflowFrontMatterNotAMap):
        load_workflow(path, environ={})


def test_not_utf8_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    path.write_bytes(b"---\na: \xff\xfe\n---\nbody")
    with pytest.raises(WorkflowParseError, match="UTF-8"):
        load_workflow(path, environ={})


def test_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "WORKFLOW.md"
    path.write_bytes(b"\xef\xbb\xbf---\npolling:\n  interval_ms: 7\n---\nbody")
    loaded = load_workflow(path, environ={})
    assert loaded.settings.polling.interval_ms == 7
    assert loaded.prompt_template == "body"


def test_config_is_the_yaml_root_map_itself(write_workflow: WriteWorkflow) -> None:
    path = write_workflow("tracker:\n  kind: memory\nextra_tool:\n  x: 1")
    loaded = load_workflow(path, environ={})
    assert loaded.raw == {"tracker": {"kind": "memory"}, "extra_tool": {"x": 1}}
    assert "config" not in loaded.raw
