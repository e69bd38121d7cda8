"""Suite-wide pytest configuration: shared options and the fixture plugins every layer uses."""

from __future__ import annotations

import importlib.util

import pytest

# NB: the control-plane fixtures are a plugin so that every test folder (cluster smoke tests,
# operator tests) can use them. A test that asks for them without the plugin fails loudly with
# "fixture not found", so loading it conditionally cannot hide a broken harness.
pytest_plugins = (
    "tests.fakes",
    *(("tests.cluster.fixtures",) if importlib.util.find_spec("tests.cluster.fixtures") else ()),
)
"""``tests.fakes`` holds the fake-tracker fixtures (``linear_server``, ``github_server``).

NB: registered once, here: importing the same fixture functions into two folder conftests makes
pytest bind them to whichever folder registered them first, so the other folder's tests report
"fixture not found" in a full run.
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-soak",
        action="store_true",
        default=False,
        help="Skip tests marked `soak` (long randomized loops). CI runs them.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--skip-soak"):
        return
    skip = pytest.mark.skip(reason="soak tests skipped by --skip-soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _workers_are_cancelled_with_their_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts in a process whose cancelled runs cancel their workers.

    NB: ``leave_workers_running`` is process-wide and one-way on purpose (a deposed controller
    is on its way out). A daemon run in the test process (a fencing or leadership-loss test)
    sets it for good; without this reset every later test in that pytest process would leave
    its workers running on cancel — order-dependent failures in a full run.
    """
    monkeypatch.setattr("lorenz.workers.runner._leaving", None)
