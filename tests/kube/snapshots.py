"""Runtime snapshots built by hand, for the pure status functions of the operator.

The status reads a :class:`~lorenz.model.RuntimeSnapshot` typed, so its tests build real ones:
only the poll block, the lane sizes and the usage totals matter to it.
"""

from __future__ import annotations

import datetime

from lorenz.model import (
    AppStatus,
    DispatchPause,
    OrchestratorSnapshot,
    PollStatus,
    RetryRow,
    RunningRow,
    RuntimeSnapshot,
    TokenUsage,
    UsageTotals,
)

AT = datetime.datetime(2026, 3, 4, 5, 6, 0, tzinfo=datetime.UTC)


def running_row(index: int) -> RunningRow:
    return RunningRow(
        slot_key=f"i{index}#0", issue_id=f"i{index}", identifier=f"T-{index}", slot_index=0,
        state="Todo", url=None, host=None, workspace_path=None, session_id=None,
        agent_pid=None, attempt=None, retry_kind=None, turn_count=0, last_agent_event=None,
        last_agent_message=None, last_agent_at=None, started_at=AT, runtime_seconds=0.0,
        usage=TokenUsage(), cost_usd=0.0,
    )


def retry_row(index: int) -> RetryRow:
    return RetryRow(
        slot_key=f"r{index}#0", issue_id=f"r{index}", identifier=f"R-{index}", slot_index=0,
        attempt=1, kind="failure", due_at=AT, due_in_ms=0.0, error=None, host=None,
        workspace_path=None,
    )


def runtime_snapshot(
    *,
    last_poll_at: datetime.datetime | None = None,
    next_poll_at: datetime.datetime | None = None,
    candidates: int = 0,
    eligible: int = 0,
    count: int = 0,
    interval_ms: int = 30000,
    last_error: str | None = None,
    dispatch_paused: DispatchPause | None = None,
    running: int = 0,
    retrying: int = 0,
    usage: UsageTotals | None = None,
) -> RuntimeSnapshot:
    return RuntimeSnapshot(
        app_status=AppStatus.RUNNING,
        workflow_path="/w/WORKFLOW.md",
        poll=PollStatus(
            status="idle", interval_ms=interval_ms, candidates=candidates, eligible=eligible,
            last_poll_at=last_poll_at, next_poll_at=next_poll_at, last_error=last_error,
            count=count, dispatch_paused=dispatch_paused,
        ),
        lanes=OrchestratorSnapshot(
            generated_at=AT,
            running=tuple(running_row(i) for i in range(running)),
            reserving=(),
            retrying=tuple(retry_row(i) for i in range(retrying)),
            blocked=(),
            usage_totals=usage or UsageTotals(),
            rate_limits=None,
        ),
        recent_events=(),
        run_history=(),
        log_file=None,
        config_error=None,
    )
