"""The error-code registry is complete, documented, used at every site, and docs/errors.md is
rendered from it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from lorenz.codes import CODE_DOCS, Area, ErrorCode, Kind
from lorenz.codes.docs import AREA_TITLES, render_error_docs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "controller" / "lorenz"
ERRORS_MD = ROOT / "docs" / "errors.md"
REGISTRY_FILES = {PACKAGE / "codes" / "__init__.py", PACKAGE / "codes" / "docs.py"}
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")


def _package_trees() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY_FILES
    ]


def test_the_committed_docs_are_the_rendered_registry() -> None:
    # NB: regenerate with `python -m lorenz.codes.docs > docs/errors.md`.
    assert ERRORS_MD.read_text(encoding="utf-8") == render_error_docs()


def test_every_code_has_one_line_meaning_and_action() -> None:
    assert set(CODE_DOCS) == set(ErrorCode)
    for code, doc in CODE_DOCS.items():
        for text in (doc.meaning, doc.action):
            assert text, code
            assert text.strip() == text, code
            assert "\n" not in text, code
            assert text.endswith("."), (code, text)
        assert isinstance(doc.area, Area)
        assert isinstance(doc.kind, Kind)
        assert code.doc is doc


def test_names_are_snake_case_and_unique() -> None:
    # NB: an enum silently makes a second member with an existing value an alias of the first;
    # __members__ keeps the aliases, iteration does not.
    assert len(ErrorCode.__members__) == len(ErrorCode)
    for name, code in ErrorCode.__members__.items():
        assert SNAKE_CASE.match(code.value), code.value
        assert name == code.value.upper(), name
    assert len({code.value for code in ErrorCode}) == len(ErrorCode)


def test_a_code_is_its_string() -> None:
    code = ErrorCode.AGENT_EXITED
    assert code == "agent_exited"
    assert hash(code) == hash("agent_exited")
    assert f"{code}: x" == str(code) + ": x" == "agent_exited: x"
    assert json.dumps({"code": code}) == '{"code": "agent_exited"}'
    assert {"agent_exited": 1}[code] == 1
    assert ErrorCode("agent_exited") is code


def test_every_area_is_rendered_with_an_anchor_per_code() -> None:
    text = render_error_docs()
    assert set(AREA_TITLES) == set(Area)
    for code in ErrorCode:
        assert text.count(f'<a id="{code.value}"></a>') == 1, code
        assert f"](#{code.value})" in text, code
    for area in {doc.area for doc in CODE_DOCS.values()}:
        assert f"## {AREA_TITLES[area]}\n" in text


def _inline_code_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """``code="x"`` keywords, ``code = "x"`` assignments and ``{"code": "x"}`` entries."""
    found: list[tuple[int, str]] = []

    def literal(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "code":
            literal(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                name = target.id if isinstance(target, ast.Name) else (
                    target.attr if isinstance(target, ast.Attribute) else None
                )
                if name == "code":
                    literal(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    literal(value)
    return found


def test_no_code_is_written_inline() -> None:
    inline = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path, tree in _package_trees()
        for line, value in _inline_code_literals(tree)
    ]
    assert inline == [], "name these codes as ErrorCode.<NAME>:\n" + "\n".join(inline)


def _used_codes() -> set[str]:
    """Codes the package names as ``ErrorCode.<NAME>``, or writes as the ``<code>: `` or
    ``code=<code>`` of a log or CLI line."""
    used: set[str] = set()
    prefixed = re.compile(r"(?:^|code=)([a-z][a-z0-9_]*)(?::| )")
    for _, tree in _package_trees():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ErrorCode"
            ):
                used.add(ErrorCode[node.attr].value)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                used.update(prefixed.findall(node.value))
    return used


def test_every_code_is_used_somewhere() -> None:
    used = _used_codes()
    unused = sorted(code.value for code in ErrorCode if code.value not in used)
    assert unused == []


def test_unknown_agent_kind_is_spelled_out_in_the_registry_only() -> None:
    # NB: it was defined three ways (a config constant, a workflow error class, an inline
    # string); aliases of the member are fine, a second spelling is not.
    code = ErrorCode.UNKNOWN_AGENT_KIND
    spelled = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _package_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value == code.value
    ]
    assert spelled == []
