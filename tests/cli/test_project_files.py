"""The files a newcomer looks for exist and say what the tooling does."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 300.0


def test_the_license_is_the_apache_2_text_that_pyproject_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "9. Accepting Warranty or Additional Liability." in text


def test_contributing_and_changelog_exist() -> None:
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for topic in ("./scripts/test --fast", "lint-imports", "docs/architecture.md", "Where"):
        assert topic in contributing, topic
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")


def test_pre_commit_runs_ruff_and_mypy() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert hooks["ruff"]["entry"].startswith("ruff check")
    assert hooks["mypy"]["entry"] == "mypy"
    # The hook checks the folders ./scripts/test and CONTRIBUTING.md's command check.
    script = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    command = re.search(r"ruff check ([\w ]+)", script)
    assert command is not None
    folders = command.group(1).split()
    assert all(re.match(hooks["ruff"]["files"], f"{folder}/x.py") for folder in folders)
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert f"ruff check {' '.join(folders)}" in contributing


def test_mypy_checks_the_tests_too() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert "tests" in config["packages"]
    assert config["strict"] is True


def collected(*args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}


def test_helm_tests_are_cluster_tests_and_the_others_are_not() -> None:
    cluster = collected("-m", "cluster", "tests/packaging")
    others = collected("-m", "not cluster", "tests/packaging")
    # run helm directly, through a fixture, and through a module helper
    assert "tests/packaging/test_chart.py::test_lint_strict_is_clean" in cluster
    assert "tests/packaging/test_chart.py::test_deployment_is_locked_down" in cluster
    assert (
        "tests/packaging/test_wheel.py::test_installed_operator_accepts_the_charts_settings"
        in cluster
    )
    # need no helm
    assert "tests/packaging/test_chart.py::test_every_values_key_is_commented" in others
    assert "tests/packaging/test_wheel.py::test_installed_package_generates_the_committed_crds" in (
        others
    )


def _heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings (lowercase, punctuation dropped), and the
    explicit ``<a id="…"></a>`` anchors a generated page sets (docs/errors.md: one per code)."""
    found: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            found.update(re.findall(r'<a id="([^"]+)"></a>', line))
        if not in_code and line.startswith("#"):
            title = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower())
            found.add(title.replace(" ", "-"))
    return found


def test_every_relative_link_of_the_docs_reaches_its_page_and_heading() -> None:
    """A newcomer follows these links from architecture.md and the README; none may dangle."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    broken: list[str] = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            path, _, anchor = target.partition("#")
            destination = page.parent / path if path else page
            if not destination.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif (
                anchor
                and destination.suffix == ".md"
                and anchor not in _heading_anchors(destination)
            ):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []
