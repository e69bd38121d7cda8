"""The parts every runtime collaborator is handed: shared objects, none of them an owner.

In the style of kopf's ``processing``, a collaborator gets what it works with by keyword and
never a reference back to the facade that made it. What several collaborators share (the
orchestrator, the workspaces, the run handles, the retry timers, reporting, the clock, the
background tasks, the workflow and tracker in force, the runner factory, the lifecycle flags and
the last candidate list) is gathered here once, in a frozen :class:`RuntimeParts`; what one
collaborator alone needs (the poll state, the pending exits, the graces) is its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from lorenz.agents import AgentRunner
from lorenz.config import AgentProtocol, WorkflowSettings
from lorenz.model import AppStatus, Clock, Issue
from lorenz.orchestrator import Orchestrator
from lorenz.runtime.providers import InForce
from lorenz.runtime.reporting import Reporting
from lorenz.runtime.retry_timers import RetryTimers
from lorenz.runtime.runs import ActiveRuns
from lorenz.runtime.spending import Spending
from lorenz.tasks import BackgroundTasks
from lorenz.trackers import TrackerClient
from lorenz.workflow import LoadedWorkflow
from lorenz.workspaces import WorkspaceManager


@dataclasses.dataclass(slots=True)
class RuntimeStatus:
    """Where the runtime is in its life; the facade sets it, every collaborator reads it."""

    app: AppStatus = AppStatus.STARTING
    """What the snapshot shows (starting, running, stopping, stopped)."""
    stopped: bool = False
    """:meth:`~.runtime.LorenzRuntime.stop` was called: no new poll, pass or run."""
    draining: bool = False
    """:meth:`~.runtime.LorenzRuntime.drain` began: ticks go on, nothing new is dispatched."""
    once: bool = False
    """``--once``: one tick and its runs; no dispatch passes between polls."""
    dry_run: bool = False
    """The runtime was started to report what it would dispatch, not to dispatch it."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeParts:
    """The shared parts of one runtime (frozen: the parts never change, their state does)."""

    orchestrator: Orchestrator
    workspaces: WorkspaceManager
    runs: ActiveRuns
    """The handle of every run in flight, by slot key."""
    timers: RetryTimers
    """One timer per pending retry; they fire into dispatch passes."""
    reporting: Reporting
    """Events, run history, snapshots and listeners, all redacted."""
    clock: Clock
    background: BackgroundTasks
    """Work nobody awaits (a poll, an agent update, a terminal action, a grace's stop)."""
    workflow: InForce[LoadedWorkflow]
    tracker: InForce[TrackerClient]
    runner_factory: Callable[[AgentProtocol], AgentRunner]
    """The agent runner for a protocol (one per run)."""
    status: RuntimeStatus
    candidates: dict[str, Issue]
    """The last full candidate list (by id, in tracker order), kept fresh by every by-id read;
    dispatch between polls picks from it."""
    base_env: Mapping[str, str]
    """The environment agents and hooks start from (this process's unless given)."""
    spending: Spending
    """Spend control: run meters, the issue and day totals, the ``budget`` lane."""

    @property
    def settings(self) -> WorkflowSettings:
        """The settings of the workflow in force (a reload may have replaced them)."""
        return self.workflow.current.settings
