"""What a reload may replace while the runtime runs: the workflow and the tracker client.

Every part of the runtime reads the workflow (its settings) and the tracker client of the
moment; a successful reload swaps both at once (:mod:`.reloading`). Holding them in one small
box each, shared by every collaborator, means nobody keeps a stale copy and nobody reaches into
the facade for the current one.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class InForce(Generic[T]):
    """The one in force now; a reload replaces :attr:`current` (read it at each use)."""

    current: T
