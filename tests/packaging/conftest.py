"""Chart and manifest tests that run the Go-built helm are cluster tests.

helm comes from ``tests/cluster/build.sh`` like kube-apiserver and etcd, so a checkout without
those binaries (``./scripts/test --fast``, ``-m "not cluster"``) must not collect the tests that
run it as failures. Which tests run helm is read from the code rather than kept as a list: a
test is marked ``cluster`` when it, one of its fixtures, or a helper they call (transitively,
within ``tests``) refers to one of the helm entry points of :mod:`tests.packaging.charts`. A new
helm test is thereby marked without anyone remembering to.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

HELM_ENTRY_POINTS = frozenset({"helm", "helm_binary", "template", "render"})
"""Functions of :mod:`tests.packaging.charts` that run the helm binary."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and _runs_helm(item):
            item.add_marker(pytest.mark.cluster)


def _runs_helm(item: pytest.Function) -> bool:
    seen: set[types.CodeType] = set()
    return any(_refers_to_helm(func, seen) for func in _functions_of(item))


def _functions_of(item: pytest.Function) -> Iterator[Callable[..., Any]]:
    yield item.obj
    # NB: `_fixtureinfo` is pytest's long-standing per-item fixture closure; no public API
    # exposes the fixture functions an item uses.
    info = getattr(item, "_fixtureinfo", None)
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        for definition in definitions:
            yield definition.func


def _refers_to_helm(func: Any, seen: set[types.CodeType]) -> bool:
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if not isinstance(code, types.CodeType):
        return False
    return _code_refers_to_helm(code, getattr(func, "__globals__", {}), seen)


def _code_refers_to_helm(
    code: types.CodeType, namespace: dict[str, Any], seen: set[types.CodeType]
) -> bool:
    if code in seen:
        return False
    seen.add(code)
    for name in code.co_names:
        target = namespace.get(name)
        module = getattr(target, "__module__", "") or ""
        if name in HELM_ENTRY_POINTS and module == "tests.packaging.charts":
            return True
        if module.startswith("tests.") and _refers_to_helm(target, seen):
            return True
    # lambdas, comprehensions and nested functions are constants of the enclosing code
    return any(
        isinstance(const, types.CodeType) and _code_refers_to_helm(const, namespace, seen)
        for const in code.co_consts
    )
