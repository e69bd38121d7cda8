"""What the launcher's preloaded image leaves out: TLS, and OpenSSL's hashes.

A worker talks to its agent's pipes and to controllers on its own unix socket: never TLS. Yet
asyncio imports :mod:`ssl` as it loads, and :mod:`hashlib` binds OpenSSL's ``_hashlib``: both
map libssl and libcrypto (~4 MiB resident, and their relocated data) into the launcher, and so
into the image every worker forked from it shares. Measured (issue #35, ``bench/cli_bench.py``,
10 live runs, alternated three times): the tree's peak PSS 2.4 MiB smaller without them.

So the launcher loads its modules with those marked missing (:func:`keep_out`, before anything
imports asyncio or hashlib): asyncio then loads without TLS support, as on a Python built
without ``ssl``, and hashlib falls back to Python's own digests (the same results; the worker
hashes only its handle). Once the preload is done, :func:`let_in` lifts the marks, so a module
a worker imports after its fork (a protocol runner that was not preloaded) finds ``ssl`` as
usual — at that worker's own cost.
"""

from __future__ import annotations

import sys
from typing import Final

KEPT_OUT: Final = ("ssl", "_ssl", "_hashlib")
"""The modules the launcher's image is loaded without."""


def keep_out() -> bool:
    """Mark :data:`KEPT_OUT` missing for the imports that follow; ``False`` when one of them is
    loaded already (too late: nothing is marked)."""
    if any(sys.modules.get(name) is not None for name in KEPT_OUT):
        return False
    for name in KEPT_OUT:
        # NB: ``None`` in sys.modules is the import system's own "not importable" mark: an
        # ``import ssl`` raises ImportError, which asyncio and hashlib both expect and handle.
        sys.modules[name] = None  # type: ignore[assignment]
    return True


def let_in() -> None:
    """Lift the marks of :func:`keep_out`; modules imported from now on find these again."""
    for name in KEPT_OUT:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
