"""The live mount in-process: what it writes to a terminal console, and what it leaves behind."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import sys
import threading
from pathlib import Path
from typing import cast

import pytest
from rich.console import Console
from rich.file_proxy import FileProxy

from lorenz.model import Issue, RuntimeSnapshot
from lorenz.tui import TerminalView, attachment_factory
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, height=40, color_system="standard")
    return console, out


async def test_mounts_draws_live_and_unmounts_cleanly(tmp_path: Path) -> None:
    release = tmp_path / "release"
    agent = write_agent(
        tmp_path,
        "waits",
        f"""
        print("busy", flush=True)
        while not os.path.exists({str(release)!r}):
            time.sleep(0.02)
        """,
    )
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(
        workflow, issues=[Issue(id="a", identifier="TUI-1", title="Shown live", state="Todo")]
    )
    console, out = _terminal()
    threads_before = set(threading.enumerate())
    stdout_before, stderr_before = sys.stdout, sys.stderr
    view = TerminalView(console=console)
    await view.start(rig.runtime)
    assert view.mounted
    # While mounted, prints go through rich (above the live region), not through it.
    assert isinstance(sys.stdout, FileProxy)
    assert isinstance(sys.stderr, FileProxy)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: "TUI-1" in out.getvalue() and "Shown live" in out.getvalue(),
        timeout=15.0,
        what='"TUI-1" in out.getvalue() and "Shown live" in out.getvalue()',
    )
    frames = view.frames
    # Without new snapshots the view still redraws (countdowns tick) — but stays ≤ 4 fps.
    await wait_until_async(
        lambda: view.frames > frames,
        timeout=15.0,
        what="view.frames > frames",
    )
    release.write_text("go")
    await rig.runtime.wait_for_runs()
    await wait_until_async(
        lambda: "success" in out.getvalue(),
        timeout=15.0,
        what='"success" in out.getvalue()',
    )
    await view.stop()

    written = out.getvalue()
    assert HIDE_CURSOR in written
    assert written.rstrip("\n").endswith(SHOW_CURSOR)
    assert written.rfind(SHOW_CURSOR) > written.rfind(HIDE_CURSOR)
    assert not view.mounted
    assert sys.stdout is stdout_before
    assert sys.stderr is stderr_before
    # No drawing thread or task is left behind.
    assert set(threading.enumerate()) <= threads_before
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "lorenz-terminal-view"]
    # And nothing more is drawn after the unmount.
    length = len(out.getvalue())
    await rig.runtime.poll_once()
    await asyncio.sleep(0.3)
    assert len(out.getvalue()) == length


async def test_a_burst_of_snapshots_costs_a_few_frames(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "noop", "pass\n")
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(workflow, issues=[])
    console, _ = _terminal()
    view = TerminalView(console=console)
    await view.start(rig.runtime)
    try:
        await asyncio.sleep(0)  # let the draw loop start
        frames = view.frames
        # Each refresh request emits an event and a snapshot, all within this one loop step.
        for _ in range(200):
            rig.runtime.request_refresh()
        await asyncio.sleep(0.05)
        assert view.frames - frames <= 2
    finally:
        await view.stop()


async def test_a_burst_of_changes_builds_a_snapshot_per_frame_not_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full snapshot is O(entries): the view is told "changed" and builds one per frame.
    agent = write_agent(tmp_path, "noop", "pass\n")
    workflow = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(workflow, issues=[])
    console, _ = _terminal()
    view = TerminalView(console=console)
    built: list[int] = []
    real = rig.runtime.snapshot

    def counted() -> RuntimeSnapshot:
        built.append(1)
        return real()

    monkeypatch.setattr(rig.runtime, "snapshot", counted)
    await view.start(rig.runtime)
    try:
        await wait_until_async(
            lambda: view.frames >= 1,
            timeout=15.0,
            what="view.frames >= 1",
        )  # the first frame comes at once
        for _ in range(200):
            rig.runtime._emit_snapshot()
        await asyncio.sleep(0.3)
    finally:
        await view.stop()
    assert view.frames >= 2
    assert len(built) == view.frames  # one per frame drawn, the last one's included


async def test_stop_is_safe_before_start_and_twice(tmp_path: Path) -> None:
    view = TerminalView(console=_terminal()[0])
    await view.stop()
    agent = write_agent(tmp_path, "noop", "pass\n")
    rig = build_rig(write_workflow(tmp_path, agent_script=agent), issues=[])
    await view.start(rig.runtime)
    await view.start(rig.runtime)  # already mounted: no second live region
    await view.stop()
    await view.stop()
    assert not view.mounted


@dataclasses.dataclass(frozen=True)
class _Options:
    tui: bool


def test_attachment_only_when_the_run_mode_asks_for_it() -> None:
    assert attachment_factory(None, _Options(tui=False)) is None  # type: ignore[arg-type]
    assert isinstance(attachment_factory(None, _Options(tui=True)), TerminalView)  # type: ignore[arg-type]


async def test_log_lines_from_an_early_handler_scroll_above_the_view(tmp_path: Path) -> None:
    # basicConfig() ran before the view: its handler holds the real stderr.
    early = logging.StreamHandler(sys.__stderr__)
    root = logging.getLogger()
    root.addHandler(early)
    level = root.level
    root.setLevel(logging.INFO)
    agent = write_agent(tmp_path, "noop", "pass\n")
    rig = build_rig(write_workflow(tmp_path, agent_script=agent), issues=[])
    console, out = _terminal()
    view = TerminalView(console=console)
    try:
        await view.start(rig.runtime)
        assert isinstance(early.stream, FileProxy)
        logging.getLogger("lorenz.test").info("a line printed while the view is up")
        await view.stop()
        # NB: cast, since the isinstance above narrowed the attribute for mypy, not for Python.
        assert cast(object, early.stream) is sys.__stderr__
        assert "a line printed while the view is up" in out.getvalue()
    finally:
        root.removeHandler(early)
        root.setLevel(level)
