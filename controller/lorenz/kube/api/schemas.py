"""pydantic JSON Schema → a Kubernetes *structural* OpenAPI v3 schema, mechanically.

The CRDs are generated from the same models that validate WORKFLOW.md and the statuses the
operator writes, so a new settings key reaches the API server without anybody editing YAML.
JSON Schema as pydantic emits it (draft 2020-12) is not what the API server accepts, though:

* every node needs a ``type`` and ``$ref``/``anyOf`` type tricks are forbidden, so references
  are inlined and ``X | None`` (``anyOf: [X, {type: null}]``) becomes ``X`` with
  ``nullable: true``;
* ``exclusiveMinimum``/``exclusiveMaximum`` are booleans in OpenAPI v3.0, numbers in 2020-12;
  for integers they become an inclusive ``minimum``/``maximum`` one step further in;
* ``additionalProperties: false`` may not sit next to ``properties`` (the API server prunes
  unknown fields instead, and ``kubectl --validate=strict`` reports them);
* ``title`` and pydantic's ``default`` are dropped: the model applies defaults, so a stored
  object keeps only what the user wrote, and a new Lorenz version's defaults apply to old
  objects. The default is appended to the description instead (``kubectl explain`` shows it);
  where the object's reader applies a default of its own (``defaults``: the operator's
  ``worker.kind``), that one is shown.

Untyped or open-ended values (``Any``, ``dict[str, Any]``) are accepted only where the model
marks the field ``x-lorenz-passthrough``: those, and only those, get
``x-kubernetes-preserve-unknown-fields: true``. Anything else the converter does not understand
is an error naming the field, so a new kind of annotation cannot silently weaken validation.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pydantic

from lorenz.config import PASSTHROUGH_KEY
from lorenz.workflow.schema import MAP_ENTRY

PRESERVE = "x-kubernetes-preserve-unknown-fields"

_KEPT_KEYS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "nullable",
        "uniqueItems",
    }
)
_DROPPED_KEYS = frozenset({"title", "default", "examples", "$defs", "$schema", "const"})


def plain_text(text: str) -> str:
    """A docstring as ``kubectl explain`` should show it: no reStructuredText markup.

    ``:class:`~a.b.Name``` → ``Name``, ````code```` and ```code``` → ``code``.
    """
    text = re.sub(r":[a-z]+:`~?(?:[\w.]+\.)?([^`]+)`", r"\1", text)
    return re.sub(r"`{1,2}([^`]+)`{1,2}", r"\1", text)


class SchemaConversionError(ValueError):
    """The JSON schema of a model has a construct with no structural equivalent."""


def structural_schema(
    model: type[pydantic.BaseModel],
    *,
    rename: Callable[[str], str],
    omit: Collection[str] = (),
    by_alias: bool = False,
    nullable: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The structural schema of ``model``.

    ``rename`` maps each property name (the model's field name, or alias with ``by_alias``) to
    the key in the CRD; ``omit`` lists dotted field paths (model names, ``<name>`` for any key
    of a map of sections) that the CRD leaves out. With ``nullable=False``, ``X | None`` is
    just ``X``: the API server then prunes an explicit ``null``, so the model's default applies
    (what ``key: null`` means in WORKFLOW.md). Pass-through values keep their nulls either way.
    ``defaults`` maps dotted field paths to the default the description names instead of the
    model's (the reader of the object fills them in; the schema still sets no ``default``).
    """
    raw = model.model_json_schema(by_alias=by_alias)
    defs = raw.pop("$defs", {})
    converter = _Converter(
        defs=defs,
        rename=rename,
        omit=frozenset(omit),
        keep_nullable=nullable,
        defaults=dict(defaults or {}),
    )
    return converter.convert(raw, path="")


