"""A Workflow reads issues only from inside its own folder on the operator's volume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lorenz.kube.controller.specs import workflow_from_spec
from lorenz.kube.errors import TrackerPathOutsideWorkflow


def body(path: str) -> dict[str, Any]:
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "victim-reader", "namespace": "team-b", "generation": 1},
        "spec": {"tracker": {"kind": "files", "path": path}},
    }


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    (tmp_path / "team-a" / "victim" / "issues").mkdir(parents=True)
    (tmp_path / "team-b" / "victim-reader" / "issues").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/srv/lorenz/team-a/victim/issues", "is absolute"),
        ("../../team-a/victim/issues", "climbs out with '..'"),
        ("issues/../../../team-a/victim/issues", "climbs out with '..'"),
        ("~/issues", "is absolute"),
    ],
)
def test_absolute_and_climbing_paths_are_refused_with_a_code(
    volume: Path, path: str, why: str
) -> None:
    with pytest.raises(TrackerPathOutsideWorkflow) as refused:
        workflow_from_spec(body(path), workflow_dir=volume / "team-b" / "victim-reader",
                           api_key=None)
    assert refused.value.code == "tracker_path_outside_workflow"
    assert refused.value.key_path == "tracker.path"
    assert why in str(refused.value)


def test_a_symlink_out_of_the_folder_is_refused(volume: Path) -> None:
    own = volume / "team-b" / "victim-reader"
    (own / "board").symlink_to(volume / "team-a" / "victim" / "issues")
    with pytest.raises(TrackerPathOutsideWorkflow) as refused:
        workflow_from_spec(body("board"), workflow_dir=own, api_key=None)
    assert "through a symlink" in str(refused.value)


def test_a_relative_path_inside_the_folder_is_used(volume: Path) -> None:
    own = volume / "team-b" / "victim-reader"
    (own / "alias").symlink_to(own / "issues")  # a symlink that stays inside is fine
    for path in ("issues", "./issues", "alias"):
        loaded = workflow_from_spec(body(path), workflow_dir=own, api_key=None)
        assert Path(str(loaded.settings.tracker.path)).resolve() == (own / "issues").resolve()
