"""The HTTP stack's optional-module probe: a missing sniffio is looked for once, not per lock."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lorenz.trackers.httpstack import record_absent_modules

PROBE = """
import importlib.abc, sys, asyncio

class Watcher(importlib.abc.MetaPathFinder):
    searches = 0
    def find_spec(self, fullname, path, target=None):
        if fullname == "sniffio":
            Watcher.searches += 1
        return None

import lorenz.trackers.{module}
sys.meta_path.insert(0, Watcher())
from httpcore._synchronization import AsyncLock, current_async_library

async def main():
    assert current_async_library() == "asyncio"
    for _ in range(5):
        async with AsyncLock():
            await asyncio.sleep(0)

asyncio.run(main())
print(Watcher.searches)
"""


@pytest.mark.parametrize("module", ["linear", "github"])
def test_httpcore_locks_do_not_search_for_sniffio_again_and_again(module: str) -> None:
    # NB: a fresh interpreter that imports only the tracker, as a daemon does. sniffio is no
    # dependency of ours: absent, it is recorded as such (no search at all); installed, its
    # first import is cached (one search). Six probes searched six times before.
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) <= 1


def test_an_installed_module_is_left_alone() -> None:
    assert record_absent_modules(("json",)) == []
    assert sys.modules["json"] is not None


def test_a_missing_module_is_recorded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "lorenz_no_such_module_here"
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert record_absent_modules((name,)) == [name]
    assert sys.modules[name] is None
    assert record_absent_modules((name,)) == []
    monkeypatch.delitem(sys.modules, name)


def test_httpx_command_line_client_is_not_imported_with_the_trackers() -> None:
    # NB: a fresh interpreter, as at start-up. click, rich and pygments are installed here (the
    # terminal view, kopf), so httpx imported its command-line client with them before.
    probe = (
        "import sys, lorenz.trackers, httpx\n"
        "print(sys.modules['httpx._main'] is None, *(m in sys.modules for m in "
        "('click', 'rich', 'pygments')))\n"
        "print(httpx.Client().build_request('GET', 'http://127.0.0.1/x').url)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True False False False", "http://127.0.0.1/x"]


def test_a_module_imported_already_is_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    from lorenz.trackers.httpstack import skip_unused_modules

    assert skip_unused_modules(("json",)) == []
    assert sys.modules["json"] is not None
    name = "lorenz_never_imported_here"
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert skip_unused_modules((name,)) == [name]
    assert sys.modules[name] is None
    monkeypatch.delitem(sys.modules, name)
