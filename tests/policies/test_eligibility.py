"""The eligibility chain: every link on its own, and the fast form agreeing with the reference."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lorenz.model import BlockerRef, Issue, RetryEntry, RetryKind, SlotKey
from lorenz.policies import (
    Ineligibility,
    IssueRules,
    dispatchable_issues,
    is_routable,
    issue_ineligibility,
    slot_ineligibility,
)
from tests.orchestrator.factories import EPOCH, issue

RULES = IssueRules.build(
    active_states=("Todo", "In Progress"),
    terminal_states=("Done", "Cancelled"),
)
LABELLED = IssueRules.build(
    active_states=("Todo", "In Progress"),
    terminal_states=("Done", "Cancelled"),
    required_labels=(" Agent ", "BACKEND"),
)


def test_an_ordinary_active_issue_is_eligible() -> None:
    assert issue_ineligibility(issue(state="Todo"), RULES) is None


@pytest.mark.parametrize("state", ["todo", "  TODO ", "In progress", "in PROGRESS"])
def test_states_compare_trimmed_and_lowercased(state: str) -> None:
    assert issue_ineligibility(issue(state=state), RULES) is None


@pytest.mark.parametrize("field", ["id", "identifier", "title", "state"])
def test_a_blank_required_field_is_malformed(field: str) -> None:
    changes: dict[str, Any] = {field: "  "}
    blank = dataclasses.replace(issue(), **changes)
    assert issue_ineligibility(blank, RULES) is Ineligibility.MALFORMED
    assert dispatchable_issues([blank], RULES) == []


def test_a_state_outside_the_active_list_is_inactive() -> None:
    assert issue_ineligibility(issue(state="Backlog"), RULES) is Ineligibility.INACTIVE


def test_terminal_wins_over_active_when_a_state_is_in_both_lists() -> None:
    rules = IssueRules.build(active_states=("Todo", "Done"), terminal_states=("done",))
    assert issue_ineligibility(issue(state="Done"), rules) is Ineligibility.TERMINAL
    assert not rules.is_active_state("Done")
    assert rules.is_terminal_state(" DONE ")


def test_dispatchable_false_is_unrouted() -> None:
    """An issue with dispatchable = false is not eligible."""
    assert issue_ineligibility(issue(dispatchable=False), RULES) is Ineligibility.UNROUTED


def test_required_labels_must_all_be_present_case_insensitively() -> None:
    """Required-label filtering is case-insensitive, after normalization."""
    assert LABELLED.required_labels == ("agent", "backend")
    assert is_routable(issue(labels=["AGENT", " Backend", "extra"]), LABELLED)
    assert not is_routable(issue(labels=["agent"]), LABELLED)
    assert issue_ineligibility(issue(labels=["backend"]), LABELLED) is Ineligibility.UNROUTED
    assert issue_ineligibility(issue(labels=["agent", "backend"]), LABELLED) is None


def test_todo_with_a_non_terminal_blocker_is_blocked() -> None:
    """A Todo issue with non-terminal blockers is not eligible."""
    blocked = issue(state="Todo", blockers=["In Progress"])
    assert issue_ineligibility(blocked, RULES) is Ineligibility.BLOCKED


def test_todo_whose_blockers_are_all_terminal_is_eligible() -> None:
    """A Todo issue whose blockers are all terminal is eligible."""
    assert issue_ineligibility(issue(state="Todo", blockers=["Done", " cancelled "]), RULES) is None


def test_the_blocker_rule_applies_to_every_active_state_not_only_todo() -> None:
    blocked = issue(state="In Progress", blockers=["Todo"])
    assert issue_ineligibility(blocked, RULES) is Ineligibility.BLOCKED


def test_a_blocker_with_unknown_state_blocks() -> None:
    assert issue_ineligibility(issue(blockers=[None]), RULES) is Ineligibility.BLOCKED


def test_the_first_failing_link_names_the_reason() -> None:
    # terminal beats unrouted and blocked; unrouted beats blocked
    assert (
        issue_ineligibility(issue(state="Done", dispatchable=False, blockers=["Todo"]), RULES)
        is Ineligibility.TERMINAL
    )
    assert (
        issue_ineligibility(issue(dispatchable=False, blockers=["Todo"]), RULES)
        is Ineligibility.UNROUTED
    )


def test_dispatchable_issues_keeps_the_input_order() -> None:
    issues = [issue(3), issue(1, state="Done"), issue(2), issue(4, blockers=["Todo"])]
    assert [i.id for i in dispatchable_issues(issues, RULES)] == ["i3", "i2"]


def _retry(due_at_ms: float) -> RetryEntry:
    return RetryEntry(
        issue_id="i1",
        identifier="ABC-1",
        slot_index=0,
        attempt=1,
        kind=RetryKind.FAILURE,
        due_at_ms=due_at_ms,
        due_at=EPOCH,
    )


def test_slot_links_claimed_and_retry_due() -> None:
    key = SlotKey("i1#0")
    assert slot_ineligibility(key, claimed={key}, retry=None, now_ms=0) is Ineligibility.CLAIMED
    assert (
        slot_ineligibility(key, claimed=set(), retry=_retry(100.0), now_ms=99.0)
        is Ineligibility.NOT_DUE
    )
    assert slot_ineligibility(key, claimed=set(), retry=_retry(100.0), now_ms=100.0) is None
    assert slot_ineligibility(key, claimed=set(), retry=None, now_ms=0) is None


STATES = st.sampled_from(["Todo", "todo ", "In Progress", "Done", "Backlog", "", " ", "cancelled"])
LABELS = st.lists(st.sampled_from(["agent", "AGENT", "backend", "ui", " "]), max_size=3)


@st.composite
def random_issue(draw: st.DrawFn) -> Issue:
    return Issue(
        id=draw(st.sampled_from(["i1", "i2", " ", "i3"])),
        identifier=draw(st.sampled_from(["ABC-1", "", "ABC-2"])),
        title=draw(st.sampled_from(["t", " "])),
        state=draw(STATES),
        labels=tuple(draw(LABELS)),
        blocked_by=tuple(
            BlockerRef(state=s) for s in draw(st.lists(st.one_of(st.none(), STATES), max_size=2))
        ),
        dispatchable=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(random_issue(), max_size=8), st.sampled_from([RULES, LABELLED]))
def test_the_fast_chain_agrees_with_the_reference_chain(
    issues: list[Issue], rules: IssueRules
) -> None:
    expected = [i for i in issues if issue_ineligibility(i, rules) is None]
    assert dispatchable_issues(issues, rules) == expected


@settings(max_examples=300, deadline=None)
@given(random_issue(), st.sampled_from([RULES, LABELLED]))
def test_reconciliation_keeps_exactly_what_dispatch_would_take(
    candidate: Issue, rules: IssueRules
) -> None:
    """The orchestrator prunes retries by eligibility; that must equal the reconcile verdict."""
    from lorenz.policies import reconciliation_decision

    keep = reconciliation_decision(candidate, rules) is None
    assert keep == (issue_ineligibility(candidate, rules) is None)
