"""The agent-runner port: what the runtime hands a runner, and what it gets back.

A runner owns one agent process for one run: it launches it in the workspace, drives turns
until the agent is done, ``agent.max_turns`` is reached or the issue stops being active, reports
progress through ``on_update``, and kills the whole process group when its task is cancelled.
Failures raise :class:`AgentRunError` with a stable code; a clean return is a successful run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from lorenz.codes import ErrorCode
from lorenz.config import AgentLaunch
from lorenz.model import AgentUpdate, Issue, LorenzError, SpawnIntent
from lorenz.model.questions import AgentQuestion, SessionResume

if TYPE_CHECKING:
    # NB: annotations only: the controller builds a RunPlacement; a worker (which imports this
    # module) must not load the settings (lorenz.config).
    from lorenz.config import HooksSettings, WorkerSettings


class AgentRunError(LorenzError):
    """A run failed: ``code`` is one of the runner's documented codes (``turn_failed``, ...)."""

    code = ErrorCode.AGENT_RUN_FAILED


class AgentAsked(AgentRunError):
    """The agent asked a question: the run ends with it (code ``input_required``), its slot
    waits for an answer, and the answer resumes ``question.session_id`` (docs/questions.md)."""

    code = ErrorCode.INPUT_REQUIRED

    def __init__(self, question: AgentQuestion) -> None:
        super().__init__(
            f"the agent asked for input ({question.source or 'a question'}): "
            f"{question.text[:300]}"
        )
        self.question = question


QUESTION_EVENT = "agent_question"
"""The event of the update a runner emits when it captured a question (``payload.question``)."""


BUDGET_EXHAUSTED = ErrorCode.BUDGET_EXHAUSTED
"""The code of a run stopped because it crossed a spend cap (see docs/budgets.md)."""

MODEL_EVENT = "agent_model"
"""The event of an update that names the model the agent's session runs (``payload.model``),
for pricing; emitted once per session, when the protocol reports it."""

T = TypeVar("T")


class TurnStop:
    """A request, from outside the runner, to stop the run's current turn at once.

    The runtime creates one per run (``AgentRunRequest.stop``) and calls :meth:`request` from
    its usage handler when a cap is crossed; the runner then stops the agent the way its
    protocol allows (Codex ``turn/interrupt``, ACP ``session/cancel``, Claude Code and
    ``command``: the process group) and fails the run with :meth:`error`. The first request
    wins; later ones are ignored. Synchronous and cheap, so it can be called from
    ``on_update``.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.code: str = BUDGET_EXHAUSTED
        self.reason: str = ""

    def request(self, *, reason: str, code: str = BUDGET_EXHAUSTED) -> None:
        if self._event.is_set():
            return
        self.code, self.reason = code, reason
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def error(self) -> AgentRunError:
        return AgentRunError(self.reason or "the run was stopped", code=self.code)


async def until_stopped(
    awaitable: Awaitable[T],
    *,
    stop: TurnStop | None,
    on_stop: Callable[[], Awaitable[Any]],
    grace_s: float,
) -> T:
    """Await ``awaitable`` unless ``stop`` is requested first: then run ``on_stop`` (bounded by
    ``grace_s``), cancel ``awaitable`` and raise ``stop.error()``."""
    if stop is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    if stop.requested:
        stopper: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stopper.set_result(None)
    else:
        stopper = asyncio.ensure_future(stop.wait())
    watched: set[asyncio.Future[Any]] = {task, stopper}
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        stopper.cancel()
        raise
    if task.done():
        stopper.cancel()
        return task.result()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(on_stop(), timeout=grace_s)
    task.cancel()
    # NB: how the cancelled turn ended (cancelled, failing) is not ours to report.
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise stop.error()


class PlacementFailed(LorenzError):
    """The run could not be *placed* (its Pod was not scheduled, its image not pulled, a quota
    refused it): nothing of the run started, so the runtime gives its reservation back with
    the reason instead of counting a failed attempt. ``reason`` is a short label for metrics
    (``unschedulable``, ``image_pull``, ``quota``, ``container_config``, ``start_timeout``);
    the message says what Kubernetes said.

    NB: raised only before the request's ``on_placed`` was called; once a run is placed, what
    goes wrong is a failure like any other.
    """

    code = ErrorCode.PLACEMENT_FAILED

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
    settings: AgentLaunch
    """How to launch the agent and speak to it (``AgentKindSettings.launch()``)."""
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
    on_launch: Callable[[bool], None] | None = None
    """Told ``True`` when the runner begins launching the run's worker and ``False`` once the
    launch answered or failed. The launch has a bound of its own (``worker_launch_timeout``, a
    host fault), so the runtime's stall clock does not run meanwhile: a stopped launcher is
    never taken for a silent agent."""
    stop: TurnStop | None = None
    """Set by the runtime to stop the current turn at once (a spend cap crossed): the runner
    stops the agent as its protocol allows and fails the run with the stop's code. ``None``:
    only cancelling the run's task stops it (the process group is killed then)."""
    on_replayed: Callable[[AgentUpdate], None] | None = None
    """An adopted run (``resume``): told, before the first relayed update, each update its
    lost controller already received (the worker's journal up to ``resume.last_seq``), so the
    spend meter counts on from the totals already charged instead of from zero."""
    answer: SessionResume | None = None
    """Continue a saved session instead of starting one: the runner resumes
    ``answer.session_id`` (Codex ``thread/resume``, Claude Code ``--resume``, ACP
    ``session/load``) and sends ``answer.text`` as the first turn's input (``prompt`` is then
    not sent). A protocol or agent that cannot resume starts a new session whose first input is
    :func:`~lorenz.model.questions.new_session_summary`."""
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
