"""Field docstrings as field descriptions, read with one parse per module instead of per class.

Every settings field is documented by the string literal under it; that text is the field's
``description``, and from there the JSON schema's, the CRD's and docs/configuration.md's.
pydantic can do this itself (``use_attribute_docstrings=True``), but it does it for each class
as the class is created: it walks the call stack with :func:`inspect.getmodule`, re-tokenizes the
class's source with the pure-Python tokenizer and parses it twice — about a tenth of the CPU of
``lorenz validate``, spent on text that only the docs, the CRDs and ``--help`` ever read.

:class:`DocumentedModel` gives the same result for the models derived from it: each module's
source is parsed once (:func:`ast.parse`, cached), and each class takes the docstrings of its
own body. The rules are pydantic's: a string literal right after an annotated assignment
documents that name; nested classes and functions are not looked into; the text is
:func:`inspect.cleandoc`-ed; an explicit ``Field(description=...)`` wins.

NB: a description must be in place before pydantic builds the model's schema, where it is
copied into the JSON-schema metadata. So models derived from :class:`DocumentedModel` must be
``defer_build=True`` (the schema is then built at first use, after
``__pydantic_init_subclass__`` ran); a model whose schema already exists is refused.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import sys
from collections.abc import Mapping
from typing import Any

import pydantic


class DocumentedModel(pydantic.BaseModel):
    """A model whose fields' docstrings become their descriptions (see the module docstring)."""

    model_config = pydantic.ConfigDict(defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__pydantic_complete__:
            raise TypeError(
                f"{cls.__qualname__}: a DocumentedModel must keep defer_build=True, or its "
                "field docstrings would miss its schema"
            )
        docstrings = attribute_docstrings(cls.__module__, cls.__qualname__)
        for name, info in cls.__pydantic_fields__.items():
            if info.description is None and name in docstrings:
                info.description = docstrings[name]


def attribute_docstrings(module: str, qualname: str) -> Mapping[str, str]:
    """``{attribute: docstring}`` of the class ``qualname`` defined at top level of ``module``
    (empty when the source cannot be read, e.g. a class made in a function or a REPL)."""
    return _module_docstrings(module).get(qualname, {})


@functools.cache
def _module_docstrings(module: str) -> dict[str, dict[str, str]]:
    loaded = sys.modules.get(module)
    filename = getattr(loaded, "__file__", None)
    if not filename:
        return {}
    source = "".join(linecache.getlines(filename))
    if not source:
        return {}
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return {}
    found: dict[str, dict[str, str]] = {}
    _collect(tree.body, prefix="", into=found)
    return found


def _collect(body: list[ast.stmt], *, prefix: str, into: dict[str, dict[str, str]]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            qualname = f"{prefix}{node.name}"
            into[qualname] = _class_docstrings(node)
            _collect(node.body, prefix=f"{qualname}.", into=into)


def _class_docstrings(node: ast.ClassDef) -> dict[str, str]:
    docstrings: dict[str, str] = {}
    previous: ast.stmt | None = None
    for statement in node.body:
        if (
            isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
            and isinstance(previous, ast.AnnAssign)
            and isinstance(previous.target, ast.Name)
        ):
            docstrings[previous.target.id] = inspect.cleandoc(statement.value.value)
        previous = statement
    return docstrings
