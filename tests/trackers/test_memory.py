"""The memory tracker: the deterministic stand-in the runtime's tests and benchmarks poll."""

from __future__ import annotations

import pytest

from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef, Issue
from lorenz.trackers import TrackerError
from lorenz.trackers.memory import MemoryTracker


def issue(n: int, state: str = "Todo", **extra: object) -> Issue:
    return Issue(id=f"id-{n}", identifier=f"MEM-{n}", title=f"Issue {n}", state=state, **extra)  # type: ignore[arg-type]


@pytest.fixture
def tracker() -> MemoryTracker:
    return MemoryTracker(
        [issue(1), issue(2, "In Progress"), issue(3, "Done"), issue(4, " todo ")],
        settings=TrackerSettings(kind="memory"),
    )


async def test_candidates_are_the_active_states_compared_trimmed_and_lowercased(
    tracker: MemoryTracker,
) -> None:
    got = await tracker.fetch_candidate_issues()
    assert [i.id for i in got] == ["id-1", "id-2", "id-4"]


async def test_settings_may_be_the_whole_workflow() -> None:
    settings = WorkflowSettings(tracker=TrackerSettings(kind="memory", active_states=("Done",)))
    tracker = MemoryTracker([issue(1), issue(2, "Done")], settings=settings)
    assert [i.id for i in await tracker.fetch_candidate_issues()] == ["id-2"]


async def test_by_states_and_by_ids(tracker: MemoryTracker) -> None:
    assert [i.id for i in await tracker.fetch_issues_by_states(["DONE"])] == ["id-3"]
    got = await tracker.fetch_issues_by_ids(["id-3", "gone", "id-1", "id-3"])
    assert [i.id for i in got] == ["id-3", "id-1"]


async def test_empty_inputs_make_no_request(tracker: MemoryTracker) -> None:
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await tracker.fetch_issues_by_states([]) == []
    assert tracker.requests["fetch_issues_by_ids"] == 0
    assert tracker.requests["fetch_issues_by_states"] == 0
    assert tracker.calls["fetch_issues_by_ids"] == 1
    assert tracker.calls["fetch_issues_by_states"] == 1
    await tracker.fetch_issues_by_ids(["id-1"])
    assert tracker.requests["fetch_issues_by_ids"] == 1


async def test_moving_adding_and_removing_issues_is_seen_on_the_next_read(
    tracker: MemoryTracker,
) -> None:
    tracker.set_state("id-1", "Done")
    tracker.remove("id-2")
    tracker.add(issue(5))
    tracker.update("id-4", title="renamed")
    got = await tracker.fetch_candidate_issues()
    assert [(i.id, i.title) for i in got] == [("id-4", "renamed"), ("id-5", "Issue 5")]
    with pytest.raises(ValueError, match="already on the board"):
        tracker.add(issue(5))
    with pytest.raises(KeyError):
        tracker.remove("id-2")


async def test_blockers_report_the_boards_current_state() -> None:
    tracker = MemoryTracker(
        [
            issue(1, blocked_by=(BlockerRef(identifier="MEM-2"), BlockerRef(id="elsewhere"))),
            issue(2, "In Progress"),
        ],
        settings=TrackerSettings(),
    )
    (first, _) = await tracker.fetch_candidate_issues()
    assert first.blocked_by == (
        BlockerRef(id="id-2", identifier="MEM-2", state="In Progress"),
        BlockerRef(id="elsewhere"),
    )
    tracker.set_state("id-2", "Done")
    (first,) = await tracker.fetch_candidate_issues()
    assert first.blocked_by[0].state == "Done"


async def test_fail_next_fails_that_many_requests_then_recovers(tracker: MemoryTracker) -> None:
    tracker.fail_next(2)
    for _ in range(2):
        with pytest.raises(TrackerError) as err:
            await tracker.fetch_candidate_issues()
        assert err.value.code == "tracker_request"
        assert err.value.retryable
    assert len(await tracker.fetch_candidate_issues()) == 3
    assert tracker.requests["fetch_candidate_issues"] == 3


async def test_fail_next_can_target_one_method_and_a_given_error(tracker: MemoryTracker) -> None:
    boom = TrackerError("boom", code="linear_api_status")
    tracker.fail_next(1, boom, methods=["fetch_issues_by_ids"])
    assert len(await tracker.fetch_candidate_issues()) == 3  # not the targeted method
    assert await tracker.fetch_issues_by_ids([]) == []  # no request, failure not used up
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_ids(["id-1"])
    assert err.value is boom
    assert [i.id for i in await tracker.fetch_issues_by_ids(["id-1"])] == ["id-1"]
    with pytest.raises(ValueError, match="unknown methods"):
        tracker.fail_next(1, methods=["fetch_everything"])


async def test_views_share_the_board_counters_and_failures(tracker: MemoryTracker) -> None:
    reloaded = tracker.with_settings(TrackerSettings(active_states=("Done",)))
    assert [i.id for i in await reloaded.fetch_candidate_issues()] == ["id-3"]
    tracker.set_state("id-1", "Done")
    assert [i.id for i in await reloaded.fetch_candidate_issues()] == ["id-1", "id-3"]
    assert tracker.requests["fetch_candidate_issues"] == 2
    await tracker.close()
    assert reloaded.close_count == 1
    assert len(await reloaded.fetch_candidate_issues()) == 2  # closing a view keeps the board


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        MemoryTracker([issue(1), issue(1)])
