"""``$VAR`` indirection, path resolution and null dropping, applied before the schema types values.

The environment never overrides WORKFLOW.md wholesale: a value is taken from the environment
only where the file says so (a whole value ``$NAME``) or where a tracker documents a fallback for
an omitted key (``LINEAR_API_KEY``). The exact rules:

* ``$NAME`` counts only as the *whole* value, ``NAME`` matching ``[A-Za-z_][A-Za-z0-9_]*``;
  ``${NAME}``, ``$A/b`` or ``x$A`` are literal text;
* secret fields (``x-lorenz-env: secret``): ``$NAME`` becomes the variable's value; a value that
  is empty (or blank) after that counts as missing; for a tracker-documented fallback, an
  omitted key or an unset ``$NAME`` reads the fallback variable instead (a ``$NAME`` that is set
  but empty does not fall back: it is missing);
* path fields (``x-lorenz-env: path``): ``$NAME`` substitution, then ``~`` expansion, then a
  relative path is made absolute against the folder of WORKFLOW.md; unset or empty means
  missing, and ``workspace.root`` then falls back to ``<system temp>/lorenz_workspaces``;
* everything else (commands, hooks, agent ``env``) stays verbatim — the launched shell expands
  what it needs;
* map keys become strings, and ``key: null`` is dropped so the default applies; pass-through
  fields (``x-lorenz-passthrough``) are the exception and keep their nulls.

The fields are found by walking the settings model (:mod:`lorenz.workflow.schema`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

from lorenz.config import ENV_KEY, PASSTHROUGH_KEY, TrackerKind, WorkflowSettings
from lorenz.workflow.schema import sections_of

_VAR_REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

TRACKER_ENV_FALLBACKS: Mapping[TrackerKind, Mapping[str, str]] = {
    TrackerKind.LINEAR: {"api_key": "LINEAR_API_KEY", "assignee": "LINEAR_ASSIGNEE"},
    TrackerKind.GITHUB: {"api_key": "GITHUB_TOKEN"},
    TrackerKind.GITLAB: {"api_key": "GITLAB_TOKEN"},
    TrackerKind.JIRA: {"api_key": "JIRA_API_TOKEN", "email": "JIRA_EMAIL"},
}
"""Per tracker kind: ``tracker.<key>`` → the environment variable read when the key is omitted
(or names an unset ``$VAR``)."""

DEFAULT_WORKSPACE_DIRNAME = "lorenz_workspaces"


def default_workspace_root() -> str:
    """``<system temp>/lorenz_workspaces``, absolute."""
    return str(Path(tempfile.gettempdir()).absolute() / DEFAULT_WORKSPACE_DIRNAME)


def var_reference(value: Any) -> str | None:
    """The variable name if ``value`` is exactly ``$NAME``, else ``None``."""
    if isinstance(value, str):
        match = _VAR_REF.fullmatch(value)
        if match:
            return match.group(1)
    return None


def resolve_front_matter(
    data: Mapping[str, Any], *, base_dir: Path, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The known sections of ``data`` with every rule above applied, ready for the schema.

    ``data`` must already be stripped of unknown top-level keys and of ``flags``/``features``.
    """
    resolver = _Resolver(base_dir=base_dir, environ=environ, fallbacks=_fallbacks_for(data))
    resolved = resolver.walk(WorkflowSettings, data, path=())
    workspace = resolved.get("workspace")
    if not isinstance(workspace, dict):
        if "workspace" in resolved:
            return resolved  # not a map: the schema reports it
        workspace = resolved["workspace"] = {}
    workspace.setdefault("root", default_workspace_root())
    return resolved


def _fallbacks_for(data: Mapping[str, Any]) -> Mapping[str, str]:
    tracker = data.get("tracker")
    if not isinstance(tracker, Mapping):
        return {}
    kind = tracker.get("kind")
    try:
        tracker_kind = TrackerKind(str(kind).strip()) if isinstance(kind, str) else None
    except ValueError:
        return {}
    if tracker_kind is None:
        return {}
    fallbacks = TRACKER_ENV_FALLBACKS.get(tracker_kind, {})
    return {f"tracker.{key}": env_name for key, env_name in fallbacks.items()}


class _Resolver:
    def __init__(
        self, *, base_dir: Path, environ: Mapping[str, str], fallbacks: Mapping[str, str]
    ) -> None:
        self.base_dir = base_dir
        self.environ = environ
        self.fallbacks = fallbacks

    def walk(
        self, model: type[pydantic.BaseModel], data: Mapping[Any, Any], *, path: tuple[str, ...]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for raw_key, value in data.items():
            key = str(raw_key)
            info = model.model_fields.get(key)
            if info is None:
                # Unknown inside a known section: keep it (even if null) so the schema names it.
                out[key] = _plain(value)
                continue
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if extra.get(PASSTHROUGH_KEY):
                if value is not None:
                    out[key] = _stringify_keys(value)
                continue
            key_path = (*path, key)
            resolved = self._field(info.annotation, extra, value, key_path=key_path)
            if resolved is not _MISSING:
                out[key] = resolved
        # NB: an omitted (or null) key with a documented env fallback behaves like "$FALLBACK".
        for dotted, env_name in self.fallbacks.items():
            parent, _, leaf = dotted.rpartition(".")
            if parent == ".".join(path) and data.get(leaf) is None:
                value = self._env_value(env_name)
                if value is not None:
                    out[leaf] = value
        return out

    def _field(
        self, annotation: Any, extra: Mapping[str, Any], value: Any, *, key_path: tuple[str, ...]
    ) -> Any:
        if value is None:
            return _MISSING
        section, is_map = sections_of(annotation)
        if section is not None and isinstance(value, Mapping):
            if is_map:
                return {
                    str(name): (
                        self.walk(section, entry, path=(*key_path, str(name)))
                        if isinstance(entry, Mapping)
                        else _plain(entry)
                    )
                    for name, entry in value.items()
                    if entry is not None
                }
            return self.walk(section, value, path=key_path)
        marker = extra.get(ENV_KEY)
        if marker == "secret":
            return self._secret(value, key_path=key_path)
        if marker == "path":
            return self._path(value)
        return _plain(value)

    def _env_value(self, name: str) -> str | None:
        value = self.environ.get(name)
        if value is None or not value.strip():
            return None
        return value

    def _secret(self, value: Any, *, key_path: tuple[str, ...]) -> Any:
        if not isinstance(value, str):
            return value  # the schema rejects it with a proper message
        name = var_reference(value)
        if name is None:
            return value if value.strip() else _MISSING
        if name in self.environ:
            return self._env_value(name) or _MISSING
        fallback = self.fallbacks.get(".".join(key_path))
        if fallback is not None:
            return self._env_value(fallback) or _MISSING
        return _MISSING

    def _path(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        name = var_reference(value)
        if name is not None:
            substituted = self._env_value(name)
            if substituted is None:
                return _MISSING
            value = substituted
        if not value.strip():
            return _MISSING
        expanded = Path(os.path.expanduser(value))
        if not expanded.is_absolute():
            expanded = self.base_dir / expanded
        return os.path.normpath(expanded)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _stringify_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _stringify_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stringify_keys(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """Keys to strings and nulls dropped, recursively through maps (lists keep their items)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
