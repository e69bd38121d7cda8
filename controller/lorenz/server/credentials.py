"""The token file: what state-changing routes over TCP ask for, readable by its owner only.

Each server start picks a fresh random token and writes it beside the workflow's lease,
``<workflow dir>/.lorenz/daemon/<sha256 of the workflow path>.token``, mode ``0600``. Anyone
who can read that file is the user who runs Lorenz (or root); ``lorenz refresh|stop`` read it
and send ``Authorization: Bearer <token>``.

NB: the file is never written in place. A temporary file is created ``0600`` from the start
(``O_EXCL``, so nothing else can have opened it), filled, flushed to disk and renamed over the
old one: a reader sees the old token or the new one, never a torn or world-readable file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

TOKEN_SUFFIX = ".token"
LEASE_SUFFIX = ".lock.json"
TOKEN_FILE_MODE = 0o600
MAX_TOKEN_BYTES = 1024
"""A token file larger than this is not ours; it is ignored."""


def token_file_beside(lease_file: Path) -> Path:
    """``<digest>.lock.json`` → ``<digest>.token`` in the same directory."""
    name = lease_file.name.removesuffix(LEASE_SUFFIX)
    return lease_file.with_name(name + TOKEN_SUFFIX)


def write_token_file(path: Path, token: str) -> None:
    """Atomically make ``path`` hold ``token`` (mode ``0600``, directory created ``0700``)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, TOKEN_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def read_token_file(path: Path) -> str | None:
    """The token in ``path``; ``None`` when it is missing, unreadable or not a token."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_TOKEN_BYTES:
        return None
    token = raw.decode("ascii", "replace").strip()
    return token or None
