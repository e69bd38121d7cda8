"""The effective configuration as plain data, safe to print, log or serve.

``lorenz config`` (and later the HTTP API) shows operators what Lorenz will actually use, after
defaults, ``$VAR`` resolution and flags. Resolved secrets must not leak into terminals, CI logs or
dashboards, so every field marked ``x-lorenz-env: secret`` is replaced by ``***`` when set, and so
are the values of agent ``env`` maps (they often carry API keys for the agent itself).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

from lorenz.config import WorkflowSettings
from lorenz.secrets import REDACTED
from lorenz.workflow.flags import FlagValue
from lorenz.workflow.schema import MAP_ENTRY, leaf_fields

__all__ = ["REDACTED", "REDACTED_MAPS", "flag_report", "redacted_settings", "secret_key_paths"]

# NB: agent env maps are not `x-lorenz-env: secret` fields (their values are passed verbatim, not
# `$VAR`-resolved), so they are named here; a test keeps this list in step with the schema.
REDACTED_MAPS: tuple[str, ...] = (f"agents.{MAP_ENTRY}.env",)


def secret_key_paths() -> tuple[str, ...]:
    """Key paths (``<name>`` for map entries) whose values are redacted."""
    return tuple(f.key_path for f in leaf_fields() if f.env_marker == "secret")


def redacted_settings(settings: WorkflowSettings) -> dict[str, Any]:
    """``settings`` as JSON-compatible data with secrets replaced by ``***``."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    for key_path in secret_key_paths():
        for parent, leaf in _locate(data, key_path.split(".")):
            if parent.get(leaf) is not None:
                parent[leaf] = REDACTED
    for key_path in REDACTED_MAPS:
        for parent, leaf in _locate(data, key_path.split(".")):
            mapping = parent.get(leaf)
            if isinstance(mapping, dict):
                parent[leaf] = {name: REDACTED for name in mapping}
    return data


def flag_report(sources: Mapping[str, FlagValue]) -> dict[str, dict[str, Any]]:
    """Flags or features as ``{key: {"value": ..., "source": ..., "via": ...}}`` (JSON-ready)."""
    report: dict[str, dict[str, Any]] = {}
    for key, flag in sources.items():
        value = flag.value
        if isinstance(value, enum.Enum):
            value = value.value
        report[key] = {"value": value, "source": flag.source.value, "via": flag.via}
    return report


def _locate(data: Any, segments: list[str]) -> Iterator[tuple[dict[str, Any], str]]:
    if not isinstance(data, dict) or not segments:
        return
    head, rest = segments[0], segments[1:]
    if not rest:
        yield data, head
        return
    children = list(data.values()) if head == MAP_ENTRY else [data.get(head)]
    for child in children:
        yield from _locate(child, rest)
