"""The deterministic dispatch order."""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from lorenz.policies import UNRANKED_PRIORITY, dispatch_sort_key, priority_rank, sort_for_dispatch
from tests.orchestrator.factories import EPOCH, issue


def ids(issues: list) -> list[str]:  # type: ignore[type-arg]
    return [i.id for i in issues]


def test_priority_first_then_oldest_creation() -> None:
    """Dispatch sorts by priority, then oldest creation time."""
    issues = [
        issue(1, priority=2, created=1),
        issue(2, priority=1, created=5),
        issue(3, priority=2, created=0),
        issue(4, priority=1, created=2),
    ]
    assert ids(sort_for_dispatch(issues)) == ["i4", "i2", "i3", "i1"]


def test_only_one_to_four_are_real_priorities() -> None:
    assert [priority_rank(p) for p in (1, 2, 3, 4)] == [1, 2, 3, 4]
    for odd in (None, 0, 5, 99, -1):
        assert priority_rank(odd) == UNRANKED_PRIORITY
    issues = [
        issue(1, priority=None),
        issue(2, priority=0),
        issue(3, priority=4),
        issue(4, priority=7),
    ]
    assert ids(sort_for_dispatch(issues))[0] == "i3"


def test_missing_creation_time_sorts_last_within_a_priority() -> None:
    issues = [
        issue(1, priority=3),
        issue(2, priority=3, created=100),
        issue(3, priority=3, created=1),
    ]
    assert ids(sort_for_dispatch(issues)) == ["i3", "i2", "i1"]


def test_identifier_then_id_break_ties() -> None:
    issues = [
        issue(1, identifier="ABC-9"),
        issue(2, identifier="ABC-10"),
        issue(3, identifier="ABC-10"),
    ]
    # lexicographic: "ABC-10" < "ABC-9"; then id
    assert ids(sort_for_dispatch(issues)) == ["i2", "i3", "i1"]


def test_naive_timestamps_are_taken_as_utc() -> None:
    aware = issue(1)
    naive = issue(2)
    object.__setattr__(aware, "created_at", EPOCH + datetime.timedelta(hours=2))
    object.__setattr__(naive, "created_at", datetime.datetime(2026, 1, 1, 1, 0))  # 01:00 UTC
    assert ids(sort_for_dispatch([aware, naive])) == ["i2", "i1"]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-1, 6)), st.one_of(st.none(), st.integers(0, 5))
        ),
        max_size=12,
    )
)
def test_order_does_not_depend_on_input_order(specs: list[tuple[int | None, int | None]]) -> None:
    issues = [issue(n, priority=p, created=c) for n, (p, c) in enumerate(specs)]
    forward = ids(sort_for_dispatch(issues))
    backward = ids(sort_for_dispatch(list(reversed(issues))))
    assert forward == backward
    keys = [dispatch_sort_key(i) for i in sort_for_dispatch(issues)]
    assert keys == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.booleans(), st.integers(-1, 6)),
            st.one_of(st.none(), st.integers(0, 3)),
            st.booleans(),
            st.sampled_from(["ABC-1", "ABC-2", "ABC-10"]),
        ),
        max_size=15,
    )
)
def test_the_fast_sort_equals_sorting_by_the_reference_key(
    specs: list[tuple[int | None, int | None, bool, str]],
) -> None:
    """Including bool priorities, equal identifiers and lists mixing naive and aware times."""
    issues = []
    for n, (priority, hours, naive, identifier) in enumerate(specs):
        made = issue(n, priority=None, created=hours, identifier=identifier)
        object.__setattr__(made, "priority", priority)
        if naive and made.created_at is not None:
            object.__setattr__(made, "created_at", made.created_at.replace(tzinfo=None))
        issues.append(made)
    assert ids(sort_for_dispatch(issues)) == ids(sorted(issues, key=dispatch_sort_key))
