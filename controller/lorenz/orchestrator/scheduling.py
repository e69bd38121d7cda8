"""The orchestrator: the only writer of scheduling state, a state machine over slots.

It decides and records; it never acts. It does not fetch issues, spawn agents, arm timers or
sleep: the runtime does all of that and reports back through these methods. The only I/O is the
injected :class:`~lorenz.model.ClaimStore`, through which every change of a claim or a retry is
persisted (acquire on claim; save on bind, update and finish-to-retry; release on cleanup), and
the only time source is the injected :class:`~lorenz.model.Clock`, so tests are exact.

The slot's lifecycle (unclaimed, reserved, running, retry pending, blocked, released) is drawn
in :mod:`lorenz.model.lifecycle`; whether a candidate may be claimed, and where it runs, are the
pure policies :mod:`lorenz.policies.admission` and :mod:`lorenz.policies.placement`. What each
transition does to the state is a plain function beside it, a module per concern: candidates
(:mod:`.candidates`), a claim's entries (:mod:`.claiming`), agent progress (:mod:`.progress`),
a run's exit (:mod:`.settling`), blocked slots (:mod:`.waiting`), releases (:mod:`.releasing`)
and recovery (:mod:`.recovery`); this class holds the lock and does the store writes.

NB: every mutating method holds one :class:`asyncio.Lock` for its whole body, store awaits
included. Without it two dispatches could both pass the cap check while the first one waits on
``store.acquire``. In-memory state is changed only *after* an acquire succeeds, so a refused
acquire leaves everything as it was (apart from remembering the slot as foreign).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Mapping, Sequence

from lorenz.config import WorkflowSettings
from lorenz.model import (
    AgentUpdate,
    CapacityProbe,
    ClaimStore,
    Clock,
    Issue,
    ReservationRecord,
    RetryEntry,
    RunningEntry,
    SlotKey,
    StaticCapacity,
    StopReason,
    slot_key,
)
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.orchestrator.candidates import dispatch_candidates, prune_retries
from lorenz.orchestrator.checkpoints import state_checkpoint
from lorenz.orchestrator.claiming import new_reservation, placement_retry, running_entry
from lorenz.orchestrator.errors import AlreadyStarted
from lorenz.orchestrator.progress import (
    ZERO_USAGE,
    fold_update,
    progress_of,
    totals_plus,
    totals_with_run,
)
from lorenz.orchestrator.records import reserved_record, retry_record, running_record
from lorenz.orchestrator.recovery import Recovery, recover_at_start, recover_from_owners
from lorenz.orchestrator.releasing import forget_slot, forget_streaks
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
from lorenz.orchestrator.settling import settle_run
from lorenz.orchestrator.snapshots import (
    OrchestratorSnapshot,
    RunIdentity,
    orchestrator_snapshot,
    run_identities,
)
from lorenz.orchestrator.state import BlockedEntry, ForeignClaim, OrchestratorState
from lorenz.orchestrator.waiting import (
    answer_slot,
    blocked_retry,
    pending_terminal_actions,
    review_blocked,
    stop_waiting_slot,
    unblock_slot,
    waiting_for,
    waiting_slots,
)
from lorenz.policies import IssueRules, reconciliation_decision, stall_error, stalled_for_ms
from lorenz.policies.admission import Admitted, admission

DEFAULT_FOREIGN_RECHECK_MS = 30000
"""How long a slot held by another owner is left alone before a claim may ask the store again,
when ``claim_store.owner_stale_ms`` is 0 (the store's own default)."""



class Orchestrator:
    """Owns :class:`OrchestratorState`; every scheduling transition goes through a method here."""

    def __init__(
        self,
        *,
        settings: WorkflowSettings,
        store: ClaimStore,
        clock: Clock,
        capacity: CapacityProbe | None = None,
    ) -> None:
        self._settings = settings
        self._rules = IssueRules.from_settings(settings)
        self._store = store
        self._clock = clock
        self._capacity: CapacityProbe = capacity if capacity is not None else StaticCapacity()
        self._placement_failures: dict[SlotKey, int] = {}
        """Placement failures in a row per slot (the placement wait doubles with each; the
        slot's next bind forgets them). NB: in memory: a restart starts the wait over."""
        self._state = OrchestratorState()
        self._lock = asyncio.Lock()
        self._slot_span = settings.agent.ensemble_size
        """Slot indexes ever in use (max over ensemble sizes seen and hydrated slots)."""
        self._usage_rebase: set[SlotKey] = set()
        self._cost_rebase: set[SlotKey] = set()
        self._last_eligibility = EligibilityReport()

    # -- settings and read-only views ---------------------------------------------------------

    @property
    def settings(self) -> WorkflowSettings:
        return self._settings

    @property
    def claim_store(self) -> ClaimStore:
        """The claim store (the runtime's spend ledger lives beside the claims in it)."""
        return self._store

    @property
    def state(self) -> OrchestratorState:
        """The live state, for reading only (the runtime never writes it)."""
        return self._state

    @property
    def rules(self) -> IssueRules:
        """The normalized tracker rules of the current settings."""
        return self._rules

    @property
    def last_eligibility(self) -> EligibilityReport:
        """What the last :meth:`eligible_issues` call swept and pruned."""
        return self._last_eligibility

    def update_settings(self, settings: WorkflowSettings) -> None:
        """Swap in reloaded settings; caps, states and timeouts apply from the next decision.

        Running and reserved slots are never evicted by a lowered cap: they finish normally,
        and no new slot is claimed until occupancy is under the new cap again.
        """
        self._settings = settings
        # NB: an explicit reload applies to every streak from its next failure, recovered ones
        # included; only a restart keeps the budgets recorded with the streaks.
        self._state.restored_budgets.clear()
        self._rules = IssueRules.from_settings(settings)
        self._slot_span = max(self._slot_span, settings.agent.ensemble_size)

    def retry_deadlines(self) -> dict[SlotKey, float]:
        """Monotonic due time (ms) of every pending retry, for the runtime's timers."""
        return {key: retry.due_at_ms for key, retry in self._state.retry_attempts.items()}

    def tracked_issue_ids(self) -> set[str]:
        """Issues with a slot reserving, running or retrying (what reconciliation refetches)."""
        return self._state.tracked_issue_ids()

    def claimed_issue_ids(self) -> set[str]:
        """Issues with a slot running or reserved here (what a lost claim store aborts)."""
        ids = {entry.issue.id for entry in self._state.running.values()}
        ids.update(reservation.issue.id for reservation in self._state.reserved.values())
        return ids

    def available_slots(self) -> int:
        """Free places under the global cap right now."""
        return max(self._settings.agent.max_concurrent_agents - self._state.occupied(), 0)

    def reconciliation_decision(self, issue: Issue | None) -> StopReason | None:
        """``None`` to keep a tracked slot going, else why it must stop (see policies)."""
        return reconciliation_decision(issue, self._rules)

    def stalled_runs(self) -> dict[SlotKey, float]:
        """Running slots past the stall threshold now, with how long each has been silent."""
        timeout = self._settings.agent_kind().stall_timeout_ms
        if timeout <= 0:
            return {}
        now_ms = self._clock.monotonic_ms()
        out: dict[SlotKey, float] = {}
        for key, entry in self._state.running.items():
            elapsed = stalled_for_ms(entry, now_ms=now_ms, stall_timeout_ms=timeout)
            if elapsed is not None:
                out[key] = elapsed
        return out

    # -- hydration ----------------------------------------------------------------------------

    async def hydrate(self) -> HydrationReport:
        """Rebuild state from the claim store at start-up (or after winning leadership).

        Claims of stale owners, and our own from a previous life, are taken over: a slot that
        was running or reserved becomes an adoption retry (its worker may live on) or a failure
        retry (its run is gone), a pending retry comes back with its wall-clock due time mapped
        onto this process's monotonic clock. Claims of live other owners are not read: their
        slots are remembered as foreign when ``acquire`` refuses them. Usage totals come from
        the checkpoint. Every rule is in :func:`~lorenz.orchestrator.hydration.plan_hydration`;
        this has the store rebind the stale owners' rows and read back exactly those and ours
        (``ClaimStore.recover``), applies the plan and persists what the lost runs became.
        """
        async with self._lock:
            state = self._state
            if state.running or state.reserved or state.retry_attempts or state.claimed:
                raise AlreadyStarted(
                    "hydrate() runs once, before the first dispatch; create a new orchestrator",
                )
            recovery = await recover_at_start(
                state,
                store=self._store,
                clock=self._clock,
                settings=self._settings,
            )
            return await self._persist_recovered(recovery)

    async def take_over(self, owners: Iterable[str]) -> HydrationReport:
        """Take over the claims of ``owners`` while running (a periodic recovery pass).

        The same recovery as :meth:`hydrate`, for owners found stale (or dead) after start-up:
        the store re-checks each owner's staleness inside its own transaction, so a live owner
        loses nothing; a moved slot that was running or reserved becomes a failure retry with
        its attempt incremented, a pending retry keeps its attempt and wall-clock due time.
        Moved slots are no longer "claimed elsewhere": they are dispatched when due, by us.
        The caller must have stopped the owners' agents first (their slots are ours now).
        """
        async with self._lock:
            recovery = await recover_from_owners(
                self._state, owners, store=self._store, clock=self._clock, settings=self._settings
            )
            return await self._persist_recovered(recovery)

    def _foreign_recheck_ms(self) -> float:
        return float(self._settings.claim_store.owner_stale_ms or DEFAULT_FOREIGN_RECHECK_MS)

    # -- eligibility --------------------------------------------------------------------------

    async def eligible_issues(
        self, issues: Sequence[Issue], *, complete: bool = True
    ) -> list[DispatchCandidate]:
        """Sorted dispatch candidates, one per free slot of every eligible issue.

        First sweeps expired reservations (cancelled with their retry restored); afterwards
        prunes retries whose issue is no longer an active, routable, unblocked candidate
        (``issues`` must be the full candidate list) or whose slot index is beyond a shrunk
        ``agent.ensemble_size``. Caps are *not* applied here: :meth:`claim` applies them, so
        the runtime can report each skipped candidate and stop at the first capacity skip.
        ``complete=False`` says ``issues`` is not a fresh full list (the runtime dispatching
        between polls from the last one): nothing is pruned or forgotten because of it.
        """
        async with self._lock:
            now_ms = self._clock.monotonic_ms()
            expired = await self._sweep_expired_locked(now_ms) if self._state.reserved else []
            candidates, eligible_tracked = self._candidates(issues, now_ms=now_ms)
            if not complete:
                self._last_eligibility = EligibilityReport(expired=tuple(expired))
                return candidates
            unblocked: list[BlockedEntry] = []
            released_blocked: list[BlockedEntry] = []
            if self._state.blocked:
                unblocked, released_blocked = await self._review_blocked_locked(
                    issues, eligible_tracked, now_ms=now_ms
                )
                if unblocked:
                    candidates, eligible_tracked = self._candidates(issues, now_ms=now_ms)
            pruned: list[RetryEntry] = []
            if self._state.retry_attempts:
                pruned = await self._prune_retries_locked(eligible_tracked)
            if self._state.foreign:
                # A foreign slot of an issue nobody may dispatch now is not worth remembering;
                # a refused acquire teaches it again if the issue comes back.
                foreign = self._state.foreign
                for key in [k for k in foreign if k.rpartition("#")[0] not in eligible_tracked]:
                    del foreign[key]
            self._last_eligibility = EligibilityReport(
                expired=tuple(expired),
                pruned=tuple(pruned),
                unblocked=tuple(unblocked),
                released_blocked=tuple(released_blocked),
            )
            return candidates

    async def _review_blocked_locked(
        self, issues: Sequence[Issue], eligible_ids: set[str], *, now_ms: float
    ) -> tuple[list[BlockedEntry], list[BlockedEntry]]:
        """On a full candidate list: release blocked slots whose issue is no longer eligible,
        note the issue's version once the terminal action is done, and unblock a slot whose
        issue has changed since (:func:`.waiting.review_blocked`)."""
        unblocked, released, noted = review_blocked(
            self._state, issues, eligible_ids, span=self._settings.agent.ensemble_size
        )
        for blocked in released:
            await self._store.release(blocked.key)
        wall = self._clock.now()
        for blocked in unblocked:
            await self._unblock_locked(blocked, now_ms=now_ms, wall=wall)
        if released or unblocked or noted:
            await self._save_checkpoint()
        return unblocked, released

    async def _unblock_locked(
        self, blocked: BlockedEntry, *, now_ms: float, wall: datetime.datetime
    ) -> RetryEntry:
        retry = unblock_slot(self._state, blocked, now_ms=now_ms, wall=wall)
        await self._store.save(retry_record(retry, owner=self._store.owner, now=wall))
        return retry

    async def unblock(self, issue_id: str | None = None) -> tuple[BlockedEntry, ...]:
        """Unblock every blocked slot (a refresh), or those of one issue: each becomes a
        failure retry due at once, with a fresh retry budget."""
        async with self._lock:
            state = self._state
            # NB: a waiting slot waits for its answer, not for a refresh.
            chosen = [
                blocked
                for blocked in state.blocked.values()
                if (issue_id is None or blocked.issue_id == issue_id) and not blocked.waiting
            ]
            if not chosen:
                return ()
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            for blocked in chosen:
                await self._unblock_locked(blocked, now_ms=now_ms, wall=wall)
            await self._save_checkpoint()
            return tuple(chosen)

    # -- questions ------------------------------------------------------------------------

    def waiting_slots(self) -> tuple[BlockedEntry, ...]:
        """Slots waiting for an answer, oldest question first."""
        return waiting_slots(self._state)

    def session_resume(self, key: SlotKey) -> SessionResume | None:
        """The answered question the slot's next run resumes, if any."""
        return self._state.resumes.get(key)

    async def record_question_posted(self, key: SlotKey, *, action_key: str) -> bool:
        """The question of a waiting slot is on the tracker; ``False`` when that wait is over."""
        async with self._lock:
            blocked = waiting_for(self._state.blocked.get(key), action_key=action_key)
            if blocked is None:
                return False
            if not blocked.question_posted:
                blocked.question_posted = True
                await self._save_checkpoint()
            return True

    async def answer(
        self, key: SlotKey, *, action_key: str, resume: SessionResume
    ) -> RetryEntry | None:
        """Answer a waiting slot: its next run (due at once, same attempt, no failure counted)
        resumes the session with ``resume``. ``None`` when that wait is over already."""
        async with self._lock:
            blocked = waiting_for(self._state.blocked.get(key), action_key=action_key)
            if blocked is None:
                return None
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            retry = answer_slot(self._state, blocked, resume=resume, now_ms=now_ms, wall=wall)
            await self._store.save(retry_record(retry, owner=self._store.owner, now=wall))
            await self._save_checkpoint()
            return retry

    async def stop_waiting(self, key: SlotKey, *, action_key: str) -> BlockedEntry | None:
        """A question went unanswered past ``input.timeout_ms``: the slot stays blocked and
        takes the terminal action (``cancel`` counts as ``block``, as for any question)."""
        async with self._lock:
            blocked = waiting_for(self._state.blocked.get(key), action_key=action_key)
            if blocked is None:
                return None
            action = self._settings.retry.terminal_action
            stop_waiting_slot(blocked, action=action, wall=self._clock.now())
            await self._save_checkpoint()
            return blocked

    def pending_terminal_actions(self) -> tuple[BlockedEntry, ...]:
        """Blocked slots whose escalation or cancel has not been applied yet (oldest first)."""
        return pending_terminal_actions(self._state)

    async def record_terminal_action(
        self, key: SlotKey, *, action_key: str, error: str | None
    ) -> BlockedEntry | None:
        """Write the receipt (``error=None``) or the failure of a terminal action; ``None`` when
        that block is gone (unblocked or released meanwhile: ``action_key`` no longer matches)."""
        async with self._lock:
            blocked = self._state.blocked.get(key)
            if blocked is None or blocked.action_key != action_key:
                return None
            if error is None:
                blocked.action_done = True
                blocked.action_error = None
            else:
                blocked.action_error = error
            await self._save_checkpoint()
            return blocked

    async def sweep_expired_reservations(self) -> list[ReservationRecord]:
        """Cancel every reservation past its expiry (also done by :meth:`eligible_issues`)."""
        async with self._lock:
            return await self._sweep_expired_locked(self._clock.monotonic_ms())

    def _candidates(
        self, issues: Sequence[Issue], *, now_ms: float
    ) -> tuple[list[DispatchCandidate], set[str]]:
        """The sorted candidates, and the ids of eligible issues that have a tracked slot."""
        return dispatch_candidates(
            self._state,
            issues,
            rules=self._rules,
            span=self._settings.agent.ensemble_size,
            now_ms=now_ms,
        )

    async def _prune_retries_locked(self, eligible_ids: set[str]) -> list[RetryEntry]:
        pruned = prune_retries(
            self._state, eligible_ids, span=self._settings.agent.ensemble_size
        )
        for retry in pruned:
            await self._store.release(retry.key)
        return pruned

    async def _sweep_expired_locked(self, now_ms: float) -> list[ReservationRecord]:
        expired = [r for r in self._state.reserved.values() if r.expires_at_ms <= now_ms]
        for reservation in expired:
            await self._cancel_locked(reservation)
        return expired

    # -- claiming -----------------------------------------------------------------------------

    async def claim(self, candidate: DispatchCandidate) -> ClaimResult:
        """Claim one candidate slot, or say why not.

        Whether and how is :func:`~lorenz.policies.admission.admission` (its checks, in order:
        already claimed here; blocked or a stale retry; held by another owner; the retry is
        due; the caps; a place to run it, from :mod:`lorenz.policies.placement`). Then
        ``store.acquire``. Consumes the slot's retry entry (kept inside a reservation, so a
        cancel can put it back).
        """
        async with self._lock:
            state = self._state
            key = candidate.key
            now_ms = self._clock.monotonic_ms()
            decision = admission(
                state,
                key=key,
                issue=candidate.issue,
                candidate_retry=candidate.retry,
                settings=self._settings,
                capacity=self._capacity,
                now_ms=now_ms,
            )
            if not isinstance(decision, Admitted):
                return Skipped(SkipReason(decision.value))

            issue = candidate.issue
            current = decision.retry
            placement = decision.placement
            wall = self._clock.now()
            owner = self._store.owner
            attempt = current.run_attempt if current is not None else None
            reservation: ReservationRecord | None = None
            entry: RunningEntry | None = None
            if placement.reserves:
                reservation = new_reservation(
                    issue,
                    slot_index=candidate.slot_index,
                    attempt=attempt,
                    retry=current,
                    acquire_timeout_ms=placement.acquire_timeout_ms,
                    agent_kind=decision.kind,
                    now_ms=now_ms,
                    wall=wall,
                )
                record = reserved_record(reservation, owner=owner, now=wall)
            else:
                entry = running_entry(
                    issue,
                    slot_index=candidate.slot_index,
                    attempt=attempt,
                    retry=current,
                    host=placement.host,
                    agent_kind=decision.kind,
                    now_ms=now_ms,
                    wall=wall,
                )
                record = running_record(entry, owner=owner, now=wall)

            if not await self._store.acquire(record):
                state.foreign[key] = ForeignClaim(
                    owner=None, recheck_at_ms=now_ms + self._foreign_recheck_ms()
                )
                return Skipped(SkipReason.CLAIMED_ELSEWHERE)

            state.foreign.pop(key, None)
            if current is not None:
                del state.retry_attempts[key]
            state.claimed.add(key)
            self._slot_span = max(self._slot_span, candidate.slot_index + 1)
            if reservation is not None:
                state.reserved[key] = reservation
                return Reserved(reservation)
            assert entry is not None
            state.running[key] = entry
            return Started(entry)

    async def bind_reservation(
        self, reservation: ReservationRecord, *, host: str | None
    ) -> RunningEntry | None:
        """Turn a reservation into a running slot on ``host``; ``None`` if its token is stale.

        An expired reservation that has not been swept yet still binds: expiry is a guard
        against acquires that never return, not a deadline for ones that do.
        """
        async with self._lock:
            state = self._state
            key = reservation.key
            current = state.reserved.get(key)
            if current is None or current.token != reservation.token:
                return None
            entry = running_entry(
                current.issue,
                slot_index=current.slot_index,
                attempt=current.attempt,
                retry=current.consumed_retry,
                host=host,
                agent_kind=current.agent_kind,
                now_ms=self._clock.monotonic_ms(),
                wall=self._clock.now(),
            )
            del state.reserved[key]
            self._placement_failures.pop(key, None)
            state.running[key] = entry
            await self._store.save(
                running_record(entry, owner=self._store.owner, now=entry.started_at)
            )
            return entry

    async def cancel_reservation(self, reservation: ReservationRecord) -> bool:
        """Release a reservation with no backoff, restoring the retry it consumed.

        ``False`` (and nothing changes) when the token is stale: the reservation was already
        bound, cancelled or swept, and the slot may belong to a newer claim.
        """
        async with self._lock:
            current = self._state.reserved.get(reservation.key)
            if current is None or current.token != reservation.token:
                return False
            await self._cancel_locked(current)
            return True

    async def give_back(
        self, reservation: ReservationRecord, *, error: str, code: str
    ) -> RetryEntry | None:
        """A reservation whose run could not be placed: release it without counting anything.

        The slot waits for placement (``placement_wait_ms``, doubling with each failure of the
        slot in a row) and is then claimed again: a retry
        it had consumed comes back with its attempt and kind, due no sooner than that, carrying
        ``error``; a first run comes back as a ``placement`` retry (still a first run). Neither
        the attempt nor the failure streak moves, so ``retry.max_attempts`` and the backoff
        only ever count runs that ran. ``None`` (and nothing changes) for a stale token.
        """
        async with self._lock:
            state = self._state
            key = reservation.key
            current = state.reserved.get(key)
            if current is None or current.token != reservation.token:
                return None
            del state.reserved[key]
            state.claimed.discard(key)
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            failures = self._placement_failures[key] = self._placement_failures.get(key, 0) + 1
            retry = placement_retry(
                current, failures=failures, error=error, code=code, now_ms=now_ms, wall=wall
            )
            state.retry_attempts[key] = retry
            await self._store.save(retry_record(retry, owner=self._store.owner, now=wall))
            return retry

    async def _cancel_locked(self, reservation: ReservationRecord) -> None:
        state = self._state
        key = reservation.key
        del state.reserved[key]
        state.claimed.discard(key)
        retry = reservation.consumed_retry
        if retry is not None:
            state.retry_attempts[key] = retry
            await self._store.save(
                retry_record(retry, owner=self._store.owner, now=self._clock.now())
            )
        else:
            await self._store.release(key)

    # -- running slots ------------------------------------------------------------------------

    async def apply_update(self, key: SlotKey, update: AgentUpdate) -> AgentProgress | None:
        """Fold one agent progress report into its running entry; ``None`` (ignored) for keys
        that are not running. Returns what the entry shows now.

        See :func:`.progress.fold_update` for how usage and cost reports are counted (never
        twice); persisted only when something a restart needs changed (session, pid, usage,
        cost), not for plain events or messages, which are the bulk of the traffic.
        """
        async with self._lock:
            entry = self._state.running.get(key)
            if entry is None:
                return None
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            persist = fold_update(
                entry,
                update,
                key=key,
                now_ms=now_ms,
                wall=wall,
                usage_rebase=self._usage_rebase,
                cost_rebase=self._cost_rebase,
            )
            if update.rate_limits is not None:
                self._state.rate_limits = dict(update.rate_limits)
            if persist:
                await self._store.save(running_record(entry, owner=self._store.owner, now=wall))
            return progress_of(entry)

    async def set_workspace(self, key: SlotKey, path: str) -> None:
        """Record where a running slot's workspace is (once the runtime has created it)."""
        async with self._lock:
            entry = self._state.running.get(key)
            if entry is None:
                return
            entry.workspace_path = path
            await self._store.save(
                running_record(entry, owner=self._store.owner, now=self._clock.now())
            )

    async def finish(
        self,
        key: SlotKey,
        *,
        normal: bool,
        error: str | None = None,
        release: bool = False,
        failure_code: str | None = None,
        count_continuation: bool = True,
        question: AgentQuestion | None = None,
    ) -> Finished | None:
        """End a running slot and schedule its retry; ``None`` if ``key`` is not running.

        The run's time and usage go into the totals. ``release=True`` writes no retry and
        releases the claim instead: the runtime knows the issue is done with (a fresh read
        after the exit said so). Otherwise the slot gets its retry or is blocked by the rules
        of :func:`~lorenz.orchestrator.settling.settle_run`; the retry is written even if the
        issue is no longer active (the next eligibility pass prunes it).
        """
        async with self._lock:
            return await self._finish_locked(
                key,
                normal=normal,
                error=error,
                release=release,
                failure_code=failure_code,
                count_continuation=count_continuation,
                question=question,
            )

    async def finish_stalled(
        self, *, silent: Mapping[SlotKey, float] | None = None
    ) -> tuple[StalledRun, ...]:
        """End every running slot past the stall threshold with a failure retry.

        ``silent``: only these slots, with how long each was silent when its stall was seen
        (the runtime stops a stalled run's agent first and ends its slot after; an update that
        came in meanwhile does not undo the stall).
        """
        async with self._lock:
            stalled: list[StalledRun] = []
            found = self.stalled_runs() if silent is None else silent
            for key, silent_ms in found.items():
                error = stall_error(silent_ms)
                finished = await self._finish_locked(key, normal=False, error=error, release=False)
                if finished is not None and (
                    finished.retry is not None or finished.blocked is not None
                ):
                    stalled.append(StalledRun(entry=finished.entry, retry=finished.retry,
                                              error=error, silent_ms=silent_ms,
                                              blocked=finished.blocked))
            return tuple(stalled)

    async def _finish_locked(
        self,
        key: SlotKey,
        *,
        normal: bool,
        error: str | None,
        release: bool,
        failure_code: str | None = None,
        count_continuation: bool = True,
        question: AgentQuestion | None = None,
    ) -> Finished | None:
        state = self._state
        entry = state.running.pop(key, None)
        if entry is None:
            return None
        state.resumes.pop(key, None)  # NB: the run that resumed the session is over.
        state.claimed.discard(key)
        self._forget_session(key)
        now_ms = self._clock.monotonic_ms()
        wall = self._clock.now()
        self._add_to_totals(entry, now_ms=now_ms)
        state.completed.add(entry.issue.id)
        if release:
            forget_streaks(state, key)
            await self._store.release(key)
            await self._save_checkpoint()
            return Finished(entry=entry, retry=None)
        settled = settle_run(
            state,
            entry,
            key=key,
            settings=self._settings,
            normal=normal,
            error=error,
            failure_code=failure_code,
            count_continuation=count_continuation,
            question=question,
            now_ms=now_ms,
            wall=wall,
        )
        if isinstance(settled, BlockedEntry):
            # NB: the row stays, as a pending retry due at once: it keeps the slot ours in a
            # shared store, and if the checkpoint entry were lost the slot simply retries.
            row = blocked_retry(settled, now_ms=now_ms)
            await self._store.save(retry_record(row, owner=self._store.owner, now=wall))
            await self._save_checkpoint()
            return Finished(entry=entry, retry=None, blocked=settled)
        # NB: the retry row first, the checkpoint second. If the process dies in between, the
        # run's usage is lost (undercount); the other order would count it twice on recovery.
        await self._store.save(retry_record(settled, owner=self._store.owner, now=wall))
        await self._save_checkpoint()
        return Finished(entry=entry, retry=settled)

    async def release_retry(self, key: SlotKey) -> None:
        """Drop a pending retry and release its claim row (a no-op for claimed or unknown keys)."""
        async with self._lock:
            if key in self._state.claimed:
                return
            forget_streaks(self._state, key)
            blocked = self._state.blocked.pop(key, None)
            if self._state.retry_attempts.pop(key, None) is not None or blocked is not None:
                await self._store.release(key)
            if blocked is not None:
                await self._save_checkpoint()

    async def cleanup_issue(self, issue_id: str) -> Released:
        """Forget every slot of an issue (running, reserved, retrying) and release its rows.

        Returns what was removed: the runtime aborts the runs and reservations in it. Time and
        usage of the stopped runs still go into the totals; no retry is scheduled.
        """
        async with self._lock:
            state = self._state
            now_ms = self._clock.monotonic_ms()
            runs: list[RunningEntry] = []
            reservations: list[ReservationRecord] = []
            retries: list[RetryEntry] = []
            touched: list[SlotKey] = []
            unblocked = False
            for index in range(self._slot_span):
                key = slot_key(issue_id, index)
                gone = forget_slot(state, key)
                if gone.blocked is not None:
                    unblocked = True
                    touched.append(key)
                elif not gone.empty:
                    touched.append(key)
                if gone.run is not None:
                    self._add_to_totals(gone.run, now_ms=now_ms)
                    self._forget_session(key)
                    runs.append(gone.run)
                    state.claimed.discard(key)
                if gone.reservation is not None:
                    reservations.append(gone.reservation)
                    state.claimed.discard(key)
                if gone.retry is not None:
                    retries.append(gone.retry)
            for key in touched:
                await self._store.release(key)
            if runs or unblocked:
                await self._save_checkpoint()
            return Released(
                runs=tuple(runs), reservations=tuple(reservations), retries=tuple(retries)
            )

    async def release_slot(self, key: SlotKey) -> Released:
        """Forget one slot (running, reserved and any retry) without scheduling a retry.

        For a stop that comes from outside, such as a deleted ``Claim``: the slot becomes
        unclaimed and may be dispatched again on the next tick. A running slot's time and usage
        still go into the totals. Returns what was removed (empty for an unknown key).
        """
        async with self._lock:
            state = self._state
            gone = forget_slot(state, key)
            if gone.empty:
                return Released()
            entry, reservation, retry = gone.run, gone.reservation, gone.retry
            state.claimed.discard(key)
            if entry is not None:
                self._add_to_totals(entry, now_ms=self._clock.monotonic_ms())
                self._forget_session(key)
            await self._store.release(key)
            if entry is not None or gone.blocked is not None:
                await self._save_checkpoint()
            return Released(
                runs=(entry,) if entry is not None else (),
                reservations=(reservation,) if reservation is not None else (),
                retries=(retry,) if retry is not None else (),
            )

    async def refresh_running_issue(self, issue: Issue) -> None:
        """Replace the issue snapshot of its running and reserved slots (moves per-state counts).

        Not persisted: a claim row keeps no state, and the identifier is the only issue field it
        stores (refreshed in memory on retries too, written with the next transition).
        """
        async with self._lock:
            state = self._state
            for index in range(self._slot_span):
                key = slot_key(issue.id, index)
                entry = state.running.get(key)
                if entry is not None:
                    entry.issue = issue
                reservation = state.reserved.get(key)
                if reservation is not None:
                    reservation.issue = issue
                retry = state.retry_attempts.get(key)
                if retry is not None:
                    retry.identifier = issue.identifier

    async def heartbeat(self) -> None:
        """Tell the claim store this owner is alive."""
        await self._store.heartbeat()

    def _add_to_totals(self, entry: RunningEntry, *, now_ms: float) -> None:
        self._state.usage_totals = totals_with_run(self._state.usage_totals, entry, now_ms=now_ms)

    def _forget_session(self, key: SlotKey) -> None:
        self._usage_rebase.discard(key)
        self._cost_rebase.discard(key)

    async def _persist_recovered(self, recovery: Recovery) -> HydrationReport:
        """After hydration or a takeover: the recovered slots tracked, the recovered usage
        counted once, each interrupted run's failure retry and (if usage moved) the checkpoint
        written."""
        state = self._state
        self._slot_span = max(self._slot_span, recovery.slot_span)
        if recovery.usage != ZERO_USAGE:
            state.usage_totals = totals_plus(
                state.usage_totals, usage=recovery.usage, seconds=0.0, cost_usd=0.0
            )
        own = self._store.owner
        for key in recovery.report.interrupted:
            retry = state.retry_attempts[key]
            await self._store.save(retry_record(retry, owner=own, now=recovery.wall))
        if recovery.usage != ZERO_USAGE:
            await self._save_checkpoint()
        return recovery.report

    async def _save_checkpoint(self) -> None:
        await self._store.save_checkpoint(state_checkpoint(self._state).to_json())

    # -- snapshot -----------------------------------------------------------------------------

    def snapshot(self) -> OrchestratorSnapshot:
        """The lanes right now, as frozen rows; totals include the runs still going."""
        return orchestrator_snapshot(
            self._state, now_ms=self._clock.monotonic_ms(), wall=self._clock.now()
        )

    def run_identities(self) -> tuple[RunIdentity, ...]:
        """Each slot running, reserved or waiting for a retry: its issue and session only."""
        return run_identities(self._state)
