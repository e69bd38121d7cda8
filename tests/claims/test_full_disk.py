"""A claim store on a file system that fills up: coded errors, a clean close, then recovery.

The file system is real: a small tmpfs mounted for the test (we run as root in the suite's
environment), filled with a filler file until ``ENOSPC``. Each backend must refuse the write
with ``claim_store_write_failed`` (never a raw driver error), close without raising, leave the
file intact, and write again once the filler is gone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorenz.claims import ClaimStoreWriteFailed, SqliteClaimStore
from tests.claims.records import BACKENDS, claim

FS_BYTES = 4 * 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of :data:`FS_BYTES`, mounted under ``tmp_path`` and unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mountpoint = tmp_path / "fs"
    mountpoint.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700", "tmpfs", str(mountpoint)],
        check=True,
    )
    try:
        yield mountpoint
    finally:
        # NB: lazy, so a file a failing test left open cannot keep the mount (and the test
        # directory) alive.
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(folder: Path) -> Path:
    """Write a filler file in ``folder`` until the file system has no byte left."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as handle:
        failure: OSError | None = None
        while failure is None:
            try:
                handle.write(chunk)
            except OSError as exc:
                failure = exc
        assert failure.errno == errno.ENOSPC
        # The last partial chunk: smaller writes find the rest.
        for size in (4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * size)
    return filler


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_full_disk_is_a_coded_write_failure_and_writes_resume(
    backend: str, small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = small_fs / "claims.db"
    store = await BACKENDS[backend].open(path, owner="owner-a")
    try:
        assert await store.acquire(claim("1"))
        assert store.write_failure is None
        filler = fill(small_fs)

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lorenz.claims"):
            for index in range(3):
                with pytest.raises(ClaimStoreWriteFailed) as raised:
                    # Big enough to need new pages however much the journal kept.
                    await store.save_checkpoint({"blob": "x" * 256 * 1024, "n": index})
        assert raised.value.code == "claim_store_write_failed"
        assert str(path) in str(raised.value)
        assert store.write_failure is raised.value
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        # Said once per outage, and never as a traceback.
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].exc_info is None
        # Reads still work while writes fail.
        state = await store.load()
        assert [c.slot_key for c in state.claims] == [claim("1").slot_key]

        filler.unlink()
        await store.save_checkpoint({"blob": "x" * 256 * 1024, "n": 99})
        assert store.write_failure is None
        assert (await store.load()).checkpoint == {"blob": "x" * 256 * 1024, "n": 99}
    finally:
        await store.close()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_close_on_a_full_disk_is_clean_and_leaves_the_file_whole(
    backend: str, small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = small_fs / "claims.db"
    store = await BACKENDS[backend].open(path, owner="owner-a")
    assert await store.acquire(claim("1"))
    filler = fill(small_fs)
    with pytest.raises(ClaimStoreWriteFailed):
        await store.save_checkpoint({"blob": "x" * 256 * 1024})
    # Many small commits, so that whatever room the journal kept is used up too.
    with contextlib.suppress(ClaimStoreWriteFailed):
        for index in range(2000):
            await store.save(claim(str(index + 2)))
    assert store.write_failure is not None

    with caplog.at_level(logging.WARNING, logger="lorenz.claims"):
        await store.close()  # must not raise
    assert not any(r.exc_info for r in caplog.records)

    filler.unlink()
    if backend == "sqlite":
        reopened = await SqliteClaimStore.open(path, owner="owner-b")
        try:
            assert await reopened.integrity_check() == "ok"
            assert claim("1").slot_key in {c.slot_key for c in (await reopened.load()).claims}
        finally:
            await reopened.close()
    else:
        reopened_any = await BACKENDS[backend].open(path, owner="owner-b")
        try:
            assert claim("1").slot_key in {c.slot_key for c in (await reopened_any.load()).claims}
        finally:
            await reopened_any.close()
