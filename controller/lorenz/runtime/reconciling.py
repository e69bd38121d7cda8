"""Reconciliation: keeping local runs in step with the claim store and the tracker.

Each tick proves our claims are still ours, stops stalled runs, and reads every tracked issue
again: an issue that left the active states has its runs stopped and its claims released, and
one that turned terminal lets the turn in progress finish within a grace before its workspaces
go. Stopping runs from outside (a deleted ``Claim``) lives here too.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from lorenz.agents import AdoptionCanceller, DroppedAdoption, RunPlacement
from lorenz.claims.errors import ClaimStoreWriteFailed
from lorenz.codes import ErrorCode
from lorenz.model import (
    AbortReason,
    DispatchPause,
    EventType,
    Issue,
    LorenzError,
    RetryEntry,
    RunOutcome,
    SlotKey,
    StopReason,
    parse_slot_key,
)
from lorenz.orchestrator import Released
from lorenz.runtime.blocking import Blocking
from lorenz.runtime.parts import RuntimeParts
from lorenz.runtime.reporting import describe_error
from lorenz.runtime.runs import ActiveRun, PendingExit, TerminalGrace
from lorenz.workspaces import PRESERVING_CODES, Workspace, WorkspaceCleanupError
from lorenz.workspaces.keys import workspace_key

logger = logging.getLogger("lorenz.runtime")

STALL_STOP_INLINE_S = 5.0
"""How long a tick waits for a stalled run's agent to stop before leaving the rest (and the
slot's retry) to the background."""


class PendingExits(Protocol):
    """The clean exits waiting for their decision (dispatch keeps them; see
    :class:`~.runs.PendingExit`): a tick's tracker read decides them along with the rest."""

    def take_exits(self) -> list[PendingExit]:
        """The exits waiting now, handed over (each one is decided by the taker)."""
        ...

    def waiting_issue_ids(self) -> set[str]:
        """The issues with an exit still waiting (one that came after :meth:`take_exits`)."""
        ...

    async def decide_exit(self, pending: PendingExit, issue: Issue | None, *, known: bool) -> None:
        """Decide one exit with its issue as just read (``known=False``: the read failed)."""
        ...


