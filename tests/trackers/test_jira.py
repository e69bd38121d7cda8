"""The Jira tracker (and its ``jira_rest`` tool) against the fake Jira Cloud REST v3 site."""

from __future__ import annotations

import base64
import datetime
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import agent_environment
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef
from lorenz.runtime.tools import JIRA_REST, JiraRestToolHandler, tracker_tools
from lorenz.secrets import tracker_secrets
from lorenz.trackers import JiraTracker, TrackerError, build_tracker
from lorenz.trackers.jira import (
    jql_string,
    normalize_issue,
    reset_delay,
    validate_rest_path,
)
from lorenz.trackers.jira_adf import MAX_DEPTH, TRUNCATED, adf_to_text, text_to_adf
from lorenz.trackers.writes import IssueWriter, escalation_marker
from lorenz.workflow import dispatch_problems, load_workflow, settings_from_mapping
from tests.fakes.jira_server import FakeJiraServer, adf

MakeTracker = Callable[..., JiraTracker]
KEY = "lz-0123456789abcdef"
OTHER_KEY = "lz-fedcba9876543210"
COMMENT = "Lorenz gave up after 3 attempts; see the last run's log."


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
async def make_tracker(
    jira_server: FakeJiraServer, sleeps: list[float]
) -> AsyncIterator[MakeTracker]:
    made: list[JiraTracker] = []

    async def recording_sleep(delay: float) -> None:
        sleeps.append(delay)  # no real wait: every injected limit is a one-off

    def make(
        *,
        token: str | None = None,
        email: str | None = None,
        provider: dict[str, Any] | None = None,
        **settings: Any,
    ) -> JiraTracker:
        settings.setdefault("active_states", ("To Do", "In Progress"))
        settings.setdefault("terminal_states", ("Done", "Cancelled"))
        settings.setdefault("project_slug", jira_server.project)
        settings.setdefault("endpoint", jira_server.url)
        tracker = JiraTracker(
            settings=TrackerSettings(kind="jira", provider=provider or {}, **settings),
            email=jira_server.email if email is None else email,
            token=jira_server.token if token is None else token,
            sleep=recording_sleep,
        )
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        await tracker.close()


# -- normalization --------------------------------------------------------------------------------

SITE = "https://example.atlassian.net"


def _item(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "summary": "Fix the login",
        "status": {"name": "In Progress", "statusCategory": {"key": "indeterminate"}},
        "project": {"key": "ENG"},
    }
    base.update(fields)
    return {"id": "10042", "key": "ENG-7", "fields": base}


def test_normalization() -> None:
    item = _item(
        description=adf("Users cannot log in."),
        labels=["Backend", "backend", "urgent"],
        priority={"name": "High", "id": "2"},
        assignee={"accountId": "abc123"},
        created="2026-01-15T10:30:00.000+0000",
        updated="2026-01-16T08:00:00.000+0100",
        issuelinks=[
            {
                "type": {"name": "Blocks", "inward": "is blocked by", "outward": "blocks"},
                "inwardIssue": {"id": "10001", "key": "ENG-1",
                                "fields": {"status": {"name": "Done"}}},
            },
            {   # this issue blocks ENG-9: not a blocker of this issue
                "type": {"name": "Blocks"},
                "outwardIssue": {"id": "10009", "key": "ENG-9"},
            },
            {   # another link type
                "type": {"name": "Relates"},
                "inwardIssue": {"id": "10002", "key": "ENG-2"},
            },
        ],
    )
    issue = normalize_issue(item, site=SITE)
    assert issue is not None
    assert (issue.id, issue.identifier, issue.title, issue.state) == (
        "10042", "ENG-7", "Fix the login", "In Progress",
    )
    assert issue.description == "Users cannot log in."
    assert issue.labels == ("backend", "urgent")
    assert issue.priority == 2
    assert issue.assignee_id == "abc123"
    assert issue.url == f"{SITE}/browse/ENG-7"
    assert issue.created_at == datetime.datetime(2026, 1, 15, 10, 30, tzinfo=datetime.UTC)
    assert issue.updated_at == datetime.datetime(2026, 1, 16, 7, 0, tzinfo=datetime.UTC)
    assert issue.blocked_by == (BlockerRef(id="10001", identifier="ENG-1", state="Done"),)
    assert issue.native_ref == {"key": "ENG-7", "project": "ENG",
                                "status_category": "indeterminate"}
    # Another link type can be configured as the blocking one.
    relates = normalize_issue(item, site=SITE, link_type="relates")
    assert relates is not None
    assert [b.identifier for b in relates.blocked_by] == ["ENG-2"]


@pytest.mark.parametrize(
    "item",
    [
        None,
        "ENG-1",
        {"id": "10042", "fields": {"summary": "x", "status": {"name": "To Do"}}},
        {"key": "ENG-1", "fields": {"summary": "x", "status": {"name": "To Do"}}},
        {"id": "ten", "key": "ENG-1", "fields": {"summary": "x", "status": {"name": "To Do"}}},
        {"id": "1", "key": "ENG-1", "fields": {"summary": " ", "status": {"name": "To Do"}}},
        {"id": "1", "key": "ENG-1", "fields": {"summary": "x", "status": None}},
        {"id": "1", "key": "ENG-1"},
    ],
)
def test_malformed_items(item: Any) -> None:
    assert normalize_issue(item, site=SITE) is None


