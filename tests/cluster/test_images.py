"""The image cache stays bounded: only the newest builds of each image are kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster import images


def test_prune_keeps_the_newest_builds_of_each_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORENZ_IMAGE_CACHE", str(tmp_path))
    made: dict[str, list[Path]] = {}
    for name in ("lorenz", "lorenz-agent", "lorenz-base"):
        for age in range(4):
            archive = tmp_path / f"{name}-{age:016x}.oci.tar"
            archive.write_bytes(b"x")
            os.utime(archive, (1_000_000 - age, 1_000_000 - age))  # age 0 is the newest
            made.setdefault(name, []).append(archive)
    pause = tmp_path / "lorenz-pause-0123456789abcdef.oci.tar"
    pause.write_bytes(b"x")
    stray = tmp_path / "notes.txt"
    stray.write_text("mine")

    with images._locked():
        images._prune()

    for archives in made.values():
        assert [a.exists() for a in archives] == [True] * images.KEEP_BUILDS + [False] * (
            4 - images.KEEP_BUILDS
        )
    assert pause.exists()
    assert stray.exists()
