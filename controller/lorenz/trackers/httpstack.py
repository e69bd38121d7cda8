"""The HTTP stack under the trackers, loaded with a per-request and a start-up waste taken out.

httpcore (under httpx) asks which async library it runs under each time it creates a lock, and
it asks by trying ``import sniffio`` first, falling back to asyncio when that fails. sniffio is
not among our dependencies, and a failed import is not remembered: every try walks
``sys.path`` again (a ``stat`` per entry and a pass through every finder). On a busy board that
was ~140 walks per 100 runs, about 2-3 % of the event loop's CPU in ``bench/tracker_bench.py``.

Where sniffio is not installed it is recorded as absent, once: the next ``import sniffio``
raises the same ``ImportError`` after one dictionary lookup. Where it is installed nothing
changes.

httpx's package imports its own command-line client (``httpx._main``) whenever click, rich and
pygments are installed — and they are: rich for our terminal view, click under kopf. That was
about 40 ms of every start-up (a quarter of the trackers' import) for a command we never run in
this process. It is recorded as absent too, so httpx takes its own fallback (an ``httpx.main``
that says its dependencies are missing); nothing else in httpx uses it.

Importing this module is what does both; ``lorenz.trackers`` imports it before anything of it
imports httpx.
"""

from __future__ import annotations

import importlib.util
import sys

ABSENT_OPTIONAL_MODULES = ("sniffio",)
"""Modules httpcore only probes for; recorded as absent when they are not installed."""

UNUSED_MODULES = ("httpx._main",)
"""Modules a dependency imports for a feature we never use here; recorded as absent unless
something imported them already."""


def record_absent_modules(names: tuple[str, ...] = ABSENT_OPTIONAL_MODULES) -> list[str]:
    """Record each of ``names`` that cannot be imported as absent; return those recorded.

    NB: ``sys.modules[name] = None`` is the import system's own way to say "no such module":
    ``import name`` then raises ``ModuleNotFoundError`` without searching, and
    ``importlib.util.find_spec(name)`` answers ``None`` as it would have.
    """
    recorded: list[str] = []
    for name in names:
        if name in sys.modules:
            continue
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]
            recorded.append(name)
    return recorded


def skip_unused_modules(names: tuple[str, ...] = UNUSED_MODULES) -> list[str]:
    """Record each of ``names`` not imported yet as absent (installed or not); return those.

    NB: only a module whose importer copes with its absence belongs here: httpx wraps the
    import of its command-line client in ``try``/``except ImportError`` for this very case.
    """
    skipped: list[str] = []
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
            skipped.append(name)
    return skipped


record_absent_modules()
skip_unused_modules()
