"""The orchestrator: the only writer of scheduling state, a state machine over slots.

It decides and records; it never acts. It does not fetch issues, spawn agents, arm timers or
sleep: the runtime does all of that and reports back through these methods. The only I/O is the
injected :class:`~lorenz.model.ClaimStore`, through which every change of a claim or a retry is
persisted (acquire on claim; save on bind, update and finish-to-retry; release on cleanup), and
the only time source is the injected :class:`~lorenz.model.Clock`, so tests are exact.

The slot's lifecycle (unclaimed, reserved, running, retry pending, blocked, released) is drawn
in :mod:`lorenz.model.lifecycle`; whether a candidate may be claimed, and where it runs, are the
pure policies :mod:`lorenz.policies.admission` and :mod:`lorenz.policies.placement`.

NB: every mutating method holds one :class:`asyncio.Lock` for its whole body, store awaits
included. Without it two dispatches could both pass the cap check while the first one waits on
``store.acquire``. In-memory state is changed only *after* an acquire succeeds, so a refused
acquire leaves everything as it was (apart from remembering the slot as foreign).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

from lorenz.config import TerminalAction, WorkflowSettings
from lorenz.model import (
    AgentUpdate,
    BlockReason,
    CapacityProbe,
    ClaimRecord,
    ClaimStore,
    Clock,
    Issue,
    ReservationRecord,
    RetryEntry,
    RetryKind,
    RunningEntry,
    SlotKey,
    StaticCapacity,
    StopReason,
    TokenUsage,
    UsageTotals,
    slot_key,
)
from lorenz.model.questions import AgentQuestion, SessionResume
from lorenz.orchestrator.checkpoints import Checkpoint
from lorenz.orchestrator.errors import AlreadyStarted, CheckpointInvalid, ClaimRecordInvalid
from lorenz.orchestrator.hydration import (
    RECOVERY_BOUND,
    RecoveredSlots,
    owners_to_take_over,
    plan_hydration,
    record_problem,
    recover_slots,
    valid_records,
)
from lorenz.orchestrator.records import reserved_record, retry_record, running_record
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
from lorenz.orchestrator.snapshots import (
    OrchestratorSnapshot,
    RunIdentity,
    orchestrator_snapshot,
    run_identities,
)
from lorenz.orchestrator.state import BlockedEntry, ForeignClaim, OrchestratorState, RetryBudget
from lorenz.policies import (
    IssueRules,
    dispatchable_issues,
    placement_wait_ms,
    reconciliation_decision,
    reservation_lifetime_ms,
    sort_for_dispatch,
    stall_error,
    stalled_for_ms,
)
from lorenz.policies.admission import Admitted, admission
from lorenz.policies.retries import (
    QUESTION_CODES,
    issue_version,
    settle_decision,
    terminal_action_key,
)

DEFAULT_FOREIGN_RECHECK_MS = 30000
"""How long a slot held by another owner is left alone before a claim may ask the store again,
when ``claim_store.owner_stale_ms`` is 0 (the store's own default)."""

_ZERO_USAGE = TokenUsage()
_AS_SLOT_KEY = cast("Callable[[str], SlotKey]", str)


def _constant(owner: str) -> Callable[[SlotKey], str]:
    def of(_key: SlotKey) -> str:
        return owner

    return of


def _max_usage(a: TokenUsage, b: TokenUsage) -> TokenUsage:
    return TokenUsage(
        input_tokens=max(a.input_tokens, b.input_tokens),
        output_tokens=max(a.output_tokens, b.output_tokens),
        total_tokens=max(a.total_tokens, b.total_tokens),
    )


def _dropped_below(reported: TokenUsage, last: TokenUsage) -> bool:
    return (
        reported.input_tokens < last.input_tokens
        or reported.output_tokens < last.output_tokens
        or reported.total_tokens < last.total_tokens
    )


def _totals_plus(
    totals: UsageTotals, *, usage: TokenUsage, seconds: float, cost_usd: float
) -> UsageTotals:
    return UsageTotals(
        input_tokens=totals.input_tokens + usage.input_tokens,
        output_tokens=totals.output_tokens + usage.output_tokens,
        total_tokens=totals.total_tokens + usage.total_tokens,
        seconds_running=totals.seconds_running + seconds,
        cost_usd=totals.cost_usd + cost_usd,
    )


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
        onto this process's monotonic clock. Claims of live other owners are remembered as
        foreign. Usage totals come from the checkpoint. Every rule is in
        :func:`~lorenz.orchestrator.hydration.plan_hydration`; this reads the store, has it move
        the stale owners' rows, applies the plan and persists what the lost runs became.
        """
        async with self._lock:
            state = self._state
            if state.running or state.reserved or state.retry_attempts or state.claimed:
                raise AlreadyStarted(
                    "hydrate() runs once, before the first dispatch; create a new orchestrator",
                )
            stored = await self._store.load(bound=RECOVERY_BOUND)
            own = self._store.owner
            valid = valid_records(stored.claims)
            stale = owners_to_take_over(valid, stored=stored)
            moved = await self._store.take_over(from_owners=stale) if stale else []
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            plan = plan_hydration(
                valid,
                stored=stored,
                moved=moved,
                own=own,
                now_ms=now_ms,
                wall=wall,
                backoff=self._settings.retry.backoff,
            )
            self._apply_recovered(plan.slots)
            recheck_at = now_ms + self._foreign_recheck_ms()
            for key, owner in plan.foreign.items():
                state.foreign[key] = ForeignClaim(owner=owner, recheck_at_ms=recheck_at)
            if plan.usage_totals is not None:
                state.usage_totals = plan.usage_totals
            state.failure_streaks.update(plan.failure_streaks)
            state.retry_budgets.update(plan.retry_budgets)
            state.restored_budgets.update(plan.retry_budgets)
            state.blocked.update(plan.blocked)
            state.resumes.update(plan.resumes)
            slots = plan.slots
            await self._persist_recovered(
                list(slots.interrupted), recovered_usage=slots.usage, owner=own, now=wall
            )
            return HydrationReport(
                interrupted=slots.interrupted,
                adopting=slots.adopting,
                restored_retries=slots.restored,
                foreign=plan.foreign,
                taken_over_from=plan.taken_over_from,
                usage_restored=plan.usage_totals is not None,
                problems=plan.problems,
            )

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
            state = self._state
            own = self._store.owner
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            interrupted: list[SlotKey] = []
            adopting: list[SlotKey] = []
            restored: list[SlotKey] = []
            problems: list[ClaimRecordInvalid | CheckpointInvalid] = []
            taken_from: set[str] = set()
            recovered_usage = TokenUsage()
            for owner in sorted(set(owners) - {own}):
                # NB: one owner per call, so each interrupted run names the owner it was lost with.
                moved: dict[SlotKey, ClaimRecord] = {}
                for record in await self._store.take_over(from_owners=[owner]):
                    taken_from.add(owner)
                    problem = record_problem(record)
                    if problem is not None:
                        problems.append(problem)
                    elif record.slot_key not in state.claimed:
                        # NB: claimed cannot happen (the row was another owner's); never clobber
                        moved[record.slot_key] = record
                slots = recover_slots(
                    moved,
                    previous_owner=_constant(owner),
                    now_ms=now_ms,
                    wall=wall,
                    backoff=self._settings.retry.backoff,
                )
                for key in moved:
                    state.foreign.pop(key, None)
                self._apply_recovered(slots)
                interrupted += slots.interrupted
                adopting += slots.adopting
                restored += slots.restored
                recovered_usage = recovered_usage + slots.usage
            await self._persist_recovered(
                interrupted, recovered_usage=recovered_usage, owner=own, now=wall
            )
            return HydrationReport(
                interrupted=tuple(interrupted),
                adopting=tuple(adopting),
                restored_retries=tuple(restored),
                taken_over_from=frozenset(taken_from),
                problems=tuple(problems),
            )

    def _apply_recovered(self, slots: RecoveredSlots) -> None:
        """Track the retries recovered slots came back as (see :mod:`.hydration`)."""
        self._slot_span = max(self._slot_span, slots.slot_span)
        self._state.retry_attempts.update(slots.retries)

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
        issue has changed since."""
        state = self._state
        span = self._settings.agent.ensemble_size
        ids = {blocked.issue_id for blocked in state.blocked.values()}
        by_id = {issue.id: issue for issue in issues if issue.id in ids}
        unblocked: list[BlockedEntry] = []
        released: list[BlockedEntry] = []
        noted = False
        for key, blocked in list(state.blocked.items()):
            issue = by_id.get(blocked.issue_id)
            if issue is None or blocked.issue_id not in eligible_ids or blocked.slot_index >= span:
                del state.blocked[key]
                state.failure_streaks.pop(key, None)
                state.retry_budgets.pop(key, None)
                state.restored_budgets.pop(key, None)
                released.append(blocked)
                continue
            if blocked.waiting:
                continue  # NB: an answer ends the wait, not a change (the question is one).
            version = issue_version(issue)
            if blocked.issue_version is None:
                if blocked.action_done:
                    blocked.issue_version = version
                    noted = True
            elif version != blocked.issue_version:
                unblocked.append(blocked)
        for blocked in released:
            await self._store.release(blocked.key)
        wall = self._clock.now()
        for blocked in unblocked:
            await self._unblock_locked(blocked, now_ms=now_ms, wall=wall)
        if released or unblocked or noted:
            await self._save_checkpoint()
        return unblocked, released

    def _blocked_retry(self, blocked: BlockedEntry, *, now_ms: float) -> RetryEntry:
        """The retry a blocked slot becomes when it is unblocked: due at once, same attempt."""
        return RetryEntry(
            issue_id=blocked.issue_id,
            identifier=blocked.identifier,
            slot_index=blocked.slot_index,
            attempt=blocked.attempt,
            kind=(
                RetryKind.CONTINUATION
                if blocked.reason is BlockReason.CONTINUATION_LIMIT
                else RetryKind.FAILURE
            ),
            due_at_ms=now_ms,
            due_at=blocked.blocked_at,
            error=blocked.error,
            error_code=blocked.error_code,
            host=blocked.host,
            workspace_path=blocked.workspace_path,
        )

    async def _unblock_locked(
        self, blocked: BlockedEntry, *, now_ms: float, wall: datetime.datetime
    ) -> RetryEntry:
        key = blocked.key
        self._state.blocked.pop(key, None)
        # NB: a person looked at it: the budget starts again.
        self._state.failure_streaks.pop(key, None)
        self._state.retry_budgets.pop(key, None)
        self._state.restored_budgets.pop(key, None)
        retry = self._blocked_retry(blocked, now_ms=now_ms)
        retry.due_at = wall
        self._state.retry_attempts[key] = retry
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
        return tuple(
            sorted(
                (b for b in self._state.blocked.values() if b.waiting),
                key=lambda b: (b.blocked_at, b.key),
            )
        )

    def session_resume(self, key: SlotKey) -> SessionResume | None:
        """The answered question the slot's next run resumes, if any."""
        return self._state.resumes.get(key)

    async def record_question_posted(self, key: SlotKey, *, action_key: str) -> bool:
        """The question of a waiting slot is on the tracker; ``False`` when that wait is over."""
        async with self._lock:
            blocked = self._state.blocked.get(key)
            if blocked is None or not blocked.waiting or blocked.action_key != action_key:
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
            state = self._state
            blocked = state.blocked.get(key)
            if blocked is None or not blocked.waiting or blocked.action_key != action_key:
                return None
            del state.blocked[key]
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            retry = self._blocked_retry(blocked, now_ms=now_ms)
            retry.kind = RetryKind.CONTINUATION
            retry.due_at = wall
            state.retry_attempts[key] = retry
            state.resumes[key] = resume
            if blocked.failures:
                state.failure_streaks[key] = blocked.failures
            await self._store.save(retry_record(retry, owner=self._store.owner, now=wall))
            await self._save_checkpoint()
            return retry

    async def stop_waiting(self, key: SlotKey, *, action_key: str) -> BlockedEntry | None:
        """A question went unanswered past ``input.timeout_ms``: the slot stays blocked and
        takes the terminal action (``cancel`` counts as ``block``, as for any question)."""
        async with self._lock:
            blocked = self._state.blocked.get(key)
            if blocked is None or not blocked.waiting or blocked.action_key != action_key:
                return None
            action = self._settings.retry.terminal_action
            if action is TerminalAction.CANCEL:
                action = TerminalAction.BLOCK
            wall = self._clock.now()
            blocked.waiting = False
            blocked.action = action
            blocked.action_key = terminal_action_key(
                issue_id=blocked.issue_id,
                slot_index=blocked.slot_index,
                blocked_at=wall,
                reason=blocked.reason,
            )
            blocked.action_done = action is TerminalAction.BLOCK
            blocked.action_error = None
            await self._save_checkpoint()
            return blocked

    def pending_terminal_actions(self) -> tuple[BlockedEntry, ...]:
        """Blocked slots whose escalation or cancel has not been applied yet (oldest first)."""
        return tuple(
            sorted(
                (b for b in self._state.blocked.values() if not b.action_done),
                key=lambda b: (b.blocked_at, b.key),
            )
        )

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
        ordered = sort_for_dispatch(dispatchable_issues(issues, self._rules))
        state = self._state
        claimed = state.claimed
        foreign = state.foreign
        retries = state.retry_attempts
        blocked = state.blocked
        span = self._settings.agent.ensemble_size
        # NB: only the few issues with a claimed, foreign or retrying slot need per-slot checks;
        # every other issue gets its candidates without a single map lookup. Candidates are
        # built with tuple.__new__ and keys with str (SlotKey is a NewType of str, and calling
        # it is a Python-level call): this loop runs once per eligible issue on every tick.
        tracked: set[str] = set()
        for tracked_key in (*claimed, *foreign, *retries, *blocked):
            tracked.add(tracked_key.rpartition("#")[0])
        eligible_tracked: set[str] = set()
        out: list[DispatchCandidate] = []
        append = out.append
        make = tuple.__new__
        as_key = _AS_SLOT_KEY
        for issue in ordered:
            issue_id = issue.id
            if issue_id not in tracked:
                if span == 1:
                    append(make(DispatchCandidate, (issue, 0, as_key(issue_id + "#0"), None)))
                else:
                    for index in range(span):
                        key = as_key(f"{issue_id}#{index}")
                        append(make(DispatchCandidate, (issue, index, key, None)))
                continue
            eligible_tracked.add(issue_id)
            for index in range(span):
                key = as_key(f"{issue_id}#{index}")
                if key in claimed or key in blocked:
                    continue
                held = foreign.get(key)
                if held is not None and held.recheck_at_ms > now_ms:
                    continue
                retry = retries.get(key)
                if retry is not None and retry.due_at_ms > now_ms:
                    continue
                append(make(DispatchCandidate, (issue, index, key, retry)))
        return out, eligible_tracked

    async def _prune_retries_locked(self, eligible_ids: set[str]) -> list[RetryEntry]:
        # NB: "eligible in this pass" is exactly "reconciliation would keep it" (same chain), so
        # the ids seen while building candidates decide, with no second scan of the issues.
        retries = self._state.retry_attempts
        span = self._settings.agent.ensemble_size
        pruned = [
            retry
            for retry in retries.values()
            if retry.issue_id not in eligible_ids or retry.slot_index >= span
        ]
        for retry in pruned:
            del retries[retry.key]
            self._state.continuation_streaks.pop(retry.key, None)
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
                lifetime = reservation_lifetime_ms(placement.acquire_timeout_ms)
                reservation = ReservationRecord(
                    issue=issue,
                    slot_index=candidate.slot_index,
                    token=secrets.token_hex(8),
                    attempt=attempt,
                    reserved_at_ms=now_ms,
                    expires_at_ms=now_ms + lifetime,
                    reserved_at=wall,
                    consumed_retry=current,
                    agent_kind=decision.kind,
                )
                record = reserved_record(reservation, owner=owner, now=wall)
            else:
                entry = RunningEntry(
                    issue=issue,
                    slot_index=candidate.slot_index,
                    attempt=attempt,
                    started_at_ms=now_ms,
                    started_at=wall,
                    host=placement.host,
                    workspace_path=current.workspace_path if current is not None else None,
                    retry_kind=(
                        current.kind
                        if current is not None and current.kind is not RetryKind.PLACEMENT
                        else None
                    ),
                    agent_kind=decision.kind,
                    resume=current.resume if current is not None else None,
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
            retry = current.consumed_retry
            entry = RunningEntry(
                issue=current.issue,
                slot_index=current.slot_index,
                attempt=current.attempt,
                started_at_ms=self._clock.monotonic_ms(),
                started_at=self._clock.now(),
                host=host,
                workspace_path=retry.workspace_path if retry is not None else None,
                retry_kind=(
                    retry.kind
                    if retry is not None and retry.kind is not RetryKind.PLACEMENT
                    else None
                ),
                agent_kind=current.agent_kind,
                resume=retry.resume if retry is not None else None,
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
            wait = placement_wait_ms(failures)
            consumed = current.consumed_retry
            if consumed is not None:
                due_ms = max(consumed.due_at_ms, now_ms + wait)
                retry = dataclasses.replace(
                    consumed,
                    due_at_ms=due_ms,
                    due_at=wall + datetime.timedelta(milliseconds=due_ms - now_ms),
                    error=error,
                    error_code=code,
                )
            else:
                retry = RetryEntry(
                    issue_id=current.issue.id,
                    identifier=current.issue.identifier,
                    slot_index=current.slot_index,
                    attempt=0,
                    kind=RetryKind.PLACEMENT,
                    due_at_ms=now_ms + wait,
                    due_at=wall + datetime.timedelta(milliseconds=wait),
                    error=error,
                    error_code=code,
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

        Usage and cost arrive as running totals and are turned into deltas against the last
        report, so repeats and out-of-order reports never count twice. A new session id counts
        one more turn; if the first totals after it are *lower* than the last report, they are
        a fresh counter (a new session) and count from zero, otherwise they continue the old one
        (Codex reports thread totals across turns).

        Persisted only when something a restart needs changed (session, pid, usage, cost), not
        for plain events or messages, which are the bulk of the traffic.
        """
        async with self._lock:
            entry = self._state.running.get(key)
            if entry is None:
                return None
            now_ms = self._clock.monotonic_ms()
            wall = self._clock.now()
            stamp = update.timestamp_ms if update.timestamp_ms is not None else now_ms
            if entry.last_agent_timestamp_ms is None or stamp >= entry.last_agent_timestamp_ms:
                entry.last_agent_timestamp_ms = stamp
                entry.last_agent_at = wall - datetime.timedelta(milliseconds=max(now_ms - stamp, 0))
                entry.last_agent_event = update.event
                if update.message is not None:
                    entry.last_agent_message = update.message
            persist = False
            if update.session_id and update.session_id != entry.session_id:
                entry.session_id = update.session_id
                entry.turn_count += 1
                self._usage_rebase.add(key)
                self._cost_rebase.add(key)
                persist = True
            if update.pid is not None and update.pid != entry.agent_pid:
                entry.agent_pid = update.pid
                persist = True
            if update.usage is not None:
                reported = update.usage
                last = entry.last_reported
                if key in self._usage_rebase:
                    self._usage_rebase.discard(key)
                    if _dropped_below(reported, last):
                        last = _ZERO_USAGE
                delta = reported.delta_since(last)
                if delta != _ZERO_USAGE:
                    entry.usage = entry.usage + delta
                    persist = True
                entry.last_reported = _max_usage(last, reported)
            if update.cost_usd is not None:
                last_cost = entry.last_reported_cost_usd
                if key in self._cost_rebase:
                    self._cost_rebase.discard(key)
                    if update.cost_usd < last_cost:
                        last_cost = 0.0
                if update.cost_usd > last_cost:
                    entry.cost_usd += update.cost_usd - last_cost
                    persist = True
                entry.last_reported_cost_usd = max(last_cost, update.cost_usd)
            if update.rate_limits is not None:
                self._state.rate_limits = dict(update.rate_limits)
            if persist:
                await self._store.save(running_record(entry, owner=self._store.owner, now=wall))
            return AgentProgress(
                issue_id=entry.issue.id,
                identifier=entry.issue.identifier,
                usage=entry.usage,
                message=entry.last_agent_message,
                at=entry.last_agent_at,
            )

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

        Clean exit: continuation retry, attempt 1, 1000 ms. Fault: failure retry, the entry's
        attempt plus one (a first run counts as 0), ``10000 * 2**(attempt-1)`` ms capped by
        ``retry.backoff``. The run's time and usage go into the totals. The retry
        is written even if the issue is no longer active; the next eligibility pass prunes it.
        ``release=True`` writes no retry and releases the claim instead: the runtime knows the
        issue is done with (a fresh read after the exit said so).

        A failure that uses up ``retry.max_attempts`` consecutive failures, or whose
        ``failure_code`` says the agent asked for input or approval, writes no retry either:
        the slot is blocked (``Finished.blocked``) until a refresh or a change of its issue.
        So is a clean exit past ``agent.max_continuation_runs`` clean runs of the slot in a row
        (``policies.continuations``): its agent keeps stopping without moving the issue.
        ``count_continuation=False`` is for a clean end the agent did not choose (the runtime
        shutting down): the continuation is written, and the count neither grows nor blocks.
        A ``question`` (the run ended because the agent asked) makes the blocked slot
        *waiting* (:attr:`BlockedEntry.waiting`): no failure is counted, no terminal action is
        taken, and an answer (:meth:`answer`) resumes the question's session.
        """
        async with self._lock:
            return await self._finish_locked(
                key, normal=normal, error=error, release=release, failure_code=failure_code,
                count_continuation=count_continuation, question=question,
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
            state.failure_streaks.pop(key, None)
            state.retry_budgets.pop(key, None)
            state.restored_budgets.pop(key, None)
            state.continuation_streaks.pop(key, None)
            await self._store.release(key)
            await self._save_checkpoint()
            return Finished(entry=entry, retry=None)
        retry_settings = self._settings.retry
        recorded = state.restored_budgets.get(key)
        if recorded is not None:
            # NB: a streak recovered at start-up keeps the limit and action it was decided
            # under, not a WORKFLOW.md changed across the restart.
            retry_settings = retry_settings.model_copy(
                update={
                    "max_attempts": recorded.max_attempts,
                    "terminal_action": recorded.terminal_action,
                }
            )
        decision = settle_decision(
            normal=normal,
            failure_code=failure_code,
            previous_attempt=entry.attempt,
            previous_failures=state.failure_streaks.get(key, 0),
            retry=retry_settings,
            previous_continuations=state.continuation_streaks.get(key, 0),
            max_continuation_runs=(
                self._settings.agent.max_continuation_runs if count_continuation else 0
            ),
            on_budget_exhausted=self._settings.budget.on_exhausted,
        )
        if decision.failures:
            state.failure_streaks[key] = decision.failures
            state.retry_budgets[key] = RetryBudget(
                max_attempts=retry_settings.max_attempts,
                terminal_action=retry_settings.terminal_action,
                failure_code=failure_code,
            )
        else:
            state.failure_streaks.pop(key, None)
            state.retry_budgets.pop(key, None)
            state.restored_budgets.pop(key, None)
        if normal and not count_continuation:
            pass  # NB: not the agent's choice: the count stays as it was
        elif decision.continuations and decision.blocked is None:
            state.continuation_streaks[key] = decision.continuations
        else:
            state.continuation_streaks.pop(key, None)
        waiting = question is not None and decision.blocked in QUESTION_CODES.values()
        if waiting:
            # NB: a question is not a failure: the streak stays as it was before this run.
            decision = dataclasses.replace(
                decision,
                failures=state.failure_streaks.get(key, 0),
                action=TerminalAction.BLOCK,
            )
        if decision.blocked is not None:
            assert decision.action is not None
            blocked = BlockedEntry(
                issue_id=entry.issue.id,
                identifier=entry.issue.identifier,
                slot_index=entry.slot_index,
                reason=decision.blocked,
                error=error,
                failures=decision.failures,
                attempt=decision.attempt,
                blocked_at=wall,
                action=decision.action,
                action_key=terminal_action_key(
                    issue_id=entry.issue.id,
                    slot_index=entry.slot_index,
                    blocked_at=wall,
                    reason=decision.blocked,
                ),
                action_done=decision.action is TerminalAction.BLOCK,
                host=entry.host,
                workspace_path=entry.workspace_path,
                error_code=failure_code,
                question=question if waiting else None,
                waiting=waiting,
            )
            state.blocked[key] = blocked
            state.failure_streaks.pop(key, None)  # kept in the entry; an unblock starts at 0
            state.retry_budgets.pop(key, None)
            state.restored_budgets.pop(key, None)
            # NB: the row stays, as a pending retry due at once: it keeps the slot ours in a
            # shared store, and if the checkpoint entry were lost the slot simply retries.
            await self._store.save(retry_record(self._blocked_retry(blocked, now_ms=now_ms),
                                                owner=self._store.owner, now=wall))
            await self._save_checkpoint()
            return Finished(entry=entry, retry=None, blocked=blocked)
        kind = decision.kind or RetryKind.FAILURE
        attempt, delay = decision.attempt, decision.delay_ms
        retry = RetryEntry(
            issue_id=entry.issue.id,
            identifier=entry.issue.identifier,
            slot_index=entry.slot_index,
            attempt=attempt,
            kind=kind,
            due_at_ms=now_ms + delay,
            due_at=wall + datetime.timedelta(milliseconds=delay),
            error=error,
            error_code=failure_code,
            host=entry.host,
            workspace_path=entry.workspace_path,
        )
        state.retry_attempts[key] = retry
        # NB: the retry row first, the checkpoint second. If the process dies in between, the
        # run's usage is lost (undercount); the other order would count it twice on recovery.
        await self._store.save(retry_record(retry, owner=self._store.owner, now=wall))
        await self._save_checkpoint()
        return Finished(entry=entry, retry=retry)

    async def release_retry(self, key: SlotKey) -> None:
        """Drop a pending retry and release its claim row (a no-op for claimed or unknown keys)."""
        async with self._lock:
            if key in self._state.claimed:
                return
            self._state.failure_streaks.pop(key, None)
            self._state.retry_budgets.pop(key, None)
            self._state.restored_budgets.pop(key, None)
            self._state.continuation_streaks.pop(key, None)
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
                entry = state.running.pop(key, None)
                reservation = state.reserved.pop(key, None)
                retry = state.retry_attempts.pop(key, None)
                blocked = state.blocked.pop(key, None)
                state.failure_streaks.pop(key, None)
                state.retry_budgets.pop(key, None)
                state.restored_budgets.pop(key, None)
                state.continuation_streaks.pop(key, None)
                if blocked is not None:
                    unblocked = True
                    touched.append(key)
                if entry is not None:
                    self._add_to_totals(entry, now_ms=now_ms)
                    self._forget_session(key)
                    runs.append(entry)
                if reservation is not None:
                    reservations.append(reservation)
                if retry is not None:
                    retries.append(retry)
                if entry is not None or reservation is not None:
                    state.claimed.discard(key)
                if (entry is not None or reservation is not None or retry is not None) and (
                    blocked is None
                ):
                    touched.append(key)
            for key in touched:
                await self._store.release(key)
            if runs or unblocked:
                await self._save_checkpoint()
            return Released(runs=tuple(runs), reservations=tuple(reservations),
                            retries=tuple(retries))

    async def release_slot(self, key: SlotKey) -> Released:
        """Forget one slot (running, reserved and any retry) without scheduling a retry.

        For a stop that comes from outside, such as a deleted ``Claim``: the slot becomes
        unclaimed and may be dispatched again on the next tick. A running slot's time and usage
        still go into the totals. Returns what was removed (empty for an unknown key).
        """
        async with self._lock:
            state = self._state
            entry = state.running.pop(key, None)
            reservation = state.reserved.pop(key, None)
            retry = state.retry_attempts.pop(key, None)
            blocked = state.blocked.pop(key, None)
            state.failure_streaks.pop(key, None)
            state.retry_budgets.pop(key, None)
            state.restored_budgets.pop(key, None)
            state.continuation_streaks.pop(key, None)
            if entry is None and reservation is None and retry is None and blocked is None:
                return Released()
            state.claimed.discard(key)
            if entry is not None:
                self._add_to_totals(entry, now_ms=self._clock.monotonic_ms())
                self._forget_session(key)
            await self._store.release(key)
            if entry is not None or blocked is not None:
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
        seconds = max(now_ms - entry.started_at_ms, 0.0) / 1000.0
        self._state.usage_totals = _totals_plus(
            self._state.usage_totals, usage=entry.usage, seconds=seconds, cost_usd=entry.cost_usd
        )

    def _forget_session(self, key: SlotKey) -> None:
        self._usage_rebase.discard(key)
        self._cost_rebase.discard(key)

    async def _persist_recovered(
        self,
        interrupted: list[SlotKey],
        *,
        recovered_usage: TokenUsage,
        owner: str,
        now: datetime.datetime,
    ) -> None:
        """After hydration or a takeover: the recovered usage counted once, each interrupted
        run's failure retry and (if usage moved) the checkpoint written."""
        state = self.state
        if recovered_usage != _ZERO_USAGE:
            state.usage_totals = _totals_plus(
                state.usage_totals, usage=recovered_usage, seconds=0.0, cost_usd=0.0
            )
        for key in interrupted:
            await self._store.save(retry_record(state.retry_attempts[key], owner=owner, now=now))
        if recovered_usage != _ZERO_USAGE:
            await self._save_checkpoint()

    async def _save_checkpoint(self) -> None:
        state = self._state
        checkpoint = Checkpoint.of(
            usage_totals=state.usage_totals,
            failure_streaks=state.failure_streaks,
            retry_budgets=state.retry_budgets,
            blocked=state.blocked,
            resumes={
                key: resume
                for key, resume in state.resumes.items()
                if key in state.retry_attempts or key in state.claimed
            },
        )
        await self._store.save_checkpoint(checkpoint.to_json())

    # -- snapshot -----------------------------------------------------------------------------

    def snapshot(self) -> OrchestratorSnapshot:
        """The lanes right now, as frozen rows; totals include the runs still going."""
        return orchestrator_snapshot(
            self._state, now_ms=self._clock.monotonic_ms(), wall=self._clock.now()
        )

    def run_identities(self) -> tuple[RunIdentity, ...]:
        """Each slot running, reserved or waiting for a retry: its issue and session only."""
        return run_identities(self._state)
