"""The Linear tracker against the fake Linear server (which validates every query)."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import graphql
import pytest

from lorenz.config import TrackerSettings
from lorenz.model import BlockerRef
from lorenz.trackers import TrackerError
from lorenz.trackers.linear import (
    QUERIES,
    LinearTracker,
    normalize_issue,
    parse_priority,
)
from tests.fakes.linear_server import FakeLinearServer, validate_linear_document

MakeTracker = Callable[..., LinearTracker]


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
async def make_tracker(
    linear_server: FakeLinearServer, sleeps: list[float]
) -> AsyncIterator[MakeTracker]:
    made: list[LinearTracker] = []

    async def recording_sleep(delay: float) -> None:
        sleeps.append(delay)
        await asyncio.sleep(delay)

    def make(
        *,
        api_key: str | None = None,
        provider: dict[str, Any] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        **settings: Any,
    ) -> LinearTracker:
        tracker = LinearTracker(
            settings=TrackerSettings(
                kind="linear",
                endpoint=linear_server.url,
                project_slug=linear_server.project_slug,
                provider=provider or {},
                **settings,
            ),
            api_key=linear_server.api_key if api_key is None else api_key,
            sleep=sleep or recording_sleep,
        )
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        await tracker.close()


def operation(linear_server: FakeLinearServer, index: int = -1) -> graphql.DocumentNode:
    query = linear_server.requests[index].query
    assert query is not None
    return graphql.parse(query)


@pytest.fixture(autouse=True)
def no_rejected_queries(linear_server: FakeLinearServer) -> Any:
    """Every query any test here sends must be valid against Linear's schema, unless the test
    says otherwise by clearing ``linear_server.requests``."""
    yield
    assert [
        r.validation_errors for r in linear_server.rejected if r.operation_name != "Invalid"
    ] == []


# -- the queries themselves ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_validates_against_the_linear_schema(name: str) -> None:
    assert validate_linear_document(QUERIES[name]) == []


async def test_the_fake_rejects_a_query_linear_would_reject(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    with pytest.raises(TrackerError) as err:
        await tracker.execute_graphql(query="query Invalid { issues { nodes { noSuchField } } }")
    assert err.value.code == "linear_api_status"
    assert "noSuchField" in str(err.value)
    (rejected,) = linear_server.rejected
    assert rejected.status == 400
    assert "Cannot query field 'noSuchField' on type 'Issue'." in rejected.validation_errors[0]
    # Wrong argument types are caught as well: ids must be [ID!], not [Int!].
    assert validate_linear_document(
        "query Q($ids: [Int!]!) { issues(filter: {id: {in: $ids}}) { nodes { id } } }"
    )


# -- candidates -----------------------------------------------------------------------------------


async def test_candidates_come_from_the_project_and_the_active_states(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    todo = linear_server.add_issue(title="Todo one")
    doing = linear_server.add_issue(title="Doing", state="In Progress")
    linear_server.add_issue(title="Done", state="Done")
    linear_server.add_issue(title="Backlog", state="Backlog")
    linear_server.add_issue(title="Other project", project="other-project-1234")
    linear_server.add_issue(title="No project", in_project=False)
    got = await make_tracker().fetch_candidate_issues()
    assert [i.id for i in got] == [todo.id, doing.id]
    (request,) = linear_server.requests
    assert request.operation_name == "LorenzIssuesByStates"
    assert request.variables["projectSlug"] == linear_server.project_slug
    assert request.variables["stateNames"] == ["Todo", "In Progress"]
    assert request.variables["first"] == 50


async def test_the_project_filter_uses_slug_id(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    await make_tracker().fetch_candidate_issues()
    project_filters = []

    class Visitor(graphql.Visitor):
        def enter_object_field(self, node: graphql.ObjectFieldNode, *_: Any) -> None:
            if node.name.value == "project":
                project_filters.append(graphql.print_ast(node.value))

    graphql.visit(operation(linear_server), Visitor())
    assert project_filters == ["{ slugId: { eq: $projectSlug } }"]


async def test_empty_inputs_make_no_request(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    assert await tracker.fetch_issues_by_states([]) == []
    assert await tracker.fetch_issues_by_states(["  "]) == []
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await make_tracker(active_states=()).fetch_candidate_issues() == []
    assert linear_server.requests == []


async def test_pagination_keeps_order_across_pages(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    seeded = [linear_server.add_issue(title=f"Issue {n}") for n in range(23)]
    got = await make_tracker(provider={"page_size": 10}).fetch_issues_by_states(["Todo"])
    assert [i.id for i in got] == [s.id for s in seeded]
    requests = linear_server.requests_for("LorenzIssuesByStates")
    assert [r.variables["after"] for r in requests] == [
        None,
        f"cursor:{seeded[9].id}",
        f"cursor:{seeded[19].id}",
    ]
    assert {r.variables["first"] for r in requests} == {10}


async def test_an_issue_leaving_the_states_between_pages_restarts_the_scan(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    # The fake refuses a cursor whose issue is no longer in the filtered list, as a server
    # may; an agent moving its issue to Done between two pages of a scan must not fail the poll.
    seeded = [linear_server.add_issue(title=f"Issue {n}") for n in range(5)]

    def move_the_first_page_end(record: Any) -> None:
        if record.operation_name == "LorenzIssuesByStates" and record.variables["after"] is None:
            linear_server.after_answer = None
            linear_server.set_state(seeded[1].id, "Done")

    linear_server.after_answer = move_the_first_page_end
    got = await make_tracker(provider={"page_size": 2}).fetch_issues_by_states(["Todo"])
    assert [i.id for i in got] == [s.id for n, s in enumerate(seeded) if n != 1]
    afters = [r.variables["after"] for r in linear_server.requests_for("LorenzIssuesByStates")]
    assert afters == [None, f"cursor:{seeded[1].id}", None, f"cursor:{seeded[2].id}"]


async def test_cursor_restarts_are_bounded(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    seeded = [linear_server.add_issue(title=f"Issue {n}") for n in range(8)]
    moved: list[str] = []

    def move_every_first_page_end(record: Any) -> None:
        if record.operation_name == "LorenzIssuesByStates" and record.variables["after"] is None:
            # The second issue still in Todo ends the page of 2 just answered.
            page_end = [s.id for s in seeded if s.id not in moved][1]
            moved.append(page_end)
            linear_server.set_state(page_end, "Done")

    linear_server.after_answer = move_every_first_page_end
    tracker = make_tracker(provider={"page_size": 2})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_states(["Todo"])
    assert err.value.code == "linear_graphql_errors"
    assert "cursor" in str(err.value).lower()
    # The first scan and CURSOR_RESTARTS (2) more, each a first page and a refused second.
    assert len(linear_server.requests_for("LorenzIssuesByStates")) == 2 * 3
    assert len(moved) == 3


async def test_state_names_are_sent_unchanged_and_deduplicated(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    linear_server.add_issue(state="Human Review")
    got = await make_tracker().fetch_issues_by_states(["Human Review", "Human Review", "Todo"])
    assert len(got) == 1
    assert linear_server.requests[0].variables["stateNames"] == ["Human Review", "Todo"]


async def test_a_next_page_without_end_cursor_is_an_error(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    page = {"nodes": [], "pageInfo": {"hasNextPage": True, "endCursor": None}}
    linear_server.fail_next("malformed", body={"data": {"issues": page}})
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == "linear_missing_end_cursor"


# -- normalization --------------------------------------------------------------------------------


async def test_blockers_come_from_inverse_blocks_relations_only(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    blocker = linear_server.add_issue(title="Blocker", state="Done")
    other = linear_server.add_issue(title="Other", state="In Progress")
    blocked = linear_server.add_issue(title="Blocked", blocked_by=[blocker.identifier])
    linear_server.add_relation(other.id, blocked.id, relation_type=" Blocks ")
    linear_server.add_relation(blocker.id, blocked.id, relation_type="related")
    linear_server.add_relation(blocked.id, other.id, relation_type="blocks")  # outgoing: ignored
    (got,) = await make_tracker().fetch_issues_by_ids([blocked.id])
    assert got.blocked_by == (
        BlockerRef(id=blocker.id, identifier=blocker.identifier, state="Done"),
        BlockerRef(id=other.id, identifier=other.identifier, state="In Progress"),
    )


async def test_fields_are_normalized(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    seeded = linear_server.add_issue(
        title="Labelled",
        description="Some *markdown*",
        labels=["Bug", " Needs Review ", "bug"],
        priority=2,
        assignee="user-1",
    )
    (got,) = await make_tracker().fetch_candidate_issues()
    assert got.labels == ("bug", "needs review")
    assert got.priority == 2
    assert got.description == "Some *markdown*"
    assert got.branch_name == seeded.branch_name
    assert got.url == f"https://linear.app/fake/issue/{seeded.identifier}"
    assert got.assignee_id == "user-1"
    assert got.created_at == seeded.created_at
    assert got.created_at is not None
    assert got.created_at.tzinfo is not None
    assert got.native_ref == {"id": seeded.id, "state_type": "unstarted", "team_key": "ENG"}
    assert got.dispatchable


def test_priority_is_an_integer_or_none() -> None:
    assert [parse_priority(v) for v in (1, 4, 2.0, 0, 0.0, None, "2", True, 2.5, -1)] == [
        1,
        4,
        2,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]


def test_unusable_optional_metadata_does_not_hide_the_issue() -> None:
    issue = normalize_issue(
        {
            "id": "i1",
            "identifier": "ENG-1",
            "title": "T",
            "state": {"name": "Todo", "type": 7},
            "description": 42,
            "priority": "high",
            "branchName": "",
            "url": None,
            "assignee": "someone",
            "labels": {"nodes": [{"name": "ok"}, {"name": None}, "junk"]},
            "inverseRelations": {"nodes": [{"type": "blocks", "issue": None}, {"type": None}]},
            "createdAt": "not a date",
            "updatedAt": "2026-02-03T04:05:06.789Z",
        }
    )
    assert issue is not None
    assert (issue.description, issue.priority, issue.branch_name, issue.url) == (None,) * 4
    assert issue.assignee_id is None
    assert issue.labels == ("ok",)
    assert issue.blocked_by == ()
    assert issue.created_at is None
    assert issue.updated_at == datetime.datetime(2026, 2, 3, 4, 5, 6, 789000, tzinfo=datetime.UTC)
    assert issue.native_ref == {"id": "i1"}


@pytest.mark.parametrize(
    "node",
    [
        {"identifier": "ENG-1", "title": "T", "state": {"name": "Todo"}},
        {"id": "i", "identifier": " ", "title": "T", "state": {"name": "Todo"}},
        {"id": "i", "identifier": "ENG-1", "title": "", "state": {"name": "Todo"}},
        {"id": "i", "identifier": "ENG-1", "title": "T", "state": None},
        "not an object",
    ],
)
def test_records_without_required_fields_are_malformed(node: Any) -> None:
    assert normalize_issue(node) is None


GOOD_NODE = {"id": "good", "identifier": "ENG-1", "title": "Good", "state": {"name": "Todo"}}
BAD_NODE = {"id": "bad", "identifier": "ENG-2", "title": None, "state": {"name": "Todo"}}


async def test_candidate_reads_drop_malformed_records_and_log_a_count(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    page = {"nodes": [GOOD_NODE, BAD_NODE], "pageInfo": {"hasNextPage": False, "endCursor": None}}
    linear_server.fail_next("malformed", body={"data": {"issues": page}})
    with caplog.at_level(logging.WARNING, logger="lorenz.trackers.linear"):
        got = await make_tracker().fetch_candidate_issues()
    assert [i.id for i in got] == ["good"]
    assert any("count=1" in r.getMessage() for r in caplog.records)


async def test_id_refresh_fails_on_a_malformed_record(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    linear_server.fail_next(
        "malformed", body={"data": {"issues": {"nodes": [GOOD_NODE, BAD_NODE]}}}
    )
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_issues_by_ids(["good", "bad"])
    assert err.value.code == "linear_unknown_payload"


# -- refresh by ids --------------------------------------------------------------------------------


async def test_refresh_by_ids_returns_full_snapshots_in_request_order(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    a = linear_server.add_issue(title="A", labels=["X"])
    b = linear_server.add_issue(title="B", state="Done", blocked_by=[a.id])
    outside = linear_server.add_issue(title="Elsewhere", project="another-project-99")
    got = await make_tracker().fetch_issues_by_ids([b.id, "missing-id", a.id, b.id, outside.id])
    assert [i.id for i in got] == [b.id, a.id]
    assert got[0].state == "Done"
    assert got[0].blocked_by == (BlockerRef(id=a.id, identifier=a.identifier, state="Todo"),)
    assert got[1].labels == ("x",)
    (request,) = linear_server.requests
    assert request.variables["ids"] == [b.id, "missing-id", a.id, outside.id]
    assert request.variables["first"] == 4


async def test_refresh_by_ids_types_ids_as_graphql_ids(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    await make_tracker().fetch_issues_by_ids(["x"])
    (definition,) = operation(linear_server).definitions[:1]
    assert isinstance(definition, graphql.OperationDefinitionNode)
    assert definition.variable_definitions is not None
    types = {
        v.variable.name.value: graphql.print_ast(v.type) for v in definition.variable_definitions
    }
    assert types["ids"] == "[ID!]!"


async def test_refresh_by_ids_goes_in_batches(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    seeded = [linear_server.add_issue(title=f"I{n}") for n in range(7)]
    got = await make_tracker(provider={"page_size": 3}).fetch_issues_by_ids(
        [s.id for s in reversed(seeded)]
    )
    assert [i.id for i in got] == [s.id for s in reversed(seeded)]
    assert [r.variables["first"] for r in linear_server.requests] == [3, 3, 1]


# -- assignee routing -----------------------------------------------------------------------------


async def test_assignee_me_resolves_the_viewer_once(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    mine = linear_server.add_issue(title="Mine", assignee=linear_server.viewer_id)
    linear_server.add_issue(title="Theirs", assignee="someone-else")
    linear_server.add_issue(title="Nobody's")
    tracker = make_tracker(assignee="me")
    got = await tracker.fetch_candidate_issues()
    assert {i.title: i.dispatchable for i in got} == {
        "Mine": True,
        "Theirs": False,
        "Nobody's": False,
    }
    (refreshed,) = await tracker.fetch_issues_by_ids([mine.id])
    assert refreshed.dispatchable
    assert [r.operation_name for r in linear_server.requests] == [
        "LorenzViewer",
        "LorenzIssuesByStates",
        "LorenzIssuesByIds",
    ]


async def test_an_explicit_assignee_needs_no_viewer_query(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    linear_server.add_issue(title="Theirs", assignee="user-7")
    (got,) = await make_tracker(assignee="user-7").fetch_candidate_issues()
    assert got.dispatchable
    assert [r.operation_name for r in linear_server.requests] == ["LorenzIssuesByStates"]


async def test_a_viewer_without_id_is_an_error(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    linear_server.fail_next("malformed", body={"data": {"viewer": {"id": None}}})
    with pytest.raises(TrackerError) as err:
        await make_tracker(assignee="me").fetch_candidate_issues()
    assert err.value.code == "missing_linear_viewer_identity"
    assert err.value.key_path == "tracker.assignee"


# -- transport, auth and error classification -----------------------------------------------------


async def test_the_api_key_is_sent_raw_without_bearer(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    await make_tracker().fetch_candidate_issues()
    (request,) = linear_server.requests
    assert request.authorization == linear_server.api_key
    assert request.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("key", ["wrong-key", f"Bearer {FakeLinearServer().api_key}"])
async def test_a_wrong_key_is_a_status_error_naming_the_setting(
    make_tracker: MakeTracker, key: str
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(api_key=key).fetch_candidate_issues()
    assert err.value.code == "linear_api_status"
    assert "HTTP 401" in err.value.message
    assert "Authentication required" in err.value.message
    assert "tracker.api_key" in err.value.message
    assert not err.value.retryable


@pytest.mark.parametrize(
    ("kind", "options", "code", "retryable"),
    [
        ("status", {"status": 500}, "linear_api_status", True),
        ("status", {"status": 404}, "linear_api_status", False),
        ("graphql_errors", {"message": "Something broke"}, "linear_graphql_errors", False),
        ("malformed", {}, "linear_unknown_payload", False),
        ("malformed", {"body": ["a", "list"]}, "linear_unknown_payload", False),
        ("malformed", {"body": {"data": None}}, "linear_unknown_payload", False),
        ("not_json", {}, "linear_unknown_payload", False),
        ("disconnect", {}, "linear_api_request", True),
    ],
)
async def test_errors_are_classified(
    linear_server: FakeLinearServer,
    make_tracker: MakeTracker,
    kind: str,
    options: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    linear_server.fail_next(kind, **options)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == code
    assert err.value.retryable is retryable
    assert "; " in err.value.message  # what happened; what to do


async def test_graphql_errors_name_the_operation_and_message(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    linear_server.fail_next("graphql_errors", message="Query too complex")
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_issues_by_ids(["x"])
    assert "LorenzIssuesByIds" in err.value.message
    assert "Query too complex (INTERNAL_ERROR)" in err.value.message


async def test_an_unreachable_endpoint_is_a_request_error() -> None:
    server = FakeLinearServer()
    await server.start()
    url = server.url
    await server.stop()
    tracker = LinearTracker(
        settings=TrackerSettings(kind="linear", endpoint=url, project_slug="p"), api_key="k"
    )
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "linear_api_request"
    await tracker.close()


# -- rate limits ----------------------------------------------------------------------------------


async def test_ratelimited_with_a_short_reset_waits_and_succeeds(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    linear_server.add_issue()
    linear_server.fail_next("ratelimited", reset_in_s=0.05)
    got = await make_tracker(provider={"rate_limit_max_wait_ms": 500}).fetch_candidate_issues()
    assert len(got) == 1
    assert len(linear_server.requests) == 2
    assert len(sleeps) == 1
    assert 0 <= sleeps[0] <= 0.5


async def test_ratelimited_with_a_distant_reset_fails_at_once_and_then_fast(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    linear_server.set_request_budget(remaining=0, reset_in_s=3600)
    tracker = make_tracker(provider={"rate_limit_max_wait_ms": 1000})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "linear_rate_limited"
    assert err.value.retryable
    assert err.value.retry_after_ms is not None
    assert 3_500_000 < err.value.retry_after_ms <= 3_600_000
    assert sleeps == []
    assert len(linear_server.requests) == 1
    # The next call knows the budget is spent and does not spend a request on a refusal.
    with pytest.raises(TrackerError) as again:
        await tracker.fetch_issues_by_ids(["x"])
    assert again.value.code == "linear_rate_limited"
    assert len(linear_server.requests) == 1


async def test_rate_limit_retries_are_bounded(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    linear_server.fail_next("ratelimited", times=10, reset_in_s=0.02)
    tracker = make_tracker(provider={"rate_limit_retries": 2, "rate_limit_max_wait_ms": 200})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "linear_rate_limited"
    assert len(linear_server.requests) == 3
    assert len(sleeps) >= 2
    assert all(s <= 0.2 for s in sleeps)


async def test_http_429_without_hints_backs_off_exponentially_within_the_cap(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    linear_server.fail_next("status", status=429, times=3, message="Too Many Requests")
    linear_server.add_issue()
    tracker = make_tracker(provider={"rate_limit_retries": 3, "rate_limit_max_wait_ms": 40})
    assert len(await tracker.fetch_candidate_issues()) == 1
    assert len(sleeps) == 3
    assert all(0 < s <= 0.04 for s in sleeps)


async def test_a_spent_budget_in_the_headers_delays_the_next_request(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    async def wait_for_the_reset(delay: float) -> None:
        sleeps.append(delay)
        linear_server.set_request_budget(remaining=100, reset_in_s=3600)  # the reset came

    linear_server.set_request_budget(remaining=1, reset_in_s=5)
    tracker = make_tracker(provider={"rate_limit_max_wait_ms": 10000}, sleep=wait_for_the_reset)
    await tracker.fetch_candidate_issues()  # spends the last request; headers say remaining 0
    assert sleeps == []
    await tracker.fetch_candidate_issues()
    assert len(sleeps) == 1
    assert 4 < sleeps[0] <= 5
    assert [r.status for r in linear_server.requests] == [200, 200]


# -- the linear_graphql tool ----------------------------------------------------------------------


async def test_execute_graphql_runs_one_operation_and_returns_the_body(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    issue = linear_server.add_issue(title="Move me")
    tracker = make_tracker()
    states = await tracker.execute_graphql(
        query="query States($name: String!) { workflowStates(filter: {name: {eq: $name}}) "
        "{ nodes { id name } } }",
        variables={"name": "Done"},
    )
    (done,) = states["data"]["workflowStates"]["nodes"]
    body = await tracker.execute_graphql(
        query="mutation Move($id: String!, $state: String!) { issueUpdate(id: $id, input: "
        "{stateId: $state}) { success issue { state { name } } } }",
        variables={"id": issue.identifier, "state": done["id"]},
    )
    assert body == {
        "data": {"issueUpdate": {"success": True, "issue": {"state": {"name": "Done"}}}}
    }
    assert linear_server.state_of(issue.id) == "Done"
    assert linear_server.requests[-1].operation_name == "Move"
    assert linear_server.requests[-1].authorization == linear_server.api_key
    # GraphQL errors are part of the body, not an exception: the agent reads them.
    missing = await tracker.execute_graphql(query='{ issue(id: "nope") { id } }')
    assert missing["errors"][0]["message"] == "Entity not found: Issue"


@pytest.mark.parametrize(
    "query",
    [
        "fragment F on Issue { id }",
        "query A { viewer { id } } query B { viewer { id } }",
        '{ viewer { id } } mutation M { commentCreate(input: {body: "x"}) { success } }',
        "query {",
    ],
)
async def test_execute_graphql_insists_on_exactly_one_operation(
    linear_server: FakeLinearServer, make_tracker: MakeTracker, query: str
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker().execute_graphql(query=query)
    assert err.value.code == "invalid_graphql_operation"
    assert linear_server.requests == []


# -- configuration and lifecycle ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "api_key", "code", "key_path"),
    [
        ({"project_slug": "p"}, "", "missing_tracker_api_key", "tracker.api_key"),
        ({"project_slug": "p"}, "   ", "missing_tracker_api_key", "tracker.api_key"),
        ({}, "k", "missing_tracker_project_slug", "tracker.project_slug"),
        (
            {"project_slug": "p", "provider": {"page_sise": 10}},
            "k",
            "invalid_tracker_config",
            "tracker.provider.page_sise",
        ),
        (
            {"project_slug": "p", "provider": {"page_size": 1000}},
            "k",
            "invalid_tracker_config",
            "tracker.provider.page_size",
        ),
        (
            {"project_slug": "p", "provider": {"page_size": "10"}},
            "k",
            "invalid_tracker_config",
            "tracker.provider.page_size",
        ),
    ],
)
def test_configuration_errors(
    settings: dict[str, Any], api_key: str, code: str, key_path: str
) -> None:
    with pytest.raises(TrackerError) as err:
        LinearTracker(settings=TrackerSettings(kind="linear", **settings), api_key=api_key)
    assert err.value.code == code
    assert err.value.key_path == key_path


async def test_construction_is_cheap_and_close_closes(
    linear_server: FakeLinearServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    assert linear_server.requests == []
    assert tracker.endpoint == linear_server.url
    await tracker.fetch_candidate_issues()
    await tracker.close()
    await tracker.close()  # idempotent
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "tracker_closed"


async def test_the_default_endpoint_is_linears() -> None:
    tracker = LinearTracker(settings=TrackerSettings(kind="linear", project_slug="p"), api_key="k")
    assert tracker.endpoint == "https://api.linear.app/graphql"
    await tracker.close()


async def test_fake_pagination_edge_cases(linear_server: FakeLinearServer) -> None:
    """The fake's Relay connection answers like Linear's for the shapes agents may send."""
    seeded = [linear_server.add_issue(title=f"P{n}") for n in range(5)]
    tracker = LinearTracker(
        settings=TrackerSettings(kind="linear", endpoint=linear_server.url, project_slug="p"),
        api_key=linear_server.api_key,
    )
    query = (
        "query Page($first: Int, $last: Int, $after: String, $before: String) { issues(first: "
        "$first, last: $last, after: $after, before: $before) { nodes { title } pageInfo { "
        "hasNextPage hasPreviousPage startCursor endCursor } } }"
    )

    async def page(**variables: Any) -> dict[str, Any]:
        body = await tracker.execute_graphql(query=query, variables=variables)
        result: dict[str, Any] = body["data"]["issues"]
        return result

    first = await page(first=2)
    assert [n["title"] for n in first["nodes"]] == ["P0", "P1"]
    assert first["pageInfo"]["hasNextPage"] is True
    assert first["pageInfo"]["hasPreviousPage"] is False
    rest = await page(first=10, after=first["pageInfo"]["endCursor"])
    assert [n["title"] for n in rest["nodes"]] == ["P2", "P3", "P4"]
    assert rest["pageInfo"]["hasNextPage"] is False
    assert rest["pageInfo"]["hasPreviousPage"] is True
    tail = await page(last=2)
    assert [n["title"] for n in tail["nodes"]] == ["P3", "P4"]
    before = await page(last=1, before=f"cursor:{seeded[2].id}")
    assert [n["title"] for n in before["nodes"]] == ["P1"]
    bad = await tracker.execute_graphql(query=query, variables={"after": "bogus"})
    assert bad["errors"][0]["message"] == "Invalid cursor"
    too_many = await tracker.execute_graphql(query=query, variables={"first": 251})
    assert "between 0 and 250" in too_many["errors"][0]["message"]
    await tracker.close()


async def test_fake_filters(linear_server: FakeLinearServer) -> None:
    """Filters the fake implements behave like Linear's comparators."""
    linear_server.add_issue(title="Alpha bug", labels=["Bug"], priority=1, assignee="u1")
    linear_server.add_issue(title="Beta", labels=["Feature"], state="In Progress")
    linear_server.add_issue(title="Gamma bug", labels=["Bug", "UI"], priority=3)
    tracker = LinearTracker(
        settings=TrackerSettings(kind="linear", endpoint=linear_server.url, project_slug="p"),
        api_key=linear_server.api_key,
    )

    async def titles(where: str) -> list[str]:
        body = await tracker.execute_graphql(
            query=f"{{ issues(filter: {where}) {{ nodes {{ title }} }} }}"
        )
        assert "errors" not in body, body
        return [n["title"] for n in body["data"]["issues"]["nodes"]]

    assert await titles('{title: {containsIgnoreCase: "BUG"}}') == ["Alpha bug", "Gamma bug"]
    assert await titles('{labels: {some: {name: {eq: "UI"}}}}') == ["Gamma bug"]
    assert await titles('{labels: {name: {in: ["Feature"]}}}') == ["Beta"]
    assert await titles("{priority: {lte: 2, gte: 1}}") == ["Alpha bug"]
    assert await titles('{state: {type: {eq: "started"}}}') == ["Beta"]
    assert await titles("{assignee: {null: true}}") == ["Beta", "Gamma bug"]
    assert await titles('{assignee: {id: {eq: "u1"}}}') == ["Alpha bug"]
    assert await titles('{or: [{title: {eq: "Beta"}}, {priority: {eq: 3}}]}') == [
        "Beta",
        "Gamma bug",
    ]
    assert await titles('{team: {key: {eq: "ENG"}}, number: {gt: 2}}') == ["Gamma bug"]
    await tracker.close()
