"""Atlassian Document Format (ADF) in and out, for the Jira tracker.

Jira Cloud REST v3 carries rich text (issue descriptions, comments) as ADF: a JSON tree of
``{"type": ..., "content": [...], "text": ..., "attrs": {...}}`` nodes under one
``{"type": "doc", "version": 1}`` root. Prompts want plain text, and the tracker's own writes
(escalation comments) start from plain text, so this module converts both ways.

The tree comes from outside, so reading it is bounded: at most :data:`MAX_DEPTH` levels and
:data:`MAX_NODES` nodes are visited and at most :data:`MAX_TEXT_CHARS` characters produced; what
lies beyond is cut off (and the cut marked) rather than read. Unknown node types contribute
their children's text, so a newer ADF node never loses the words inside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting read; deeper nodes are skipped."""
MAX_NODES = 20000
"""Most nodes read from one document."""
MAX_TEXT_CHARS = 200000
"""Longest text produced from one document."""
TRUNCATED = "\n[…]"
"""Appended when a document was cut off at one of the bounds above."""

_BLOCKS = frozenset(
    {
        "paragraph",
        "heading",
        "blockquote",
        "codeBlock",
        "bulletList",
        "orderedList",
        "listItem",
        "panel",
        "rule",
        "table",
        "tableRow",
        "tableHeader",
        "tableCell",
        "mediaGroup",
        "mediaSingle",
        "expand",
        "nestedExpand",
        "decisionList",
        "decisionItem",
        "taskList",
        "taskItem",
    }
)
"""Node types that start on a line of their own."""
_VISIBLE_ATTRS = {
    "mention": ("text",),
    "emoji": ("text", "shortName"),
    "status": ("text",),
    "inlineCard": ("url",),
    "blockCard": ("url",),
    "date": ("timestamp",),
}
"""Leaf nodes without text children: the attribute that holds what a reader sees."""


class _Budget:
    def __init__(self) -> None:
        self.nodes = 0
        self.chars = 0
        self.cut = False

    def take_node(self) -> bool:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.cut = True
            return False
        return True

    def take_text(self, text: str) -> str:
        room = MAX_TEXT_CHARS - self.chars
        if room <= 0:
            self.cut = True
            return ""
        if len(text) > room:
            self.cut = True
            text = text[:room]
        self.chars += len(text)
        return text


def adf_to_text(document: Any) -> str | None:
    """The plain text of an ADF document (a string passes through; anything else is ``None``).

    Blocks are separated by blank lines, list items get ``- `` (or ``1. ``), headings ``#``
    marks, code blocks fences; mentions, emoji, dates and cards become their visible text.
    """
    if document is None:
        return None
    if isinstance(document, str):
        return document
    if not isinstance(document, Mapping):
        return None
    budget = _Budget()
    lines = _blocks(document, depth=0, budget=budget)
    text = "\n\n".join(block for block in lines if block.strip()).strip("\n")
    if budget.cut:
        text += TRUNCATED
    return text


def _blocks(node: Mapping[str, Any], *, depth: int, budget: _Budget) -> list[str]:
    """The node's children as rendered blocks (the root and container nodes)."""
    out: list[str] = []
    inline: list[str] = []
    for child in _children(node, depth=depth, budget=budget):
        kind = child.get("type")
        if kind in _BLOCKS:
            if inline:
                out.append("".join(inline))
                inline = []
            out.append(_block(child, depth=depth + 1, budget=budget))
        else:
            inline.append(_inline(child, depth=depth + 1, budget=budget))
    if inline:
        out.append("".join(inline))
    return out


def _children(node: Mapping[str, Any], *, depth: int, budget: _Budget) -> list[Mapping[str, Any]]:
    content = node.get("content")
    if depth >= MAX_DEPTH:
        if content:
            budget.cut = True
        return []
    if not isinstance(content, list):
        return []
    children: list[Mapping[str, Any]] = []
    for child in content:
        if not isinstance(child, Mapping):
            continue
        if not budget.take_node():
            break
        children.append(child)
    return children


def _block(node: Mapping[str, Any], *, depth: int, budget: _Budget) -> str:
    kind = node.get("type")
    attrs = node.get("attrs") if isinstance(node.get("attrs"), Mapping) else {}
    assert isinstance(attrs, Mapping)
    if kind == "rule":
        return budget.take_text("---")
    if kind == "codeBlock":
        language = attrs.get("language") if isinstance(attrs.get("language"), str) else ""
        body = "".join(_inline(c, depth=depth + 1, budget=budget)
                       for c in _children(node, depth=depth, budget=budget))
        return f"```{language}\n{body}\n```"
    if kind in ("bulletList", "orderedList", "taskList", "decisionList"):
        items = _children(node, depth=depth, budget=budget)
        order = attrs.get("order")
        start = order if isinstance(order, int) else 1
        rendered = []
        for index, item in enumerate(items):
            text = "\n".join(_blocks(item, depth=depth + 1, budget=budget))
            marker = f"{start + index}. " if kind == "orderedList" else "- "
            if kind == "taskList" and isinstance(item.get("attrs"), Mapping):
                marker = "- [x] " if item["attrs"].get("state") == "DONE" else "- [ ] "
            rendered.append(marker + text.replace("\n", "\n  "))
        return "\n".join(rendered)
    if kind == "tableRow":
        cells = _children(node, depth=depth, budget=budget)
        return " | ".join(
            " ".join(_blocks(c, depth=depth + 1, budget=budget)).replace("\n", " ")
            for c in cells
        )
    if kind == "table":
        return "\n".join(_blocks(node, depth=depth, budget=budget))
    separator = "\n\n" if kind in ("blockquote", "panel", "expand", "nestedExpand") else ""
    text = separator.join(_blocks(node, depth=depth, budget=budget))
    if kind == "heading":
        raw_level = attrs.get("level")
        level = raw_level if isinstance(raw_level, int) else 1
        return f"{'#' * max(1, min(6, level))} {text}"
    if kind == "blockquote":
        return "\n".join(f"> {line}" for line in text.split("\n"))
    return text


def _inline(node: Mapping[str, Any], *, depth: int, budget: _Budget) -> str:
    kind = node.get("type")
    attrs = node.get("attrs") if isinstance(node.get("attrs"), Mapping) else {}
    assert isinstance(attrs, Mapping)
    if kind == "text":
        text = node.get("text")
        return budget.take_text(text) if isinstance(text, str) else ""
    if kind == "hardBreak":
        return "\n"
    for key in _VISIBLE_ATTRS.get(str(kind), ()):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return budget.take_text(value)
    if kind in _BLOCKS:
        return _block(node, depth=depth, budget=budget)
    return "".join(_inline(c, depth=depth + 1, budget=budget)
                   for c in _children(node, depth=depth, budget=budget))


def text_to_adf(text: str, *, code_line: str | None = None) -> dict[str, Any]:
    """``text`` as an ADF document: one paragraph per blank-line-separated block, single line
    breaks as ``hardBreak``. ``code_line``, when given, is a last paragraph in code style
    (the escalation marker: readable, set apart from the prose)."""
    paragraphs: list[dict[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        content: list[dict[str, Any]] = []
        for index, line in enumerate(block.split("\n")):
            if index:
                content.append({"type": "hardBreak"})
            if line:
                content.append({"type": "text", "text": line})
        paragraphs.append({"type": "paragraph", "content": content})
    if code_line is not None:
        paragraphs.append(
            {
                "type": "paragraph",
                "content": [{"type": "text", "text": code_line, "marks": [{"type": "code"}]}],
            }
        )
    return {"type": "doc", "version": 1, "content": paragraphs}
