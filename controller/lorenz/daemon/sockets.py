"""Where a daemon without an HTTP server listens: a unix socket only its user can open.

A control socket accepts ``POST /api/v1/stop`` from whoever can connect, so its privacy is the
file system's: the socket lives in a per-user directory that is ``0700`` and owned by us
(``$XDG_RUNTIME_DIR/lorenz/``, else ``/tmp/lorenz-<uid>/``), and the socket itself is ``0600``.

NB: ``/tmp`` is shared. Anyone can create ``/tmp/lorenz-<uid>`` before we do — as a symlink, or
as their own directory — so an existing directory is accepted only if it is a real directory
(``lstat``, never followed), owned by our uid; its mode is then forced to ``0700``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from lorenz.daemon.errors import ControlDirUnsafe

DIR_MODE = 0o700
SOCKET_MODE = 0o600
"""The socket's own mode (the server sets it right after binding)."""
SUN_PATH_MAX = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the terminator)."""
DIGEST_CHARS = 24
"""Hex characters of the workflow digest in the socket name (96 bits: collisions are moot)."""


def runtime_dir(*, environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_RUNTIME_DIR/lorenz`` (when that is set and absolute), else ``/tmp/lorenz-<uid>``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_RUNTIME_DIR", "").strip()
    if base and os.path.isabs(base):
        return Path(base) / "lorenz"
    return Path("/tmp") / f"lorenz-{os.getuid()}"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` as ``0700``, or accept it if it is already our own real directory.

    Raises :class:`ControlDirUnsafe` for a symlink, a non-directory or another user's directory.
    """
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, DIR_MODE)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ControlDirUnsafe(path=path, reason=exc.strerror or str(exc)) from exc
    if stat.S_ISLNK(info.st_mode):
        raise ControlDirUnsafe(path=path, reason="it is a symlink")
    if not stat.S_ISDIR(info.st_mode):
        raise ControlDirUnsafe(path=path, reason="it is not a directory")
    if info.st_uid != os.getuid():
        raise ControlDirUnsafe(path=path, reason=f"it is owned by uid {info.st_uid}, not us")
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def socket_path_for(canonical_workflow: Path, *, environ: Mapping[str, str] | None = None) -> Path:
    """``<runtime dir>/<first 24 hex of sha256(workflow path)>.sock`` (directory not created)."""
    digest = hashlib.sha256(str(canonical_workflow).encode("utf-8")).hexdigest()[:DIGEST_CHARS]
    return runtime_dir(environ=environ) / f"{digest}.sock"


def unix_endpoint(path: Path) -> str:
    """How the lease records a socket endpoint: ``unix:///absolute/path.sock``."""
    return f"unix://{path}"
