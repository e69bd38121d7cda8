"""Fixtures every node test module shares: the tracker fake the operator polls and the recorder
its agents report to (one of each per module, as the modules' operators are), and whether the
node enforces NetworkPolicy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.node import Node
from tests.fakes.linear_server import FakeLinearServer
from tests.node.test_helm_operator import Recorder


def node_enforces_network_policy(node: Node) -> bool:
    """Whether the test node enforces NetworkPolicy now: the outcome the network tests assert
    (tests/node/test_hostile_tenant.py). It does while the enforcer beside its kubelet runs
    (kube-network-policies' engine, tests/cluster/enforcer.py); a test that stops it gets a
    node whose network ignores NetworkPolicies, as a plain bridge CNI's does."""
    return node.enforces_network_policy


@pytest.fixture(scope="module")
def linear() -> Iterator[FakeLinearServer]:
    with FakeLinearServer().running_in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def recorder(linear: FakeLinearServer) -> Iterator[Recorder]:
    server = Recorder(linear)
    yield server
    server.close()