class Reconciling:
    """Stops the runs the tracker or the claim store no longer backs.

    It owns the terminal graces (issues that turned terminal mid-turn, by id) and the one-time
    start-up sweep of terminal workspaces.
    """

    def __init__(self, *, parts: RuntimeParts, blocking: Blocking) -> None:
        self._parts = parts
        self._blocking = blocking
        self._graces: dict[str, TerminalGrace] = {}
        """Issues that turned terminal mid-turn, by id, while their runs finish the turn."""
        self._startup_cleanup_done = False
        self._write_failure: ClaimStoreWriteFailed | None = None
        self._write_failure_since: datetime.datetime | None = None
        self._stopping_stalled: set[SlotKey] = set()
        """Stalled slots whose agent is being stopped; each ends with its retry after."""

    @property
    def write_failure(self) -> ClaimStoreWriteFailed | None:
        """Why the claim store refuses writes (full or read-only disk), from the last heartbeat;
        ``None`` once a heartbeat succeeds. Dispatch is paused while it is set: a claim that
        cannot be recorded must not be run."""
        return self._write_failure

    @property
    def write_pause(self) -> DispatchPause | None:
        """:attr:`write_failure` as the snapshot shows it (``poll.dispatch_paused``)."""
        failure = self._write_failure
        if failure is None:
            return None
        return DispatchPause(
            code=failure.code,
            message=self._parts.reporting.scrub(describe_error(failure)),
            since=self._write_failure_since or self._parts.clock.now(),
        )

    def in_grace(self, issue_id: str) -> bool:
        """Whether this issue turned terminal and its runs are finishing their last turn."""
        return issue_id in self._graces

    def end_all_graces(self) -> None:
        """The runtime stops: no grace timer fires any more (the runs are aborted anyway)."""
        for grace in self._graces.values():
            if grace.timer is not None:
                grace.timer.cancel()
        self._graces.clear()

    async def heartbeat_claims(self) -> None:
        """Prove our claims are still ours before this tick mutates anything.

        A store the file system refuses to write (``claim_store_write_failed``: a full or
        read-only disk) pauses dispatch until a heartbeat is written again (see
        :attr:`write_failure`): one ``dispatch_paused`` event when it starts, one
        ``dispatch_resumed`` when it clears.

        A store that declared us stale and handed our claims to another owner says so once
        (``claim_owner_lost``): every local run of those slots now belongs to someone else, so
        it is aborted without recording a result, and the slots are forgotten locally.
        """
        try:
            await self._parts.orchestrator.heartbeat()
        except ClaimStoreWriteFailed as exc:
            # NB: not raised: the tick goes on (reconciliation, blocked slots, the candidate
            # read) and only dispatch pauses; the store logged the outage once already.
            if self._write_failure is None:
                self._write_failure_since = self._parts.clock.now()
                self._parts.reporting.event(
                    EventType.DISPATCH_PAUSED,
                    message=f"dispatch paused: {exc}",
                    code=exc.code,
                )
            self._write_failure = exc
            return
        except LorenzError as exc:
            if exc.code != ErrorCode.CLAIM_OWNER_LOST:
                raise
            await self.abandon_runs(reason=str(exc))
            return
        if self._write_failure is not None:
            # A heartbeat was written: the store cleared its condition, and so do we.
            self._write_failure = None
            self._parts.reporting.event(
                EventType.DISPATCH_RESUMED,
                message="dispatch resumed: the claim store accepts writes again",
                code=ClaimStoreWriteFailed.code,
            )

    async def abandon_runs(self, *, reason: str) -> None:
        """Abort every local run whose claim we no longer own; record nothing for them."""
        issue_ids = self._parts.orchestrator.claimed_issue_ids()
        for run in self._parts.runs.all():
            run.finish_externally(AbortReason.LEADERSHIP_LOST)
        for issue_id in sorted(issue_ids):
            await self._parts.orchestrator.cleanup_issue(issue_id)
        self._parts.timers.cancel_all()
        self._parts.reporting.event(
            EventType.LEADERSHIP_LOST, message=f"claims lost: {reason}", aborted=len(issue_ids)
        )

    async def cleanup_terminal_workspaces_once(self) -> None:
        if self._startup_cleanup_done:
            return
        self._startup_cleanup_done = True
        try:
            on_disk = self._parts.workspaces.list_workspaces()
            # NB: not the workspaces of issues with a slot here (hydration's adoption retries):
            # a lost controller's worker may still work in one; reconciliation stops such a
            # run first and removes its workspaces after.
            tracked = self._parts.orchestrator.tracked_issue_ids()
            ids = sorted({w.issue_id for w in on_disk if w.issue_id} - tracked)
            if not ids:
                return
            issues = await self._parts.tracker.current.fetch_issues_by_ids(ids)
            terminal = {s.strip().lower() for s in self._parts.settings.tracker.terminal_states}
            removed: list[str] = []
            for issue in issues:
                # NB: a preserved worktree is reported and the sweep goes on with the next one.
                if (
                    issue.state_key in terminal
                    and await self.remove_workspaces(issue.identifier, issue_id=issue.id)
                    is not None
                ):
                    removed.append(issue.identifier)
            self._parts.reporting.event(
                EventType.STARTUP_WORKSPACE_CLEANUP,
                message=f"removed {len(removed)} workspace(s) of terminal issues",
                removed=removed,
            )
        except Exception as exc:  # noqa: BLE001 - reported; the sweep must not stop the start
            self._parts.reporting.event(
                EventType.STARTUP_WORKSPACE_CLEANUP_FAILED, message=describe_error(exc)
            )

    async def remove_workspaces(self, identifier: str, *, issue_id: str) -> list[Path] | None:
        """Remove a done issue's workspaces; ``None`` when some were left in place.

        A worktree with uncommitted work, or one that is not ours, is kept on purpose: that is
        reported (``workspace_preserved``, a warning) and never fails the tick; the same goes
        for a removal that failed for another reason (its code is in the event).
        """
        try:
            return await self._parts.workspaces.remove_issue(identifier)
        except WorkspaceCleanupError as exc:
            preserved = all(f.code in PRESERVING_CODES for f in exc.failures)
            self._parts.reporting.event(
                EventType.WORKSPACE_PRESERVED if preserved else EventType.WORKSPACE_CLEANUP,
                issue_id=issue_id,
                identifier=identifier,
                message=self._parts.reporting.scrub(exc.message),
                code=exc.code,
                kept=[str(f.path) for f in exc.failures if f.path is not None],
                removed=[str(p) for p in exc.removed],
            )
            return None

    async def reconcile_stalled_runs(self) -> None:
        """Stop each stalled run's agent, then end its slot with a failure retry.

        NB: the kill path first. A stalled run's worker may be frozen (stopped, wedged) while
        its agent still works: the run's task is cancelled — the runner asks its worker to
        end the run and, without a final record, kills the worker's process group and waits
        for it (:mod:`lorenz.workers.leftovers`) — and only once that task ended is the retry
        written. Until then the slot stays running, counted against concurrency: a retry must
        never start beside a possibly live agent. A stop that outlasts
        :data:`STALL_STOP_INLINE_S` goes on in the background, so the tick is not held up.
        """
        stalled = self._parts.orchestrator.stalled_runs()
        now_stalled: dict[SlotKey, float] = {}
        stopping: dict[SlotKey, tuple[asyncio.Task[None], float]] = {}
        now_ms = self._parts.clock.monotonic_ms()
        for key, silent_ms in stalled.items():
            if key in self._stopping_stalled:
                continue  # NB: its agent is being stopped; the slot ends when that is done
            run = self._parts.runs.get(key)
            if run is not None and run.launching:
                continue  # NB: a launch has its own bound (worker_launch_timeout: a host fault)
            if run is not None and run.launched_at_ms is not None:
                since_launch = now_ms - run.launched_at_ms
                if since_launch < silent_ms:
                    if since_launch <= self._parts.settings.agent_kind().stall_timeout_ms:
                        continue  # NB: the agent's silence counts from its worker's launch
                    silent_ms = since_launch
            task = run.task if run is not None else None
            if run is None or task is None or task.done():
                now_stalled[key] = silent_ms
                continue
            run.finish_externally(AbortReason.STALLED)
            logger.warning(
                "run stalled after %d ms without agent activity; stopping its agent slot=%s",
                int(silent_ms),
                key,
            )
            stopping[key] = (task, silent_ms)
        if stopping:
            # NB: all of them at once: each run's stop goes on concurrently with the others.
            await asyncio.wait(
                {task for task, _ in stopping.values()}, timeout=STALL_STOP_INLINE_S
            )
        for key, (task, silent_ms) in stopping.items():
            if task.done():
                now_stalled[key] = silent_ms
                continue
            self._stopping_stalled.add(key)
            self._parts.background.spawn(
                self.finish_stalled_after(task, key=key, silent_ms=silent_ms),
                name=f"lorenz-stall-stop:{key}",
            )
        if now_stalled:
            await self.finish_stalled(now_stalled)

    async def finish_stalled_after(
        self, task: asyncio.Task[None], *, key: SlotKey, silent_ms: float
    ) -> None:
        """End a stalled slot once its run's task (its agent) is over."""
        try:
            await asyncio.wait({task})
            await self.finish_stalled({key: silent_ms})
            if not self._parts.status.stopped:
                self._parts.timers.sync(self._parts.orchestrator.retry_deadlines())
        finally:
            self._stopping_stalled.discard(key)

    async def finish_stalled(self, silent: dict[SlotKey, float]) -> None:
        for stalled in await self._parts.orchestrator.finish_stalled(silent=silent):
            entry = stalled.entry
            run = self._parts.runs.get(entry.key)
            if run is not None:
                run.finish_externally(AbortReason.STALLED)
            self._parts.reporting.record_run(
                entry, outcome=RunOutcome.STALLED, error=stalled.error
            )
            self._parts.reporting.event(
                EventType.RUN_STALLED,
                issue=entry.issue,
                slot=entry.slot_index,
                message=stalled.error,
            )
            self._parts.reporting.retry_event(stalled.retry)
            if stalled.blocked is not None:
                self._blocking.on_blocked(stalled.blocked)

    async def reconcile_tracked_issues(self, *, exits: PendingExits) -> None:
        """Read every tracked issue again; decide the pending ``exits`` with the same read."""
        pending_exits = exits.take_exits()
        tracked = self._parts.orchestrator.tracked_issue_ids()
        if not tracked:
            return
        try:
            fresh = await self._parts.tracker.current.fetch_issues_by_ids(sorted(tracked))
        except Exception as exc:  # noqa: BLE001 - reported; a live run outlives a tracker error
            # NB: never tear down a live run on a transient tracker error.
            self._parts.reporting.event(
                EventType.RECONCILE_REFRESH_FAILED,
                message=describe_error(exc),
                code=getattr(exc, "code", type(exc).__name__),
            )
            for pending in pending_exits:
                await exits.decide_exit(pending, None, known=False)
            return
        by_id = {issue.id: issue for issue in fresh}
        for pending in pending_exits:
            await exits.decide_exit(pending, by_id.get(pending.issue_id), known=True)
        waiting = exits.waiting_issue_ids()
        for issue_id in sorted(tracked & self._parts.orchestrator.tracked_issue_ids() - waiting):
            # NB: an issue with a run that exited after the read above is left to the pass
            # that decides that exit; stopping it here would cancel a run that ended cleanly.
            issue = by_id.get(issue_id)
            reason = self._parts.orchestrator.reconciliation_decision(issue)
            if reason is None:
                assert issue is not None
                await self._parts.orchestrator.refresh_running_issue(issue)
                continue
            if reason is StopReason.TERMINAL and self.finishing_turn(issue_id, issue):
                continue
            self.end_grace(issue_id)
            await self.stop_issue(issue_id, issue=issue, reason=str(reason))

    def finishing_turn(self, issue_id: str, issue: Issue | None) -> bool:
        """Whether runs of this terminal issue are (now) finishing their turn in a grace."""
        if issue_id in self._graces:
            return True
        return issue is not None and self.begin_grace(issue)

    def begin_grace(self, issue: Issue) -> bool:
        """Let the runs of a just-terminal issue finish their turn; ``False``: stop them now.

        Only bound runs are in a turn; a slot still reserving a worker is given back at once
        (its retry is then pruned, the issue being terminal).
        """
        grace_ms = self._parts.settings.agent.terminal_grace_ms
        runs = [
            run
            for run in self._parts.runs.of_issue(issue.id)
            if run.is_active and not run.exited
        ]
        turning = [run for run in runs if run.started]
        if grace_ms <= 0 or not turning:
            return False
        for run in runs:
            if not run.started:
                run.finish_externally(AbortReason.CANCELED)
        grace = TerminalGrace(issue=issue, keys={run.key for run in turning})
        grace.timer = asyncio.get_running_loop().call_later(
            grace_ms / 1000.0, self.on_grace_over, issue.id
        )
        self._graces[issue.id] = grace
        for run in turning:
            self._parts.reporting.event(
                EventType.RUN_FINISHING,
                issue=issue,
                slot=parse_slot_key(run.key)[1],
                message=f"issue terminal: the turn in progress may finish within {grace_ms} ms; "
                "no new turn starts",
                reason=str(StopReason.TERMINAL),
                grace_ms=grace_ms,
            )
        return True

    def end_grace(self, issue_id: str) -> TerminalGrace | None:
        grace = self._graces.pop(issue_id, None)
        if grace is not None and grace.timer is not None:
            grace.timer.cancel()
        return grace

    def on_grace_over(self, issue_id: str) -> None:
        """The grace ran out: cancel what is still going, as any terminal stop does."""
        grace = self.end_grace(issue_id)
        if grace is None or self._parts.status.stopped:
            return
        self._parts.background.spawn(
            self.stop_issue(issue_id, issue=grace.issue, reason=str(StopReason.TERMINAL)),
            name=f"lorenz-grace-over:{issue_id}",
        )

    async def stop_issue(self, issue_id: str, *, issue: Issue | None, reason: str) -> None:
        """Stop every slot of an issue, release its claims, clean up when it is terminal."""
        released = await self._parts.orchestrator.cleanup_issue(issue_id)
        identifier = issue.identifier if issue is not None else released.identifier or issue_id
        self.stopped(released, reason=reason, message=f"run stopped: issue {reason}")
        # NB: before the workspaces go: a dropped adoption's worker may still work in one.
        await self.cancel_dropped_adoptions(
            released.retries, issues={issue_id: issue} if issue is not None else {}, reason=reason
        )
        for key in list(self._parts.timers.armed()):
            if key.rsplit("#", 1)[0] == issue_id:
                self._parts.timers.cancel(key)
        if reason == "terminal":
            removed = await self.remove_workspaces(identifier, issue_id=issue_id)
            if removed is not None:
                self._parts.reporting.event(
                    EventType.WORKSPACE_CLEANUP,
                    issue_id=issue_id,
                    identifier=identifier,
                    message=f"removed {len(removed)} workspace(s)",
                    reason=reason,
                    removed=[str(path) for path in removed],
                )
        else:
            self._parts.reporting.event(
                EventType.RUN_RECONCILED,
                issue_id=issue_id,
                identifier=identifier,
                message=f"released: issue {reason}",
                reason=reason,
            )

    async def cancel_slot(self, key: SlotKey, *, reason: str = "claim_deleted") -> bool:
        """Stop one slot's run from outside (a deleted ``Claim``); the issue may run again.

        ``True``: something was stopped, and the slot is free (the caller nudges dispatch).
        """
        run = self._parts.runs.get(key)
        self._parts.timers.cancel(key)
        released: Released = await self._parts.orchestrator.release_slot(key)
        if not released.aborted and run is None:
            return False
        self.stopped(released, reason=reason, message=f"run stopped: {reason}")
        await self.cancel_dropped_adoptions(released.retries, issues={}, reason=reason)
        if run is not None:
            # NB: a run the orchestrator no longer holds (it exited, its end not yet decided)
            # is still ours to stop.
            run.finish_externally(AbortReason.CANCELED)
        return True

    def stopped(self, released: Released, *, reason: str, message: str) -> None:
        """What every stop from outside does with the slots the orchestrator released.

        Their retry timers are disarmed, their runs aborted (a run settled by someone else
        records nothing itself), and each run that was going gets its history row and one
        ``run_canceled`` event here. Both stops use it: an issue's (reconciliation, the end of a
        terminal grace) and one slot's (a deleted ``Claim``).
        """
        for key in released.aborted:
            self._parts.timers.cancel(key)
            run = self._parts.runs.get(key)
            if run is not None:
                run.finish_externally(AbortReason.CANCELED)
        self._parts.reporting.retries_released(released.retries, reason=reason)
        for entry in released.runs:
            self._parts.reporting.record_run(
                entry, outcome=RunOutcome.CANCELED, error=f"stopped: {reason}"
            )
            self._parts.reporting.event(
                EventType.RUN_CANCELED,
                issue=entry.issue,
                slot=entry.slot_index,
                message=message,
                reason=reason,
            )

    async def cancel_dropped_adoptions(
        self, retries: Iterable[RetryEntry], *, issues: Mapping[str, Issue], reason: str
    ) -> None:
        """Cancel the workers of the ``adoption`` retries just dropped, and wait for them.

        An adoption retry (hydration's, for a lost controller's run whose worker may live on)
        dropped because its issue is no longer a candidate would leave that worker running
        beside nobody, until its next turn boundary went unanswered. Instead its worker is
        cancelled through its handle with the reason, its final record awaited (bounded), and
        ``after_run`` runs as for any cancelled run (here for a local worker; the worker runs
        it itself on an SSH host). The claim was released with the retry. ``issues``: the
        issues as last read, by id (a dropped retry whose issue is missing gets a stand-in).
        """
        dropped = [retry for retry in retries if retry.resume is not None]
        if dropped:
            await asyncio.gather(
                *(
                    self._cancel_dropped(retry, issue=issues.get(retry.issue_id), reason=reason)
                    for retry in dropped
                )
            )

    async def _cancel_dropped(self, retry: RetryEntry, *, issue: Issue | None, reason: str) -> None:
        resume = retry.resume
        assert resume is not None
        settings = self._parts.settings
        subject = issue or Issue(
            id=retry.issue_id, identifier=retry.identifier, title="", state=""
        )
        placement = (
            RunPlacement(host=resume.placement, hooks=settings.hooks, worker=settings.worker)
            if resume.placement is not None
            else None
        )
        runner = self._parts.runner_factory(settings.agent_kind().protocol)
        if not isinstance(runner, AdoptionCanceller):
            return  # in-process runners: no worker to cancel
        dropped = DroppedAdoption(
            issue=subject,
            slot_index=retry.slot_index,
            resume=resume,
            placement=placement,
            reason=f"{reason}: the run of a lost controller is not adopted",
        )
        try:
            over = await runner.cancel_adoption(dropped)
        except Exception:
            # Logged, not raised: the slot is released either way; at worst the worker ends at
            # its next turn boundary, unanswered.
            logger.exception("cancelling a dropped adoption failed handle=%s", resume.handle)
            return
        self._parts.reporting.event(
            EventType.RUN_CANCELED,
            issue=subject,
            slot=retry.slot_index,
            attempt=retry.run_attempt,
            message=f"the worker of a lost controller was {'' if over else 'not '}cancelled "
            f"({reason}): its run is not adopted",
            reason=reason,
        )
        if over and placement is None:
            path = (
                Path(retry.workspace_path)
                if retry.workspace_path
                else self._parts.workspaces.path_for(subject, slot_index=retry.slot_index)
            )
            workspace = Workspace(
                path=path,
                key=workspace_key(subject.identifier),
                created_now=False,
                issue=subject,
                slot_index=retry.slot_index,
            )
            await self._parts.workspaces.after_run(workspace, attempt=retry.run_attempt)

    def grace_keys(self, issue_id: str) -> set[SlotKey]:
        grace = self._graces.get(issue_id)
        return grace.keys if grace is not None else set()

    async def settle_in_grace(
        self, run: ActiveRun, *, key: SlotKey, normal: bool, text: str | None
    ) -> None:
        """A run of a terminal issue ended its last turn: no retry; the last one cleans up."""
        grace = self._graces[run.issue_id]
        grace.keys.discard(key)
        finished = await self._parts.orchestrator.finish(
            key, normal=normal, error=text, release=True
        )
        if finished is not None:
            self._parts.reporting.run_ended(
                finished.entry,
                normal=normal,
                error=text,
                finished_as="run finished; issue terminal",
            )
        if not grace.keys and self.end_grace(run.issue_id) is not None:
            await self.stop_issue(run.issue_id, issue=grace.issue, reason=str(StopReason.TERMINAL))
