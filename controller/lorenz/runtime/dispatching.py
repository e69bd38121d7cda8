"""Dispatch: claiming eligible issues, running each claimed slot, settling its end.

A run goes claim → (reserve a worker) → workspace, hooks, prompt, agent → settle. Between ticks,
nudges (freed capacity, a clean exit, a due retry) merge into dispatch passes that decide pending
exits and fill free slots from the last candidate list. This is the part of the runtime that
spawns processes, so it lives apart from polling, reconciliation and reporting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Protocol

from lorenz.agents import AgentAsked, AgentRunRequest, PlacementFailed, RunPlacement
from lorenz.agents.base import TurnStop
from lorenz.codes import ErrorCode
from lorenz.config import AgentKindSettings, WorkflowSettings
from lorenz.model import (
    AbortReason,
    AgentUpdate,
    DispatchPause,
    EventType,
    Issue,
    LorenzError,
    ReservationRecord,
    RetryKind,
    RunFailure,
    RunningEntry,
    SlotKey,
    slot_key,
)
from lorenz.orchestrator import DispatchCandidate, Reserved, Skipped, Started
from lorenz.policies import WorkerHealth, agent_kind_for, classify_worker_outcome
from lorenz.policies.placement import RunLocation, run_location
from lorenz.policies.retries import HOST_FAULT_CODES
from lorenz.runtime.agent_calls import AgentCalls
from lorenz.runtime.blocking import Blocking
from lorenz.runtime.exits import CleanExits
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reconciling import Reconciling
from lorenz.runtime.reporting import describe_error
from lorenz.runtime.runs import ActiveRun
from lorenz.runtime.spending import RunMeter
from lorenz.runtime.tools import tracker_tools
from lorenz.workflow import continuation_prompt, render_prompt
from lorenz.workspaces import Workspace

logger = logging.getLogger("lorenz.runtime")


class WorkerSlot(Protocol):
    """A host handed out by a worker pool for one run."""

    host: str | None


class WorkerPool(Protocol):
    """A pool that governs dispatch: reservations are bound once it hands out a host."""

    async def acquire(self, *, key: SlotKey, timeout_ms: int) -> WorkerSlot | None:
        """A slot, or ``None`` when the pool has no capacity."""
        ...

    async def release(self, slot: WorkerSlot, *, poison: bool) -> None: ...

    async def drain(self, *, deadline_ms: int) -> None: ...


class Dispatching:
    """Claims slots, runs them as detached tasks, and settles how each one ended.

    It owns the dispatch passes (wanted, running, their wake-up), the host-fault pause and its
    probe, and the issues refused for an unpassable field; and two parts of its own: the clean
    exits waiting for their decision (:class:`~.exits.CleanExits`, which a pass decides) and
    what each run hands its agent (:class:`~.agent_calls.AgentCalls`). ``tick_lock`` is the lock a
    tick's body holds (see :class:`~.polling.Polling`): a pass holds it too, so the two never
    interleave.
    """

    def __init__(
        self,
        *,
        parts: RuntimeParts,
        reconciling: Reconciling,
        blocking: Blocking,
        pool: WorkerPool | None,
        tick_lock: asyncio.Lock,
    ) -> None:
        self._parts = parts
        self._reconciling = reconciling
        self._blocking = blocking
        self._pool = pool
        self._tick_lock = tick_lock
        self._agent = AgentCalls(parts=parts, reconciling=reconciling)
        self._exits = CleanExits(
            parts=parts, reconciling=reconciling, blocking=blocking, wake=self.nudge
        )
        self._refused: dict[str, tuple[object, ...]] = {}
        """Issues not started because of an unpassable field, with the version reported."""
        self._pass_wanted = False
        self._pass_task: asyncio.Task[None] | None = None
        self._pass_wake = asyncio.Event()
        self._host_fault: DispatchPause | None = None
        self._probe: ActiveRun | None = None
        """The one run dispatched while a host fault pauses dispatch (its outcome decides)."""

    @property
    def host_fault(self) -> DispatchPause | None:
        """Why this host cannot start runs now (a launch, placement or worker-state fault),
        ``None`` once a probe run's worker started.

        While it is set, dispatch is paused except for one *probe* run at a time: whichever
        eligible slot comes next (a tick or a pass) is started, and its outcome decides —
        its worker started (an agent update, or an end that is not a host fault): dispatch
        resumes (``dispatch_resumed``); the same fault again: still paused, and the next pass
        probes again. The probe's failure never counts against ``retry.max_attempts``
        (:data:`~lorenz.policies.retries.INFRASTRUCTURE_CODES`)."""
        return self._host_fault

    def note_host_fault(self, *, code: str, text: str) -> None:
        """A run failed because this host could not start or place it: pause dispatch."""
        if self._host_fault is not None:
            return
        message = (
            f"{text} — new runs wait until this host can start workers again (one probe run "
            "at a time; dispatch resumes by itself)"
        )
        self._host_fault = DispatchPause(
            code=code, message=self._parts.reporting.scrub(message), since=self._parts.clock.now()
        )
        self._parts.reporting.event(
            EventType.DISPATCH_PAUSED, message=f"dispatch paused: {text}", code=code
        )

    def clear_host_fault(self, *, why: str) -> None:
        """A run's worker started (or a run ended for a reason of its own): dispatch resumes."""
        fault = self._host_fault
        if fault is None:
            return
        self._host_fault = None
        self._probe = None
        self._parts.reporting.event(
            EventType.DISPATCH_RESUMED, message=f"dispatch resumed: {why}", code=fault.code
        )
        self.nudge()

    def probe_in_flight(self) -> bool:
        """Whether the run probing a paused host is still going."""
        probe = self._probe
        return probe is not None and probe.task is not None and not probe.task.done()

    def wake_passes(self) -> None:
        """The runtime stops: cut a pass's batching wait short (it then sees the stop)."""
        self._pass_wake.set()

    @property
    def exits(self) -> CleanExits:
        """The clean exits waiting for their decision (a tick's reconciliation decides them
        too)."""
        return self._exits

    def nudge(self) -> None:
        """Freed capacity, a clean exit or a due retry: act now, not at the next interval.

        What runs is a dispatch pass, not a tick: it decides pending exits and fills free slots
        from the last candidate list, revalidating each chosen issue by id first (one batched
        read). Passes serialize with ticks and with each other; nudges during a pass merge into
        one follow-up pass. Never in ``--once``.
        """
        if self._parts.status.stopped or self._parts.status.once:
            return
        self._pass_wanted = True
        if self._pass_task is None:
            self._pass_task = asyncio.get_running_loop().create_task(
                self.run_passes(), name="lorenz-dispatch-pass"
            )

    async def run_passes(self) -> None:
        try:
            while self._pass_wanted and not self._parts.status.stopped:
                # NB: gather what comes close together (exits of runs started together, retries
                # due together) so one tracker read serves them all; stop() cuts the wait short.
                batch_s = self._parts.settings.polling.dispatch_batch_ms / 1000.0
                if batch_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._pass_wake.wait(), timeout=batch_s)
                if self._parts.status.stopped:
                    break
                self._pass_wanted = False
                async with self._tick_lock:
                    try:
                        await self.dispatch_pass()
                    except Exception:
                        # Logged, not raised: a failed pass must not end this loop; the next
                        # nudge or tick passes again.
                        logger.exception("dispatch pass failed")
        finally:
            self._pass_task = None

    def on_retry_due(self, key: SlotKey) -> None:
        self.nudge()

    async def dispatch_pass(self) -> None:
        """Between polls: decide pending exits, then fill free slots from the last candidates.

        Every chosen candidate is read again by id before it is claimed (an issue closed since
        the last poll must not start); the read is one request for the exits and the chosen
        issues together. A failed read decides the exits as continuations (as a settle always
        did) and starts nothing.
        """
        exits = self._exits.take_exits()
        chosen: list[DispatchCandidate] = []
        if (
            not self._parts.status.stopped
            and not self._parts.status.draining
            and not self._parts.status.dry_run
            and self._parts.candidates
        ):
            room = self._parts.orchestrator.available_slots() + len(exits)
            if self._host_fault is not None:
                room = min(room, 0 if self.probe_in_flight() else 1)  # NB: one probe at a time
            exiting = {pending.issue_id for pending in exits}
            if room > 0:
                cached = list(self._parts.candidates.values())
                for candidate in await self._parts.orchestrator.eligible_issues(
                    cached, complete=False
                ):
                    if candidate.issue.id in exiting:
                        continue
                    if self._parts.spending.is_held(candidate.issue.id):
                        continue  # NB: in the budget lane; the next tick checks it again
                    chosen.append(candidate)
                    if len(chosen) >= room:
                        break
                # NB: a pass over the cached list sweeps expired reservations too (and prunes
                # nothing): the next tick's report would replace this one unread.
                self._parts.reporting.eligibility(self._parts.orchestrator.last_eligibility)
        ids = sorted({p.issue_id for p in exits} | {c.issue.id for c in chosen})
        if not ids:
            return
        try:
            found = await self._parts.tracker.current.fetch_issues_by_ids(ids)
        except Exception as exc:  # noqa: BLE001 - reported; the pass retries at the next tick
            self._parts.reporting.event(
                EventType.RECONCILE_REFRESH_FAILED,
                message=describe_error(exc),
                code=getattr(exc, "code", type(exc).__name__),
            )
            for pending in exits:
                await self._exits.decide_exit(pending, None, known=False)
            return
        by_id = {issue.id: issue for issue in found}
        for pending in exits:
            await self._exits.decide_exit(pending, by_id.get(pending.issue_id), known=True)
        for candidate in chosen:
            if self._parts.status.stopped:
                break
            fresh = by_id.get(candidate.issue.id)
            reason = self._parts.orchestrator.reconciliation_decision(fresh)
            if reason is not None or fresh is None:
                self._parts.candidates.pop(candidate.issue.id, None)
                self._parts.reporting.event(
                    EventType.DISPATCH_SKIPPED,
                    issue=candidate.issue,
                    slot=candidate.slot_index,
                    message=f"skipped: the issue is {reason} now (read again before dispatch)",
                    reason="issue_changed",
                )
                continue
            self._parts.candidates[fresh.id] = fresh
            task = await self.maybe_dispatch(candidate._replace(issue=fresh))
            if task is None and self._parts.orchestrator.available_slots() <= 0:
                break

    async def maybe_dispatch(self, candidate: DispatchCandidate) -> asyncio.Task[None] | None:
        issue = candidate.issue
        if self._parts.status.draining:
            return None  # NB: a drain starts nothing, wherever the candidate came from
        if self._reconciling.write_failure is not None:
            return None  # NB: a claim the store cannot record must not be run (paused)
        probing = self._host_fault is not None
        if probing and self.probe_in_flight():
            return None  # NB: paused by a host fault: one probe run at a time
        if self.refuse_unpassable(issue, slot=candidate.slot_index):
            return None
        previous = self._parts.runs.get(slot_key(issue.id, candidate.slot_index))
        if previous is not None and previous.task is not None and not previous.task.done():
            # NB: the slot's last run is still being stopped (its worker asked to end it, or
            # killed and waited for): never a second agent beside one that may still live.
            # Its end nudges a pass, which comes back here.
            return None
        if await self._parts.spending.holds(issue, slot=candidate.slot_index):
            return None  # NB: a cap of the issue or of the day is reached: the budget lane
        result = await self._parts.orchestrator.claim(candidate)
        if isinstance(result, Skipped):
            if result.reason in ("worker_host_capacity", "claimed_elsewhere"):
                self._parts.reporting.event(
                    EventType.DISPATCH_SKIPPED,
                    issue=issue,
                    slot=candidate.slot_index,
                    message=f"skipped: {result.reason}",
                    reason=result.reason,
                )
            return None
        key = result.reservation.key if isinstance(result, Reserved) else result.entry.key
        run = ActiveRun(key=key, issue_id=issue.id, identifier=issue.identifier)
        if self._parts.status.draining or self._parts.status.stopped:
            # NB: the claim was awaited, and a drain or stop may have begun meanwhile — after
            # its final cancel went over the runs. A run started now would be cancelled by
            # nobody, and the stop would wait for it for ever: give the claim back instead.
            await self.withdraw(run, result)
            return None
        self._parts.runs.register(run)
        if probing:
            self._probe = run
        if isinstance(result, Started):
            self._parts.reporting.event(
                EventType.RUN_STARTED,
                issue=issue,
                slot=candidate.slot_index,
                attempt=candidate.attempt,
                host=result.entry.host,
                message="run started",
            )
            run.started = True
            coro = self.run_slot(run, entry=result.entry)
        else:
            self._parts.reporting.event(
                EventType.RUN_RESERVING,
                issue=issue,
                slot=candidate.slot_index,
                attempt=candidate.attempt,
                message="reserving a worker",
            )
            coro = self.run_reserved(run, reservation=result.reservation)
        task = asyncio.get_running_loop().create_task(coro, name=f"lorenz-run:{key}")
        run.task = task
        return task

    async def withdraw(self, run: ActiveRun, claimed: Started | Reserved) -> None:
        """Give back a claim written while a drain or stop began; start nothing for it.

        A reservation is cancelled (its consumed retry restored); a running slot is settled as
        a clean shutdown's, keeping its place with a continuation retry (see :meth:`settle`).
        """
        logger.info(
            "claim given back: the runtime began to stop while it was written slot=%s", run.key
        )
        if isinstance(claimed, Reserved):
            await self.give_back(run, claimed.reservation, reason=None)
            return
        run.reason = AbortReason.SHUTDOWN
        await self.settle(
            run, key=run.key, normal=False, error=_aborted(run.reason), worker_slot=None
        )

    def refuse_unpassable(self, issue: Issue, *, slot: int) -> bool:
        """Whether an issue holds a field no run can be given; say so once.

        Hooks and agents get the identifier, title and state as environment variables (and the
        identifier names the workspace), and a worker gets them in its run spec: a NUL byte
        cannot be passed to a process at all, and a field over the run spec's limit cannot be
        put in one (:func:`lorenz.workers.spec.unpassable_fields`). Such an issue is not
        started — no run, no retry — and reported once per version of it
        (``issue_field_invalid``): it is looked at again when it changes.
        """
        # NB: imported here, so the runtime does not load the workers before a dispatch.
        from lorenz.workers.spec import unpassable_fields

        problems = unpassable_fields(issue)
        fields = sorted(problems)
        if not fields:
            self._refused.pop(issue.id, None)
            return False
        version = (issue.identifier, issue.title, issue.state, issue.updated_at)
        if self._refused.get(issue.id) != version:
            self._refused[issue.id] = version
            self._parts.reporting.event(
                EventType.DISPATCH_SKIPPED,
                issue=issue,
                slot=slot,
                message="skipped: the issue's "
                + "; ".join(f"{name} {problems[name]}" for name in fields)
                + ", which cannot be passed to hooks or agents; edit the issue to fix it",
                reason="issue_field_invalid",
                code=ErrorCode.ISSUE_FIELD_INVALID,
                fields=fields,
            )
        return True

    async def run_reserved(self, run: ActiveRun, *, reservation: ReservationRecord) -> None:
        if self._pool is None:
            # No pool: the reservation is a run placed in a Pod of its own. The runner creates
            # the Pod and binds the reservation once its worker serves (see run_slot).
            await self.run_slot(run, entry=_unbound(reservation), reservation=reservation)
            return
        timeout_ms = self._parts.settings.worker.worker_pool.acquire_timeout_ms
        try:
            slot = await self._pool.acquire(key=run.key, timeout_ms=timeout_ms)
        except asyncio.CancelledError:
            await self.give_back(run, reservation, reason=None)
            return
        except Exception as exc:  # noqa: BLE001 - any pool failure gives the reservation back
            await self.give_back(
                run,
                reservation,
                reason="worker_pool_acquire_error",
                message=f"worker_pool_acquire_error {describe_error(exc)}",
            )
            return
        if slot is None:
            await self.give_back(
                run,
                reservation,
                reason="worker_host_capacity",
                message="skipped: worker_host_capacity",
            )
            return
        entry = await self._parts.orchestrator.bind_reservation(reservation, host=slot.host)
        if entry is None or not run.is_active:
            await self._pool.release(slot, poison=False)
            self._parts.runs.discard(run)
            return
        self._parts.reporting.event(
            EventType.RUN_STARTED,
            issue=entry.issue,
            slot=entry.slot_index,
            attempt=entry.attempt,
            host=entry.host,
            message="run started",
        )
        run.started = True
        await self.run_slot(run, entry=entry, worker_slot=slot)

    async def give_back(
        self,
        run: ActiveRun,
        reservation: ReservationRecord,
        *,
        reason: str | None,
        message: str | None = None,
    ) -> None:
        """No host for a reservation: cancel it (no backoff, retry restored) and say why."""
        await self._parts.orchestrator.cancel_reservation(reservation)
        self._parts.runs.discard(run)
        if reason is not None:
            self._parts.reporting.event(
                EventType.DISPATCH_SKIPPED,
                issue=reservation.issue,
                slot=reservation.slot_index,
                message=message,
                reason=reason,
            )

    async def run_slot(
        self,
        run: ActiveRun,
        *,
        entry: RunningEntry,
        worker_slot: WorkerSlot | None = None,
        reservation: ReservationRecord | None = None,
    ) -> None:
        """Run a bound slot; or, with ``reservation``, place it first (a run in a Pod).

        Placement is two-phase there: ``entry`` is what the binding will be, the runner
        creates the run's Pod and calls ``on_placed`` once its worker serves, and only then is
        the reservation bound (``run_started``). A :class:`PlacementFailed` before that gives
        the reservation back with its reason (see :meth:`unplaced`): nothing ran, so nothing
        counts as a failed attempt.
        """
        key = entry.key
        settings = self._parts.settings
        workflow = self._parts.workflow.current
        issue = entry.issue
        workspace: Workspace | None = None
        error: RunFailure | None = None
        not_placed: PlacementFailed | None = None
        normal = False
        cancelled_from_outside = False
        bound = reservation is None
        workspace_path: str | None = None
        meter: RunMeter | None = None

        async def placed(where: str | None) -> bool:
            nonlocal entry, bound
            if reservation is None or bound:
                return bound
            if not run.is_active:
                return False
            binding = await self._parts.orchestrator.bind_reservation(reservation, host=where)
            if binding is None:
                return False
            entry, bound, run.started = binding, True, True
            if workspace_path is not None:
                await self._parts.orchestrator.set_workspace(key, workspace_path)
            self._parts.reporting.event(
                EventType.RUN_STARTED,
                issue=binding.issue,
                slot=binding.slot_index,
                attempt=binding.attempt,
                host=binding.host,
                message="run started",
            )
            self._parts.reporting.emit_snapshot()
            return True

        try:
            kind_name = entry.agent_kind or agent_kind_for(issue, agent=settings.agent)
            kind = _agent_kind(settings, kind_name)
            placement: RunPlacement | None = None
            location = run_location(
                settings.worker, host=entry.host, pooled=worker_slot is not None
            )
            if location is RunLocation.POD:
                # A Pod of its own (the operator's pod runner): like an SSH host, the worker
                # there creates the workspace on the Pod's volume and runs every hook.
                from lorenz.workers.placement import POD_PLACEMENT, pod_workspace_path

                path = Path(pod_workspace_path(settings, issue=issue, slot_index=entry.slot_index))
                placement = RunPlacement(
                    host=POD_PLACEMENT, hooks=settings.hooks, worker=settings.worker
                )
                workspace_path = str(path)
                await self._parts.orchestrator.set_workspace(key, str(path))
            elif location is RunLocation.SSH and entry.host is not None:
                # SSH placement (a static-path host is a worker.ssh_hosts entry; a pool's hosts
                # are the pool's business): the workspace and its hooks live on the host; the
                # worker there creates it and runs them (nothing of it exists on this machine).
                # NB: imported here, so workflows without SSH hosts never load the workers.
                from lorenz.workers.placement import remote_workspace_path

                path = Path(
                    remote_workspace_path(settings, issue=issue, slot_index=entry.slot_index)
                )
                placement = RunPlacement(
                    host=entry.host, hooks=settings.hooks, worker=settings.worker
                )
                await self._parts.orchestrator.set_workspace(key, str(path))
            else:
                workspace = await self._parts.workspaces.prepare(
                    issue, slot_index=entry.slot_index, attempt=entry.attempt
                )
                path = workspace.path
                await self._parts.orchestrator.set_workspace(key, str(path))
                if entry.resume is None:
                    # NB: an adopted run's before_run ran when its worker was started.
                    await self._parts.workspaces.before_run(workspace, attempt=entry.attempt)
            if not bound and placement is None:
                # NB: a reload moved the workflow off Pods since the claim: nothing places
                # this run in two phases any more, so it is bound as it starts.
                await placed(None)
            prompt = render_prompt(workflow, issue=issue, attempt=entry.attempt)
            runner = self._parts.runner_factory(kind.protocol)
            # Spend control: the meter counts each update against the caps before the update
            # is applied, and stops the turn through ``stop`` the moment a cap is crossed.
            stop = TurnStop()
            await self._parts.spending.load(issue)
            meter = self._parts.spending.meter(
                key=key, slot_index=entry.slot_index, issue=issue, command=kind.command,
                stop=stop,
            )

            def on_update(update: AgentUpdate) -> None:
                meter.observe(update)
                self.on_agent_update(key, update)

            request = AgentRunRequest(
                issue=issue,
                attempt=entry.attempt,
                slot_index=entry.slot_index,
                prompt=prompt,
                workspace=path,
                settings=kind.launch(),
                max_turns=settings.agent.max_turns,
                env=self._agent.agent_env(
                    issue=issue,
                    attempt=entry.attempt,
                    slot_index=entry.slot_index,
                    workspace=path,
                    kind=kind,
                    remote=placement is not None,
                ),
                on_update=on_update,
                issue_is_active=lambda: self._agent.issue_still_active(issue.id),
                continuation_prompt=continuation_prompt,
                tools=tracker_tools(self._parts.tracker.current),
                placement=placement,
                resume=entry.resume,
                on_placed=placed if not bound else None,
                on_launch=lambda up: self._agent.on_launch(run, launching=up),
                answer=self._parts.orchestrator.session_resume(key),
                stop=stop,
                on_replayed=meter.replayed,
            )
            # NB: from here the worker may be placed (a Pod created) before the slot binds.
            run.placing = not bound
            await runner.run(request)
            normal = True
        except asyncio.CancelledError:
            if run.reason is None:
                # NB: cancelled by nobody we know of (the loop itself is going away): settle it
                # as a shutdown, then let the cancellation propagate.
                run.reason = AbortReason.SHUTDOWN
                cancelled_from_outside = True
            error = _aborted(run.reason)
        except LorenzError as exc:
            if isinstance(exc, PlacementFailed) and not bound:
                not_placed = exc
            if isinstance(exc, AgentAsked):
                run.question = exc.question
            error = RunFailure.from_error(exc)
        except Exception as exc:  # noqa: BLE001 - an uncoded runner crash is a failed run
            error = RunFailure(
                code=ErrorCode.AGENT_EXITED,
                text=f"agent exited: {describe_error(exc)}",
            )
        finally:
            if meter is not None:
                self._parts.spending.forget(meter)
            if workspace is not None and run.reason is not AbortReason.HANDED_OVER:
                # NB: shielded so that cancellation (stop, stall, reconciliation) still runs
                # after_run; the hook is bounded by hooks.timeout_ms inside the manager. The
                # manager logs every hook failure itself and re-raises only a cancellation that
                # came in meanwhile: absorbed here, so the settle below still records the run.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(
                        self._parts.workspaces.after_run(workspace, attempt=entry.attempt)
                    )
            if error is not None:
                error = RunFailure(code=error.code, text=self._parts.reporting.scrub(error.text))
            if reservation is not None and not bound:
                await self.unplaced(run, reservation, error=error, not_placed=not_placed)
            else:
                await self.settle(
                    run, key=key, normal=normal, error=error, worker_slot=worker_slot
                )
        if cancelled_from_outside:
            raise asyncio.CancelledError

    async def unplaced(
        self,
        run: ActiveRun,
        reservation: ReservationRecord,
        *,
        error: RunFailure | None,
        not_placed: PlacementFailed | None,
    ) -> None:
        """Settle a run that ended before it was placed (its reservation never bound).

        Not placed (unschedulable, image pull, quota): the reservation is given back with the
        reason and the slot waits for placement — no attempt, no backoff, no failure streak
        (``placement_failed``). Stopped or cancelled meanwhile: given back as any reservation.
        Anything else (the run's own settings are wrong: no image, a spec too large) is a
        failure of the run like after a bind, so that it counts and ends up blocked.
        """
        orchestrator = self._parts.orchestrator
        try:
            if run.reason is AbortReason.HANDED_OVER:
                # Left to its worker while it was being placed: the Claim stays reserved with
                # its spawn intent, for the next controller to adopt (or prove never started).
                # NB: giving the reservation back dropped the intent, and the next controller
                # then deleted the run's Pod as an orphan and ran the agent again (#37).
                logger.info(
                    "run left to its worker while being placed slot=%s", reservation.key
                )
            elif not run.is_active or (
                error is not None and error.code == ErrorCode.RUN_ABORTED
            ):
                await orchestrator.cancel_reservation(reservation)
            elif not_placed is not None and error is not None:
                retry = await orchestrator.give_back(reservation, error=error.text, code=error.code)
                self.note_host_fault(code=error.code, text=error.text)
                if retry is not None:
                    self._parts.reporting.event(
                        EventType.PLACEMENT_FAILED,
                        issue=reservation.issue,
                        slot=reservation.slot_index,
                        attempt=reservation.attempt,
                        message=f"not placed, given back: {error.text}",
                        reason=not_placed.reason,
                        code=error.code,
                    )
                    if not self._parts.status.stopped:
                        self._parts.timers.sync(orchestrator.retry_deadlines())
            else:
                binding = await orchestrator.bind_reservation(reservation, host=None)
                if binding is not None:
                    await self.settle(
                        run,
                        key=binding.key,
                        normal=error is None,
                        error=error,
                        worker_slot=None,
                    )
                    return
        finally:
            self._parts.runs.discard(run)
            self._parts.reporting.emit_snapshot()

    async def settle(
        self,
        run: ActiveRun,
        *,
        key: SlotKey,
        normal: bool,
        error: RunFailure | None,
        worker_slot: WorkerSlot | None,
    ) -> None:
        text = error.text if error is not None else None
        try:
            if run.reason is AbortReason.HANDED_OVER:
                # Left to its worker: the claim stays running with its spawn intent, for the
                # next controller to adopt; writing a retry here would start a second agent.
                logger.info("run left to its worker for the next controller slot=%s", key)
            elif run.reason is AbortReason.SHUTDOWN:
                # A clean shutdown: keep the slot's place with a continuation retry, so a
                # durable store brings it back after a restart without counting a failure.
                await self._exits.finish_for_shutdown(key)
            elif run.is_active and key in self._reconciling.grace_keys(run.issue_id):
                await self._reconciling.settle_in_grace(
                    run, key=key, normal=normal, text=text
                )
            elif run.is_active and normal:
                if run is self._probe:
                    self.clear_host_fault(why="the probe run's worker ran its agent")
                run.exited = True
                await self._exits.settle_clean_exit(run)
            elif run.is_active:
                code = error.code if error is not None else None
                if code in HOST_FAULT_CODES and error is not None:
                    self.note_host_fault(code=error.code, text=error.text)
                elif run is self._probe and code != ErrorCode.RUN_ABORTED:
                    self.clear_host_fault(why=f"the probe run ended with {code}, not a host fault")
                finished = await self._parts.orchestrator.finish(
                    key,
                    normal=normal,
                    error=text,
                    failure_code=error.code if error is not None else None,
                    question=run.question,
                )
                if finished is not None:
                    self._parts.reporting.run_ended(
                        finished.entry, normal=normal, error=text, finished_as="run finished"
                    )
                    self._parts.reporting.retry_event(finished.retry)
                    if finished.blocked is not None:
                        self._blocking.on_blocked(finished.blocked)
                    if finished.retry is not None and not self._parts.status.stopped:
                        self._parts.timers.sync(self._parts.orchestrator.retry_deadlines())
            if worker_slot is not None and self._pool is not None:
                health = classify_worker_outcome(error, stalled=run.reason is AbortReason.STALLED)
                poison = health is WorkerHealth.POISON
                try:
                    await self._pool.release(worker_slot, poison=poison)
                except Exception:
                    # NB: a pool that cannot take its host back must not fail the run's
                    # settling; the run is recorded either way.
                    logger.exception("worker pool release failed slot=%s", key)
        finally:
            self._parts.runs.discard(run)
            self._parts.reporting.emit_snapshot()
            self.nudge()

    async def wait_for_runs(self) -> None:
        """Wait until every run in flight has settled."""
        while True:
            tasks = self._parts.runs.tasks()
            if not tasks:
                break
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.settle_unstarted_runs()

    async def wait_for_runs_within(
        self, *, grace_s: float, cut_short: asyncio.Event | None = None
    ) -> bool:
        """Wait up to ``grace_s`` seconds for the runs in flight (a drain's window).

        ``True`` once none is in flight; ``False`` when the window ended, or ``cut_short`` was
        set, first. The runs themselves are left as they are.
        """
        clock, runs = self._parts.clock, self._parts.runs
        deadline = clock.monotonic_ms() + grace_s * 1000.0
        cut = asyncio.ensure_future(cut_short.wait()) if cut_short is not None else None
        try:
            while tasks := runs.tasks():
                remaining_s = (deadline - clock.monotonic_ms()) / 1000.0
                if remaining_s <= 0 or (cut is not None and cut.done()):
                    return False
                waiting: set[asyncio.Future[Any]] = set(tasks)
                if cut is not None:
                    waiting.add(cut)
                await asyncio.wait(
                    waiting, timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED
                )
            return True
        finally:
            if cut is not None:
                cut.cancel()

    async def drain_pool(self) -> None:
        """Bounded async teardown of the worker pool, if there is one."""
        if self._pool is None:
            return
        deadline = self._parts.settings.worker.worker_pool.drain_deadline_ms
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pool.drain(deadline_ms=deadline), deadline / 1000.0)

    async def settle_runs(self) -> None:
        """On the way out: let every aborted run record its shutdown."""
        tasks = self._parts.runs.tasks()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.settle_unstarted_runs()

    async def settle_unstarted_runs(self) -> None:
        """Settle the runs whose task ended without running a line of it.

        NB: a task cancelled before its first step (``stop()`` called in the very loop
        iteration that dispatched it) never enters its body, so nothing in it settles the slot:
        it would stay "running", claimed, with no process. Every handle still registered once
        its task is done is such a run (a run that started always discards its handle).
        """
        for run in self._parts.runs.all():
            if run.task is not None and run.task.done():
                await self.settle(
                    run,
                    key=run.key,
                    normal=False,
                    error=_aborted(run.reason),
                    worker_slot=None,
                )

    def on_agent_update(self, key: SlotKey, update: AgentUpdate) -> None:
        if self._probe is not None and self._probe.key == key:
            # NB: the probe's agent spoke, so its worker started: the fault is over. (Runs
            # started before the fault prove nothing about launching now.)
            self.clear_host_fault(why="the probe run's worker started")
        self._agent.on_agent_update(key, update)


