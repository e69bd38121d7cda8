"""A package's names loaded on first use (PEP 562), the same way in every package that does it.

A process often needs one module of a package and not the rest: the launcher and its workers
need :mod:`lorenz.leadership.processes` but not the file lease, a controller polling Linear
needs one tracker adapter of six (issue #35: what each process imports is memory every run
pays for). Such a package keeps a table of where each lazy name lives and installs the module
``__getattr__`` and ``__dir__`` that :func:`lazy_attributes` makes: a name is imported from its
home module at its first use and kept as a plain global after (no ``__getattr__`` again).

NB: packages install them under ``if not TYPE_CHECKING``: a module ``__getattr__`` would make
type checkers accept any name; they read the packages' explicit ``X as X`` imports instead
(tests/test_lean_imports.py checks that those and the tables agree).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    *, package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose lazy names live in the
    submodules ``homes`` names (name → submodule), kept in ``namespace`` (its ``globals()``)."""

    def __getattr__(name: str) -> object:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # NB: the next use is a plain global, no __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
