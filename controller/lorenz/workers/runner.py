"""An :class:`~lorenz.agents.AgentRunner` that runs each request in a worker.

The runtime drives runners through one port (``runner.run(request)``); this one turns the
request into a :class:`RunSpec`, starts (or finds) the worker, and relays its journal back as
:class:`~lorenz.model.AgentUpdate` s, its tool calls to ``request.tools`` and its between-turn
question to ``request.issue_is_active``. The agent protocol code runs in the worker; the
runtime sees the same updates, results and error codes as from an in-process runner.

Adoption from the claim: a request with ``resume`` (the spawn intent a lost controller
recorded, brought back by hydration) re-attaches to that worker after the intent's
``last_seq`` — no record is relayed twice, none is skipped — and settles from its final record;
a worker that is gone without one fails the run (``worker_gone``, a failure retry) once what it
left running is killed (:mod:`lorenz.workers.leftovers`); one that
cannot be probed is *quarantined*: the run stays bound, counted against concurrency, and the
worker is probed again until it answers or ends.

Adoption without claims: before starting a worker for (workflow, issue, slot), the runner looks
in its state root for a live worker of the same slot that no controller collected — the
predecessor of a restarted ``lorenz`` — and follows that one from its first record instead of
starting a second agent on the same issue. A predecessor's run that ended while nobody watched
is settled from its final record. Either way the slot never runs twice.

Never another live controller's worker: each controller writes its owner id into the
``controller`` file of every run it starts or adopts. A worker whose file names another
controller that is provably alive on this host (pid and start time) is neither adopted nor
cancelled, whatever generation its handle carries: a run beside it fails with
``worker_controlled_elsewhere`` (no agent is started next to it), an adoption from a claim
waits (bounded) for that controller to exit — a deposed or stopping one is on its way out —
and a dropped adoption leaves it alone.

Cancellation (stall, reconciliation, shutdown of the controller) cancels the worker's run with
a reason and waits, bounded, for its final record, so the runtime's after-run bookkeeping sees
a finished run — the same contract as the in-process runners. A worker that does not end its
run (frozen, unknown, gone) has the run's processes killed where they run (the transport's
``kill``: this host, its SSH host, its Pod), and the cancellation ends only once that kill is
confirmed: until then the slot stays held (``worker_kill_unconfirmed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from lorenz.agents import (
    AgentAsked,
    AgentRunError,
    AgentRunRequest,
    AgentRunResult,
    DroppedAdoption,
)
from lorenz.agents.base import TurnStop
from lorenz.codes import ErrorCode
from lorenz.model import (
    AgentUpdate,
    SpawnIntent,
    SpawnIntents,
    SpawnPhase,
    TokenUsage,
    slot_key,
)
from lorenz.model.questions import AgentQuestion
from lorenz.policies.retries import NEVER_STARTED_CODE
from lorenz.workers.client import CallHandlers
from lorenz.workers.handles import (
    LocalTransport,
    Transport,
    WorkerGone,
    WorkerHandle,
    WorkerKillUnconfirmed,
    WorkerUnknown,
)
from lorenz.workers.intents import PAUSE_AT_SPAWN_PHASE_ENV as PAUSE_AT_SPAWN_PHASE_ENV
from lorenz.workers.intents import IntentRecorder
from lorenz.workers.journal import DEFAULT_MAX_BYTES as DEFAULT_JOURNAL_MAX_BYTES
from lorenz.workers.journal import Record
from lorenz.workers.launch import WorkerLaunchError
from lorenz.workers.marks import CONTROLLER_NAME as CONTROLLER_NAME
from lorenz.workers.marks import StateRootIndex, controller_id, index_of, read_spec
from lorenz.workers.marks import live_controller_of as live_controller_of
from lorenz.workers.marks import record_controller as record_controller
from lorenz.workers.spec import HookSpec, IssueSpec, RunSpec, is_handle, unpassable_fields
from lorenz.workers.states import (
    COLLECTED_NAME as COLLECTED_NAME,  # NB: re-exported: tests and tools import it from here
)
from lorenz.workers.states import (
    DEFAULT_RETENTION_S,
    ProbeState,
    mark_collected,
    prune_state_dirs,
)

logger = logging.getLogger(__name__)

_StateRootIndex = StateRootIndex
"""NB: its old name here, kept for ``tests/workers/test_state_index.py`` (it lives in
:mod:`lorenz.workers.marks`)."""

CANCEL_WAIT_S: Final = 60.0
"""How long a cancelled run's worker may take to end the run before its processes are killed."""