class _Converter:
    def __init__(
        self,
        *,
        defs: Mapping[str, Any],
        rename: Callable[[str], str],
        omit: frozenset[str],
        keep_nullable: bool,
        defaults: Mapping[str, Any],
    ) -> None:
        self._defs = defs
        self._rename = rename
        self._omit = omit
        self._keep_nullable = keep_nullable
        self._defaults = defaults

    def convert(self, node: Mapping[str, Any], *, path: str) -> dict[str, Any]:
        node = self._resolved(node, path=path)
        passthrough = bool(node.get(PASSTHROUGH_KEY))
        node, nullable = self._without_null(node, path=path, passthrough=passthrough)
        nullable = nullable and (self._keep_nullable or passthrough)
        out: dict[str, Any] = {}
        kind = node.get("type")
        if kind is None and "enum" in node:
            kinds = {type(value).__name__ for value in node["enum"]}
            if kinds != {"str"}:
                raise SchemaConversionError(f"{path or '<root>'}: enum of {sorted(kinds)}")
            kind = "string"
        if kind is None:
            if not passthrough:
                raise SchemaConversionError(
                    f"{path or '<root>'}: an untyped value must be marked {PASSTHROUGH_KEY}"
                )
            out[PRESERVE] = True
            self._describe(out, node, path=path)
            if nullable:
                out["nullable"] = True
            return out
        if isinstance(kind, list):
            raise SchemaConversionError(f"{path or '<root>'}: a union of types {kind}")
        out["type"] = kind
        self._describe(out, node, path=path)
        for key, value in node.items():
            if key in ("type", "description", "properties", "required", "items"):
                continue
            if key in ("additionalProperties", "exclusiveMinimum", "exclusiveMaximum"):
                continue
            if key in _DROPPED_KEYS or key.startswith("x-lorenz-"):
                continue
            if key.startswith("x-kubernetes-") or key in _KEPT_KEYS:
                out[key] = copy.deepcopy(value)
                continue
            raise SchemaConversionError(f"{path or '<root>'}: unsupported keyword {key!r}")
        if kind in ("integer", "number"):
            self._bounds(out, node)
        if kind == "array":
            items = node.get("items")
            if not isinstance(items, Mapping):
                raise SchemaConversionError(f"{path or '<root>'}: an array needs one items schema")
            out["items"] = self.convert(items, path=f"{path}[]")
        if kind == "object":
            self._object(out, node, path=path, passthrough=passthrough)
        if nullable:
            out["nullable"] = True
        return out

    # -- pieces ----------------------------------------------------------------------------

    def _resolved(self, node: Mapping[str, Any], *, path: str) -> dict[str, Any]:
        result = dict(node)
        while True:
            if "$ref" in result:
                ref = str(result.pop("$ref"))
                name = ref.rsplit("/", 1)[-1]
                if name not in self._defs:
                    raise SchemaConversionError(f"{path or '<root>'}: unknown $ref {ref}")
                result = {**self._defs[name], **result}
                continue
            all_of = result.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1:
                del result["allOf"]
                result = {**all_of[0], **result}
                continue
            if "allOf" in result:
                raise SchemaConversionError(f"{path or '<root>'}: allOf with several schemas")
            return result

    def _without_null(
        self, node: dict[str, Any], *, path: str, passthrough: bool
    ) -> tuple[dict[str, Any], bool]:
        options = node.get("anyOf")
        if options is None:
            return node, False
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        typed = [o for o in options if o != {"type": "null"}]
        nullable = len(typed) < len(options)
        if len(typed) == 1:
            merged = {**self._resolved(typed[0], path=path), **rest}
            return self._without_null(merged, path=path, passthrough=passthrough)[0], nullable
        if passthrough:
            return rest, nullable
        raise SchemaConversionError(f"{path or '<root>'}: a union of {len(typed)} schemas")

    def _describe(self, out: dict[str, Any], node: Mapping[str, Any], *, path: str) -> None:
        text = plain_text(str(node.get("description") or "").strip())
        default = self._defaults.get(path, node.get("default"))
        if default is not None and default != {} and default != []:
            shown = json.dumps(default)
            text = f"{text} Default: {shown}." if text else f"Default: {shown}."
        if text:
            out["description"] = text

    def _bounds(self, out: dict[str, Any], node: Mapping[str, Any]) -> None:
        integer = node.get("type") == "integer"
        for key, inclusive, step in (
            ("exclusiveMinimum", "minimum", 1),
            ("exclusiveMaximum", "maximum", -1),
        ):
            if key not in node:
                continue
            bound = node[key]
            if isinstance(bound, bool):
                out[key] = bound
            elif integer:
                out[inclusive] = int(bound) + step
            else:
                out[inclusive] = bound
                out[key] = True

    def _object(
        self, out: dict[str, Any], node: Mapping[str, Any], *, path: str, passthrough: bool
    ) -> None:
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties:
            converted: dict[str, Any] = {}
            for name, schema in properties.items():
                child = f"{path}.{name}" if path else name
                if child in self._omit:
                    continue
                converted[self._rename(name)] = self.convert(schema, path=child)
            out["properties"] = converted
            required = [
                self._rename(name)
                for name in node.get("required", ())
                if (f"{path}.{name}" if path else name) not in self._omit
            ]
            if required:
                out["required"] = required
            if extra not in (None, False):
                raise SchemaConversionError(
                    f"{path or '<root>'}: properties and additionalProperties together"
                )
            return
        if extra is None or extra is False:
            if passthrough:
                out[PRESERVE] = True
            return
        if extra is True or extra == {}:
            if not passthrough:
                raise SchemaConversionError(
                    f"{path or '<root>'}: a map of any values must be marked {PASSTHROUGH_KEY}"
                )
            out[PRESERVE] = True
            return
        entry = f"{path}.{MAP_ENTRY}" if path else MAP_ENTRY
        out["additionalProperties"] = self.convert(extra, path=entry)
