"""Whether a Workflow's runs can be placed: ``Degraded`` after failures in a row.

A run that is not placed (``placement_failed``: an image that does not pull, no node that fits,
a full quota) gives its reservation back and is tried again later, which a
``PlacementFailed`` Event says — seen only by ``kubectl describe``. A Workflow whose runs keep
failing to place says so in its status instead: one failure is a busy cluster, several in a row
are something for its owner to fix. A run that starts, or a new spec, clears it.
"""

from __future__ import annotations

import dataclasses

from lorenz.codes import ErrorCode
from lorenz.kube.controller.status import Degradation
from lorenz.model import RuntimeEvent

PLACEMENT_FAILURES_DEGRADE = 3
"""Runs in a row that could not be placed before the Workflow says so as ``Degraded``."""


@dataclasses.dataclass(slots=True)
class PlacementHealth:
    """The placement failures in a row of one Workflow's runs, and the degradation they set."""

    failures: int = 0
    """Runs in a row that were not placed."""
    degraded: Degradation | None = None
    """Set once :data:`PLACEMENT_FAILURES_DEGRADE` runs in a row were not placed."""

    def failed(self, event: RuntimeEvent, *, generation: int) -> bool:
        """One more run that was not placed; ``True`` when the degradation is (re)set."""
        self.failures += 1
        if self.failures < PLACEMENT_FAILURES_DEGRADE:
            return False
        self.degraded = Degradation(
            code=event.code or ErrorCode.PLACEMENT_FAILED,
            message=f"{self.failures} runs in a row were not placed; the last "
            f"({event.reason or 'unknown'}): {event.message or ''}",
            generation=generation,
            stage="cannot place its runs",
        )
        return True

    def reset(self) -> bool:
        """A run was placed or the spec changed; ``True`` when anything was cleared."""
        cleared = bool(self.failures)
        self.failures, self.degraded = 0, None
        return cleared
