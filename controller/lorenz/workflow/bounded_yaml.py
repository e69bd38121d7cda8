"""Decoding untrusted YAML within fixed bounds of size, depth and expanded node count.

WORKFLOW.md is outside input: it may come from a branch anyone can push to, and the daemon
re-reads it on every change. Plain ``yaml.safe_load`` has two traps there:

* **alias expansion** — ``&a [x, x, ...]`` then ``&b [*a, *a, ...]`` nine times over is a few
  hundred bytes of YAML that PyYAML builds cheaply (aliases share one Python object), but that
  expands to hundreds of millions of values as soon as anything walks the result (our resolver,
  pydantic, ``json.dumps``): tens of seconds and gigabytes;
* **nesting** — the composer recurses once per level, so ``[[[[...]]]]`` a thousand deep raises
  :class:`RecursionError` out of the parser, which is not a ``yaml.YAMLError``.

:class:`BoundedSafeLoader` is PyYAML's safe loader with its composer hooked: every node counts
towards :data:`MAX_YAML_NODES`, an alias counts the whole subtree it stands for (measured once
per anchor), and the depth of the *expanded* tree is held to :data:`MAX_YAML_DEPTH`. Exceeding a
bound raises :class:`YamlTooComplex` naming it, long before the work becomes large. The size of
the text is bounded before parsing by the caller (:data:`MAX_WORKFLOW_BYTES`).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_WORKFLOW_BYTES = 1024 * 1024
"""Largest WORKFLOW.md accepted (bytes): ``workflow_too_large`` above it."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of front-matter maps and lists, aliases expanded: ``workflow_too_complex``."""
MAX_YAML_NODES = 100_000
"""Most front-matter values (scalars, maps, lists), aliases expanded: ``workflow_too_complex``."""


class YamlTooComplex(yaml.YAMLError):
    """The YAML exceeds :data:`MAX_YAML_DEPTH` or :data:`MAX_YAML_NODES` (message names which)."""


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses documents beyond the depth and node-count bounds."""

    max_depth = MAX_YAML_DEPTH
    max_nodes = MAX_YAML_NODES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._measured: dict[int, tuple[int, int]] = {}
        """id(node) → (expanded node count, expanded height) of an aliased node."""
        self._open_anchors: list[str] = []
        """Anchors of the nodes being composed (an alias to one of them is a cycle)."""

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            anchor = self._next_anchor()
            if anchor in self._open_anchors:
                # NB: PyYAML registers an anchor before composing its children, so `&a [*a]`
                # would decode to a list containing itself: infinite once walked.
                raise YamlTooComplex(f"alias *{anchor} refers to a value that contains it")
            target = self.anchors.get(anchor) if anchor is not None else None
            if target is not None:
                # NB: an alias is the whole subtree again for anyone walking the result.
                size, height = self._measure(target)
                self._count(size)
                self._check_depth(self._depth + height)
            return super().compose_node(parent, index)
        anchor = self._next_anchor()
        self._depth += 1
        self._check_depth(self._depth)
        self._count(1)
        if anchor is not None:
            self._open_anchors.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.pop()

    def _next_anchor(self) -> str | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # NB: untyped in types-PyYAML
        anchor = getattr(event, "anchor", None)
        return anchor if isinstance(anchor, str) else None

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > self.max_nodes:
            raise YamlTooComplex(
                f"more than {self.max_nodes} values once aliases are expanded "
                f"(limit {self.max_nodes} nodes)"
            )

    def _check_depth(self, depth: int) -> None:
        if depth > self.max_depth:
            raise YamlTooComplex(
                f"nested deeper than {self.max_depth} levels (limit depth {self.max_depth})"
            )

    def _measure(self, node: Node) -> tuple[int, int]:
        """(node count, height) of a finished ``node`` with every alias inside it expanded."""
        key = id(node)
        known = self._measured.get(key)
        if known is not None:
            return known
        size, height = 1, 1
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        for child in children:
            child_size, child_height = self._measure(child)
            size += child_size
            height = max(height, child_height + 1)
            if size > self.max_nodes:
                break  # already too big; _count reports it
            if height > self.max_depth:
                break
        self._measured[key] = (size, height)
        return size, height


def load_bounded_yaml(text: str) -> Any:
    """The one document in ``text``, decoded safely within the bounds.

    Raises ``yaml.YAMLError`` (:class:`YamlTooComplex` for a bound). NB: ``RecursionError`` is
    turned into :class:`YamlTooComplex` too, as a last line of defence should a path through
    PyYAML recurse before a bound is checked.
    """
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YamlTooComplex(
            f"nested too deeply to decode (limit depth {MAX_YAML_DEPTH})"
        ) from None
    finally:
        loader.dispose()