def _agent_kind(settings: WorkflowSettings, name: str) -> AgentKindSettings:
    """The settings of the kind a slot was claimed for (gone if a reload removed it)."""
    try:
        return settings.agent_kind(name)
    except KeyError:
        raise LorenzError(
            f"the agent kind {name!r} this run was dispatched with is no longer defined in "
            "agents; the run is retried with the kind the workflow chooses now",
            code=ErrorCode.UNKNOWN_AGENT_KIND,
        ) from None


def _unbound(reservation: ReservationRecord) -> RunningEntry:
    """What a reservation's binding will be (as ``bind_reservation`` makes it): the run is
    prepared from it while it is being placed."""
    retry = reservation.consumed_retry
    return RunningEntry(
        issue=reservation.issue,
        slot_index=reservation.slot_index,
        attempt=reservation.attempt,
        started_at_ms=reservation.reserved_at_ms,
        started_at=reservation.reserved_at,
        workspace_path=retry.workspace_path if retry is not None else None,
        retry_kind=(
            retry.kind if retry is not None and retry.kind is not RetryKind.PLACEMENT else None
        ),
        agent_kind=reservation.agent_kind,
        resume=retry.resume if retry is not None else None,
    )


def _aborted(reason: AbortReason | None) -> RunFailure:
    return RunFailure(code=ErrorCode.RUN_ABORTED, text=f"aborted: {reason}")