CANCEL_PROBE_S: Final = 2.0
"""While a cancel is waited for, the worker is probed this often (a frozen one is killed)."""

MAX_RUNS_PER_ATTEMPT: Final = 10_000

QUARANTINE_PROBE_S: Final = 5.0

CONTROLLER_EXIT_WAIT_S: Final = 30.0
"""How long an adoption from a claim waits for the worker's live controller to exit."""

CONTROLLED_ELSEWHERE_CODE: Final = ErrorCode.WORKER_CONTROLLED_ELSEWHERE
"""The failure of a run whose slot's worker is followed by another live controller."""

_pruned_roots: set[Path] = set()
"""State roots whose old state directories this process has removed already."""


@dataclasses.dataclass(slots=True)
class Departure:
    """Whether one runtime's cancelled runs leave their detached workers running.

    For a controller that lost the right to write (leadership lost, fenced out by a newer
    generation, claims taken over) or hands its runs over at the end of a drain: it stops
    following its runs, and the workers go on for the controller that leads now to adopt.
    Passed to the runtime's runners as their ``leaving`` (it is called for the reason).

    NB: per runtime, not per process: the operator leads several workflows in one process,
    and the one it hands over or loses must not make the others' cancelled runs leave their
    workers behind.
    """

    reason: str | None = None
    """Why the runs are left to their workers (``None``: cancelling a run cancels its worker)."""

    def leave(self, *, reason: str) -> None:
        """From now on, a cancelled run leaves its worker running instead of cancelling it.

        NB: one-way, and the first reason stays: such a controller is on its way out, and no
        run of it may be cancelled on its behalf any more.
        """
        if self.reason is None:
            self.reason = reason
            logger.warning("leaving workers running for the next controller reason=%s", reason)

    def __call__(self) -> str | None:
        return self.reason


def agent_update_from(record: Record) -> AgentUpdate:
    """The :class:`AgentUpdate` an ``agent_update`` record was written from."""
    data = record.data
    usage = data.get("usage")
    rate_limits = data.get("rate_limits")
    payload = data.get("payload")
    pid = data.get("pid")
    cost = data.get("cost_usd")
    return AgentUpdate(
        event=str(data.get("event") or "notification"),
        message=data.get("message") if isinstance(data.get("message"), str) else None,
        session_id=data.get("session_id") if isinstance(data.get("session_id"), str) else None,
        usage=TokenUsage(**{k: int(v) for k, v in usage.items()})
        if isinstance(usage, Mapping)
        else None,
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        rate_limits=rate_limits if isinstance(rate_limits, Mapping) else None,
        pid=pid if isinstance(pid, int) else None,
        payload=payload if isinstance(payload, Mapping) else None,
    )


