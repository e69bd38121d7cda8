"""Fixtures of the operator tests: the CRDs installed once per session on the test cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.assembly import IN_PROCESS_RUNS_ENV
from lorenz.kube.clients import KubeApi
from tests.cluster.cluster import Cluster
from tests.kube.operators import Kube, OperatorProcess, Rig

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


@pytest.fixture(autouse=True)
def _runs_in_process_unless_about_workers(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operators of these tests (in this process, or started with its environment) run
    their agents in process (the suite's test-only switch), except in the modules about
    workers (``RUNS_IN_WORKERS = True``), which run the default: a detached worker per run.

    NB: the tests about leadership, failover and Claims count interrupted runs as failure
    retries; with workers (left running by a replica that goes) they would be adoptions.
    """
    if getattr(request.module, "RUNS_IN_WORKERS", False):
        monkeypatch.delenv(IN_PROCESS_RUNS_ENV, raising=False)
    else:
        monkeypatch.setenv(IN_PROCESS_RUNS_ENV, "1")


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


@pytest.fixture
def rig(tmp_path: Path, kube_namespace: str) -> Rig:
    """The test's agent script and log, and its Workflows' issues on the operators' volume."""
    return Rig(root=tmp_path, volume=tmp_path / "operators" / "volume", namespace=kube_namespace)


TEST_SHARDS = 4
"""Shard Leases of the operators under test (fewer than the default 16: less load on a shared
machine at the tests' 0.5 s retry period)."""


@pytest.fixture
def kube(kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]) -> Kube:
    """kubectl in the test's namespace (CRDs installed); the operators' Leases live there too."""
    return Kube(kube_control_plane, kube_namespace, shards=TEST_SHARDS)


@pytest.fixture
def operators(
    kube_control_plane: Cluster, tmp_path: Path, kube_namespace: str, lorenz_crds: list[str]
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start ``lorenz operator`` processes; every one is stopped after the test.

    Their shard Leases live in the test's namespace (``--lease-namespace``), :data:`TEST_SHARDS`
    of them, unless a test says otherwise.
    """
    started: list[OperatorProcess] = []

    def start(identity: str, **kwargs: Any) -> OperatorProcess:
        wait = kwargs.pop("wait", True)
        kwargs.setdefault("lease_namespace", kube_namespace)
        kwargs.setdefault("shards", TEST_SHARDS)
        operator = OperatorProcess(
            kube_control_plane, identity=identity, workdir=tmp_path / "operators", **kwargs
        )
        started.append(operator)
        return operator.start(wait=wait)

    yield start
    for operator in started:
        operator.stop()
