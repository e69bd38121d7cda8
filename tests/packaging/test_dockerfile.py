"""The Dockerfile's structure: pinned bases, two stages, non-root numeric user, no build tools.

The image cannot be built here (no Docker engine), so these checks read the file; the wheel
it installs is built and installed for real by test_wheel.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.packaging import dockerfiles

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

# A base image reference pinned to a full version (3.11.13, not 3.11 or latest), optionally
# followed by a digest.
_PINNED_PYTHON = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
_BUILD_TOOLS = ("gcc", "g++", "build-essential", "make ", "clang", "python3-dev", "libc6-dev")


@pytest.fixture(scope="module")
def dockerfile() -> dockerfiles.Dockerfile:
    return dockerfiles.read(DOCKERFILE)


def test_buildkit_syntax_directive(dockerfile: dockerfiles.Dockerfile) -> None:
    # RUN --mount needs BuildKit's frontend; the directive pins its major version.
    assert dockerfile.directives.get("syntax") == "docker/dockerfile:1"


def test_two_stages_builder_then_final(dockerfile: dockerfiles.Dockerfile) -> None:
    assert [stage.name for stage in dockerfile.stages] == ["builder", "final"]


def test_every_base_is_pinned_to_a_full_python_version(
    dockerfile: dockerfiles.Dockerfile,
) -> None:
    for stage in dockerfile.stages:
        assert _PINNED_PYTHON.match(stage.base), stage.base
    # Both stages share one base: the wheel is built by the interpreter that runs it.
    assert len({stage.base for stage in dockerfile.stages}) == 1


def test_pin_checker_rejects_floating_tags() -> None:
    for floating in ("python:3.11-slim-bookworm", "python:latest", "python", "python:3.11.13"):
        text = f"FROM {floating} AS builder\nFROM {floating} AS final\n"
        base = dockerfiles.parse(text).stages[0].base
        assert not _PINNED_PYTHON.match(base), floating
    digest = "python:3.11.13-slim-bookworm@sha256:" + "ab" * 32
    overridden = dockerfiles.parse(f"ARG PYTHON_IMAGE={digest}\nFROM ${{PYTHON_IMAGE}}\n")
    assert _PINNED_PYTHON.match(overridden.stages[0].base)


def test_builder_builds_wheels_for_lorenz_and_its_dependencies(
    dockerfile: dockerfiles.Dockerfile,
) -> None:
    builder = dockerfile.stages[0]
    assert "pip wheel --wheel-dir /wheels ." in builder.run_text
    # --no-deps would leave the final stage needing the network (or failing) at install time.
    assert "--no-deps" not in builder.run_text
    copied = [i.text for i in builder.all("COPY")]
    assert copied == ["pyproject.toml README.md ./", "controller ./controller"]


def test_final_stage_installs_only_from_the_builders_wheels(
    dockerfile: dockerfiles.Dockerfile,
) -> None:
    final = dockerfile.final
    installs = [i for i in final.all("RUN") if "pip install" in i.text]
    assert len(installs) == 1
    (install,) = installs
    assert install.flags["mount"] == "type=bind,from=builder,source=/wheels,target=/wheels"
    assert "--no-index" in install.text
    assert "--find-links=/wheels" in install.text
    assert "--no-cache-dir" in install.text
    # The source tree never reaches the final stage.
    assert not [i for i in final.all("COPY") if "--from" not in i.text]


def test_final_stage_has_git_and_no_build_tools(dockerfile: dockerfiles.Dockerfile) -> None:
    final = dockerfile.final
    apt = [i.text for i in final.all("RUN") if "apt-get install" in i.text]
    assert len(apt) == 1
    (line,) = apt
    assert re.search(r"\bgit\b", line)
    assert "--no-install-recommends" in line
    assert "rm -rf /var/lib/apt/lists/*" in line
    for tool in _BUILD_TOOLS:
        assert tool not in final.run_text, tool


def test_final_stage_runs_as_numeric_non_root_user(dockerfile: dockerfiles.Dockerfile) -> None:
    final = dockerfile.final
    user = final.last("USER")
    assert user is not None
    uid, _, gid = user.text.partition(":")
    # NB: numeric, so that Kubernetes' runAsNonRoot can verify the user without /etc/passwd.
    assert uid == "10001"
    assert gid == "10001"
    # USER comes after every RUN: nothing the image runs at start-up runs as root.
    assert user.line > max(i.line for i in final.all("RUN"))
    assert "useradd --system --uid" in final.run_text
    assert final.all("ARG")[0].text == "LORENZ_UID=10001"


def test_entrypoint_and_command(dockerfile: dockerfiles.Dockerfile) -> None:
    final = dockerfile.final
    entrypoint, command = final.last("ENTRYPOINT"), final.last("CMD")
    assert entrypoint is not None
    assert command is not None
    # Exec form: `lorenz` is PID 1 and receives SIGTERM itself (kopf stops gracefully on it).
    assert entrypoint.exec_form == ["lorenz"]
    assert command.exec_form == ["operator"]


def test_home_is_set_for_agents_and_hooks(dockerfile: dockerfiles.Dockerfile) -> None:
    env = " ".join(i.text for i in dockerfile.final.all("ENV"))
    assert "HOME=/home/lorenz" in env


def test_parser_reads_continuations_comments_and_exec_form() -> None:
    parsed = dockerfiles.parse(
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=img:1.2.3\n"
        "FROM $BASE AS one\n"
        "RUN a \\\n"
        "# a comment inside a continuation\n"
        "  && b\n"
        'CMD ["x", "y"]\n'
        "CMD x y\n"
    )
    assert parsed.directives == {"syntax": "docker/dockerfile:1"}
    (stage,) = parsed.stages
    assert (stage.base, stage.name) == ("img:1.2.3", "one")
    assert stage.all("RUN")[0].text == "a && b"
    assert stage.all("CMD")[0].exec_form == ["x", "y"]
    assert stage.all("CMD")[1].exec_form is None
    with pytest.raises(ValueError, match="only ARG"):
        dockerfiles.parse("RUN x\nFROM y\n")


@pytest.fixture(scope="module")
def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    return dockerfiles.dockerignore_patterns(DOCKERIGNORE.read_text())


def test_dockerignore_lets_through_what_the_wheel_is_built_from(
    ignore_patterns: list[tuple[bool, re.Pattern[str]]],
) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "controller"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "controller/lorenz/__init__.py" in tracked
    for path in ["pyproject.toml", "README.md", *tracked]:
        assert not dockerfiles.is_ignored(path, ignore_patterns), path


def test_dockerignore_keeps_everything_else_out(
    ignore_patterns: list[tuple[bool, re.Pattern[str]]],
) -> None:
    for path in (
        ".git/config",
        ".venv/bin/python",
        "tests/conftest.py",
        "docs/install.md",
        "charts/lorenz/values.yaml",
        "Dockerfile",
        ".env",
        "controller/lorenz/__pycache__/cli.cpython-311.pyc",
        "controller/lorenz.egg-info/PKG-INFO",
        "controller/lorenz/model/issue.pyc",
        "controller/.lorenz/claim-store/claims.db",
    ):
        assert dockerfiles.is_ignored(path, ignore_patterns), path


def test_dockerignore_matcher_semantics() -> None:
    patterns = dockerfiles.dockerignore_patterns("*\n!keep/\nkeep/**/drop\n# comment\n")
    assert dockerfiles.is_ignored("other.txt", patterns)
    assert not dockerfiles.is_ignored("keep/a/b.txt", patterns)
    assert dockerfiles.is_ignored("keep/a/drop/c.txt", patterns)
    assert dockerfiles.is_ignored("keep/drop", patterns)


def test_the_example_agent_image_builds_on_lorenz_and_runs_as_its_user() -> None:
    """examples/agent-image/Dockerfile, the image docs/install.md tells run Pods to use: one
    stage FROM the Lorenz image (a build ARG), back to uid 10001 after every RUN, and no
    ENTRYPOINT or CMD of its own (the run Pod's command is `lorenz worker`)."""
    example = dockerfiles.read(REPO / "examples" / "agent-image" / "Dockerfile")
    (stage,) = example.stages
    assert stage.base == "lorenz:latest"
    user = stage.last("USER")
    assert user is not None
    assert user.text == "10001:10001"
    assert user.line > max(i.line for i in stage.all("RUN"))
    assert stage.all("ENTRYPOINT") == []
    assert stage.all("CMD") == []
