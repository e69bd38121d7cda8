"""The wheel the Dockerfile installs: it builds, installs in a clean venv, and the CLI runs.

This is the part of the image build that can run here. The wheel is built the way the
Dockerfile's builder stage builds it (`pip wheel`, build isolation) from a copy of exactly the
files .dockerignore lets through, then installed with its dependencies into a fresh venv that
has never seen the repository, and its `lorenz` console script is run from a scratch folder.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.packaging.charts import render

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path
    scratch: Path

    @property
    def lorenz(self) -> Path:
        return self.venv / "bin" / "lorenz"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def environ(self) -> dict[str, str]:
        # NB: nothing of the repository's environment may leak in: no PYTHONPATH, no active
        # venv, and a PATH whose first entry is the fresh venv.
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("HOME", str(self.scratch))
        return env

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.lorenz), *args],
            cwd=cwd or self.scratch,
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=120,
        )


def _build_context(destination: Path) -> Path:
    """Copy what the Docker build context holds (see .dockerignore) to `destination`."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".lorenz")
    destination.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, destination / name)
    shutil.copytree(REPO / "controller", destination / "controller", ignore=ignore)
    return destination


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    root = tmp_path_factory.mktemp("wheel")
    context = _build_context(root / "context")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(context), "-w", str(dist), "--no-deps", "-q"],
        check=True,
        timeout=300,
        cwd=root,
    )
    (wheel,) = dist.glob("lorenz-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Dependencies come from the package index (and pip's local cache/wheelhouse), exactly as
    # a user's `pip install lorenz-*.whl` would get them.
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
        check=True,
        timeout=600,
        cwd=root,
    )
    scratch = root / "scratch"
    scratch.mkdir()
    return InstalledWheel(wheel=wheel, venv=venv, scratch=scratch)


def _project() -> dict[str, object]:
    with (REPO / "pyproject.toml").open("rb") as file:
        project: dict[str, object] = tomllib.load(file)["project"]
    return project


def test_wheel_is_named_after_the_project_version(installed: InstalledWheel) -> None:
    assert installed.wheel.name == f"lorenz-{_project()['version']}-py3-none-any.whl"


def test_wheel_ships_the_package_data(installed: InstalledWheel) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert "lorenz/py.typed" in names
    assert "lorenz/cli/__init__.py" in names
    # No test code or repository clutter in the wheel.
    assert not [name for name in names if name.startswith(("tests/", "bench/", "examples/"))]
    assert not [name for name in names if "__pycache__" in name]
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    text = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "lorenz = lorenz.cli:main" in text


def test_installed_package_is_the_wheel_not_the_repository(installed: InstalledWheel) -> None:
    result = subprocess.run(
        [str(installed.python), "-c", "import lorenz; print(lorenz.__file__)"],
        cwd=installed.scratch,
        env=installed.environ(),
        capture_output=True,
        text=True,
        check=True,
    )
    location = Path(result.stdout.strip())
    assert location.is_relative_to(installed.venv), location
    assert not location.is_relative_to(REPO)


def test_console_script_reports_the_version(installed: InstalledWheel) -> None:
    result = installed.run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"lorenz {_project()['version']}"


def test_console_script_help_lists_the_commands(installed: InstalledWheel) -> None:
    result = installed.run("--help")
    assert result.returncode == 0, result.stderr
    assert "usage: lorenz" in result.stdout
    assert "validate" in result.stdout


def test_installed_cli_validates_the_demo_workflow(
    installed: InstalledWheel, tmp_path: Path
) -> None:
    demo = tmp_path / "demo"
    shutil.copytree(REPO / "examples" / "demo", demo)
    result = installed.run("validate", str(demo / "WORKFLOW.md"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


def test_installed_cli_rejects_a_broken_workflow(installed: InstalledWheel, tmp_path: Path) -> None:
    broken = tmp_path / "WORKFLOW.md"
    broken.write_text("---\ntracker:\n  kind: nonsense\n---\nprompt\n")
    result = installed.run("validate", str(broken))
    assert result.returncode == 2
    assert "tracker" in (result.stdout + result.stderr)


def test_installed_operator_help(installed: InstalledWheel) -> None:
    result = installed.run("operator", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: lorenz operator" in result.stdout
    for flag in ("--workspace-root", "--liveness-endpoint", "--api-port", "--namespaces"):
        assert flag in result.stdout


def _chart_operator_env(tmp_path: Path) -> dict[str, str]:
    """The LORENZ_OPERATOR_* variables the chart's Deployment sets (default values)."""
    objects = render(tmp=tmp_path)
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {
        item["name"]: item["value"]
        for item in container["env"]
        if item["name"].startswith("LORENZ_OPERATOR_")
    }


def test_installed_operator_accepts_the_charts_settings(
    installed: InstalledWheel, tmp_path: Path
) -> None:
    env = installed.environ() | _chart_operator_env(tmp_path)
    env.pop("KUBECONFIG", None)
    env["HOME"] = str(tmp_path)  # no ~/.kube/config, and not in a pod: no credentials
    env["LORENZ_OPERATOR_WORKSPACE_ROOT"] = str(tmp_path / "workspaces")
    result = subprocess.run(
        [str(installed.lorenz), "operator"],
        cwd=installed.scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Every variable the chart sets validated; the operator stopped only for lack of a cluster.
    assert result.returncode == 2
    assert "kube_config_missing" in result.stderr, result.stderr
    assert "invalid_operator_settings" not in result.stderr

    env["LORENZ_OPERATOR_API_PORT"] = "not-a-port"
    result = subprocess.run(
        [str(installed.lorenz), "operator"],
        cwd=installed.scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid_operator_settings" in result.stderr
    assert "LORENZ_OPERATOR_API_PORT" in result.stderr


def test_installed_package_generates_the_committed_crds(
    installed: InstalledWheel, tmp_path: Path
) -> None:
    copy = tmp_path / "crds"
    shutil.copytree(REPO / "crds", copy)
    result = installed.run("crds", "--check", str(copy))
    assert result.returncode == 0, result.stderr
    (copy / "claims.lorenz.dev.yaml").write_text("stale\n")
    assert installed.run("crds", "--check", str(copy)).returncode == 1
