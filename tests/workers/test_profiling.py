"""The bench's per-process CPU lines (``lorenz.workers.profiling``): written only when asked."""

from __future__ import annotations

import os
import pstats
from pathlib import Path

import pytest

from lorenz.workers import profiling


def test_nothing_is_written_without_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(profiling.PROFILE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    profiling.begin("worker")
    profiling.end("worker")
    assert list(tmp_path.iterdir()) == []


def test_a_process_appends_its_kind_pid_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(profiling.PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(profiling.CPROFILE_ENV, raising=False)
    monkeypatch.delenv(profiling.PAGES_ENV, raising=False)  # NB: pages.txt only when asked
    profiling.begin("launch")
    profiling.end("launch")
    profiling.end("worker")
    lines = (tmp_path / "cpu.txt").read_text().splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["launch", str(os.getpid())], ["worker", str(os.getpid())]
    ]
    user, system, faults = lines[0].split()[2:]
    assert float(user) > 0
    assert float(system) >= 0
    assert int(faults) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.txt"]


def test_a_cprofile_is_written_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(profiling.PROFILE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(profiling.CPROFILE_ENV, "1")
    profiling.begin("worker")
    sum(i * i for i in range(10_000))
    profiling.end("worker")
    stats = pstats.Stats(str(tmp_path / f"worker-{os.getpid()}.prof"))
    assert stats.total_calls > 0  # type: ignore[attr-defined]
