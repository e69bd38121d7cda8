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
