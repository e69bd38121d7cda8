"""Dispatch candidates: every free slot of every dispatchable issue, in dispatch order, and
the retries a full candidate list prunes.

Why a module of its own: this runs once per eligible issue on every tick, so it is written for
speed (see the ``NB`` below) and kept apart from the slot transitions of
:class:`~lorenz.orchestrator.scheduling.Orchestrator`, which calls it under its lock. It reads
the state and changes nothing; the caps are applied later, per claim
(:mod:`lorenz.policies.admission`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from lorenz.model import Issue, RetryEntry, SlotKey
from lorenz.orchestrator.results import DispatchCandidate
from lorenz.orchestrator.state import OrchestratorState
from lorenz.policies import IssueRules, dispatchable_issues, sort_for_dispatch

_AS_SLOT_KEY = cast("Callable[[str], SlotKey]", str)


def dispatch_candidates(
    state: OrchestratorState,
    issues: Sequence[Issue],
    *,
    rules: IssueRules,
    span: int,
    now_ms: float,
) -> tuple[list[DispatchCandidate], set[str]]:
    """The sorted candidates, and the ids of eligible issues that have a tracked slot.

    ``span`` is ``agent.ensemble_size`` (slots per issue). A slot claimed here or blocked is
    no candidate; nor is one held by another owner until its recheck time, or one whose retry
    is not due yet.
    """
    ordered = sort_for_dispatch(dispatchable_issues(issues, rules))
    claimed = state.claimed
    foreign = state.foreign
    retries = state.retry_attempts
    blocked = state.blocked
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


def prune_retries(
    state: OrchestratorState, eligible_ids: set[str], *, span: int
) -> list[RetryEntry]:
    """Drop the pending retries whose issue is not eligible in this pass, or whose slot index
    is beyond ``span`` (their rows are the caller's to release)."""
    # NB: "eligible in this pass" is exactly "reconciliation would keep it" (same chain), so
    # the ids seen while building candidates decide, with no second scan of the issues.
    retries = state.retry_attempts
    pruned = [
        retry
        for retry in retries.values()
        if retry.issue_id not in eligible_ids or retry.slot_index >= span
    ]
    for retry in pruned:
        del retries[retry.key]
        state.continuation_streaks.pop(retry.key, None)
    return pruned
