"""Agent progress: folding an agent's running reports into its slot's entry, and the totals.

Why a module of its own: agents report usage and cost as running totals, repeated and out of
order, and restart their counters with a new session; turning those into deltas that never
count twice is arithmetic with traps of its own, kept apart from the slot transitions of
:class:`~lorenz.orchestrator.scheduling.Orchestrator` and tested through it. Nothing here does
I/O or holds a lock: the orchestrator calls these under its lock and persists what they say.
"""

from __future__ import annotations

import datetime

from lorenz.model import AgentUpdate, RunningEntry, SlotKey, TokenUsage, UsageTotals
from lorenz.orchestrator.results import AgentProgress

ZERO_USAGE = TokenUsage()


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


def totals_plus(
    totals: UsageTotals, *, usage: TokenUsage, seconds: float, cost_usd: float
) -> UsageTotals:
    """``totals`` with one run's (or a recovery's) usage, time and cost added."""
    return UsageTotals(
        input_tokens=totals.input_tokens + usage.input_tokens,
        output_tokens=totals.output_tokens + usage.output_tokens,
        total_tokens=totals.total_tokens + usage.total_tokens,
        seconds_running=totals.seconds_running + seconds,
        cost_usd=totals.cost_usd + cost_usd,
    )


def totals_with_run(totals: UsageTotals, entry: RunningEntry, *, now_ms: float) -> UsageTotals:
    """``totals`` with a run that ends now added (its time since it started, usage and cost)."""
    seconds = max(now_ms - entry.started_at_ms, 0.0) / 1000.0
    return totals_plus(totals, usage=entry.usage, seconds=seconds, cost_usd=entry.cost_usd)


def fold_update(
    entry: RunningEntry,
    update: AgentUpdate,
    *,
    key: SlotKey,
    now_ms: float,
    wall: datetime.datetime,
    usage_rebase: set[SlotKey],
    cost_rebase: set[SlotKey],
) -> bool:
    """Fold one progress report into ``entry``; whether something a restart needs changed.

    Usage and cost arrive as running totals and are turned into deltas against the last
    report, so repeats and out-of-order reports never count twice. A new session id counts
    one more turn and puts the slot in ``usage_rebase`` and ``cost_rebase``: if the first
    totals after it are *lower* than the last report, they are a fresh counter (a new session)
    and count from zero, otherwise they continue the old one (Codex reports thread totals
    across turns). The flag is ``True`` for a session, pid, usage or cost change, not for
    plain events or messages, which are the bulk of the traffic.
    """
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
        usage_rebase.add(key)
        cost_rebase.add(key)
        persist = True
    if update.pid is not None and update.pid != entry.agent_pid:
        entry.agent_pid = update.pid
        persist = True
    if update.usage is not None:
        reported = update.usage
        last = entry.last_reported
        if key in usage_rebase:
            usage_rebase.discard(key)
            if _dropped_below(reported, last):
                last = ZERO_USAGE
        delta = reported.delta_since(last)
        if delta != ZERO_USAGE:
            entry.usage = entry.usage + delta
            persist = True
        entry.last_reported = _max_usage(last, reported)
    if update.cost_usd is not None:
        last_cost = entry.last_reported_cost_usd
        if key in cost_rebase:
            cost_rebase.discard(key)
            if update.cost_usd < last_cost:
                last_cost = 0.0
        if update.cost_usd > last_cost:
            entry.cost_usd += update.cost_usd - last_cost
            persist = True
        entry.last_reported_cost_usd = max(last_cost, update.cost_usd)
    return persist


def progress_of(entry: RunningEntry) -> AgentProgress:
    """What a running entry shows now, for the runtime's listeners."""
    return AgentProgress(
        issue_id=entry.issue.id,
        identifier=entry.issue.identifier,
        usage=entry.usage,
        message=entry.last_agent_message,
        at=entry.last_agent_at,
    )
