"""The scheduling core: one authoritative state and the only component that changes it.

The runtime (layer 6) asks :class:`Orchestrator` for sorted candidates, claims them, reports
agent progress and run endings back, and reads snapshots; the orchestrator persists every claim
and retry through the injected claim store. See ``docs/scheduling.md`` for the rules.
"""

from lorenz.orchestrator.checkpoints import CHECKPOINT_SCHEMA, Checkpoint
from lorenz.orchestrator.errors import (
    AlreadyStarted,
    CheckpointInvalid,
    ClaimRecordInvalid,
    OrchestratorError,
)
from lorenz.orchestrator.results import (
    AgentProgress,
    ClaimResult,
    DispatchCandidate,
    EligibilityReport,
    Finished,
    HydrationReport,
    Released,
    Reserved,
    Skipped,
    SkipReason,
    StalledRun,
    Started,
)
from lorenz.orchestrator.scheduling import DEFAULT_FOREIGN_RECHECK_MS, Orchestrator
from lorenz.orchestrator.snapshots import (
    BlockedRow,
    OrchestratorSnapshot,
    ReservingRow,
    RetryRow,
    RunningRow,
)
from lorenz.orchestrator.state import ForeignClaim, OrchestratorState

__all__ = [
    "CHECKPOINT_SCHEMA",
    "DEFAULT_FOREIGN_RECHECK_MS",
    "AgentProgress",
    "AlreadyStarted",
    "BlockedRow",
    "Checkpoint",
    "CheckpointInvalid",
    "ClaimRecordInvalid",
    "ClaimResult",
    "DispatchCandidate",
    "EligibilityReport",
    "Finished",
    "ForeignClaim",
    "HydrationReport",
    "Orchestrator",
    "OrchestratorError",
    "OrchestratorSnapshot",
    "OrchestratorState",
    "Released",
    "Reserved",
    "ReservingRow",
    "RetryRow",
    "RunningRow",
    "SkipReason",
    "Skipped",
    "StalledRun",
    "Started",
]
