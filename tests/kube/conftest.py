"""Fixtures of the operator tests: the CRDs installed once per session on the test cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


@pytest.fixture(scope="session")
def lorenz_crds(kube_control_plane: Cluster) -> list[str]:
    """The committed ``crds/*.yaml``, installed and Established."""
    return kube_control_plane.install_crds(CRDS)
