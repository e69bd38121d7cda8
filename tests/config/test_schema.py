"""The settings model's JSON schema is structural, and every key is documented with a reload note.

The Workflow CRD is generated from this schema, and Kubernetes only accepts structural schemas:
every node must say its type. Pass-through values (owned by an adapter or by Codex) are the one
allowed exception, and they must be marked ``x-lorenz-passthrough`` so the CRD generator can
emit ``x-kubernetes-preserve-unknown-fields`` for them.
"""

from __future__ import annotations

from typing import Any

import pytest

from lorenz.config import ENV_KEY, PASSTHROUGH_KEY, RELOAD_KEY, WorkflowSettings
from lorenz.workflow.redaction import REDACTED_MAPS, secret_key_paths
from lorenz.workflow.schema import MAP_ENTRY, iter_fields, leaf_fields

SCHEMA = WorkflowSettings.model_json_schema()
DEFS: dict[str, Any] = SCHEMA.get("$defs", {})


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    assert ref.startswith("#/$defs/"), ref
    resolved: dict[str, Any] = DEFS[ref.removeprefix("#/$defs/")]
    return resolved


def _untyped_holes(node: dict[str, Any], path: str) -> list[str]:
    """Paths of schema nodes that do not say what they hold (pass-through nodes excepted)."""
    if node.get(PASSTHROUGH_KEY):
        return []
    if "$ref" in node:
        return _untyped_holes(_resolve(node), path)
    if "enum" in node or "const" in node:
        return []
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in node:
            holes: list[str] = []
            for index, member in enumerate(node[combinator]):
                holes += _untyped_holes(member, f"{path}<{combinator}{index}>")
            return holes
    kind = node.get("type")
    if kind is None:
        return [path]
    if kind == "object":
        holes = []
        for name, child in node.get("properties", {}).items():
            holes += _untyped_holes(child, f"{path}.{name}" if path else name)
        extra = node.get("additionalProperties")
        if extra is True:
            holes.append(f"{path}.*")
        elif isinstance(extra, dict):
            holes += _untyped_holes(extra, f"{path}.*")
        elif "properties" not in node and extra is None:
            holes.append(f"{path}.*")
        return holes
    if kind == "array":
        items = node.get("items")
        return [f"{path}[]"] if not isinstance(items, dict) else _untyped_holes(items, f"{path}[]")
    return []


def test_schema_is_produced_with_every_section() -> None:
    assert SCHEMA["type"] == "object"
    assert set(SCHEMA["properties"]) == set(WorkflowSettings.model_fields)
    assert SCHEMA.get("additionalProperties") is False


def test_schema_is_structural_except_marked_pass_through_values() -> None:
    assert _untyped_holes(SCHEMA, "") == []


def test_the_hole_finder_can_fail() -> None:
    assert _untyped_holes({"type": "object", "properties": {"x": {}}}, "") == ["x"]
    assert _untyped_holes({"type": "object", "additionalProperties": True}, "m") == ["m.*"]
    assert _untyped_holes({"type": "array"}, "a") == ["a[]"]
    assert _untyped_holes({"default": None, PASSTHROUGH_KEY: True}, "p") == []


def test_pass_through_markers_sit_on_untyped_fields_only() -> None:
    marked = [f.key_path for f in leaf_fields() if f.passthrough]
    assert marked == [
        "tracker.provider",
        f"agents.{MAP_ENTRY}.approval_policy",
        f"agents.{MAP_ENTRY}.turn_sandbox_policy",
        "codex.approval_policy",
        "codex.turn_sandbox_policy",
        # Kubernetes' own Affinity object, checked by the API server when the Pod is created.
        "worker.pod_template.affinity",
    ]


def test_sections_forbid_unknown_keys_in_the_schema() -> None:
    for name, definition in DEFS.items():
        if definition.get("type") == "object" and "properties" in definition:
            assert definition.get("additionalProperties") is False, name


@pytest.mark.parametrize("field", list(iter_fields()), ids=lambda f: f.key_path)
def test_every_field_has_a_description(field: Any) -> None:
    assert field.description.strip(), f"{field.key_path} needs a docstring"


@pytest.mark.parametrize("field", list(leaf_fields()), ids=lambda f: f.key_path)
def test_every_key_has_a_reload_note(field: Any) -> None:
    assert field.extra.get(RELOAD_KEY) in {"hot", "new-runs", "restart"}, field.key_path


def test_every_section_has_a_docstring() -> None:
    for field in iter_fields():
        if field.section is not None:
            assert (field.section.__doc__ or "").strip(), field.section.__name__


def test_env_markers_are_known_values() -> None:
    for field in leaf_fields():
        assert field.extra.get(ENV_KEY) in (None, "secret", "path"), field.key_path


def test_redaction_covers_secrets_and_agent_env() -> None:
    assert set(secret_key_paths()) == {
        "tracker.api_key",
        "tracker.assignee",
        "tracker.email",
        "tracker.webhook_secret",
    }
    paths = {f.key_path for f in leaf_fields()}
    assert set(REDACTED_MAPS) <= paths


_JSON_SCHEMA_KEYWORDS = frozenset(
    {
        "$defs", "$ref", "additionalProperties", "allOf", "anyOf", "const", "default",
        "description", "enum", "exclusiveMaximum", "exclusiveMinimum", "format", "items",
        "maxItems", "maxLength", "maximum", "minItems", "minLength", "minimum", "oneOf",
        "pattern", "properties", "required", "title", "type", "uniqueItems",
    }
)  # fmt: skip


def _non_standard_keywords(node: Any, path: str = "") -> list[str]:
    if not isinstance(node, dict):
        return []
    found = []
    for key, value in node.items():
        if key.startswith("x-"):
            continue
        if key not in _JSON_SCHEMA_KEYWORDS:
            found.append(f"{path}/{key}")
        elif key in ("properties", "$defs"):
            for name, child in value.items():
                found += _non_standard_keywords(child, f"{path}/{key}/{name}")
        elif key in ("anyOf", "oneOf", "allOf"):
            for index, child in enumerate(value):
                found += _non_standard_keywords(child, f"{path}/{key}[{index}]")
        elif key in ("items", "additionalProperties"):
            found += _non_standard_keywords(value, f"{path}/{key}")
    return found


def test_schema_uses_only_standard_keywords() -> None:
    # NB: a constraint placed after a BeforeValidator makes pydantic emit "gt"/"ge"/"le",
    # which are not JSON Schema and which the Kubernetes API server rejects in a CRD.
    assert _non_standard_keywords(SCHEMA) == []
    assert _non_standard_keywords({"properties": {"p": {"gt": 0}}}) == ["/properties/p/gt"]
