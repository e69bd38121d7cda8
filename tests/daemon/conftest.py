"""Fixtures for the daemon tests: a short private runtime dir, a recorded workflow, cleanup."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import (
    DaemonProcess,
    daemon_environ,
    daemons_cleaned,
    kill_marked,
    short_runtime_dir,
)


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    path = short_runtime_dir()
    yield path
    # Workers (state root ``path/w``, see daemon_environ) outlive the lorenz that started them.
    kill_marked("LORENZ_WORKER_STATE", str(path / "w"))
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "wf"


@pytest.fixture
def daemon_env(runtime_dir: Path, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return daemon_environ(runtime_dir, home)


@pytest.fixture
def daemons(root: Path) -> Iterator[list[DaemonProcess]]:
    """Append every DaemonProcess you start; leftovers and their agents are killed after."""
    with daemons_cleaned(root) as started:
        yield started
