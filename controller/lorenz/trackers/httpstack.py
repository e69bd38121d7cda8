"""The HTTP stack under the trackers, loaded with one per-request waste taken out.

httpcore (under httpx) asks which async library it runs under each time it creates a lock, and
it asks by trying ``import sniffio`` first, falling back to asyncio when that fails. sniffio is
not among our dependencies, and a failed import is not remembered: every try walks
``sys.path`` again (a ``stat`` per entry and a pass through every finder). On a busy board that
was ~140 walks per 100 runs, about 2-3 % of the event loop's CPU in ``bench/tracker_bench.py``.

Where sniffio is not installed it is recorded as absent, once: the next ``import sniffio``
raises the same ``ImportError`` after one dictionary lookup. Where it is installed nothing
changes. Importing this module is what does it; the trackers that speak HTTP import it.
"""

from __future__ import annotations

import importlib.util
import sys

ABSENT_OPTIONAL_MODULES = ("sniffio",)
"""Modules httpcore only probes for; recorded as absent when they are not installed."""


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


record_absent_modules()
