"""Where a run's CPU goes outside the controller: per-process figures for ``bench/cli_bench.py``.

A run's orchestration is spread over processes the controller cannot see into: the launcher and one
fork of it per run, which becomes the run's worker (a fork that ends before that, having found the
worker running or failed, reports as ``launch``). Their CPU is counted in the bench's whole-tree
figure, but not split. With ``LORENZ_PROFILE_DIR`` set in the controller's environment (the bench
sets it; nothing else should), each of these processes appends one line to ``DIR/cpu.txt`` as it
ends — its kind, pid and the CPU it used since its fork or exec (``RUSAGE_SELF``) — and with
``LORENZ_PROFILE_CPROFILE=1`` also writes a cProfile of itself to ``DIR/<kind>-<pid>.prof`` (which
inflates the CPU figures: read them from a run without it). With ``LORENZ_PROFILE_PAGES=1`` each
worker also appends to ``DIR/pages.txt`` which of its pages it wrote and why
(:mod:`lorenz.workers.written_pages`; slow: for the memory figures only). Unset, everything here
is one environment lookup.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import cProfile

PROFILE_DIR_ENV: Final = "LORENZ_PROFILE_DIR"
CPROFILE_ENV: Final = "LORENZ_PROFILE_CPROFILE"
PAGES_ENV: Final = "LORENZ_PROFILE_PAGES"

_profiler: cProfile.Profile | None = None


def begin(kind: str) -> None:
    """In a process just forked (or started) as ``kind``: start its profile if asked for.

    NB: a profiler inherited across a fork (the launcher's, or the fork's own as ``launch``
    when it becomes the worker) is stopped first, so each process profiles only itself.
    """
    global _profiler
    if _profiler is not None:
        _profiler.disable()
        _profiler = None
    if not os.environ.get(PROFILE_DIR_ENV):
        return
    if kind == "launcher" and os.environ.get(PAGES_ENV) == "1":
        # NB: imported before the forks: a fork importing it would write hundreds of pages
        # before it notes its frames, and count them as the launcher's.
        import lorenz.workers.written_pages  # noqa: F401
    if kind == "launch" and os.environ.get(PAGES_ENV) == "1":
        from lorenz.workers.written_pages import remember_frames

        with contextlib.suppress(OSError):
            remember_frames()  # NB: first, before this process writes more than it must
    if os.environ.get(CPROFILE_ENV) == "1":
        import cProfile  # NB: on demand: nobody else loads the profiler's modules

        _profiler = cProfile.Profile(time.process_time)  # NB: CPU, not wall (a loaded host)
        _profiler.enable()


def end(kind: str) -> None:
    """As the process ends (before ``os._exit``): its CPU line, and its profile if one runs."""
    global _profiler
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return
    pid = os.getpid()
    try:
        if _profiler is not None:
            _profiler.disable()
            _profiler.dump_stats(os.path.join(directory, f"{kind}-{pid}.prof"))
            _profiler = None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _append(directory, "cpu.txt",
                f"{kind} {pid} {usage.ru_utime!r} {usage.ru_stime!r} {usage.ru_minflt}\n")
        if kind == "worker" and os.environ.get(PAGES_ENV) == "1" and os.getppid() != 1:
            from lorenz.workers.written_pages import written_pages

            # NB: compared with the launcher it was forked from (gone: reparented to pid 1).
            _append(directory, "pages.txt",
                    written_pages(parent=os.getppid()).line(kind=kind, pid=pid))
    except OSError:
        pass  # NB: a figure for the bench, never a reason for a run to fail


def _append(directory: str, name: str, line: str) -> None:
    """One whole line appended (``O_APPEND``: lines of processes ending at once never mix)."""
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