class WorkerRunner:
    """Runs every request in a local worker (or on ``transport``)."""

    def __init__(
        self,
        *,
        workflow: str,
        transport: Transport | None = None,
        generation: int = 0,
        hooks: HookSpec | None = None,
        controller_wait_ms: int = 300_000,
        retention_s: float = DEFAULT_RETENTION_S,
        intents: SpawnIntents | None = None,
        placement: str | None = None,
        quarantine_probe_s: float = QUARANTINE_PROBE_S,
        unknown_patience_s: float = 30.0,
        heartbeat_s: float = 15.0,
        leaving: Callable[[], str | None] | None = None,
        journal_max_bytes: int = DEFAULT_JOURNAL_MAX_BYTES,
    ) -> None:
        self.workflow = workflow
        self.journal_max_bytes = journal_max_bytes
        """The cap of each run's journal (``worker.journal_max_bytes``)."""
        self.transport: Transport = transport or LocalTransport()
        self.generation = generation
        self.hooks = hooks or HookSpec()
        """Hooks the worker runs (empty when the runtime runs them around the runner)."""
        self.controller_wait_ms = controller_wait_ms
        self.last_handle: WorkerHandle | None = None
        """The handle of the newest run (for tests and diagnostics)."""
        self.retention_s = retention_s
        """Finished runs' state directories older than this are removed (by the first run of
        this process on the state root)."""
        self.intents = intents
        """Where the slot's spawn intent is recorded (the claim store), if anywhere."""
        self.placement = placement
        """The ``worker.ssh_hosts`` entry the transport runs on (``None``: this host)."""
        self.quarantine_probe_s = quarantine_probe_s
        """A quarantined (unknown) worker is followed again after this pause."""
        self.unknown_patience_s = unknown_patience_s
        """How long an unreachable worker is probed before it is quarantined."""
        self.heartbeat_s = heartbeat_s
        """The ping interval while following (a missed pong sends the worker to the probes)."""
        self.leaving = leaving
        """Why this controller's runs leave their workers running when cancelled (``None``:
        they cancel them); per runtime, see :class:`Departure`."""

    @property
    def owner(self) -> str:
        """This controller's id, as it marks the runs it follows (:data:`CONTROLLER_NAME`)."""
        return controller_id()

    def _leaves_workers(self) -> bool:
        """Whether a cancelled run leaves its worker running (for the next controller)."""
        return self.leaving is not None and self.leaving() is not None

    def placed_at(self, handle: str) -> str | None:
        """Where the worker of ``handle`` runs, as the slot's binding records it (its host)."""
        del handle
        return self.placement

    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        """The spec of ``request``'s run; :class:`AgentRunError` ``issue_field_invalid`` for
        an issue no spec can hold (the runtime refuses such issues before dispatch; this is
        the backstop, so the failure is coded rather than a raw validation error)."""
        problems = unpassable_fields(request.issue)
        if problems:
            said = "; ".join(f"its {name} {why}" for name, why in sorted(problems.items()))
            raise AgentRunError(
                f"issue {request.issue.identifier[:60]!r} cannot be run: {said}; edit the issue",
                code=ErrorCode.ISSUE_FIELD_INVALID,
            )
        tools = request.tools.tool_specs() if request.tools is not None else []
        return RunSpec(
            workflow=self.workflow,
            issue=IssueSpec.from_issue(request.issue),
            slot_index=request.slot_index,
            attempt=request.attempt,
            generation=self.generation,
            run=run,
            prompt=request.prompt,
            agent=request.settings,
            max_turns=request.max_turns,
            continuation_prompts=[
                request.continuation_prompt(turn, request.max_turns)
                for turn in range(2, request.max_turns + 1)
            ],
            workspace=str(request.workspace.absolute()),
            hooks=self.hooks,
            env=dict(request.env),
            answer=request.answer.to_json() if request.answer is not None else None,
            tools=tools,
            controller_wait_ms=self.controller_wait_ms,
            journal_max_bytes=self.journal_max_bytes,
        )

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        handlers = CallHandlers(tools=request.tools, issue_active=request.issue_is_active)
        root = getattr(self.transport, "state_root", None)
        if isinstance(root, Path) and root not in _pruned_roots:
            # NB: once per state root and process, not per runner: the runtime builds a runner
            # for every dispatch, and a week of runs is a long directory to walk each time.
            _pruned_roots.add(root)
            await asyncio.to_thread(prune_state_dirs, root, older_than_s=self.retention_s)
        recorder = (
            IntentRecorder(
                store=self.intents,
                key=slot_key(request.issue.id, request.slot_index),
                generation=self.generation,
                placement=self.placement,
            )
            if self.intents is not None
            else None
        )
        adopted = self._adoptable(
            request.resume, issue_id=request.issue.id, slot=request.slot_index
        )
        last_seq = 0
        if adopted is not None:
            assert request.resume is not None
            await self._await_controller_exit(adopted, issue=request.issue.identifier)
            name, last_seq = adopted, request.resume.last_seq
            if recorder is not None:
                # NB: the claim keeps naming the worker that runs: a crash now finds it again.
                await recorder.require(name, SpawnPhase.PROBING, last_seq)
            logger.info(
                "adopting the worker of a lost controller handle=%s after_seq=%s", name, last_seq
            )
            if request.on_replayed is not None and last_seq:
                await self._replay(name, last_seq=last_seq, to=request.on_replayed)
        else:
            # NB: built once: the intent names its handle, and the first launch sends it.
            first = self.spec_for(request)
            if recorder is not None:
                await recorder.require(first.handle, SpawnPhase.PROVISIONING)
            found = await self._predecessor(request)
            if found is not None:
                name = found
            else:
                if request.on_launch is not None:
                    request.on_launch(True)
                try:
                    name = await self._start_or_cancel(
                        request, recorder=recorder, handlers=handlers, first=first
                    )
                finally:
                    if request.on_launch is not None:
                        request.on_launch(False)
        self._record_controller(name)
        handle = WorkerHandle(
            transport=self.transport,
            handle=name,
            handlers=handlers,
            last_seq=last_seq,
            unknown_patience_s=self.unknown_patience_s,
            heartbeat_s=self.heartbeat_s,
        )
        self.last_handle = handle
        if request.on_placed is not None and not await request.on_placed(self.placed_at(name)):
            # NB: the slot's reservation is gone (swept, cancelled): this worker is nobody's
            # run; it is stopped rather than followed.
            await self._cancel(handle, asyncio.ensure_future(handle.follow(_ignore)))
            raise AgentRunError(
                f"the reservation of {request.issue.identifier} slot {request.slot_index} was "
                "given up while its worker started; the slot is dispatched again",
                code=ErrorCode.RESERVATION_LOST,
            )

        def relay(record: Record) -> None:
            if recorder is not None:
                # NB: persisted before it is relayed: a successor re-attaches after it.
                recorder.update(recorder.intent(name, SpawnPhase.RUNNING, record.seq))
            if record.kind == "agent_update":
                request.on_update(agent_update_from(record))
            elif record.kind == "hook_finished":
                _log_hook(record, handle=name)

        while True:
            follow = asyncio.ensure_future(handle.follow(relay))
            try:
                final = await self._follow_until_stopped(
                    handle, follow, stop=request.stop, on_update=request.on_update
                )
                break
            except asyncio.CancelledError:
                if self._leaves_workers():
                    follow.cancel()  # NB: the worker goes on; the next controller adopts it
                else:
                    await self._cancel(handle, follow, on_update=request.on_update)
                raise
            except WorkerGone as exc:
                # NB: before the claim says so: a successor that reads ``compensated`` retries
                # at once, and the dead worker's agent must not work beside that retry.
                await self._kill_run(name, on_update=request.on_update)
                if recorder is not None:
                    recorder.update(
                        recorder.intent(name, SpawnPhase.COMPENSATED, handle.last_seq)
                    )
                    await recorder.flush()
                if await self._never_started(request.resume, name=name, handle=handle):
                    raise AgentRunError(
                        f"the worker {name} never started: its controller was lost while "
                        "launching it; the run is retried as the same attempt, not counted as "
                        "a failure",
                        code=NEVER_STARTED_CODE,
                    ) from exc
                raise
            except WorkerUnknown as exc:
                # Quarantine: the worker may still run, so neither a retry (a second agent
                # beside it) nor a kill; the slot stays bound — counted against concurrency —
                # and the worker is probed again until it answers, ends or the run is stopped.
                logger.warning("worker quarantined handle=%s: %s", name, exc)
                if recorder is not None:
                    recorder.update(
                        recorder.intent(name, SpawnPhase.QUARANTINED, handle.last_seq)
                    )
                    await recorder.flush()
                request.on_update(
                    AgentUpdate(event="worker_quarantined", message=exc.message)
                )
                try:
                    await asyncio.sleep(self.quarantine_probe_s)
                except asyncio.CancelledError:
                    # NB: stopped (a stall, the issue left) while quarantined: the worker was
                    # asked nothing and cannot be, yet its agent may work on; the slot is
                    # settled only once the run's processes are proven gone.
                    if not self._leaves_workers():
                        await self._kill_run(name, on_update=request.on_update)
                    raise
        if recorder is not None:
            await recorder.flush()
        self._mark_collected(name)
        return _result_of(final)

    async def _start_or_cancel(
        self,
        request: AgentRunRequest,
        *,
        recorder: IntentRecorder | None,
        handlers: CallHandlers,
        first: RunSpec | None = None,
    ) -> str:
        """:meth:`_start`; a run cancelled meanwhile cancels the worker the launch started.

        NB: the worker serves (and its agent may have started) before the launch command
        returns; a cancellation in between must not leave that worker running unwatched.
        """
        start = asyncio.ensure_future(self._start(request, recorder=recorder, first=first))
        try:
            return await asyncio.shield(start)
        except asyncio.CancelledError:
            if self._leaves_workers():
                raise  # NB: the worker goes on; the next controller adopts it
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(start, timeout=CANCEL_WAIT_S)
            if start.done() and not start.cancelled() and start.exception() is None:
                handle = WorkerHandle(
                    transport=self.transport,
                    handle=start.result(),
                    handlers=handlers,
                    unknown_patience_s=self.unknown_patience_s,
                    heartbeat_s=self.heartbeat_s,
                )
                self.last_handle = handle
                await self._cancel(handle, asyncio.ensure_future(handle.follow(_ignore)))
            raise

    async def _start(
        self,
        request: AgentRunRequest,
        *,
        recorder: IntentRecorder | None = None,
        first: RunSpec | None = None,
    ) -> str:
        """Start a worker under the first handle no earlier run of this attempt used.

        With a recorder, the claim says ``spawn_requested`` (with the handle) before the
        launch and ``probing`` once it answered. ``first``: the spec of run 0, if built already.
        """
        root = getattr(self.transport, "state_root", None)
        for ordinal in range(MAX_RUNS_PER_ATTEMPT):
            spec = (
                first
                if ordinal == 0 and first is not None
                else self.spec_for(request, run=ordinal)
            )
            if isinstance(root, Path) and (root / spec.handle / COLLECTED_NAME).exists():
                continue  # NB: known locally to be an earlier run; no process needed to ask
            if recorder is not None:
                await recorder.require(spec.handle, SpawnPhase.SPAWN_REQUESTED)
            try:
                result = await self.transport.launch(spec)
            except WorkerLaunchError as exc:
                if exc.code == ErrorCode.WORKER_HANDLE_USED:
                    continue
                raise
            if result.existing in (None, ProbeState.ALIVE.value):
                if recorder is not None:
                    recorder.update(recorder.intent(result.handle, SpawnPhase.PROBING))
                return result.handle
            if result.existing == ProbeState.UNKNOWN.value:
                raise AgentRunError(
                    f"the worker {result.handle} of an earlier run cannot be probed; the run is "
                    "retried later",
                    code=ErrorCode.WORKER_UNKNOWN,
                )
            # "final": an earlier run of this attempt (a continuation), already collected.
        raise AgentRunError(
            f"{MAX_RUNS_PER_ATTEMPT} runs of attempt {request.attempt} of "
            f"{request.issue.identifier} already have state directories; clean the worker "
            "state root",
            code=ErrorCode.WORKER_HANDLES_EXHAUSTED,
        )

    async def _follow_until_stopped(
        self,
        handle: WorkerHandle,
        follow: asyncio.Future[Record],
        *,
        stop: TurnStop | None,
        on_update: Callable[[AgentUpdate], None] | None = None,
    ) -> Record:
        """The worker's final record; or, when ``stop`` is requested first (a spend cap
        crossed, see docs/budgets.md), cancel the worker's run with the stop's reason, wait
        (bounded) for its end, and raise the stop's error.

        NB: like ``asyncio.shield``, a cancellation of this call leaves ``follow`` running
        (``asyncio.wait`` does not cancel what it waits for): the caller decides its fate.
        """
        if stop is None:
            return await asyncio.shield(follow)
        stopper = asyncio.ensure_future(stop.wait())
        watched: set[asyncio.Future[Any]] = {follow, stopper}
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if follow.done():
            return follow.result()
        await self._cancel(
            handle, follow, reason=stop.reason or "the run was stopped", on_update=on_update
        )
        raise stop.error()

    async def _cancel(
        self,
        handle: WorkerHandle,
        follow: asyncio.Future[Record],
        *,
        reason: str = "the controller aborted the run",
        on_update: Callable[[AgentUpdate], None] | None = None,
    ) -> None:
        """Cancel the worker's run and wait (bounded) for its final record; without one, kill
        every process of the run wherever it runs before returning.

        NB: a worker that does not end its run is not proof that its agent stopped: a frozen
        worker (SIGSTOP, a wedged process) reads no cancel while its agent goes on working, and
        the caller settles the slot — a retry — as soon as this returns. So the wait ends early
        once a probe finds the worker not answering (``unknown``: its pid lives, its socket is
        silent, or its host does not answer), and then, as after :data:`CANCEL_WAIT_S`, the
        transport kills every process of the run (the worker, its agent, a hook:
        :mod:`lorenz.workers.leftovers`; on an SSH host over ssh; a Pod by its deletion) and
        this returns only once they are proven gone (:meth:`_kill_run`).
        """
        if await handle.cancel(reason):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CANCEL_WAIT_S
            while not follow.done() and loop.time() < deadline:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(follow), timeout=CANCEL_PROBE_S)
                if follow.done():
                    continue
                with contextlib.suppress(Exception):
                    probe = await self.transport.probe(handle.handle)
                    if probe.state is ProbeState.UNKNOWN:
                        logger.warning(
                            "the worker does not answer its cancel (frozen?); killing its "
                            "processes handle=%s: %s",
                            handle.handle,
                            probe.detail,
                        )
                        break
            if follow.done() and not follow.cancelled() and follow.exception() is None:
                self._mark_collected(handle.handle)
                return
        follow.cancel()
        await self._kill_run(handle.handle, on_update=on_update)

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        """Cancel the worker a dropped adoption would have followed; see
        :class:`~lorenz.agents.AdoptionCanceller`.

        The worker is followed after the intent's ``last_seq`` (nothing is relayed: no slot
        waits for it), asked to cancel with ``dropped.reason``, and waited for — bounded — until
        its final record; the worker then runs its own cleanup (``after_run`` when the spec
        carries it) as for any cancellation. A worker that already ended is only collected; one
        that does not answer the cancel is killed where it runs (its agent with it).
        """
        name = self._adoptable(dropped.resume, issue_id=dropped.issue.id, slot=dropped.slot_index)
        if name is None:
            return False
        controller = self._live_controller(name)
        if controller is not None:
            logger.warning(
                "not cancelling worker handle=%s: it is followed by the live controller %s",
                name,
                controller,
            )
            return False
        handle = WorkerHandle(
            transport=self.transport,
            handle=name,
            handlers=CallHandlers(issue_active=_never_active),
            last_seq=dropped.resume.last_seq,
            unknown_patience_s=self.unknown_patience_s,
            heartbeat_s=self.heartbeat_s,
        )
        self.last_handle = handle
        follow = asyncio.ensure_future(handle.follow(_ignore))
        try:
            # NB: sent before the follow attached is fine (the cancel opens its own
            # connection); a worker that already ended answers nothing and is only collected.
            await handle.cancel(dropped.reason)
            final = await asyncio.wait_for(asyncio.shield(follow), timeout=CANCEL_WAIT_S)
        except WorkerGone:
            await self._kill_run(name)  # NB: its agent may outlive it, working on
            logger.info("dropped adoption: the worker is gone handle=%s", name)
            return True
        except (WorkerUnknown, TimeoutError) as exc:
            follow.cancel()
            # NB: a worker that does not answer (frozen, wedged) may leave its agent working
            # on an issue whose slot is released now: killed where it runs, once (bounded by
            # the transport); one that cannot be killed either is logged, its slot released
            # as before.
            try:
                await self.transport.kill(name)
            except Exception as kill_exc:  # noqa: BLE001 - any failure: not proven over
                logger.warning(
                    "dropped adoption: the worker could not be cancelled (%s) nor killed (%s) "
                    "handle=%s",
                    exc,
                    kill_exc,
                    name,
                )
                return False
            logger.warning(
                "dropped adoption: the worker did not answer its cancel (%s); killed handle=%s",
                exc,
                name,
            )
            return True
        except BaseException:
            follow.cancel()
            raise
        self._mark_collected(name)
        logger.info(
            "dropped adoption: the worker ended handle=%s outcome=%s reason=%s",
            name,
            final.data.get("outcome"),
            dropped.reason,
        )
        return True

    async def _never_started(
        self, resume: SpawnIntent | None, *, name: str, handle: WorkerHandle
    ) -> bool:
        """Whether the gone worker ``name`` of an adopted intent never started: its lost
        controller recorded no answer of the launch (``provisioning``, ``spawn_requested``) and
        no journal record exists — no hook, no agent ran.

        NB: only from those phases. Past them the launch answered, so a worker ran; and a
        journal this controller cannot see (another host's state root) proves nothing.
        """
        if resume is None or resume.handle != name or handle.last_seq:
            return False
        if resume.phase not in (SpawnPhase.PROVISIONING, SpawnPhase.SPAWN_REQUESTED):
            return False
        try:
            records = await self.transport.read_journal(name, after_seq=0)
        except Exception:  # noqa: BLE001 - unreadable is not proof of nothing: a failure
            return False
        return not records

    async def _replay(
        self, name: str, *, last_seq: int, to: Callable[[AgentUpdate], None]
    ) -> None:
        """Tell ``to`` the agent updates of ``name``'s journal up to ``last_seq`` (what the lost
        controller received); a journal that cannot be read is logged and skipped."""
        try:
            records = await self.transport.read_journal(name, after_seq=0)
        except Exception:  # the run is adopted anyway; its spend may then overcount
            logger.exception("reading an adopted worker's journal failed handle=%s", name)
            return
        for record in records:
            if record.seq <= last_seq and record.kind == "agent_update":
                to(agent_update_from(record))

    def _adoptable(self, resume: SpawnIntent | None, *, issue_id: str, slot: int) -> str | None:
        """The handle of ``resume`` if it may be adopted (or cancelled) for this slot.

        NB: the intent comes from the claim store; a handle that is malformed, or whose local
        run spec names another workflow, issue or slot, is never attached to (the run then
        starts as usual, beside nothing: such a worker is not this slot's).
        """
        if resume is None:
            return None
        if not is_handle(resume.handle):
            logger.warning("not adopting a malformed worker handle=%r", resume.handle)
            return None
        root = getattr(self.transport, "state_root", None)
        if isinstance(root, Path):
            spec = read_spec(root / resume.handle)
            if spec is not None and not self._spec_matches(spec, issue_id=issue_id, slot=slot):
                logger.warning(
                    "not adopting worker handle=%s: it runs another slot", resume.handle
                )
                return None
        return resume.handle

    def _spec_matches(self, spec: dict[str, Any], *, issue_id: str, slot: int) -> bool:
        return (
            spec.get("workflow") == self.workflow
            and (spec.get("issue") or {}).get("id") == issue_id
            and spec.get("slot_index") == slot
        )

    async def _predecessor(self, request: AgentRunRequest) -> str | None:
        """A live or uncollected worker of this slot started by an earlier controller."""
        root = getattr(self.transport, "state_root", None)
        if not isinstance(root, Path):
            return None

        def uncollected_of_this_slot() -> list[str]:
            return index_of(root).uncollected(
                workflow=self.workflow, issue_id=request.issue.id, slot=request.slot_index
            )

        # NB: off the event loop: the state root holds every run of the retention window.
        for name in await asyncio.to_thread(uncollected_of_this_slot):
            probe = await self.transport.probe(name)
            if probe.state in (ProbeState.ALIVE, ProbeState.FINAL):
                controller = self._live_controller(name)
                if controller is not None:
                    # NB: neither adopt it (its controller follows it, and would see it
                    # cancelled by us) nor start an agent beside it.
                    raise AgentRunError(
                        f"the worker {name} of {request.issue.identifier} slot "
                        f"{request.slot_index} is followed by the live controller {controller} "
                        "(another lorenz runs this workflow); nothing was started beside it",
                        code=CONTROLLED_ELSEWHERE_CODE,
                    )
                logger.info("adopting the worker of an earlier controller handle=%s", name)
                return name
            if probe.state is ProbeState.GONE:
                await self._kill_run(name)  # NB: before a new agent starts for the slot
                self._mark_collected(name)  # dead and settled now: never looked at again
        return None

    def _live_controller(self, name: str) -> str | None:
        root = getattr(self.transport, "state_root", None)
        if not isinstance(root, Path):
            return None  # NB: another host's runs: their controller is not ours to prove alive
        return live_controller_of(root / name, me=self.owner)

    def _record_controller(self, name: str) -> None:
        root = getattr(self.transport, "state_root", None)
        if isinstance(root, Path):
            record_controller(root / name, owner=self.owner)

    async def _await_controller_exit(self, name: str, *, issue: str) -> None:
        """Before adopting ``name`` from a claim: its live controller (if any) must be gone.

        NB: a claim is taken over from an owner that is stale or dead, or one that lost its
        lease — such a controller stops following its runs and exits, but may not have exited
        yet. One still alive after :data:`CONTROLLER_EXIT_WAIT_S` keeps its worker.
        """
        deadline = asyncio.get_running_loop().time() + CONTROLLER_EXIT_WAIT_S
        while (controller := self._live_controller(name)) is not None:
            if asyncio.get_running_loop().time() >= deadline:
                raise AgentRunError(
                    f"the worker {name} of {issue} is still followed by the live controller "
                    f"{controller} after {CONTROLLER_EXIT_WAIT_S:.0f} s; not adopted",
                    code=CONTROLLED_ELSEWHERE_CODE,
                )
            await asyncio.sleep(0.2)

    async def _kill_run(
        self, name: str, *, on_update: Callable[[AgentUpdate], None] | None = None
    ) -> None:
        """Kill every process of the run ``name`` where it runs (:meth:`Transport.kill`: this
        host's, an SSH host's, the Pod), trying again every ``quarantine_probe_s`` until the
        transport confirms they are gone.

        NB: never given up on this controller's clock: the caller settles the slot (a retry,
        a fresh worker) once this returns, and an unconfirmed kill may have left the agent
        working. Until then the slot stays held — counted against concurrency, no retry —
        and ``on_update`` is told once why (``worker_quarantined`` with the coded reason
        ``worker_kill_unconfirmed``). A controller that leaves its workers meanwhile (its
        shutdown's kill bound passed, leadership lost) stops trying: the run ends cancelled,
        unsettled, and its claim keeps the worker's intent for the next controller, which
        probes and kills it in turn.
        """
        told = False
        while True:
            if told and self._leaves_workers():
                raise asyncio.CancelledError  # NB: unsettled: the next controller's to kill
            try:
                await self.transport.kill(name)
                return
            except WorkerKillUnconfirmed as exc:
                problem = exc
            except Exception as exc:  # noqa: BLE001 - any failure is an unconfirmed kill
                problem = WorkerKillUnconfirmed(
                    f"killing the run {name} failed ({exc}); the slot stays held and the kill "
                    "is tried again"
                )
            logger.warning("worker kill unconfirmed handle=%s: %s", name, problem.message)
            if on_update is not None and not told:
                told = True
                on_update(AgentUpdate(event="worker_quarantined", message=str(problem)))
            await asyncio.sleep(self.quarantine_probe_s)

    def _mark_collected(self, name: str) -> None:
        root = getattr(self.transport, "state_root", None)
        if isinstance(root, Path):
            mark_collected(root / name)


