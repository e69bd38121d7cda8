"""Defensive readers of one field of a tracker's JSON answer, shared by every tracker.

GitHub, GitLab, Jira and Linear all answer with loosely typed JSON where any field may be
missing, ``null`` or of an unexpected type; each tracker's payload module reads its issues with
the same few coercions (a non-blank string, a mapping or nothing, an ISO 8601 time, label
names). They live here once so that the trackers agree on what "odd" means: an odd value
becomes ``None`` (or an empty result), never an exception that would fail a whole poll.
Tracker-specific meaning (priorities, states, blockers) stays in the tracker's own module.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any


def nonblank(value: Any) -> str | None:
    """The value when it is a string with some non-space character, else ``None`` (untrimmed)."""
    return value if isinstance(value, str) and value.strip() else None


def as_mapping(value: Any) -> Mapping[str, Any]:
    """The value when it is a mapping, else an empty one, so chained ``.get`` calls stay safe."""
    return value if isinstance(value, Mapping) else {}


def parse_timestamp(value: Any) -> datetime.datetime | None:
    """An ISO 8601 time (``Z``, offsets, Jira's ``+0000``) as an aware datetime; naive → UTC.

    ``None`` for anything that is not a string or does not parse.
    """
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def label_names(item: Mapping[str, Any]) -> list[str]:
    """The non-blank names of an item's ``labels``, given as plain names or ``{"name": …}``.

    NB: GitHub always lists objects; GitLab lists plain names by default and objects when asked
    ``with_labels_details=true``. Blank or odd entries are skipped, order is kept.
    """
    labels = item.get("labels")
    if not isinstance(labels, list):
        return []
    names = []
    for label in labels:
        name = label.get("name") if isinstance(label, Mapping) else label
        if isinstance(name, str) and name.strip():
            names.append(name)
    return names
