"""The suite's own guards against the machine: a stale pyenv rehash lock is removed even while
login shells wait for it (they did not, and every agent start of a loaded run stalled 60 s)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.conftest import STALE_PYENV_LOCK_S, remove_a_stale_pyenv_lock


def test_a_stale_rehash_lock_goes_even_while_rehashes_wait_for_it(tmp_path: Path) -> None:
    lock = tmp_path / ".pyenv-shim"
    lock.write_text("")
    # A rehash waiting for the lock, as a login shell's `pyenv rehash` does: its command line
    # names pyenv-rehash, exactly like the lock's (dead) holder did.
    waiter = subprocess.Popen(["bash", "-c", "sleep 60", "/root/.pyenv/libexec/pyenv-rehash"])
    try:
        assert not remove_a_stale_pyenv_lock(lock), "a fresh lock is a live rehash's: kept"
        assert lock.exists()
        old = time.time() - STALE_PYENV_LOCK_S - 1
        os.utime(lock, (old, old))
        assert remove_a_stale_pyenv_lock(lock)
        assert not lock.exists()
        assert not remove_a_stale_pyenv_lock(lock), "no lock: nothing to do"
    finally:
        waiter.kill()
        waiter.wait()
