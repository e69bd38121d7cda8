"""The HTTP stack's optional-module probe: a missing sniffio is looked for once, not per lock."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from lorenz.trackers.httpstack import record_absent_modules

PROBE = """
import importlib.abc, importlib.util, sys, asyncio

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
            pass

asyncio.run(main())
try:
    import sniffio
except ImportError:
    pass
else:
    raise SystemExit("sniffio imported")
assert importlib.util.find_spec("sniffio") is None
print(Watcher.searches)
"""


@pytest.mark.skipif(
    importlib.util.find_spec("sniffio") is not None
    and sys.modules.get("sniffio", True) is not None,
    reason="sniffio is installed here: httpcore uses it and nothing is recorded",
)
@pytest.mark.parametrize("module", ["linear", "github"])
def test_httpcore_locks_do_not_search_for_a_missing_sniffio(module: str) -> None:
    # NB: a fresh interpreter that imports only the tracker, as a daemon does.
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


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
