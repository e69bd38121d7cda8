"""The terminal view of a foreground run: a rich live region redrawn from runtime snapshots.

Mounted by the single-host composition root as an attachment (``start(runtime)`` after the
runtime exists, ``stop()`` during shutdown) and only when stdout is a terminal. It draws from
one asyncio task instead of rich's refresh thread: snapshots only mark the view dirty, the task
redraws at most :data:`MAX_FPS` times a second — and once a second regardless, so countdowns
tick — which keeps a burst of agent updates from costing more than a few frames, and leaves no
thread behind on stop.

While mounted, rich redirects ``sys.stdout``/``sys.stderr`` so that anything printed (log lines
from a handler that writes to the *current* ``sys.stderr``, see :mod:`lorenz.daemon.logs`)
scrolls above the live region instead of tearing through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.live import Live

from lorenz.runtime import LorenzRuntime
from lorenz.tui.rendering import render_snapshot
from lorenz.workflow import LoadedWorkflow

MAX_FPS = 4.0
"""Upper bound on redraws per second."""
IDLE_REDRAW_S = 1.0
"""Redraw at least this often without new snapshots (clocks and countdowns)."""


class TerminalView:
    """The live terminal view; an attachment for :func:`lorenz.daemon.host.run_host`."""

    def __init__(
        self,
        *,
        console: Console | None = None,
        file: TextIO | None = None,
        max_fps: float = MAX_FPS,
        clock: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self._console = console or Console(file=file, stderr=False)
        self._min_interval_s = 1.0 / max_fps
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self._live: Live | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._runtime: LorenzRuntime | None = None
        self._dirty = asyncio.Event()
        self._closing = False
        self._rerouted: list[tuple[logging.StreamHandler[Any], Any]] = []
        self.frames = 0
        """Frames drawn so far (for tests and benchmarks)."""

    @property
    def mounted(self) -> bool:
        return self._live is not None

    async def start(self, runtime: LorenzRuntime) -> None:
        if self._live is not None:
            return
        self._live = Live(
            console=self._console,
            auto_refresh=False,
            # NB: "crop" keeps the region within the terminal: a live region taller than the
            # screen cannot be redrawn in place and would scroll a copy per frame.
            vertical_overflow="crop",
            redirect_stdout=True,
            redirect_stderr=True,
            transient=False,
        )
        self._live.start()
        self._closing = False
        self._reroute_log_handlers()
        # NB: told "changed" only; the snapshot is built per frame drawn (at most MAX_FPS),
        # not per change (a chatty agent is hundreds a second).
        self._runtime = runtime
        self._unsubscribe = runtime.on_change(self._dirty.set)
        self._dirty.set()  # the first frame at once, as the state is now
        self._task = asyncio.get_running_loop().create_task(
            self._draw_loop(), name="lorenz-terminal-view"
        )

    async def stop(self) -> None:
        """Unmount: draw the last picture, restore the cursor and the real stdout/stderr."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._task is not None:
            # NB: the loop is asked to leave rather than cancelled mid-wait: a cancellation
            # racing a snapshot could be swallowed, and the unmount would wait forever.
            self._closing = True
            self._dirty.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=2.0)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        live, self._live = self._live, None
        if live is not None:
            # NB: the last frame is cosmetic: a closed terminal must not fail the stop.
            with contextlib.suppress(Exception):
                self._draw(live)
            self._restore_log_handlers()
            live.stop()
        self._runtime = None

    async def _draw_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(IDLE_REDRAW_S):
                    await self._dirty.wait()
            if self._closing or self._live is None:
                return
            self._dirty.clear()
            started = loop.time()
            self._draw(self._live)
            await asyncio.sleep(max(self._min_interval_s - (loop.time() - started), 0.0))

    def _reroute_log_handlers(self) -> None:
        """Point log handlers that write to the real terminal at rich's proxies.

        NB: a handler set up before the view (``logging.basicConfig``) holds the original
        ``sys.stderr``; its lines would be written straight into the live region and leave
        torn copies of it on screen. Through the proxy they scroll above the view instead.
        """
        proxies = {id(sys.__stderr__): sys.stderr, id(sys.__stdout__): sys.stdout}
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                proxy = proxies.get(id(handler.stream))
                if proxy is not None and proxy is not handler.stream:
                    self._rerouted.append((handler, handler.setStream(proxy)))

    def _restore_log_handlers(self) -> None:
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted = []

    def _draw(self, live: Live) -> None:
        if self._runtime is None:
            return
        snapshot = self._runtime.snapshot()
        height = self._console.size.height
        # Roughly: header, totals and lane chrome take ~16 lines; the rest goes to rows.
        rows = max(2, min(8, (height - 16) // 4))
        live.update(
            render_snapshot(snapshot, now=self._clock(), max_rows_per_lane=rows),
            refresh=True,
        )
        self.frames += 1


class _ViewOptions(Protocol):
    """What :func:`attachment_factory` reads from the host's options."""

    @property
    def tui(self) -> bool: ...


def attachment_factory(loaded: LoadedWorkflow, options: _ViewOptions) -> TerminalView | None:
    """For ``ATTACHMENTS``: a terminal view when the run mode asked for one (stdout is a TTY
    and ``--no-tui`` is absent), otherwise nothing."""
    if not getattr(options, "tui", False):
        return None
    return TerminalView()
