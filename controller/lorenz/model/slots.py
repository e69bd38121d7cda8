"""Slot keys: the unit of work is one slot of one issue, not the issue itself.

An issue may run an ensemble of slots (``agent.ensemble_size``, default 1); each slot claims,
runs and retries on its own, so every scheduling map is keyed by ``<issue id>#<slot index>``.
"""

from __future__ import annotations

from typing import NewType

SlotKey = NewType("SlotKey", str)

SEPARATOR = "#"


def slot_key(issue_id: str, slot_index: int) -> SlotKey:
    """The key of slot ``slot_index`` of issue ``issue_id``."""
    if slot_index < 0:
        raise ValueError(f"slot index must be >= 0, got {slot_index}")
    return SlotKey(f"{issue_id}{SEPARATOR}{slot_index}")


def parse_slot_key(key: str) -> tuple[str, int]:
    """Split a slot key back into ``(issue_id, slot_index)``.

    NB: issue ids may themselves contain ``#``; the index is always after the *last* one.
    """
    issue_id, sep, index = key.rpartition(SEPARATOR)
    if not sep or not issue_id or not index.isdigit():
        raise ValueError(f"not a slot key: {key!r}")
    return issue_id, int(index)
