"""Walking the settings model: every key, its markers, and the sections it nests.

``lorenz.config.settings`` declares each key once, with its markers in ``json_schema_extra``
(``x-lorenz-env``, ``x-lorenz-passthrough``, ``x-lorenz-reload``). The loader (``$VAR`` and path
resolution, null dropping), the flag registry (flags are the fields of the flag-only sections)
and the docs generator all need "the fields with marker X"; they get them from here, by walking
the model, so there is never a second list of keys to keep in step.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any

import pydantic
from pydantic.fields import FieldInfo

from lorenz.config import ENV_KEY, PASSTHROUGH_KEY, RELOAD_KEY, WorkflowSettings

MAP_ENTRY = "<name>"
"""The key-path segment that stands for "any key" of a map of sections (``agents.<name>``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SettingsField:
    """One key of the schema, wherever it sits."""

    key_path: str
    """Dotted path; map-of-section entries appear as ``<name>`` (``agents.<name>.command``)."""
    name: str
    """The field name (the last segment of the path)."""
    info: FieldInfo
    """pydantic's description of the field (type, default, docstring)."""
    owner: type[pydantic.BaseModel]
    """The model (section) the field belongs to."""
    section: type[pydantic.BaseModel] | None
    """The nested model, when the field is itself a section (or a map of sections)."""
    is_map_of_sections: bool
    """``True`` for ``dict[str, <section>]`` fields (``agents``)."""

    @property
    def extra(self) -> dict[str, Any]:
        extra = self.info.json_schema_extra
        return dict(extra) if isinstance(extra, dict) else {}

    @property
    def env_marker(self) -> str | None:
        """``secret``, ``path`` or ``None`` (see ``lorenz.config.settings``)."""
        marker = self.extra.get(ENV_KEY)
        return str(marker) if marker is not None else None

    @property
    def passthrough(self) -> bool:
        """Adapter-owned data, kept exactly as written."""
        return bool(self.extra.get(PASSTHROUGH_KEY))

    @property
    def reload(self) -> str | None:
        """``hot``, ``new-runs`` or ``restart``; ``None`` for sections."""
        value = self.extra.get(RELOAD_KEY)
        return str(value) if value is not None else None

    @property
    def description(self) -> str:
        return self.info.description or ""


def sections_of(annotation: Any) -> tuple[type[pydantic.BaseModel] | None, bool]:
    """The section model inside a field annotation, and whether it is a map of them.

    ``TrackerSettings`` → (TrackerSettings, False); ``dict[str, AgentKindSettings]`` →
    (AgentKindSettings, True); ``X | None`` is looked through; anything else → (None, False).
    """
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        for arg in args:
            if arg is type(None):
                continue
            model, is_map = sections_of(arg)
            if model is not None:
                return model, is_map
        return None, False
    if origin is dict and len(args) == 2:
        value = args[1]
        if isinstance(value, type) and issubclass(value, pydantic.BaseModel):
            return value, True
    return None, False


def iter_fields(
    model: type[pydantic.BaseModel] = WorkflowSettings, *, prefix: str = ""
) -> Iterator[SettingsField]:
    """Every field of ``model`` and of its nested sections, parents before children."""
    for name, info in model.model_fields.items():
        key_path = f"{prefix}{name}"
        section, is_map = sections_of(info.annotation)
        yield SettingsField(
            key_path=key_path,
            name=name,
            info=info,
            owner=model,
            section=section,
            is_map_of_sections=is_map,
        )
        if section is not None:
            child_prefix = f"{key_path}.{MAP_ENTRY}." if is_map else f"{key_path}."
            yield from iter_fields(section, prefix=child_prefix)


def leaf_fields(model: type[pydantic.BaseModel] = WorkflowSettings) -> Iterator[SettingsField]:
    """The fields that hold values (not sections)."""
    return (f for f in iter_fields(model) if f.section is None)


def model_at(
    loc: tuple[str | int, ...], model: type[pydantic.BaseModel] = WorkflowSettings
) -> type[pydantic.BaseModel] | None:
    """The section model that a pydantic error location points *into*, if there is one.

    ``("tracker",)`` → TrackerSettings; ``("agents", "claude")`` → AgentKindSettings.
    """
    current: type[pydantic.BaseModel] | None = model
    pending_map = False
    for segment in loc:
        if current is None:
            return None
        if pending_map:
            pending_map = False
            continue
        info = current.model_fields.get(str(segment))
        if info is None:
            return None
        current, pending_map = sections_of(info.annotation)
    return None if pending_map else current