def test_odd_optional_fields_do_not_drop_the_issue() -> None:
    issue = normalize_issue(
        _item(priority={"name": "Blocker"}, labels="nope", issuelinks=[None, {"type": 3}],
              description=42, created="yesterday"),
        site=SITE,
    )
    assert issue is not None
    assert (issue.priority, issue.labels, issue.blocked_by, issue.description,
            issue.created_at) == (None, (), (), None, None)


def test_jql_strings_are_quoted_and_escaped() -> None:
    assert jql_string('In "Review" \\ now') == '"In \\"Review\\" \\\\ now"'


def test_reset_header_is_read_as_an_iso_time() -> None:
    now = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC).timestamp()
    assert reset_delay("2026-03-01T12:05Z", now=now) == 300.0
    assert reset_delay("2026-03-01T12:05:30.000+0000", now=now) == 330.0
    assert reset_delay("2026-03-01T11:00Z", now=now) == 0.0
    assert reset_delay("soon", now=now) is None
    assert reset_delay(None, now=now) is None


# -- ADF ------------------------------------------------------------------------------------------


def test_adf_becomes_readable_text() -> None:
    document = {
        "type": "doc",
        "version": 1,
        "content": [
            {"type": "heading", "attrs": {"level": 2},
             "content": [{"type": "text", "text": "Steps"}]},
            {"type": "orderedList", "content": [
                {"type": "listItem", "content": [
                    {"type": "paragraph", "content": [{"type": "text", "text": "Open"}]}]},
                {"type": "listItem", "content": [
                    {"type": "paragraph", "content": [
                        {"type": "text", "text": "Ask "},
                        {"type": "mention", "attrs": {"id": "x", "text": "@Ada"}},
                    ]}]},
            ]},
            {"type": "codeBlock", "attrs": {"language": "python"},
             "content": [{"type": "text", "text": "print(1)"}]},
            {"type": "paragraph", "content": [
                {"type": "text", "text": "line one"}, {"type": "hardBreak"},
                {"type": "text", "text": "line two"},
                {"type": "futureInlineThing", "content": [{"type": "text", "text": "!"}]},
            ]},
            {"type": "rule"},
        ],
    }
    assert adf_to_text(document) == (
        "## Steps\n\n1. Open\n2. Ask @Ada\n\n```python\nprint(1)\n```\n\n"
        "line one\nline two!\n\n---"
    )
    assert adf_to_text(None) is None
    assert adf_to_text("plain") == "plain"
    assert adf_to_text(["not", "a", "doc"]) is None


def test_adf_reading_is_bounded() -> None:
    deep: dict[str, Any] = {"type": "text", "text": "bottom"}
    for _ in range(MAX_DEPTH * 3):
        deep = {"type": "paragraph", "content": [deep]}
    text = adf_to_text({"type": "doc", "content": [deep]})
    assert text is not None
    assert "bottom" not in text
    assert text.endswith(TRUNCATED)
    huge = {"type": "doc", "content": [
        {"type": "paragraph", "content": [{"type": "text", "text": "x" * 300000}]}]}
    text = adf_to_text(huge)
    assert text is not None
    assert len(text) < 200100
    assert text.endswith(TRUNCATED)


def test_text_becomes_adf_paragraphs() -> None:
    document = text_to_adf("first\nsecond\n\nthird", code_line="marker")
    assert document["type"] == "doc"
    assert document["version"] == 1
    assert adf_to_text(document) == "first\nsecond\n\nthird\n\nmarker"
    assert document["content"][-1]["content"][0]["marks"] == [{"type": "code"}]


# -- reading issues -------------------------------------------------------------------------------


