"""Suite-wide pytest configuration: shared options and the fixture plugins every layer uses."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from lorenz.tasks import install_child_watcher
from lorenz.workers.states import STATE_ROOT_ENV

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


def pytest_configure(config: pytest.Config) -> None:
    # NB: the composition roots (run_host, the operator, the worker) install the pidfd child
    # watcher; tests that start agents and hooks without them must run on the same one.
    install_child_watcher()


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


STALE_PYENV_LOCK_S = 5.0
"""How old pyenv's rehash lock may get before the suite removes it (a rehash takes ~0.2 s)."""


def _pyenv_lock() -> Path | None:
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    shims = Path(root) / "shims"
    return shims / ".pyenv-shim" if shims.is_dir() else None


def remove_a_stale_pyenv_lock(lock: Path) -> bool:
    """Remove ``lock`` if it is older than :data:`STALE_PYENV_LOCK_S`; whether it did.

    NB: by age alone. A rehash that waits for the lock is a ``pyenv-rehash`` process too, so
    "no rehash alive" never holds while a stale lock stalls anyone: a check for it left the
    lock in place for as long as the suite kept starting agents, each login shell waiting 60 s
    (the soak and failover timeouts of a loaded CI run). Removing the lock of a live but slow
    rehash only lets a second one run beside it, which links the same shims: harmless.
    """
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return False
    if age <= STALE_PYENV_LOCK_S:
        return False
    lock.unlink(missing_ok=True)
    return True


@pytest.fixture(autouse=True, scope="session")
def _no_stale_pyenv_lock() -> Iterator[None]:
    """Keep a killed ``pyenv rehash`` from stalling every later agent start.

    NB: agents start under ``bash -lc``; on a machine whose login profile runs ``pyenv init``
    (this one does), each start runs ``pyenv rehash``, which holds a lock file for its run. A
    test that SIGKILLs an agent's process group mid-rehash (the crash and chaos tests do) leaves
    that lock behind, and from then on every login shell waits 60 s for it — every agent of
    every later test, in every group, times out. Nothing of the product is involved; the suite
    removes a lock older than :data:`STALE_PYENV_LOCK_S` (checked twice a second). Does nothing
    where pyenv is not installed.
    """
    lock = _pyenv_lock()
    if lock is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            remove_a_stale_pyenv_lock(lock)

    watcher = threading.Thread(target=watch, name="pyenv-lock-watch", daemon=True)
    remove_a_stale_pyenv_lock(lock)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=5.0)


@pytest.fixture(autouse=True, scope="session")
def _a_private_worker_state_root() -> Iterator[Path]:
    """Every worker this pytest process starts, directly or through a ``lorenz`` it runs with
    its own environment, keeps its state under one short private root, removed at the end.

    NB: runs execute in detached workers by default, with their state under
    ``$LORENZ_WORKER_STATE`` (else ``~/.lorenz/workers``): without this the suite would leave
    state directories in the home of whoever runs it. Short, because it holds unix sockets
    (107 bytes at most). Workers outlive the ``lorenz`` that started them by design; any still
    running at the end of the session are killed with their agents (found by this root in
    their environment).
    """
    configured = os.environ.get(STATE_ROOT_ENV)
    if configured:
        yield Path(configured)
        return
    root = Path(tempfile.mkdtemp(prefix="lzw-", dir="/tmp"))
    os.environ[STATE_ROOT_ENV] = str(root)
    try:
        yield root
    finally:
        del os.environ[STATE_ROOT_ENV]
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if process.environ().get(STATE_ROOT_ENV) == str(root):
                    process.kill()
        shutil.rmtree(root, ignore_errors=True)
