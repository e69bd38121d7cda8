"""camelCase keys in a Workflow spec, snake_case keys in WORKFLOW.md: one generated mapping.

Kubernetes API conventions want camelCase field names (``maxConcurrentAgents``); WORKFLOW.md
and the settings model use snake_case (``max_concurrent_agents``). The mapping between the two
is *derived from the settings model* by walking it: a key is renamed only where the model has a
field of that name, so user-chosen keys (agent kind names, per-state caps, ``env`` variables)
and pass-through maps (``tracker.provider``, Codex policies) are never touched, and there is no
second list of keys to keep in step. The derived tables are checked to be one-to-one (no two
fields of a section may share a camelCase form), which is what makes the round trip exact.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Mapping
from typing import Any

import pydantic

from lorenz.config import WorkflowSettings
from lorenz.workflow.schema import sections_of


def camel(name: str) -> str:
    """``max_concurrent_agents`` → ``maxConcurrentAgents`` (a name without ``_`` is unchanged)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@functools.cache
def field_names(model: type[pydantic.BaseModel]) -> Mapping[str, str]:
    """snake_case field name → camelCase key, for one section; raises on a collision."""
    table: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name in model.model_fields:
        key = camel(name)
        if key in seen:
            raise ValueError(
                f"{model.__name__}: fields {seen[key]!r} and {name!r} both map to {key!r}"
            )
        seen[key] = name
        table[name] = key
    return table


@functools.cache
def spec_keys(model: type[pydantic.BaseModel]) -> Mapping[str, str]:
    """camelCase key → snake_case field name, for one section (the inverse table)."""
    return {key: name for name, key in field_names(model).items()}


def _listed_section(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The section of a ``tuple[Section, ...]`` or ``list[Section]`` field, else ``None``."""
    if typing.get_origin(annotation) not in (tuple, list):
        return None
    args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
    if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], pydantic.BaseModel):
        return args[0]
    return None


def _convert(
    data: Mapping[Any, Any],
    model: type[pydantic.BaseModel],
    *,
    to_spec: bool,
) -> dict[Any, Any]:
    table = field_names(model) if to_spec else spec_keys(model)
    out: dict[Any, Any] = {}
    for key, value in data.items():
        field = key if to_spec else table.get(str(key))
        if field is None or field not in model.model_fields:
            # NB: unknown keys are left exactly as written, so the settings model reports them
            # under the name the user typed.
            out[key] = value
            continue
        annotation = model.model_fields[field].annotation
        section, is_map = sections_of(annotation)
        listed = _listed_section(annotation)
        if listed is not None and isinstance(value, list | tuple):
            # A list of sections (``worker.podTemplate.tolerations``): each item is renamed.
            value = [
                _convert(item, listed, to_spec=to_spec) if isinstance(item, Mapping) else item
                for item in value
            ]
        elif section is not None and isinstance(value, Mapping):
            if is_map:
                value = {
                    entry: (
                        _convert(item, section, to_spec=to_spec)
                        if isinstance(item, Mapping)
                        else item
                    )
                    for entry, item in value.items()
                }
            else:
                value = _convert(value, section, to_spec=to_spec)
        out[field_names(model)[field] if to_spec else field] = value
    return out


def spec_from_front_matter(
    front_matter: Mapping[Any, Any], *, model: type[pydantic.BaseModel] = WorkflowSettings
) -> dict[Any, Any]:
    """WORKFLOW.md front matter (snake_case) → a Workflow spec (camelCase)."""
    return _convert(front_matter, model, to_spec=True)


def front_matter_from_spec(
    spec: Mapping[Any, Any], *, model: type[pydantic.BaseModel] = WorkflowSettings
) -> dict[Any, Any]:
    """A Workflow spec (camelCase) → front matter (snake_case) for the settings model."""
    return _convert(spec, model, to_spec=False)


def snake(key: str) -> str:
    """``inputTokens`` → ``input_tokens`` (the inverse of :func:`camel` for snake_case names)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def camel_keys(value: Any) -> Any:
    """``value`` with every mapping key camelCased, recursively (for operator-owned data)."""
    if isinstance(value, Mapping):
        return {camel(str(k)): camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def snake_keys(value: Any) -> Any:
    """The inverse of :func:`camel_keys`."""
    if isinstance(value, Mapping):
        return {snake(str(k)): snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake_keys(v) for v in value]
    return value
