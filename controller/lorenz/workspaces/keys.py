"""Issue identifiers become directory names and branch names here, and nowhere else.

Identifiers come from trackers and are not ours to trust: ``A/B`` must not become a nested
directory, ``../x`` must not climb out of the root, and two identifiers that sanitize to the
same text must still get different directories. The rule: replace every character outside
``[A-Za-z0-9._-]`` by ``_``; when that changed anything, append ``--`` and the first 16 hex
characters of the SHA-256 of the original identifier. Identifiers that need no change keep their
plain key, so a workspace named ``ABC-123`` is what an operator expects to find.
"""

from __future__ import annotations

import hashlib
import re

from lorenz.codes import ErrorCode
from lorenz.workspaces.errors import WorkspaceError

STATE_DIR_NAME = ".lorenz"
"""Lorenz's own state under the workspace root (markers, manifests, the default claim store)."""

SLOT_DIR_PREFIX = "slot-"
BRANCH_PREFIX = "lorenz/"
HASH_HEX_CHARS = 16
MAX_PLAIN_KEY_CHARS = 128
"""Longer identifiers are cut (and hashed) so a key always fits a 255-byte file name."""

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_HASHED_KEY = re.compile(rf"--[0-9a-f]{{{HASH_HEX_CHARS}}}$")
_SLOT_DIR = re.compile(rf"^{SLOT_DIR_PREFIX}(0|[1-9][0-9]*)$")

# NB: these would name the root itself, its parent, or Lorenz's state directory; they are legal
# characters, so without this they would pass the sanitizer unchanged.
_RESERVED_KEYS = frozenset({".", "..", STATE_DIR_NAME})


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_HEX_CHARS]


def workspace_key(identifier: str) -> str:
    """The directory name of an issue's workspace (see the module docstring for the rule)."""
    if not identifier:
        raise WorkspaceError(
            "the issue identifier is empty; the tracker must give every issue an identifier",
            code=ErrorCode.WORKSPACE_IDENTIFIER_BLANK,
        )
    sanitized = _UNSAFE_CHARS.sub("_", identifier)
    if len(sanitized) > MAX_PLAIN_KEY_CHARS:
        sanitized = sanitized[:MAX_PLAIN_KEY_CHARS]
    if sanitized == identifier and sanitized.casefold() not in _RESERVED_KEYS:
        return sanitized
    return f"{sanitized}--{_short_hash(identifier)}"


def identifier_from_key(key: str) -> str | None:
    """The identifier a key was made from, when the key alone proves it (an unhashed key)."""
    if _HASHED_KEY.search(key) or _UNSAFE_CHARS.search(key) or key.casefold() in _RESERVED_KEYS:
        return None
    return key


def slot_dir_name(slot_index: int) -> str:
    """The subdirectory of one ensemble slot: ``slot-<n>``."""
    if slot_index < 0:
        raise ValueError(f"slot index must not be negative: {slot_index}")
    return f"{SLOT_DIR_PREFIX}{slot_index}"


def parse_slot_dir_name(name: str) -> int | None:
    """The slot index of a ``slot-<n>`` directory name, or ``None`` for any other name."""
    match = _SLOT_DIR.match(name)
    return int(match.group(1)) if match else None


def _git_safe_component(key: str) -> str:
    # Keys only hold [A-Za-z0-9._-], so of git's ref-format rules only the dot rules can bite:
    # no "..", no component starting with "." or ending with "." or ".lock".
    fixed = key.replace("..", "_.")
    while ".." in fixed:
        fixed = fixed.replace("..", "_.")
    if fixed.startswith("."):
        fixed = "_" + fixed[1:]
    if fixed.endswith(".lock"):
        fixed = fixed[: -len(".lock")] + "_lock"
    if fixed.endswith("."):
        fixed = fixed[:-1] + "_"
    if fixed == key:
        return key
    # NB: the fix-ups are not injective ("a..b" and "a_.b"), and a shared branch would put two
    # issues on one line of history, so a changed name gets a hash of the key it came from.
    return f"{fixed}--{_short_hash(key)}"


def branch_name(key: str, *, slot_index: int | None) -> str:
    """The branch of a worktree: ``lorenz/<key>``, or ``lorenz/<key>+slot-<n>`` for one slot of
    an ensemble (git cannot check one branch out in two worktrees).

    ``+`` cannot occur in a key, so a slot branch never collides with another issue's branch.
    """
    component = _git_safe_component(key)
    if slot_index is None:
        return f"{BRANCH_PREFIX}{component}"
    return f"{BRANCH_PREFIX}{component}+{slot_dir_name(slot_index)}"
