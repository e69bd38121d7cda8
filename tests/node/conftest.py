"""Fixtures every node test module shares: the tracker fake the operator polls and the recorder
its agents report to (one of each per module, as the modules' operators are)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.linear_server import FakeLinearServer
from tests.node.test_helm_operator import Recorder


@pytest.fixture(scope="module")
def linear() -> Iterator[FakeLinearServer]:
    with FakeLinearServer().running_in_thread() as server:
        yield server


@pytest.fixture(scope="module")
def recorder(linear: FakeLinearServer) -> Iterator[Recorder]:
    server = Recorder(linear)
    yield server
    server.close()