async def test_candidates_are_the_project_issues_in_active_states(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    todo = jira_server.add_issue("First", status="To Do", description="Do the thing.")
    doing = jira_server.add_issue("Second", status="In Progress", labels=["api"])
    jira_server.add_issue("Finished", status="Done")
    jira_server.add_issue("Elsewhere", status="To Do", project="OPS")
    tracker = make_tracker(active_states=("to do", "IN PROGRESS"))

    issues = await tracker.fetch_candidate_issues()

    assert [(i.id, i.identifier, i.state) for i in issues] == [
        (str(todo.id), "ENG-1", "To Do"),
        (str(doing.id), "ENG-2", "In Progress"),
    ]
    assert issues[0].description == "Do the thing."
    assert issues[1].labels == ("api",)
    [search] = jira_server.requests_to("/search/jql")
    assert search.query["jql"] == (
        'project = "ENG" AND status in ("to do", "IN PROGRESS") ORDER BY created ASC'
    )
    assert set(search.query["fields"].split(",")) >= {"summary", "status", "issuelinks"}


async def test_terminal_reads_and_an_extra_jql_filter(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    jira_server.add_issue("Done, backend", status="Done", labels=["backend"])
    jira_server.add_issue("Done, frontend", status="Done", labels=["frontend"])
    jira_server.add_issue("Cancelled", status="Cancelled", labels=["backend"])
    tracker = make_tracker(provider={"jql": "labels = backend"})

    issues = await tracker.fetch_issues_by_states(["Done", "Cancelled"])

    assert [i.title for i in issues] == ["Done, backend", "Cancelled"]
    assert jira_server.requests_to("/search/jql")[0].query["jql"].endswith(
        'AND (labels = backend) ORDER BY created ASC'
    )


async def test_state_names_the_site_does_not_have_are_left_out(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    jira_server.add_issue("Finished", status="Done")
    jira_server.add_issue("Dropped", status="Cancelled")
    jira_server.add_issue("Open", status="To Do")
    # The default terminal states: Jira refuses "Closed", "Canceled" and "Duplicate" here.
    tracker = make_tracker(terminal_states=("Closed", "Cancelled", "Canceled", "Duplicate", "Done"))

    with caplog.at_level(logging.WARNING, logger="lorenz.trackers.jira"):
        issues = await tracker.fetch_issues_by_states(tracker._settings.terminal_states)
        again = await tracker.fetch_issues_by_states(tracker._settings.terminal_states)

    assert [i.title for i in issues] == [i.title for i in again] == ["Finished", "Dropped"]
    searches = jira_server.requests_to("/search/jql")
    assert [r.status for r in searches] == [400, 200, 200]  # the names are remembered
    assert searches[-1].query["jql"].startswith(
        'project = "ENG" AND status in ("Cancelled", "Done")'
    )
    assert caplog.text.count("Jira has no status named Canceled, Closed, Duplicate") == 1
    # Only unknown names left: nothing to ask.
    assert await tracker.fetch_issues_by_states(["Closed", "Duplicate"]) == []
    assert len(jira_server.requests_to("/search/jql")) == 3


async def test_other_jql_errors_are_not_swallowed(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker(provider={"jql": "component = Backend"})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "jira_api_status"
    assert "Field 'component' does not exist" in str(err.value)
    assert "tracker.provider.jql" in str(err.value)
    assert len(jira_server.requests) == 1


async def test_next_page_token_paging_visits_every_page(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    for n in range(7):
        jira_server.add_issue(f"Issue {n}")
    tracker = make_tracker(provider={"page_size": 3})

    issues = await tracker.fetch_candidate_issues()

    assert [i.title for i in issues] == [f"Issue {n}" for n in range(7)]
    searches = jira_server.requests_to("/search/jql")
    assert [r.query.get("nextPageToken") is not None for r in searches] == [False, True, True]
    assert all(r.query["maxResults"] == "3" for r in searches)


async def test_a_scan_longer_than_max_pages_is_an_error(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    for n in range(5):
        jira_server.add_issue(f"Issue {n}")
    tracker = make_tracker(provider={"page_size": 1, "max_pages": 3})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert (err.value.code, err.value.key_path) == (
        "jira_too_many_pages", "tracker.provider.max_pages",
    )
    assert len(jira_server.requests_to("/search/jql")) == 3


async def test_a_repeated_page_token_ends_the_scan_with_an_error(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    page = {"issues": [], "nextPageToken": "same", "isLast": False}
    jira_server.fail_next("malformed", body=page, times=2, paths=["/search/jql"])
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == "jira_unknown_payload"
    assert err.value.retryable


async def test_empty_inputs_make_no_request(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await tracker.fetch_issues_by_ids(["ENG-1", "abc", ""]) == []
    assert await tracker.fetch_issues_by_states([]) == []
    assert jira_server.requests == []


async def test_refresh_by_ids(jira_server: FakeJiraServer, make_tracker: MakeTracker) -> None:
    first = jira_server.add_issue("First", status="In Progress")
    gone = jira_server.add_issue("Gone")
    moved = jira_server.add_issue("Moved")
    done = jira_server.add_issue("Done now")
    jira_server.delete_issue(gone.id)
    jira_server.move_issue(moved.id, to_project="OPS")
    jira_server.set_status(done.id, "Done")
    tracker = make_tracker()

    issues = await tracker.fetch_issues_by_ids(
        [str(done.id), str(first.id), str(gone.id), str(moved.id), str(first.id)]
    )

    assert [(i.title, i.state) for i in issues] == [("Done now", "Done"), ("First", "In Progress")]
    [bulk] = jira_server.requests_to("/issue/bulkfetch")
    assert bulk.method == "POST"
    assert bulk.body["issueIdsOrKeys"] == [str(done.id), str(first.id), str(gone.id),
                                           str(moved.id)]


async def test_refresh_by_ids_batches_at_one_hundred(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = [jira_server.add_issue(f"Issue {n}") for n in range(130)]
    issues = await make_tracker().fetch_issues_by_ids([str(i.id) for i in seeded])
    assert len(issues) == 130
    assert [len(r.body["issueIdsOrKeys"]) for r in jira_server.requests_to("bulkfetch")] == [
        100, 30,
    ]


async def test_refresh_by_ids_fails_on_issue_errors_or_a_malformed_issue(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    issue = jira_server.add_issue("First")
    tracker = make_tracker()
    jira_server.issue_errors = [{"id": issue.id, "errorMessage": "Service timeout"}]
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_ids([str(issue.id)])
    assert err.value.code == "jira_issue_errors"
    assert err.value.retryable

    broken = {"issues": [{"id": str(issue.id), "key": "ENG-1", "fields": {}}], "issueErrors": []}
    jira_server.fail_next("malformed", body=broken)
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_ids([str(issue.id)])
    assert err.value.code == "jira_unknown_payload"


async def test_candidate_reads_drop_malformed_items_and_log_a_count(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    page = {
        "issues": [
            {"id": "10001", "key": "ENG-1",
             "fields": {"summary": "Fine", "status": {"name": "To Do"}}},
            {"id": "10002", "key": "ENG-2", "fields": {"status": {"name": "To Do"}}},
            "junk",
        ],
        "isLast": True,
    }
    jira_server.fail_next("malformed", body=page)
    with caplog.at_level(logging.WARNING, logger="lorenz.trackers.jira"):
        issues = await make_tracker().fetch_candidate_issues()
    assert [i.title for i in issues] == ["Fine"]
    assert "dropped malformed Jira issues project=ENG count=2" in caplog.text


async def test_blockers_come_from_is_blocked_by_links(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    blocker = jira_server.add_issue("Blocker", status="In Progress")
    finished = jira_server.add_issue("Finished blocker", status="Done")
    blocked = jira_server.add_issue("Blocked", blocked_by=[blocker.key, finished.key])
    tracker = make_tracker()

    by_title = {i.title: i for i in await tracker.fetch_candidate_issues()}

    assert by_title["Blocked"].blocked_by == (
        BlockerRef(id=str(blocker.id), identifier=blocker.key, state="In Progress"),
        BlockerRef(id=str(finished.id), identifier=finished.key, state="Done"),
    )
    # The blocker itself sees an outward "blocks" link, which is not a blocker of its own.
    assert by_title["Blocker"].blocked_by == ()
    [refreshed] = await tracker.fetch_issues_by_ids([str(blocked.id)])
    assert len(refreshed.blocked_by) == 2
    assert len(jira_server.requests) == 2  # links came embedded: no request per issue


async def test_assignee_routing(jira_server: FakeJiraServer, make_tracker: MakeTracker) -> None:
    jira_server.add_issue("Mine", assignee=jira_server.account_id)
    jira_server.add_issue("Theirs", assignee="557058:other")
    jira_server.add_issue("Nobody's")

    mine = make_tracker(assignee="me")
    verdicts = {i.title: i.dispatchable for i in await mine.fetch_candidate_issues()}
    assert verdicts == {"Mine": True, "Theirs": False, "Nobody's": False}
    await mine.fetch_candidate_issues()
    assert len(jira_server.requests_to("/myself")) == 1  # asked once per tracker

    theirs = make_tracker(assignee="557058:other")
    verdicts = {i.title: i.dispatchable for i in await theirs.fetch_candidate_issues()}
    assert verdicts == {"Mine": False, "Theirs": True, "Nobody's": False}


async def test_requests_use_basic_auth_with_email_and_token(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    await make_tracker().fetch_candidate_issues()
    [request] = jira_server.requests
    scheme, _, credential = (request.authorization or "").partition(" ")
    assert scheme == "Basic"
    assert base64.b64decode(credential).decode() == f"{jira_server.email}:{jira_server.token}"
    assert request.headers["Accept"] == "application/json"


# -- errors ---------------------------------------------------------------------------------------


async def test_a_bad_token_is_a_status_error_naming_the_settings(
    make_tracker: MakeTracker, jira_server: FakeJiraServer
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(token="wrong-token-value").fetch_candidate_issues()
    assert err.value.code == "jira_api_status"
    assert not err.value.retryable
    assert "HTTP 401" in str(err.value)
    assert "tracker.email and tracker.api_key" in str(err.value)
    assert "wrong-token-value" not in str(err.value)
    assert jira_server.token not in str(err.value)


async def test_an_unknown_project_is_a_status_error_naming_project_slug(
    make_tracker: MakeTracker,
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(project_slug="NOPE").fetch_candidate_issues()
    assert err.value.code == "jira_api_status"
    assert "The value 'NOPE' does not exist for the field 'project'" in str(err.value)
    assert "tracker.project_slug" in str(err.value)


@pytest.mark.parametrize(
    ("kind", "options", "code", "retryable"),
    [
        ("status", {"status": 500}, "jira_api_status", True),
        ("status", {"status": 403}, "jira_api_status", False),
        ("not_json", {}, "jira_unknown_payload", False),
        ("malformed", {"body": ["a", "list"]}, "jira_unknown_payload", False),
        ("malformed", {"body": {"issues": "nope"}}, "jira_unknown_payload", False),
        ("disconnect", {}, "jira_api_request", True),
    ],
)
async def test_errors_are_classified(
    jira_server: FakeJiraServer,
    make_tracker: MakeTracker,
    kind: str,
    options: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    jira_server.fail_next(kind, **options)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert (err.value.code, err.value.retryable) == (code, retryable)


async def test_a_response_larger_than_the_bound_is_refused(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    jira_server.fail_next("huge")
    with pytest.raises(TrackerError) as err:
        await make_tracker(provider={"max_response_bytes": 1024 * 1024}).fetch_candidate_issues()
    assert err.value.code == "jira_response_too_large"


async def test_an_unreachable_site_is_a_request_error() -> None:
    tracker = JiraTracker(
        settings=TrackerSettings(kind="jira", endpoint="http://127.0.0.1:9", project_slug="ENG"),
        email="a@example.com",
        token="secret-token-value",
    )
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "jira_api_request"
    assert err.value.retryable
    assert "secret-token-value" not in str(err.value)
    await tracker.close()
    with pytest.raises(TrackerError) as closed:
        await tracker.fetch_candidate_issues()
    assert closed.value.code == "tracker_closed"


# -- rate limits ----------------------------------------------------------------------------------


async def test_a_429_with_retry_after_waits_and_succeeds(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    jira_server.add_issue("Seen")
    jira_server.fail_next("rate_limit", retry_after=2)
    issues = await make_tracker().fetch_candidate_issues()
    assert [i.title for i in issues] == ["Seen"]
    assert len(sleeps) == 1
    assert 2.0 <= sleeps[0] <= 2.25
    assert [r.status for r in jira_server.requests] == [429, 200]


async def test_a_503_with_retry_after_is_waited_out_too(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    jira_server.fail_next("busy", retry_after=1)
    assert await make_tracker().fetch_candidate_issues() == []
    assert len(sleeps) == 1
    assert 1.0 <= sleeps[0] <= 1.25


async def test_a_long_retry_after_fails_at_once_with_the_delay(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    jira_server.fail_next("rate_limit", retry_after=120)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert (err.value.code, err.value.retryable) == ("jira_rate_limited", True)
    assert err.value.retry_after_ms == 120000
    assert "jira-burst-based" in str(err.value)
    assert sleeps == []


async def test_rate_limit_retries_are_bounded(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    jira_server.fail_next("rate_limit", retry_after=1, times=5)
    with pytest.raises(TrackerError) as err:
        await make_tracker(provider={"rate_limit_retries": 2}).fetch_candidate_issues()
    assert err.value.code == "jira_rate_limited"
    assert len(jira_server.requests) == 3
    assert len(sleeps) == 2


async def test_a_spent_budget_makes_the_next_call_wait_for_the_reset(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    tracker = make_tracker()
    jira_server.set_rate_budget(remaining=0, reset_in_s=90)
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "jira_rate_limited"
    assert err.value.retry_after_ms is not None
    assert 60000 <= err.value.retry_after_ms <= 90000
    sent = len(jira_server.requests)
    with pytest.raises(TrackerError) as again:
        await tracker.fetch_candidate_issues()
    assert again.value.code == "jira_rate_limited"
    assert len(jira_server.requests) == sent  # refused locally: no request spent on it


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "email", "token", "code", "key_path"),
    [
        ({}, "a@b.c", "", "missing_tracker_api_key", "tracker.api_key"),
        ({}, " ", "t", "missing_tracker_email", "tracker.email"),
        ({"endpoint": None}, "a@b.c", "t", "missing_tracker_endpoint", "tracker.endpoint"),
        ({"endpoint": "example.atlassian.net"}, "a@b.c", "t", "invalid_tracker_endpoint",
         "tracker.endpoint"),
        ({"project_slug": None}, "a@b.c", "t", "missing_tracker_project_slug",
         "tracker.project_slug"),
        ({"project_slug": "ENG-1"}, "a@b.c", "t", "invalid_tracker_project_slug",
         "tracker.project_slug"),
        ({"provider": {"page_sise": 5}}, "a@b.c", "t", "invalid_tracker_config",
         "tracker.provider.page_sise"),
        ({"provider": {"page_size": 500}}, "a@b.c", "t", "invalid_tracker_config",
         "tracker.provider.page_size"),
        ({"provider": {"tool_methods": ["GET", "PATCH"]}}, "a@b.c", "t",
         "invalid_tracker_config", "tracker.provider.tool_methods"),
    ],
)
def test_configuration_errors(
    settings: dict[str, Any], email: str, token: str, code: str, key_path: str
) -> None:
    values: dict[str, Any] = {"endpoint": SITE, "project_slug": "ENG", **settings}
    with pytest.raises(TrackerError) as err:
        JiraTracker(settings=TrackerSettings(kind="jira", **values), email=email, token=token)
    assert (err.value.code, err.value.key_path) == (code, key_path)


def test_defaults() -> None:
    tracker = JiraTracker(
        settings=TrackerSettings(kind="jira", endpoint=SITE + "/", project_slug="eng"),
        email="a@b.c",
        token="t",
    )
    assert (tracker.endpoint, tracker.project_key) == (SITE, "ENG")
    assert tracker.options.page_size == 50
    assert tracker.options.tool_methods == ("GET", "POST", "PUT")


async def test_the_factory_reads_the_token_and_email_from_settings_or_environment(
    jira_server: FakeJiraServer,
) -> None:
    jira_server.add_issue("Seen", status="Todo")  # the default active states
    settings = WorkflowSettings(
        tracker=TrackerSettings(kind="jira", endpoint=jira_server.url, project_slug="ENG")
    )
    env = {"JIRA_API_TOKEN": jira_server.token, "JIRA_EMAIL": jira_server.email}
    built = build_tracker(settings, env=env)
    assert isinstance(built, JiraTracker)
    assert [i.title for i in await built.fetch_candidate_issues()] == ["Seen"]
    await built.close()
    explicit = WorkflowSettings(
        tracker=TrackerSettings(
            kind="jira", endpoint=jira_server.url, project_slug="ENG",
            email=jira_server.email, api_key=jira_server.token,
        )
    )
    built = build_tracker(explicit, env={})
    assert [i.title for i in await built.fetch_candidate_issues()] == ["Seen"]
    await built.close()
    with pytest.raises(TrackerError) as err:
        build_tracker(settings, env={"JIRA_EMAIL": jira_server.email})
    assert err.value.code == "missing_tracker_api_key"
    with pytest.raises(TrackerError) as err:
        build_tracker(settings, env={"JIRA_API_TOKEN": jira_server.token})
    assert err.value.code == "missing_tracker_email"


def test_the_token_variable_never_reaches_an_agent_or_a_log() -> None:
    env = agent_environment(
        base={"JIRA_API_TOKEN": "ATATT-secret-value", "JIRA_EMAIL": "bot@example.com",
              "PATH": "/bin"},
    )
    assert env == {"JIRA_EMAIL": "bot@example.com", "PATH": "/bin"}
    secrets = tracker_secrets(api_key=None, environ={"JIRA_API_TOKEN": "ATATT-secret-value"})
    assert "ATATT-secret-value" in secrets


def test_workflow_resolution_and_preflight() -> None:
    def settings(tracker: dict[str, Any], env: dict[str, str]) -> WorkflowSettings:
        return settings_from_mapping(
            {"tracker": tracker}, base_dir=Path("/w"), environ=env
        ).settings

    complete = settings(
        {"kind": "jira", "endpoint": SITE, "project_slug": "ENG"},
        {"JIRA_API_TOKEN": "tok", "JIRA_EMAIL": "bot@example.com"},
    )
    assert (complete.tracker.api_key, complete.tracker.email) == ("tok", "bot@example.com")
    assert dispatch_problems(complete) == []
    from_vars = settings(
        {"kind": "jira", "endpoint": SITE, "project_slug": "ENG", "email": "$MY_EMAIL",
         "api_key": "$MY_TOKEN"},
        {"MY_TOKEN": "tok", "MY_EMAIL": "me@example.com"},
    )
    assert (from_vars.tracker.api_key, from_vars.tracker.email) == ("tok", "me@example.com")
    bare = settings({"kind": "jira"}, {})
    problems = [(p.code, p.key_path) for p in dispatch_problems(bare)]
    assert problems == [
        ("missing_tracker_api_key", "tracker.api_key"),
        ("missing_tracker_endpoint", "tracker.endpoint"),
        ("missing_tracker_project_slug", "tracker.project_slug"),
        ("missing_tracker_email", "tracker.email"),
    ]
    assert "JIRA_API_TOKEN" in dispatch_problems(bare)[0].message


# -- terminal actions -----------------------------------------------------------------------------


async def _one(tracker: JiraTracker, issue_id: int) -> Any:
    [issue] = await tracker.fetch_issues_by_ids([str(issue_id)])
    return issue


async def test_escalation_posts_once_and_a_replay_posts_nothing(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Flaky work", labels=["backend"])
    tracker = make_tracker()
    issue = await _one(tracker, seeded.id)

    assert await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert jira_server.issue(seeded.id).labels == ["backend", "needs-human"]
    [posted] = jira_server.comment_texts(seeded.id)
    assert posted.startswith(COMMENT)
    assert posted.endswith(escalation_marker(KEY))
    [write] = jira_server.requests_to("/comment", method="POST")
    assert write.body["body"]["type"] == "doc"

    # A replay after a restart: the same key, the issue as read before the first write.
    assert not await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label="needs-human")
    assert jira_server.comment_texts(seeded.id) == [posted]
    assert len(jira_server.requests_to("/comment", method="POST")) == 1
    assert jira_server.issue(seeded.id).labels == ["backend", "needs-human"]

    # A later escalation (another key) is a new comment; the label is not added twice.
    fresh = await _one(tracker, seeded.id)
    assert await tracker.escalate_issue(fresh, key=OTHER_KEY, comment="again", label="needs-human")
    assert len(jira_server.comment_texts(seeded.id)) == 2
    assert len(jira_server.requests_to(f"/issue/{seeded.id}", method="PUT")) == 1


async def test_escalation_finds_its_marker_on_a_later_comment_page(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Busy thread")
    tracker = make_tracker()
    issue = await _one(tracker, seeded.id)
    assert await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label=None)
    jira_server.issue(seeded.id).comments.extend(adf(f"chatter {n}") for n in range(150))
    jira_server.issue(seeded.id).comments.reverse()  # the marked comment is now the last
    assert not await tracker.escalate_issue(issue, key=KEY, comment=COMMENT, label=None)
    pages = jira_server.requests_to("/comment", method="GET")
    assert [r.query["startAt"] for r in pages[-2:]] == ["0", "100"]


async def test_a_label_with_spaces_is_refused_before_any_write(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Work")
    tracker = make_tracker()
    issue = await _one(tracker, seeded.id)
    with pytest.raises(TrackerError) as err:
        await tracker.escalate_issue(issue, key=KEY, comment=None, label="needs human")
    assert (err.value.code, err.value.key_path) == ("invalid_jira_label", "retry.escalate.label")
    assert jira_server.requests_to("/issue/", method="PUT") == []


async def test_cancel_runs_the_transition_and_a_replay_writes_nothing(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Hopeless", status="In Progress")
    tracker = make_tracker()
    assert isinstance(tracker, IssueWriter)  # what the runtime checks before either action
    issue = await _one(tracker, seeded.id)

    await tracker.move_issue_to_state(issue, state="cancelled")
    assert jira_server.issue(seeded.id).status == "Cancelled"
    [move] = jira_server.requests_to("/transitions", method="POST")
    assert set(move.body) == {"transition"}

    await tracker.move_issue_to_state(issue, state="Cancelled")  # the replay, a stale issue
    assert len(jira_server.requests_to("/transitions", method="POST")) == 1
    assert len(jira_server.requests_to("/transitions", method="GET")) == 1


async def test_cancel_to_a_state_no_transition_reaches_is_a_coded_error(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Work")
    jira_server.unavailable_transitions.add("Cancelled")
    tracker = make_tracker()
    issue = await _one(tracker, seeded.id)
    for state in ("Cancelled", "Archived"):
        with pytest.raises(TrackerError) as err:
            await tracker.move_issue_to_state(issue, state=state)
        assert (err.value.code, err.value.key_path) == (
            "tracker_state_not_found", "retry.cancel_state",
        )
        assert "Done" in str(err.value)
    assert jira_server.requests_to("/transitions", method="POST") == []
    assert jira_server.issue(seeded.id).status == "To Do"


# -- the jira_rest tool ---------------------------------------------------------------------------


async def test_the_tool_makes_one_call_with_the_trackers_credentials(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Tool target")
    tracker = make_tracker()
    handler = tracker_tools(tracker)
    assert isinstance(handler, JiraRestToolHandler)
    [spec] = handler.tool_specs()
    assert spec["name"] == JIRA_REST
    assert spec["inputSchema"]["properties"]["method"]["enum"] == ["GET", "POST", "PUT"]

    read = await handler.call_tool(
        JIRA_REST,
        {"method": "get", "path": f"/rest/api/3/issue/{seeded.key}",
         "query": {"fields": "summary,status"}},
    )
    assert read["success"]
    result = json.loads(read["output"])
    assert result["status"] == 200
    assert result["body"]["fields"] == {
        "summary": "Tool target", "status": result["body"]["fields"]["status"],
    }

    posted = await handler.call_tool(
        JIRA_REST,
        {"method": "POST", "path": f"/rest/api/3/issue/{seeded.key}/comment",
         "body": {"body": adf("Progress: tests pass.")}},
    )
    assert posted["success"]
    assert json.loads(posted["output"])["status"] == 201
    assert jira_server.comment_texts(seeded.id) == ["Progress: tests pass."]
    assert jira_server.token not in read["output"] + posted["output"]


async def test_the_tool_returns_jira_errors_for_the_agent_to_read(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    handler = JiraRestToolHandler(tracker=make_tracker())
    missing = await handler.call_tool(
        JIRA_REST, {"method": "GET", "path": "/rest/api/3/issue/ENG-999"}
    )
    assert not missing["success"]
    result = json.loads(missing["output"])
    assert result["status"] == 404
    assert result["body"]["errorMessages"] == [
        "Issue does not exist or you do not have permission to see it."
    ]
    jira_server.fail_next("rate_limit", retry_after=300)
    limited = await handler.call_tool(JIRA_REST, {"method": "GET", "path": "/rest/api/3/myself"})
    assert not limited["success"]
    assert "rate limit" in limited["output"]


@pytest.mark.parametrize(
    "path",
    [
        "/rest/api/2/issue/ENG-1",
        "rest/api/3/issue/ENG-1",
        "https://evil.example.com/rest/api/3/issue/ENG-1",
        "//evil.example.com/rest/api/3/myself",
        "/rest/api/3/../../../admin",
        "/rest/api/3/issue/./ENG-1",
        "/rest/api/3/issue//ENG-1",
        "/rest/api/3/%2e%2e/%2E%2E/admin",
        "/rest/api/3/issue%2fENG-1",
        "/rest/api/3/issue/ENG-1?expand=all",
        "/rest/api/3/issue/ENG-1#top",
        "/rest/api/3/issue/ENG 1",
        "/rest/api/3/issue\\ENG-1",
        "/rest/api/3/" + "a" * 2000,
        "",
        None,
    ],
)
async def test_the_tool_refuses_paths_that_could_leave_the_api(
    jira_server: FakeJiraServer, make_tracker: MakeTracker, path: Any
) -> None:
    handler = JiraRestToolHandler(tracker=make_tracker())
    answer = await handler.call_tool(JIRA_REST, {"method": "GET", "path": path})
    assert not answer["success"]
    assert "path" in answer["output"]
    assert jira_server.requests == []
    with pytest.raises(TrackerError) as err:
        validate_rest_path(path)
    assert err.value.code == "invalid_jira_rest_call"


async def test_the_tool_refuses_other_methods_bodies_and_oversized_calls(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Target")
    tracker = make_tracker(provider={"tool_max_body_bytes": 2048,
                                     "tool_max_response_bytes": 4096})
    handler = JiraRestToolHandler(tracker=tracker)
    path = f"/rest/api/3/issue/{seeded.key}"
    refusals: list[dict[str, Any]] = [
        {"method": "DELETE", "path": path},
        {"method": "PATCH", "path": path},
        {"method": "GET", "path": path, "body": {"x": 1}},
        {"method": "PUT", "path": path, "body": {"fields": {"summary": "x" * 5000}}},
        {"method": "GET", "path": path, "query": {"fields": ["a", "b"]}},
        {"method": "GET", "path": path, "query": "fields=summary"},
    ]
    for arguments in refusals:
        answer = await handler.call_tool(JIRA_REST, arguments)
        assert not answer["success"], arguments
    assert jira_server.requests == []

    jira_server.issue(seeded.id).description = adf("y" * 10000)
    too_big = await handler.call_tool(JIRA_REST, {"method": "GET", "path": path})
    assert not too_big["success"]
    assert "larger than 4096 bytes" in too_big["output"]
    other = await handler.call_tool("linear_graphql", {"query": "{ viewer { id } }"})
    assert not other["success"]
    assert JIRA_REST in other["output"]


async def test_delete_can_be_allowed(
    jira_server: FakeJiraServer, make_tracker: MakeTracker
) -> None:
    seeded = jira_server.add_issue("Target")
    tracker = make_tracker(provider={"tool_methods": ["GET", "DELETE"]})
    await tracker.escalate_issue(await _one(tracker, seeded.id), key=KEY, comment="x", label=None)
    comment_id = seeded.id * 1000
    path = f"/rest/api/3/issue/{seeded.key}/comment/{comment_id}"
    assert await tracker.execute_jira_rest(method="DELETE", path=path) == {
        "status": 204, "body": None,
    }
    assert jira_server.comment_texts(seeded.id) == []
    again = await tracker.execute_jira_rest(method="delete", path=path)
    assert again["status"] == 404
    with pytest.raises(TrackerError) as err:
        await tracker.execute_jira_rest(method="POST", path=path, body={})
    assert err.value.code == "invalid_jira_rest_call"


# -- the example workflow -------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jira" / "WORKFLOW.md"


async def test_the_example_workflow_loads_and_reads_the_fake_site(
    jira_server: FakeJiraServer,
) -> None:
    env = {"JIRA_API_TOKEN": jira_server.token, "JIRA_EMAIL": jira_server.email}
    loaded = load_workflow(EXAMPLE, environ=env)
    assert loaded.warnings == ()
    assert dispatch_problems(loaded.settings) == []
    assert loaded.prompt.problems() == []
    assert (loaded.settings.tracker.email, loaded.settings.tracker.api_key) == (
        jira_server.email, jira_server.token,
    )
    jira_server.add_issue("Ready", labels=["agent-ok"], description="Make it so.")
    jira_server.add_issue(
        "An epic, filtered out by the example's JQL", labels=["agent-ok"], issue_type="Epic"
    )
    settings = loaded.settings.model_copy(
        update={"tracker": loaded.settings.tracker.model_copy(update={"endpoint": jira_server.url})}
    )
    tracker = build_tracker(settings, env={})
    try:
        [issue] = await tracker.fetch_candidate_issues()
    finally:
        await tracker.close()
    [search] = jira_server.requests_to("/search/jql")
    assert "AND (issuetype != Epic)" in search.query["jql"]
    prompt = loaded.render_prompt(issue=issue)
    assert "ENG-1: Ready" in prompt
    assert "Make it so." in prompt
