"""Fixtures of the operator tests: the CRDs installed once per session on the test cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lorenz.kube.clients import KubeApi
from tests.cluster.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


@pytest.fixture(scope="session")
def lorenz_crds(kube_control_plane: Cluster) -> list[str]:
    """The committed ``crds/*.yaml``, installed and Established."""
    return kube_control_plane.install_crds(CRDS)


@pytest.fixture
async def kube_api(kube_control_plane: Cluster) -> AsyncIterator[KubeApi]:
    """The operator's API layer, as the cluster admin."""
    api = KubeApi.from_kubeconfig(kubeconfig=str(kube_control_plane.kubeconfig))
    yield api
    await api.close()


class ManualMonotonic:
    """A monotonic clock the test moves by hand (lease expiry without sleeping)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
