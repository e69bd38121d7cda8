"""Which issues may be dispatched at all: the eligibility chain, as pure predicates.

The chain is split from the orchestrator so that the same predicates gate dispatch, retries and
reconciliation (a run keeps going only while its issue would still be dispatched), and so that
every link can be tested on a plain :class:`~lorenz.model.Issue` without any scheduling state.

The issue-level links, in order: well-formed, in an active state, not in a terminal state,
routable (``dispatchable`` and every ``tracker.required_labels`` entry present), and no open
blocker. The slot-level links (not already claimed, retry due) need the orchestrator's state and
live in :func:`slot_ineligibility`.

NB: the blocker rule applies to every active state, not only ``Todo`` as in the first draft of
the Symphony specification (see ``docs/architecture.md``): an issue moved to ``In Progress``
while something still blocks it is not worked on either. A blocker in a terminal state does not
block; a blocker with an unknown (``None``) state does.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from lorenz.config import WorkflowSettings
from lorenz.model import Issue, RetryEntry, SlotKey
from lorenz.model.issues import normalize_state


class Ineligibility(enum.StrEnum):
    """Why an issue (or one of its slots) is not a dispatch candidate right now."""

    MALFORMED = "malformed"
    """``id``, ``identifier``, ``title`` or ``state`` is blank."""
    INACTIVE = "inactive"
    """The state is not one of ``tracker.active_states``."""
    TERMINAL = "terminal"
    """The state is one of ``tracker.terminal_states`` (this wins over being active)."""
    UNROUTED = "unrouted"
    """``dispatchable`` is false, or a required label is missing."""
    BLOCKED = "blocked"
    """At least one blocker is not in a terminal state."""
    CLAIMED = "claimed"
    """The slot is running or reserved (here, or by another live owner)."""
    NOT_DUE = "not_due"
    """The slot waits for a retry whose deadline has not passed."""


@dataclasses.dataclass(frozen=True, slots=True)
class IssueRules:
    """The tracker settings the chain reads, normalized once per settings object.

    NB: build it once per settings swap (:meth:`from_settings`), not per issue: normalizing the
    state lists for every issue is what makes a naive chain slow on 10k candidates.
    """

    active_states: frozenset[str]
    terminal_states: frozenset[str]
    required_labels: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: WorkflowSettings) -> IssueRules:
        return cls.build(
            active_states=settings.tracker.active_states,
            terminal_states=settings.tracker.terminal_states,
            required_labels=settings.tracker.required_labels,
        )

    @classmethod
    def build(
        cls,
        *,
        active_states: Iterable[str],
        terminal_states: Iterable[str],
        required_labels: Iterable[str] = (),
    ) -> IssueRules:
        labels: dict[str, None] = {}
        for label in required_labels:
            norm = normalize_state(label)
            if norm:
                labels.setdefault(norm, None)
        return cls(
            active_states=frozenset(normalize_state(s) for s in active_states),
            terminal_states=frozenset(normalize_state(s) for s in terminal_states),
            required_labels=tuple(labels),
        )

    def is_terminal_state(self, state: str | None) -> bool:
        return normalize_state(state) in self.terminal_states

    def is_active_state(self, state: str | None) -> bool:
        """Active and not terminal (a state listed in both counts as terminal)."""
        norm = normalize_state(state)
        return norm in self.active_states and norm not in self.terminal_states


def is_routable(issue: Issue, rules: IssueRules) -> bool:
    """``dispatchable`` is true and every required label is on the issue."""
    if not issue.dispatchable:
        return False
    labels = issue.labels  # already normalized by Issue itself
    return all(label in labels for label in rules.required_labels)


def has_open_blockers(issue: Issue, rules: IssueRules) -> bool:
    """Whether any blocker is not (known to be) in a terminal state."""
    terminal = rules.terminal_states
    return any(normalize_state(b.state) not in terminal for b in issue.blocked_by)


def issue_ineligibility(issue: Issue, rules: IssueRules) -> Ineligibility | None:
    """The first failing issue-level link of the chain, or ``None`` when the issue may run.

    This is the reference form of the chain; :func:`dispatchable_issues` is the fast form used
    on whole candidate lists and must always agree with it (a property test checks that).
    """
    if not issue.is_well_formed():
        return Ineligibility.MALFORMED
    state = issue.state_key
    if state in rules.terminal_states:
        return Ineligibility.TERMINAL
    if state not in rules.active_states:
        return Ineligibility.INACTIVE
    if not is_routable(issue, rules):
        return Ineligibility.UNROUTED
    if has_open_blockers(issue, rules):
        return Ineligibility.BLOCKED
    return None


def dispatchable_issues(issues: Sequence[Issue], rules: IssueRules) -> list[Issue]:
    """The issues that pass every issue-level link, in their original order.

    NB: this is the hot loop of every tick, written for speed (10k candidates in a few ms):
    the per-call caches key on the tracker's raw state spelling, since a candidate list holds
    thousands of issues but only a handful of distinct states (and blocker states); the common
    single required label is a plain membership test; no generator or helper call per issue.
    """
    active = rules.active_states
    terminal = rules.terminal_states
    required = rules.required_labels
    single_label = required[0] if len(required) == 1 else None
    more_labels = required if len(required) > 1 else ()
    state_ok: dict[str, bool] = {}
    blocker_open: dict[str | None, bool] = {}
    out: list[Issue] = []
    append = out.append
    for issue in issues:
        state = issue.state
        ok = state_ok.get(state)
        if ok is None:
            norm = normalize_state(state)
            ok = state_ok[state] = norm in active and norm not in terminal
        if not ok or not issue.dispatchable:
            continue
        if single_label is not None:
            if single_label not in issue.labels:
                continue
        elif more_labels:
            labels = issue.labels
            missing = False
            for label in more_labels:
                if label not in labels:
                    missing = True
                    break
            if missing:
                continue
        blockers = issue.blocked_by
        if blockers:
            blocked = False
            for blocker in blockers:
                blocker_state = blocker.state
                is_open = blocker_open.get(blocker_state)
                if is_open is None:
                    is_open = normalize_state(blocker_state) not in terminal
                    blocker_open[blocker_state] = is_open
                if is_open:
                    blocked = True
                    break
            if blocked:
                continue
        # Well-formedness last: it is the rarest failure, and the state check above already
        # rejected a blank state (active states are never blank).
        if not (issue.id.strip() and issue.identifier.strip() and issue.title.strip()):
            continue
        append(issue)
    return out


def retry_is_due(retry: RetryEntry, *, now_ms: float) -> bool:
    """A retry may be dispatched once its monotonic deadline has passed (or is exactly now)."""
    return retry.due_at_ms <= now_ms


def slot_ineligibility(
    key: SlotKey,
    *,
    claimed: frozenset[SlotKey] | set[SlotKey],
    retry: RetryEntry | None,
    now_ms: float,
) -> Ineligibility | None:
    """The slot-level links: not already claimed, and any pending retry is due."""
    if key in claimed:
        return Ineligibility.CLAIMED
    if retry is not None and not retry_is_due(retry, now_ms=now_ms):
        return Ineligibility.NOT_DUE
    return None