async def _never_active() -> bool:
    # NB: a run being cancelled starts no new turn, whatever its worker asks meanwhile.
    return False


def _ignore(record: Record) -> None:
    del record  # nobody waits for a dropped adoption's records: they stay in its journal


def _result_of(final: Record) -> AgentRunResult:
    data = final.data
    if data.get("outcome") == "success":
        turns = data.get("turns")
        return AgentRunResult(
            turns=turns if isinstance(turns, int) else 0,
            session_id=data.get("session_id") if isinstance(data.get("session_id"), str) else None,
            stop_reason=data.get("stop_reason")
            if isinstance(data.get("stop_reason"), str)
            else None,
        )
    question = AgentQuestion.from_json(data.get("question"))
    if question is not None:
        raise AgentAsked(question)
    code = data.get("error_code")
    raise AgentRunError(
        str(data.get("error") or data.get("reason") or "the run failed"),
        code=code if isinstance(code, str) else ErrorCode.AGENT_RUN_FAILED,
    )


def _log_hook(record: Record, *, handle: str) -> None:
    """A hook the worker ran, in the controller's log as a locally run hook would be.

    NB: a failed ``after_run`` never reaches the run's result (cleanup goes on), so without
    this line it would be seen only in the worker's journal on the worker's host.
    """
    hook = record.data.get("hook")
    if record.data.get("ok"):
        logger.info("workspace hook finished hook=%s handle=%s", hook, handle)
    else:
        logger.warning(
            "workspace hook failed hook=%s handle=%s code=%s: %s",
            hook, handle, record.data.get("code"), record.data.get("error"),
        )
