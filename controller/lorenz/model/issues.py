"""The normalized issue every tracker adapter produces and every policy reads.

Trackers differ (Linear, GitHub, Markdown files); the orchestrator sees only this shape. Fields
follow the issue model of the Symphony specification (the public description of an
issue-tracker-to-coding-agent orchestrator that Lorenz implements; introduced in
``docs/architecture.md``): ``id`` is the tracker's internal key, ``identifier`` the human
one (``ABC-123``) used in logs and workspace names. States keep the tracker's spelling;
comparisons go through :func:`normalize_state`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any


def normalize_state(state: str | None) -> str:
    """States (and labels) compare trimmed and lowercased."""
    return (state or "").strip().lower()


@dataclasses.dataclass(frozen=True, slots=True)
class BlockerRef:
    """An issue that blocks another one (from an inverse ``blocks`` relation)."""

    id: str | None = None
    identifier: str | None = None
    state: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Issue:
    """One tracker issue, normalized."""

    id: str
    identifier: str
    title: str
    state: str
    description: str | None = None
    priority: int | None = None
    branch_name: str | None = None
    url: str | None = None
    labels: tuple[str, ...] = ()
    blocked_by: tuple[BlockerRef, ...] = ()
    created_at: datetime.datetime | None = None
    updated_at: datetime.datetime | None = None
    assignee_id: str | None = None
    dispatchable: bool = True
    """The adapter's verdict on provider-specific eligibility (e.g. assigned elsewhere)."""
    native_ref: Mapping[str, Any] | None = None
    """Opaque, non-secret provider ids; the orchestrator never reads it."""

    def __post_init__(self) -> None:
        # NB: labels are lowercased, trimmed and de-duplicated once, here, so that every
        # adapter (and every test) gets the same normalization for free.
        seen: dict[str, None] = {}
        for label in self.labels:
            norm = normalize_state(label)
            if norm:
                seen.setdefault(norm, None)
        object.__setattr__(self, "labels", tuple(seen))
        object.__setattr__(self, "blocked_by", tuple(self.blocked_by))

    @property
    def state_key(self) -> str:
        """The normalized state, for comparisons."""
        return normalize_state(self.state)

    def is_well_formed(self) -> bool:
        """``id``, ``identifier``, ``title`` and ``state`` are all non-blank."""
        return bool(
            self.id.strip()
            and self.identifier.strip()
            and self.title.strip()
            and self.state.strip()
        )

    def to_template_dict(self) -> dict[str, Any]:
        """The issue as plain data for prompt templates and JSON: strings keys, ISO timestamps."""
        return {
            "id": self.id,
            "identifier": self.identifier,
            "title": self.title,
            "description": self.description,
            "priority": self.priority,
            "state": self.state,
            "branch_name": self.branch_name,
            "url": self.url,
            "labels": list(self.labels),
            "blocked_by": [
                {"id": b.id, "identifier": b.identifier, "state": b.state} for b in self.blocked_by
            ],
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "assignee_id": self.assignee_id,
            "dispatchable": self.dispatchable,
            "native_ref": dict(self.native_ref) if self.native_ref is not None else None,
        }
