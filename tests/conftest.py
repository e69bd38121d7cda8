"""Suite-wide pytest configuration: shared options and the fixture plugins every layer uses."""

from __future__ import annotations

import pytest

pytest_plugins = ("tests.cluster.fixtures",)


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
