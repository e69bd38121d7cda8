"""Splitting WORKFLOW.md into YAML front matter and a prompt body, and decoding the YAML.

This is done by hand with PyYAML rather than with a front-matter library, because the rules are
exact and a library bends them: python-frontmatter turns a non-map front matter into ``{}``
silently, where we must report ``workflow_front_matter_not_a_map``. The rules:

* front matter exists only when the first line is exactly ``---``; it runs to the next line
  that is exactly ``---``, and the body is everything after that line;
* lines end with ``\\r\\n``, ``\\n`` or ``\\r`` (any mix);
* with no closing ``---``, every remaining line is YAML and the body is empty;
* empty (or whitespace-only) front matter is ``{}``; anything other than a map is an error;
* the body is trimmed of surrounding whitespace;
* the YAML is decoded within bounds of depth and alias-expanded size (an alias bomb or a
  thousand-deep nesting is a coded error, not a frozen or crashed process).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from lorenz.workflow.bounded_yaml import YamlTooComplex, load_bounded_yaml
from lorenz.workflow.errors import (
    WorkflowFrontMatterNotAMap,
    WorkflowParseError,
    WorkflowTooComplex,
)

FENCE = "---"
_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclasses.dataclass(frozen=True, slots=True)
class SplitDocument:
    """WORKFLOW.md cut into its two parts (nothing decoded yet)."""

    front_matter: str | None
    """The YAML text between the fences, or ``None`` when the file has no front matter."""
    body: str
    """The prompt template, trimmed."""
    body_line: int
    """1-based line number in the file of the trimmed body's first line."""


def split_front_matter(text: str) -> SplitDocument:
    """Cut ``text`` into front matter and body by the fence rules above."""
    # NB: str.splitlines() would also split on \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029,
    # which may legitimately appear inside YAML strings or the prompt; only the three real
    # newline conventions count.
    lines = _NEWLINE.split(text)
    if not lines or lines[0] != FENCE:
        raw_body = "\n".join(lines)
        return SplitDocument(
            front_matter=None, body=raw_body.strip(), body_line=1 + _leading_newlines(raw_body)
        )
    for index in range(1, len(lines)):
        if lines[index] == FENCE:
            raw_body = "\n".join(lines[index + 1 :])
            return SplitDocument(
                front_matter="\n".join(lines[1:index]),
                body=raw_body.strip(),
                body_line=index + 2 + _leading_newlines(raw_body),
            )
    return SplitDocument(front_matter="\n".join(lines[1:]), body="", body_line=len(lines) + 1)


def parse_front_matter(yaml_text: str | None, *, path: Path | None = None) -> dict[str, Any]:
    """Decode the front matter into a map; ``None`` or blank text gives ``{}``.

    Decoding is bounded in depth and expanded size (:mod:`lorenz.workflow.bounded_yaml`).
    """
    if yaml_text is None or not yaml_text.strip():
        return {}
    where = f"{path}: " if path else ""
    try:
        data = load_bounded_yaml(yaml_text)
    except YamlTooComplex as exc:
        raise WorkflowTooComplex(
            f"{where}front matter is too complex: {exc}; flatten it or remove repeated aliases"
        ) from None
    except yaml.YAMLError as exc:
        raise WorkflowParseError(
            f"{where}front matter is not valid YAML ({_describe_yaml_error(exc)}); fix the YAML "
            "between the --- lines"
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WorkflowFrontMatterNotAMap(
            f"{where}front matter must be a YAML map of keys (tracker:, agent:, ...), "
            f"not a {_yaml_kind(data)}"
        )
    return data


def decode_workflow_bytes(content: bytes, *, path: Path | None = None) -> str:
    """UTF-8 text of the file (a leading byte-order mark is dropped)."""
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"{path} " if path else ""
        raise WorkflowParseError(
            f"{where}is not UTF-8 text (byte {exc.start}); save the file as UTF-8"
        ) from exc


def _leading_newlines(text: str) -> int:
    return text[: len(text) - len(text.lstrip())].count("\n")


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return str(problem)
    # NB: the mark counts from the first YAML line, which is line 2 of the file (after ---).
    return f"line {mark.line + 2}, column {mark.column + 1}: {problem}"


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__
