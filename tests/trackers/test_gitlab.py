"""The GitLab tracker (and its ``gitlab_api`` tool) against the fake GitLab REST v4 server."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.config import TrackerSettings
from lorenz.model import BlockerRef
from lorenz.runtime.tools import GITLAB_API, GitLabApiToolHandler, tracker_tools
from lorenz.secrets import TRACKER_SECRET_ENV, strip_secrets, tracker_secrets
from lorenz.trackers import TrackerError, build_tracker
from lorenz.trackers.gitlab import GitLabTracker, LabelStates, normalize_issue, tool_path_segments
from lorenz.workflow import dispatch_problems, load_workflow
from tests.fakes.gitlab_server import FakeGitLabServer

MakeTracker = Callable[..., GitLabTracker]
SCOPED = {"state_label_scope": "status"}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gitlab" / "WORKFLOW.md"


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
async def make_tracker(
    gitlab_server: FakeGitLabServer, sleeps: list[float]
) -> AsyncIterator[MakeTracker]:
    made: list[GitLabTracker] = []

    async def recording_sleep(delay: float) -> None:
        sleeps.append(delay)  # no real wait: every injected limit is a one-off

    def make(
        *, token: str | None = None, provider: dict[str, Any] | None = None, **settings: Any
    ) -> GitLabTracker:
        settings.setdefault("active_states", ("Todo", "In Progress"))
        settings.setdefault("terminal_states", ("Done", "Cancelled"))
        settings.setdefault("project_slug", gitlab_server.project)
        tracker = GitLabTracker(
            settings=TrackerSettings(
                kind="gitlab",
                endpoint=gitlab_server.url,
                provider=SCOPED if provider is None else provider,
                **settings,
            ),
            token=gitlab_server.token if token is None else token,
            sleep=recording_sleep,
        )
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        await tracker.close()


# -- states from scoped labels --------------------------------------------------------------------


STATES = LabelStates(active=("Todo", "In Progress"), terminal=("Done", "Cancelled"),
                     scope="status")
PLAIN = LabelStates(active=("opened",), terminal=("closed",), scope=None)


@pytest.mark.parametrize(
    ("states", "state", "labels", "expected"),
    [
        (STATES, "opened", ["bug", "status::todo"], "todo"),
        (STATES, "opened", ["Status::In progress", "status::todo"], "In progress"),
        (STATES, "opened", ["status::review"], "opened"),  # not a configured state
        (STATES, "opened", ["todo", "workflow::todo"], "opened"),  # other scopes don't count
        (STATES, "opened", ["status::done"], "done"),
        (STATES, "closed", ["status::todo", "status::Cancelled"], "Cancelled"),
        (STATES, "closed", ["status::todo"], "Done"),  # closed: the first terminal state
        (STATES, "closed", [], "Done"),
        (STATES, "locked", ["status::todo"], None),
        (PLAIN, "opened", ["status::todo"], "opened"),
        (PLAIN, "closed", ["status::todo"], "closed"),
    ],
)
def test_state_comes_from_scoped_labels(
    states: LabelStates, state: str, labels: list[str], expected: str | None
) -> None:
    assert states.state_of({"state": state, "labels": labels}) == expected


def test_normalization() -> None:
    item = {
        "id": 90005, "iid": 5, "project_id": 7, "title": "Fix it", "description": "Body",
        "state": "opened", "labels": ["Bug", "status::todo"],
        "assignees": [{"username": "ada"}, {"username": "bob"}],
        "web_url": "https://gitlab.example.com/g/a/-/issues/5",
        "references": {"full": "g/a#5"},
        "created_at": "2026-01-01T00:00:01.000Z", "updated_at": "2026-01-02T00:00:00Z",
    }
    issue = normalize_issue(item, project="g/a", states=STATES)
    assert issue is not None
    assert (issue.id, issue.identifier, issue.title) == ("5", "g/a#5", "Fix it")
    assert issue.state == "todo"
    assert issue.labels == ("bug", "status::todo")
    assert issue.assignee_id == "ada"
    assert issue.url == "https://gitlab.example.com/g/a/-/issues/5"
    assert issue.native_ref == {"project": "g/a", "iid": 5, "state": "opened", "id": 90005,
                                "project_id": 7, "assignees": ["ada", "bob"]}
    assert issue.created_at is not None
    assert issue.created_at.year == 2026
    no_reference = normalize_issue({**item, "references": None}, project="g/a", states=STATES)
    assert no_reference is not None
    assert no_reference.identifier == "g/a#5"


@pytest.mark.parametrize(
    "item",
    [
        None,
        [],
        {"iid": 0, "title": "t", "state": "opened"},
        {"iid": True, "title": "t", "state": "opened"},
        {"iid": 1, "title": " ", "state": "opened"},
        {"iid": 1, "title": "t", "state": "merged"},
    ],
)
def test_malformed_items(item: Any) -> None:
    assert normalize_issue(item, project="g/a", states=STATES) is None


# -- reads ----------------------------------------------------------------------------------------


async def test_candidates_are_open_issues_with_active_state_labels(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    todo = gitlab_server.add_issue("Todo", labels=["status::todo"])
    doing = gitlab_server.add_issue("Doing", labels=["bug", "status::In Progress"])
    gitlab_server.add_issue("Closed todo", labels=["status::todo"], state="closed")
    gitlab_server.add_issue("Unlabelled")
    gitlab_server.add_issue("Done", labels=["status::done"])
    got = await make_tracker().fetch_candidate_issues()
    assert sorted((i.id, i.state) for i in got) == [
        (str(todo.iid), "todo"), (str(doing.iid), "In Progress")
    ]
    listings = [r for r in gitlab_server.requests if r.path.endswith("/issues")]
    assert {(r.query.get("state"), r.query.get("labels")) for r in listings} == {
        ("opened", "status::Todo"), ("opened", "status::In Progress")
    }


async def test_terminal_reads_include_closed_issues_without_state_labels(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.add_issue("Open done", labels=["status::done"])
    gitlab_server.add_issue("Closed plain", state="closed")
    gitlab_server.add_issue("Closed cancelled", labels=["status::cancelled"], state="closed")
    gitlab_server.add_issue("Open todo", labels=["status::todo"])
    got = await make_tracker().fetch_issues_by_states(["Done", "Cancelled"])
    assert sorted((i.title, i.state) for i in got) == [
        ("Closed cancelled", "cancelled"), ("Closed plain", "Done"), ("Open done", "done")
    ]


async def test_without_a_label_scope_states_are_opened_and_closed(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.add_issue("Open", labels=["status::todo"])
    gitlab_server.add_issue("Shut", state="closed")
    tracker = make_tracker(provider={}, active_states=("opened",), terminal_states=("closed",))
    assert [(i.title, i.state) for i in await tracker.fetch_candidate_issues()] == [
        ("Open", "opened")
    ]
    assert [(i.title, i.state) for i in await tracker.fetch_issues_by_states(["closed"])] == [
        ("Shut", "closed")
    ]
    assert all("labels" not in r.query for r in gitlab_server.requests_to("/issues"))


@pytest.mark.parametrize("link_header", [True, False])
async def test_paging_visits_every_page(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, link_header: bool
) -> None:
    gitlab_server.link_header = link_header
    for n in range(7):
        gitlab_server.add_issue(f"I{n}", labels=["status::todo"])
    tracker = make_tracker(active_states=("Todo",),
                           provider={**SCOPED, "page_size": 3, "links": False})
    got = await tracker.fetch_candidate_issues()
    assert [i.title for i in got] == [f"I{n}" for n in range(7)]  # oldest first
    pages = gitlab_server.requests_to("/issues")
    assert [r.query.get("page", "1") for r in pages] == ["1", "2", "3"]
    assert all(r.query["labels"] == "status::Todo" for r in pages)


async def test_pages_are_bounded(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    for n in range(5):
        gitlab_server.add_issue(f"I{n}", labels=["status::todo"])
    tracker = make_tracker(provider={**SCOPED, "page_size": 1, "max_pages": 3})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_too_many_pages"
    assert len(gitlab_server.requests) == 3


async def test_empty_inputs_make_no_request(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await tracker.fetch_issues_by_ids(["abc", "0", "", "\u0663"]) == []
    assert await tracker.fetch_issues_by_states([]) == []
    assert gitlab_server.requests == []


async def test_refresh_by_ids_reads_a_batch_by_iid(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    first = gitlab_server.add_issue("A", labels=["status::todo"])
    second = gitlab_server.add_issue("B", labels=["status::todo"])
    gone = gitlab_server.add_issue("C")
    gitlab_server.close_issue(second.iid)
    gitlab_server.delete_issue(gone.iid)
    tracker = make_tracker(provider={**SCOPED, "links": False})
    got = await tracker.fetch_issues_by_ids([str(second.iid), str(first.iid), str(gone.iid),
                                             "999", "x"])
    assert [(i.id, i.state) for i in got] == [(str(second.iid), "Done"), (str(first.iid), "todo")]
    [request] = gitlab_server.requests_to("/issues")
    assert sorted(v for k, v in request.query_items if k == "iids[]") == sorted(
        [str(first.iid), str(second.iid), str(gone.iid), "999"]
    )
    assert "state" not in request.query  # both opened and closed


async def test_refresh_by_ids_fails_on_a_malformed_issue(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.fail_next("malformed", body=[{"iid": 1, "state": "opened"}])
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_issues_by_ids(["1"])
    assert err.value.code == "gitlab_unknown_payload"


async def test_candidate_reads_drop_malformed_items_and_log_a_count(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"iid": 3, "title": "ok", "state": "opened", "labels": ["status::todo"]}
    gitlab_server.fail_next("malformed", body=[good, {"iid": "x"}, {"title": "no iid"}])
    with caplog.at_level(logging.WARNING, logger="lorenz.trackers.gitlab"):
        got = await make_tracker(active_states=("Todo",),
                                 provider={**SCOPED, "links": False}).fetch_candidate_issues()
    assert [i.id for i in got] == ["3"]
    assert "count=2" in caplog.text


async def test_blockers_come_from_is_blocked_by_links(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    blocked = gitlab_server.add_issue("Blocked", labels=["status::todo"])
    blocker = gitlab_server.add_issue("Blocker", labels=["status::in progress"])
    other = gitlab_server.add_issue("Blocker by the inverse link", labels=["status::done"])
    related = gitlab_server.add_issue("Related")
    gitlab_server.add_link(source=blocked.iid, target=blocker.iid, link_type="is_blocked_by")
    gitlab_server.add_link(source=other.iid, target=blocked.iid, link_type="blocks")
    gitlab_server.add_link(source=blocked.iid, target=related.iid)
    gitlab_server.add_link(source=blocked.iid, target=related.iid, link_type="blocks")
    [issue] = await make_tracker(active_states=("Todo",)).fetch_candidate_issues()
    project = gitlab_server.project
    assert issue.blocked_by == (
        # "in progress" is not among this workflow's states, so the blocker reads as opened.
        BlockerRef(id=str(blocker.iid), identifier=f"{project}#{blocker.iid}", state="opened"),
        BlockerRef(id=str(other.iid), identifier=f"{project}#{other.iid}", state="done"),
    )


async def test_no_links_api_means_no_blockers_and_no_more_asking(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.links_api = False
    gitlab_server.add_issue("A", labels=["status::todo"])
    tracker = make_tracker()
    [issue] = await tracker.fetch_candidate_issues()
    assert issue.blocked_by == ()
    assert tracker.links_available is False
    await tracker.fetch_candidate_issues()
    assert len(gitlab_server.requests_to("/links")) == 1


async def test_an_issue_deleted_before_its_links_are_read_keeps_the_links_api(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    seeded = gitlab_server.add_issue("A", labels=["status::todo"])
    gitlab_server.fail_next("status", status=404, message="404 Not found", paths=["/links"])
    tracker = make_tracker()
    [issue] = await tracker.fetch_issues_by_ids([str(seeded.iid)])
    assert issue.blocked_by == ()
    assert tracker.links_available is True


async def test_links_can_be_turned_off(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.add_issue("A", labels=["status::todo"])
    await make_tracker(provider={**SCOPED, "links": False}).fetch_candidate_issues()
    assert gitlab_server.requests_to("/links") == []


async def test_assignee_routing(gitlab_server: FakeGitLabServer, make_tracker: MakeTracker) -> None:
    mine = gitlab_server.add_issue("Mine", labels=["status::todo"],
                                   assignees=["other", gitlab_server.username])
    theirs = gitlab_server.add_issue("Theirs", labels=["status::todo"], assignees=["other"])
    nobody = gitlab_server.add_issue("Nobody's", labels=["status::todo"])
    for assignee in ("me", gitlab_server.username.upper()):
        got = {i.id: i.dispatchable
               for i in await make_tracker(assignee=assignee).fetch_candidate_issues()}
        assert got == {str(mine.iid): True, str(theirs.iid): False, str(nobody.iid): False}
    assert len(gitlab_server.requests_to("/user")) == 1


async def test_headers_and_project_addressing(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.add_issue("A", labels=["status::todo"])
    await make_tracker(provider={**SCOPED, "links": False}).fetch_candidate_issues()
    await make_tracker(project_slug=str(gitlab_server.project_id),
                       provider={**SCOPED, "links": False}).fetch_candidate_issues()
    by_path, by_id = gitlab_server.requests[0], gitlab_server.requests[-1]
    assert by_path.path.startswith(f"/api/v4/projects/{gitlab_server.encoded_project}/issues")
    assert by_id.path.startswith(f"/api/v4/projects/{gitlab_server.project_id}/issues")
    assert by_path.headers["PRIVATE-TOKEN"] == gitlab_server.token
    assert "Authorization" not in by_path.headers


async def test_a_bad_token_is_a_status_error_that_does_not_show_the_token(
    make_tracker: MakeTracker,
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(token="glpat-wrong-secret").fetch_candidate_issues()
    assert err.value.code == "gitlab_api_status"
    assert "401 Unauthorized" in err.value.message
    assert "GITLAB_TOKEN" in err.value.message
    assert "glpat-wrong-secret" not in err.value.message
    assert err.value.retryable is False


async def test_an_unknown_project_is_a_status_error(make_tracker: MakeTracker) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(project_slug="elsewhere/app").fetch_candidate_issues()
    assert err.value.code == "gitlab_api_status"
    assert "404 Project Not Found" in err.value.message
    assert "tracker.project_slug" in err.value.message


@pytest.mark.parametrize(
    ("kind", "options", "code", "retryable"),
    [
        ("status", {"status": 500}, "gitlab_api_status", True),
        ("status", {"status": 403, "message": "403 Forbidden"}, "gitlab_api_status", False),
        ("malformed", {"body": {"not": "a list"}}, "gitlab_unknown_payload", False),
        ("not_json", {}, "gitlab_unknown_payload", False),
        ("disconnect", {}, "gitlab_api_request", True),
    ],
)
async def test_errors_are_classified(
    gitlab_server: FakeGitLabServer,
    make_tracker: MakeTracker,
    kind: str,
    options: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    gitlab_server.fail_next(kind, **options)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == code
    assert err.value.retryable is retryable
    assert "; " in err.value.message


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ({"message": {"labels": ["is invalid"]}}, '{"labels": ["is invalid"]}'),
        ({"error": "state_event does not have a valid value"},
         "state_event does not have a valid value"),
        ({"error": "invalid_token", "error_description": "Token was revoked."},
         "invalid_token: Token was revoked."),
    ],
)
async def test_error_bodies_are_shown_in_gitlabs_words(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, body: Any, shown: str
) -> None:
    gitlab_server.fail_next("status", status=400, body=body)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == "gitlab_api_status"
    assert f"HTTP 400 for issue listing: {shown}; " in err.value.message


async def test_responses_are_bounded_in_size(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    gitlab_server.fail_next("oversized")
    tracker = make_tracker(provider={**SCOPED, "max_response_bytes": 1024 * 1024})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_response_too_large"
    gitlab_server.add_issue("Small", labels=["status::todo"])
    assert [i.title for i in await tracker.fetch_candidate_issues()] == ["Small"]


async def test_an_unreachable_endpoint_is_a_request_error() -> None:
    server = FakeGitLabServer()
    await server.start()
    url = server.url
    await server.stop()
    tracker = GitLabTracker(
        settings=TrackerSettings(
            kind="gitlab", endpoint=url, project_slug="g/a", active_states=["opened"]
        ),
        token="t",
    )
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_api_request"
    await tracker.close()


# -- rate limits ----------------------------------------------------------------------------------


async def test_429_with_retry_after_waits_and_succeeds(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    gitlab_server.add_issue("I", labels=["status::todo"])
    gitlab_server.fail_next("throttled", retry_after=2)
    got = await make_tracker(
        active_states=("Todo",), provider={**SCOPED, "rate_limit_max_wait_ms": 5000}
    ).fetch_candidate_issues()
    assert len(got) == 1
    assert len(sleeps) == 1
    assert 2 <= sleeps[0] <= 2.25


async def test_429_without_retry_after_uses_the_reset_header(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    gitlab_server.set_rate_budget(remaining=500, reset_in_s=1800)
    gitlab_server.fail_next("throttled")
    with pytest.raises(TrackerError) as err:
        await make_tracker(provider={**SCOPED, "rate_limit_max_wait_ms": 5000}
                           ).fetch_candidate_issues()
    assert err.value.code == "gitlab_rate_limited"
    assert err.value.retryable is True
    assert err.value.retry_after_ms is not None
    assert err.value.retry_after_ms > 1_000_000
    assert "Retry later" in err.value.message
    assert sleeps == []


async def test_a_spent_budget_fails_fast_on_the_next_call(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    gitlab_server.add_issue("I", labels=["status::todo"])
    gitlab_server.set_rate_budget(remaining=1, reset_in_s=3600)
    tracker = make_tracker(active_states=("Todo",), provider={**SCOPED, "links": False})
    assert len(await tracker.fetch_candidate_issues()) == 1  # the last request of the budget
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_rate_limited"
    assert err.value.retry_after_ms is not None
    assert err.value.retry_after_ms > 3_000_000
    assert len(gitlab_server.requests) == 1  # no request spent on a certain refusal
    assert sleeps == []


async def test_a_spent_budget_answers_429_with_retry_after(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    gitlab_server.set_rate_budget(remaining=0, reset_in_s=2)
    tracker = make_tracker(provider={**SCOPED, "rate_limit_retries": 0})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_rate_limited"
    assert gitlab_server.requests[0].status == 429
    assert err.value.retry_after_ms is not None
    assert 1000 <= err.value.retry_after_ms <= 2000


async def test_rate_limit_retries_are_bounded(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    gitlab_server.fail_next("throttled", times=10, retry_after=1)
    tracker = make_tracker(
        provider={**SCOPED, "rate_limit_retries": 3, "rate_limit_max_wait_ms": 1500}
    )
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "gitlab_rate_limited"
    assert len(gitlab_server.requests) == 4
    assert len(sleeps) == 3
    assert all(s <= 1.5 for s in sleeps)


# -- state moves ----------------------------------------------------------------------------------


async def test_moving_swaps_scoped_labels_and_closes_or_reopens(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    seeded = gitlab_server.add_issue("A", labels=["bug", "status::todo"])
    tracker = make_tracker(provider={**SCOPED, "links": False},
                           active_states=("Todo",), terminal_states=("Done", "Cancelled"))
    [issue] = await tracker.fetch_issues_by_ids([str(seeded.iid)])
    await tracker.move_issue_to_state(issue, state="Cancelled")
    assert (seeded.state, seeded.labels) == ("closed", ["bug", "status::Cancelled"])
    await tracker.move_issue_to_state(issue, state="Review")
    assert (seeded.state, seeded.labels) == ("opened", ["bug", "status::Review"])
    writes = [r for r in gitlab_server.requests if r.method == "PUT"]
    assert writes[0].body == {"remove_labels": "status::todo", "add_labels": "status::Cancelled",
                              "state_event": "close"}
    before = len(gitlab_server.requests)
    await tracker.move_issue_to_state(issue, state="review")  # already there: one read only
    assert [r.method for r in gitlab_server.requests[before:]] == ["GET"]


async def test_without_a_label_scope_only_opened_and_terminal_states_are_reachable(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    seeded = gitlab_server.add_issue("A")
    tracker = make_tracker(provider={"links": False}, active_states=("opened",),
                           terminal_states=("closed",))
    [issue] = await tracker.fetch_issues_by_ids([str(seeded.iid)])
    with pytest.raises(TrackerError) as err:
        await tracker.move_issue_to_state(issue, state="Review")
    assert (err.value.code, err.value.key_path) == (
        "gitlab_state_unreachable", "tracker.provider.state_label_scope"
    )
    await tracker.move_issue_to_state(issue, state="closed")
    assert (seeded.state, seeded.labels) == ("closed", [])
    await tracker.move_issue_to_state(issue, state="opened")
    assert seeded.state == "opened"


# -- the agent's tool (gitlab_api) ----------------------------------------------------------------


async def test_gitlab_api_reads_and_writes_within_the_project(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    seeded = gitlab_server.add_issue("A", labels=["status::todo"])
    tracker = make_tracker()
    base = f"/projects/{gitlab_server.encoded_project}/issues/{seeded.iid}"
    posted = await tracker.call_gitlab_api(method="post", path=f"{base}/notes",
                                           body={"body": "Picked up"})
    assert posted["status"] == 201
    assert posted["body"]["body"] == "Picked up"
    listed = await tracker.call_gitlab_api(
        method="GET", path=f"/api/v4{base}/notes", query={"per_page": 1, "sort": "asc"}
    )
    assert [n["body"] for n in listed["body"]] == ["Picked up"]
    assert listed["headers"]["x-total"] == "1"
    by_id = await tracker.call_gitlab_api(
        method="PUT", path=f"/projects/{gitlab_server.project_id}/issues/{seeded.iid}",
        body={"add_labels": "needs-review"},
    )
    assert by_id["status"] == 200
    assert "needs-review" in seeded.labels
    missing = await tracker.call_gitlab_api(method="GET", path=f"{base}9999")
    assert missing["status"] == 404
    assert missing["body"] == {"message": "404 Not found"}
    assert all(r.headers["PRIVATE-TOKEN"] == gitlab_server.token for r in gitlab_server.requests)


@pytest.mark.parametrize(
    "path",
    [
        "https://evil.example/api/v4/projects/1",
        "//evil.example/api/v4/projects/1",
        "projects/1",
        "/projects/x/../../users",
        "/projects/x/%2e%2e/%2E%2E/users",
        "/projects/x/issues?private_token=1",
        "/projects/x\\..\\y",
        "/projects/x/issues/1 ",
        "/projects//issues",
        "",
        "/" + "a" * 3000,
    ],
)
def test_gitlab_api_paths_that_could_leave_the_instance_are_refused(path: str) -> None:
    with pytest.raises(TrackerError) as err:
        tool_path_segments(path)
    assert err.value.code == "gitlab_api_path_refused"


async def test_gitlab_api_refusals_send_nothing(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    own = f"/projects/{gitlab_server.encoded_project}"
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"method": "DELETE", "path": f"{own}/issues/1"}, "gitlab_api_method_refused"),
        ({"method": "PATCH", "path": f"{own}/issues/1"}, "gitlab_api_method_refused"),
        ({"method": "GET", "path": "/users"}, "gitlab_api_path_refused"),
        ({"method": "GET", "path": "/projects"}, "gitlab_api_path_refused"),
        ({"method": "GET", "path": f"{own}/../other%2Fapp"}, "gitlab_api_path_refused"),
        ({"method": "GET", "path": f"{own}/issues", "body": {"a": 1}}, "gitlab_api_body_refused"),
        ({"method": "GET", "path": f"{own}/issues", "query": {"a": {"b": 1}}},
         "gitlab_api_query_invalid"),
        ({"method": "POST", "path": f"{own}/issues", "body": {"d": "x" * (1024 * 1024 + 1)}},
         "gitlab_api_body_too_large"),
        ({"method": "GET", "path": f"{own}/issues", "query": {"sudo": "root"}},
         "gitlab_api_query_invalid"),
        ({"method": "GET", "path": f"{own}/issues", "query": {"Private_Token": "x"}},
         "gitlab_api_query_invalid"),
        ({"method": "PUT", "path": f"{own}/issues/1", "body": {"sudo": 1, "title": "t"}},
         "gitlab_api_body_refused"),
    ]
    for arguments, code in refusals:
        with pytest.raises(TrackerError) as err:
            await tracker.call_gitlab_api(**arguments)
        assert err.value.code == code, arguments
    assert gitlab_server.requests == []
    with pytest.raises(TrackerError) as err:
        await tracker.call_gitlab_api(method="GET", path="/projects/other%2Fapp/issues")
    assert err.value.code == "gitlab_api_path_refused"
    # Only the project itself was read, to learn its numeric id; nothing reached the other one.
    assert [r.path for r in gitlab_server.requests] == [f"/api/v4{own}"]


async def test_gitlab_api_scope_and_methods_can_be_widened(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker(provider={**SCOPED, "api_scope": "instance",
                                     "api_methods": ["GET", "DELETE"]})
    me = await tracker.call_gitlab_api(method="GET", path="/user")
    assert me["body"]["username"] == gitlab_server.username
    other = await tracker.call_gitlab_api(method="GET", path="/projects/other%2Fapp")
    assert other["status"] == 404
    with pytest.raises(TrackerError) as err:
        await tracker.call_gitlab_api(method="POST", path="/user")
    assert err.value.code == "gitlab_api_method_refused"


async def test_the_runtime_offers_gitlab_api_with_the_token_kept_host_side(
    gitlab_server: FakeGitLabServer, make_tracker: MakeTracker
) -> None:
    seeded = gitlab_server.add_issue("A", labels=["status::todo"])
    tracker = make_tracker()
    handler = tracker_tools(tracker)
    assert isinstance(handler, GitLabApiToolHandler)
    [spec] = handler.tool_specs()
    assert spec["name"] == GITLAB_API
    assert spec["inputSchema"]["properties"]["method"]["enum"] == ["GET", "POST", "PUT"]
    path = f"/projects/{gitlab_server.encoded_project}/issues/{seeded.iid}"
    ok = await handler.call_tool(GITLAB_API, {"method": "GET", "path": path})
    assert ok["success"] is True
    assert json.loads(ok["output"])["body"]["title"] == "A"
    missing = await handler.call_tool(GITLAB_API, {"method": "GET", "path": path + "0"})
    assert missing["success"] is False
    assert json.loads(missing["output"])["status"] == 404
    refused = await handler.call_tool(GITLAB_API, {"method": "GET", "path": "/users"})
    assert refused["success"] is False
    assert "gitlab_api" in refused["output"]
    unknown = await handler.call_tool("linear_graphql", {})
    assert unknown["success"] is False
    for answer in (ok, missing, refused):
        assert gitlab_server.token not in answer["output"]


def test_the_gitlab_token_never_reaches_an_agent_or_a_log() -> None:
    base = {"PATH": "/usr/bin", "GITLAB_TOKEN": "glpat-controller-only-token"}
    assert "GITLAB_TOKEN" in TRACKER_SECRET_ENV
    assert strip_secrets(base=base) == {"PATH": "/usr/bin"}
    assert tracker_secrets(api_key=None, environ=base) == ["glpat-controller-only-token"]


# -- configuration and lifecycle ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "token", "code", "key_path"),
    [
        ({"project_slug": "g/a"}, "", "missing_tracker_api_key", "tracker.api_key"),
        ({}, "t", "missing_tracker_project_slug", "tracker.project_slug"),
        ({"project_slug": "just-a-name"}, "t", "invalid_tracker_project_slug",
         "tracker.project_slug"),
        ({"project_slug": "g/../a"}, "t", "invalid_tracker_project_slug", "tracker.project_slug"),
        ({"project_slug": "g a/b"}, "t", "invalid_tracker_project_slug", "tracker.project_slug"),
        ({"project_slug": "g/a", "provider": {"page_size": 101}}, "t", "invalid_tracker_config",
         "tracker.provider.page_size"),
        ({"project_slug": "g/a", "provider": {"api_methods": ["TRACE"]}}, "t",
         "invalid_tracker_config", "tracker.provider.api_methods.0"),
        ({"project_slug": "g/a", "provider": {"state_label_scope": "a:b"}}, "t",
         "invalid_tracker_config", "tracker.provider.state_label_scope"),
        ({"project_slug": "g/a", "provider": {"state_label_scope": " "}}, "t",
         "invalid_tracker_config", "tracker.provider.state_label_scope"),
        ({"project_slug": "g/a", "active_states": ["opened", "todo"]}, "t",
         "gitlab_states_need_label_scope", "tracker.active_states"),
        ({"project_slug": "g/a", "endpoint": "gitlab.example.com", "provider": SCOPED}, "t",
         "invalid_tracker_endpoint", "tracker.endpoint"),
        ({"project_slug": "g/a", "endpoint": "ftp://gitlab.example.com", "provider": SCOPED},
         "t", "invalid_tracker_endpoint", "tracker.endpoint"),
        ({"project_slug": "g/a", "endpoint": "https://h/?x=1", "provider": SCOPED}, "t",
         "invalid_tracker_endpoint", "tracker.endpoint"),
    ],
)
def test_configuration_errors(
    settings: dict[str, Any], token: str, code: str, key_path: str
) -> None:
    with pytest.raises(TrackerError) as err:
        GitLabTracker(settings=TrackerSettings(kind="gitlab", **settings), token=token)
    assert err.value.code == code
    assert err.value.key_path == key_path


@pytest.mark.parametrize(
    ("endpoint", "api_base"),
    [
        (None, "https://gitlab.com/api/v4"),
        ("https://git.example.org/", "https://git.example.org/api/v4"),
        ("https://git.example.org/gitlab/api/v4", "https://git.example.org/gitlab/api/v4"),
    ],
)
def test_self_managed_endpoints(endpoint: str | None, api_base: str) -> None:
    tracker = GitLabTracker(
        settings=TrackerSettings(
            kind="gitlab", endpoint=endpoint, project_slug="4711", provider=SCOPED
        ),
        token="t",
    )
    assert tracker.api_base == api_base


async def test_close(make_tracker: MakeTracker) -> None:
    tracker = make_tracker()
    await tracker.fetch_candidate_issues()
    await tracker.close()
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_ids(["1"])
    assert err.value.code == "tracker_closed"


# -- the shipped example --------------------------------------------------------------------------


async def test_the_example_workflow_validates_and_reads_a_project(
    gitlab_server: FakeGitLabServer,
) -> None:
    loaded = load_workflow(EXAMPLE, environ={"GITLAB_TOKEN": gitlab_server.token})
    assert loaded.warnings == ()
    assert dispatch_problems(loaded.settings) == []
    assert loaded.prompt.problems() == []
    tracker_settings = loaded.settings.tracker.model_copy(
        update={"endpoint": gitlab_server.url, "project_slug": gitlab_server.project}
    )
    settings = loaded.settings.model_copy(update={"tracker": tracker_settings})
    gitlab_server.add_issue("Ship it", labels=["status::In Progress"])
    gitlab_server.add_issue("Not yet", labels=["status::backlog"])
    tracker = build_tracker(settings)
    try:
        [issue] = await tracker.fetch_candidate_issues()
    finally:
        await tracker.close()
    assert (issue.title, issue.state) == ("Ship it", "In Progress")
    prompt = loaded.render_prompt(issue=issue)
    assert f"{gitlab_server.project}#1: Ship it" in prompt
