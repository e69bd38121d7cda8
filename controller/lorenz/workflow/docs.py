"""Keeping ``docs/configuration.md`` generated from the schema, so the reference never drifts.

The page is hand-written prose with generated blocks between markers::

    <!-- generated:keys -->
    ...table produced from the settings model...
    <!-- /generated:keys -->

Blocks: ``keys`` (every key: type, default, validation, reload note, description), ``flags``,
``features``, ``errors`` (every coded workflow error) and ``limits`` (the parsing bounds). Run::

    python -m lorenz.workflow.docs            # rewrite docs/configuration.md in place
    python -m lorenz.workflow.docs --check    # exit 1 if it is out of date (the tests do this)
"""

from __future__ import annotations

import argparse
import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pydantic
from pydantic.fields import FieldInfo

from lorenz.workflow.bounded_yaml import MAX_WORKFLOW_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES
from lorenz.workflow.errors import (
    ERROR_CLASSES,
    WorkflowLoadTimeout,
    WorkflowTooComplex,
    WorkflowTooLarge,
)
from lorenz.workflow.flags import FEATURES, FLAG_FIELDS, env_feature_name, env_flag_name
from lorenz.workflow.reloading import LOAD_TIMEOUT_S
from lorenz.workflow.schema import SettingsField, iter_fields

DEFAULT_DOC = Path("docs/configuration.md")
_BLOCK = re.compile(
    r"(?P<open><!-- generated:(?P<name>[a-z-]+) -->\n).*?(?P<close><!-- /generated:(?P=name) -->)",
    re.DOTALL,
)


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (types.UnionType, typing.Union):
        members = [_type_name(a) for a in args if a is not type(None)]
        optional = len(members) < len(args)
        return " or ".join(members) + (" (optional)" if optional else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if annotation is Any:
        return "any (pass-through)"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return "section"
    names = {str: "string", int: "integer", bool: "boolean", float: "number"}
    if isinstance(annotation, type) and annotation in names:
        return names[annotation]
    return str(annotation)


def _constraints(annotation: Any, metadata: Sequence[Any]) -> list[str]:
    # NB: pydantic keeps constraints as annotated-types objects (Gt, Ge, Le, MinLen); they are
    # read by attribute so that this module does not import pydantic's own dependencies.
    found: list[str] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            found.extend(_constraints(item.annotation, item.metadata))
            continue
        for attribute, template in (("gt", "> {}"), ("ge", ">= {}"), ("le", "<= {}")):
            value = getattr(item, attribute, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.append(template.format(value))
        if getattr(item, "min_length", None) == 1:
            found.append("non-empty")
    for arg in typing.get_args(annotation):
        if isinstance(arg, FieldInfo):
            found.extend(_constraints(arg.annotation, arg.metadata))
        elif typing.get_origin(arg) is typing.Annotated:
            found.extend(_constraints(arg, typing.get_args(arg)[1:]))
    return found


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, pydantic.BaseModel):
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    if value in ("", [], {}):
        return f"`{value!r}`".replace("'", '"')
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _default_note(field: SettingsField) -> str:
    if field.key_path == "workspace.root":
        return "`<system temp>/lorenz_workspaces`"
    return _default(field.info)


def render_keys() -> str:
    rows = [
        "| key | type | default | validation | reload | description |",
        "|---|---|---|---|---|---|",
    ]
    for field in iter_fields():
        if field.section is not None:
            kind = "map of sections" if field.is_map_of_sections else "section"
            rows.append(
                f"| **`{field.key_path}`** | {kind} | | | | {_one_line(field.description)} |"
            )
            continue
        checks = list(dict.fromkeys(_constraints(field.info.annotation, field.info.metadata)))
        marker = field.env_marker
        if marker == "secret":
            checks.append("`$VAR` (secret)")
        elif marker == "path":
            checks.append("`$VAR`, `~`, relative to WORKFLOW.md")
        if field.passthrough:
            checks.append("passed through unchanged")
        rows.append(
            f"| `{field.key_path}` | {_type_name(field.info.annotation)} | "
            f"{_default_note(field)} | {', '.join(checks)} | {field.reload or ''} | "
            f"{_one_line(field.description)} |"
        )
    return "\n".join(rows)


def render_flags() -> str:
    rows = ["| flag | environment | type | default | description |", "|---|---|---|---|---|"]
    for key, field in FLAG_FIELDS.items():
        rows.append(
            f"| `{key}` | `{env_flag_name(key)}` | {_type_name(field.info.annotation)} | "
            f"{_default(field.info)} | {_one_line(field.description)} |"
        )
    return "\n".join(rows)


def render_features() -> str:
    rows = ["| feature | environment | implies | description |", "|---|---|---|---|"]
    for name, feature in FEATURES.items():
        implies = ", ".join(f"`{k}={_flag_literal(v)}`" for k, v in feature.implies.items())
        rows.append(
            f"| `{name}` | `{env_feature_name(name)}` | {implies} | "
            f"{_one_line(feature.description)} |"
        )
    return "\n".join(rows)


def _flag_literal(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def render_errors() -> str:
    rows = ["| code | meaning |", "|---|---|"]
    for cls in ERROR_CLASSES:
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0]
        rows.append(f"| `{cls.code}` | {_one_line(summary)} |")
    return "\n".join(rows)


def render_limits() -> str:
    rows = ["| limit | value | when exceeded |", "|---|---|---|"]
    for name, value, code in (
        ("file size", f"{MAX_WORKFLOW_BYTES} bytes (1 MiB)", WorkflowTooLarge.code),
        ("nesting depth of maps and lists", str(MAX_YAML_DEPTH), WorkflowTooComplex.code),
        ("values (scalars, maps, lists), aliases expanded", str(MAX_YAML_NODES),
         WorkflowTooComplex.code),
        ("time for a hot reload", f"{LOAD_TIMEOUT_S:g} s", WorkflowLoadTimeout.code),
    ):
        rows.append(f"| {name} | {value} | `{code}` |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {
    "keys": render_keys,
    "flags": render_flags,
    "features": render_features,
    "errors": render_errors,
    "limits": render_limits,
}


def regenerate(text: str) -> str:
    """``text`` with every generated block re-rendered (unknown block names are an error)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}; known: {', '.join(BLOCKS)}")
        return f"{match.group('open')}{BLOCKS[name]()}\n{match.group('close')}"

    return _BLOCK.sub(replace, text)


def block_names(text: str) -> list[str]:
    return [match.group("name") for match in _BLOCK.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lorenz.workflow.docs")
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_DOC)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    fresh = regenerate(current)
    if args.check:
        if fresh != current:
            print(
                f"{args.path} is out of date; run python -m lorenz.workflow.docs", file=sys.stderr
            )
            return 1
        return 0
    if fresh != current:
        args.path.write_text(fresh, encoding="utf-8")
        print(f"updated {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
