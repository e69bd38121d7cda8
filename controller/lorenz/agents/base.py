"""The agent-runner port: what the runtime hands a runner, and what it gets back.

A runner owns one agent process for one run: it launches it in the workspace, drives turns
until the agent is done, ``agent.max_turns`` is reached or the issue stops being active, reports
progress through ``on_update``, and kills the whole process group when its task is cancelled.
Failures raise :class:`AgentRunError` with a stable code; a clean return is a successful run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lorenz.config import AgentKindSettings, HooksSettings, WorkerSettings
from lorenz.model import AgentUpdate, Issue, LorenzError, SpawnIntent


class AgentRunError(LorenzError):
    """A run failed: ``code`` is one of the runner's documented codes (``turn_failed``, ...)."""

    code = "agent_run_failed"


class PlacementFailed(LorenzError):
    """The run could not be *placed* (its Pod was not scheduled, its image not pulled, a quota
    refused it): nothing of the run started, so the runtime gives its reservation back with
    the reason instead of counting a failed attempt. ``reason`` is a short label for metrics
    (``unschedulable``, ``image_pull``, ``quota``, ``container_config``, ``start_timeout``);
    the message says what Kubernetes said.

    NB: raised only before the request's ``on_placed`` was called; once a run is placed, what
    goes wrong is a failure like any other.
    """

    code = "placement_failed"

    def __init__(self, message: str, *, code: str | None = None, reason: str) -> None:
        super().__init__(message, code=code)
        self.reason = reason


class ToolHandler(Protocol):
    """Executes host-side tools an agent may call (``linear_graphql``)."""

    def tool_specs(self) -> list[dict[str, Any]]:
        """Tool descriptions advertised to the agent (name, description, input schema)."""
        ...

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Run a tool; return ``{"success": bool, "output": str, ...}``; never raise."""
        ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunPlacement:
    """A run placed on another host: the runner starts it there, hooks included."""

    host: str
    """The ``worker.ssh_hosts`` entry."""
    hooks: HooksSettings
    """The hooks to run on the host (the workspace is there, so the controller cannot)."""
    worker: WorkerSettings
    """How to reach the host (ssh config, remote command, remote state root)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentRunRequest:
    """Everything one run needs."""

    issue: Issue
    attempt: int | None
    slot_index: int
    prompt: str
    """The fully rendered first-turn prompt."""
    workspace: Path
    settings: AgentKindSettings
    max_turns: int
    env: Mapping[str, str]
    """The complete environment for the agent process (tracker secrets already stripped)."""
    on_update: Callable[[AgentUpdate], None]
    """Progress sink; cheap and synchronous, never raises."""
    issue_is_active: Callable[[], Awaitable[bool]]
    """Asked before each continuation turn: keep going only while this says yes."""
    continuation_prompt: Callable[[int, int], str]
    """``(turn, max_turns) -> text`` for turns 2..max_turns (never the original prompt)."""
    tools: ToolHandler | None = None
    placement: RunPlacement | None = None
    """Where the run executes when not on this machine (SSH placement); ``workspace`` is then a
    path on that host, which the runner creates there. Only a runner that places runs in workers
honours it (the assembly's runner factory picks one for such requests)."""
    resume: SpawnIntent | None = None
    """The worker of a lost controller to adopt instead of starting the agent: probe its
    handle, re-attach after ``last_seq`` (no record twice), settle from its final record, or
    fail the run with ``worker_gone``. Only a runner that places runs in workers honours it."""
    on_placed: Callable[[str | None], Awaitable[bool]] | None = None
    """Two-phase placement (runs in Pods): the runner calls it once the run's worker serves,
    with where it runs (the Pod's name); the runtime binds the slot's reservation then.
    ``False``: the reservation is gone (swept, cancelled) and the runner stops the worker.
    Until it was called, a :class:`PlacementFailed` gives the reservation back."""
    scratch_dir: Path | None = None
    """A private directory for the run's own files (the command runner's prompt file): the
    worker's state directory, which outlives a worker killed mid-run as its evidence. ``None``:
    the system's temporary directory, where a killed process's files are left behind."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AgentRunResult:
    """How a successful run ended."""

    turns: int
    session_id: str | None = None
    stop_reason: str | None = None


class AgentRunner(Protocol):
    async def run(self, request: AgentRunRequest) -> AgentRunResult: ...


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DroppedAdoption:
    """A lost controller's run whose adoption was dropped: its issue is no longer a candidate
    (terminal, inactive, gone, blocked), so its worker is cancelled instead of followed."""

    issue: Issue
    """The issue as last read (a stand-in with the stored id and identifier when it is gone)."""
    slot_index: int
    resume: SpawnIntent
    """The spawn intent the lost controller recorded: the worker's handle and last seq."""
    placement: RunPlacement | None = None
    """Where the worker runs (``None``: this machine)."""
    reason: str
    """Why the run ends: the worker journals it with the cancellation."""


@runtime_checkable
class AdoptionCanceller(Protocol):
    """A runner that places runs in workers can also cancel one it will not adopt."""

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        """Cancel the worker of ``dropped`` with its reason and wait, bounded, for its final
        record. ``True`` once the run is over (final record collected, or the worker gone);
        ``False`` when its worker cannot be reached or is not this slot's (it may still run)."""
        ...
