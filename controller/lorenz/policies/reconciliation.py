"""Whether a tracked slot (running, reserving or retrying) may go on, given a fresh issue.

Reconciliation asks the same question dispatch asks — would this issue be dispatched now? — and
names the first reason it would not. The reasons drive what the runtime does next: ``terminal``
also removes the workspace; every other reason stops the run and keeps the workspace.

Order: ``missing`` (the tracker no longer returns the id), ``terminal``, ``inactive``,
``unrouted``, ``blocked``. A malformed refresh counts as ``inactive`` (its state is blank or
unusable).
"""

from __future__ import annotations

from lorenz.model import Issue, StopReason
from lorenz.policies.eligibility import IssueRules, has_open_blockers, is_routable


def reconciliation_decision(issue: Issue | None, rules: IssueRules) -> StopReason | None:
    """``None`` to keep the slot going, else why it must stop."""
    if issue is None:
        return StopReason.MISSING
    state = issue.state_key
    if state in rules.terminal_states:
        return StopReason.TERMINAL
    if state not in rules.active_states or not issue.is_well_formed():
        return StopReason.INACTIVE
    if not is_routable(issue, rules):
        return StopReason.UNROUTED
    if has_open_blockers(issue, rules):
        return StopReason.BLOCKED
    return None
