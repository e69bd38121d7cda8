"""``lorenz.model`` loads its names on first use: each resolves to its module's own object,
the lazy table agrees with ``__all__``, and a command that needs one error class does not
import the snapshot dataclasses."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lorenz.model

DEMO_WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "demo" / "WORKFLOW.md"


def test_every_exported_name_is_its_modules_own_object() -> None:
    exports = lorenz.model._EXPORTS
    assert sorted(name for names in exports.values() for name in names) == sorted(
        lorenz.model.__all__
    )
    for module_name, names in exports.items():
        module = importlib.import_module(f"lorenz.model.{module_name}")
        for name in names:
            assert getattr(lorenz.model, name) is getattr(module, name), name
    assert set(lorenz.model.__all__) <= set(dir(lorenz.model))


def test_the_type_checkers_imports_are_the_lazy_table() -> None:
    """The package keeps two name lists (``__all__`` is made from the lazy table): the imports
    type checkers read, each an explicit re-export, must name the same homes."""
    source = Path(lorenz.model.__file__).read_text(encoding="utf-8")
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imported: dict[str, tuple[str, ...]] = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        assert node.module is not None
        assert all(alias.asname == alias.name for alias in node.names), node.module
        module = node.module.removeprefix("lorenz.model.")
        imported[module] = imported.get(module, ()) + tuple(a.name for a in node.names)
    assert imported == lorenz.model._EXPORTS


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = lorenz.model.NoSuchThing  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from lorenz.model import NoSuchThing", {})


def test_validate_does_not_import_the_snapshot_dataclasses() -> None:
    # NB: as the console script runs it (``main()`` with no argv): the one-shot exit skips the
    # interpreter's teardown but still runs atexit callbacks, where the report is printed.
    script = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted("
        "m for m in sys.modules if m.startswith('lorenz.model')))))\n"
        "from lorenz.cli import main\n"
        f"sys.argv = ['lorenz', 'validate', {str(DEMO_WORKFLOW)!r}]\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.startswith("ok "), done
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert "lorenz.model" in modules, "the check must see the package at all"
    assert "lorenz.model.snapshots" not in modules, modules
    assert "lorenz.model.events" not in modules, modules
