"""The GitHub tracker against the fake GitHub REST server."""

from __future__ import annotations

import datetime
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from lorenz.config import TrackerSettings
from lorenz.model import BlockerRef
from lorenz.trackers import TrackerError
from lorenz.trackers.github import GitHubTracker, LabelStates, normalize_issue
from tests.fakes.github_server import FakeGitHubServer

MakeTracker = Callable[..., GitHubTracker]


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
async def make_tracker(
    github_server: FakeGitHubServer, sleeps: list[float]
) -> AsyncIterator[MakeTracker]:
    made: list[GitHubTracker] = []

    async def recording_sleep(delay: float) -> None:
        sleeps.append(delay)  # no real wait: every injected limit is a one-off

    def make(
        *, token: str | None = None, provider: dict[str, Any] | None = None, **settings: Any
    ) -> GitHubTracker:
        settings.setdefault("active_states", ("Todo", "In Progress"))
        settings.setdefault("terminal_states", ("Done", "Cancelled"))
        settings.setdefault("repository", github_server.repository)
        tracker = GitHubTracker(
            settings=TrackerSettings(
                kind="github",
                endpoint=github_server.url,
                provider=provider or {},
                **settings,
            ),
            token=github_server.token if token is None else token,
            sleep=recording_sleep,
        )
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        await tracker.close()


# -- states from labels ---------------------------------------------------------------------------


STATES = LabelStates(active=("Todo", "In Progress"), terminal=("Done", "Cancelled"))


@pytest.mark.parametrize(
    ("state", "labels", "expected"),
    [
        ("open", ["bug", "todo"], "todo"),
        ("open", ["In progress", "Todo"], "In progress"),  # the first matching label wins
        ("open", ["bug"], "open"),
        ("open", ["done"], "done"),
        ("closed", ["todo", "Cancelled"], "Cancelled"),
        ("closed", ["todo"], "Done"),  # closed without a terminal label: the first terminal state
        ("closed", [], "Done"),
        ("weird", ["todo"], None),
    ],
)
def test_state_comes_from_labels(state: str, labels: list[str], expected: str | None) -> None:
    assert STATES.state_of({"state": state, "labels": [{"name": n} for n in labels]}) == expected


def test_normalization() -> None:
    item = {
        "number": 7,
        "id": 123,
        "node_id": "I_abc",
        "title": "Fix it",
        "body": "Details",
        "state": "open",
        "state_reason": None,
        "labels": [{"name": "Todo"}, {"name": " Bug "}, "plain", {"name": None}],
        "assignees": [{"login": "alice"}, {"login": "bob"}],
        "html_url": "https://github.com/o/r/issues/7",
        "created_at": "2026-01-02T03:04:05Z",
        "updated_at": "garbage",
    }
    issue = normalize_issue(item, repository="o/r", states=STATES)
    assert issue is not None
    assert (issue.id, issue.identifier, issue.title, issue.state) == (
        "7",
        "o/r#7",
        "Fix it",
        "Todo",
    )
    assert issue.description == "Details"
    assert issue.labels == ("todo", "bug", "plain")
    assert issue.assignee_id == "alice"
    assert issue.url == "https://github.com/o/r/issues/7"
    assert issue.created_at == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert issue.updated_at is None
    assert issue.priority is None
    assert issue.native_ref == {
        "repository": "o/r",
        "number": 7,
        "node_id": "I_abc",
        "state": "open",
        "database_id": 123,
        "assignees": ["alice", "bob"],
    }


@pytest.mark.parametrize(
    "item",
    [
        {"title": "No number", "state": "open"},
        {"number": True, "title": "Bool number", "state": "open"},
        {"number": 1, "title": " ", "state": "open"},
        {"number": 1, "title": "No state"},
        ["not", "an", "object"],
    ],
)
def test_malformed_items(item: Any) -> None:
    assert normalize_issue(item, repository="o/r", states=STATES) is None


# -- reads ----------------------------------------------------------------------------------------


async def test_candidates_are_open_issues_with_active_labels_without_pull_requests(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    todo = github_server.add_issue("Todo", labels=["todo", "bug"])
    doing = github_server.add_issue("Doing", labels=["In Progress"])
    github_server.add_issue("Done", labels=["done"])
    github_server.add_issue("Unlabelled")
    github_server.add_issue("Closed todo", labels=["todo"], state="closed")
    github_server.add_pull_request("PR", labels=["todo"])
    got = await make_tracker().fetch_candidate_issues()
    assert sorted((i.id, i.state) for i in got) == [
        (str(todo.number), "todo"),
        (str(doing.number), "In Progress"),
    ]
    listings = github_server.requests_to("/issues")
    assert [(r.query.get("state"), r.query.get("labels")) for r in listings[:2]] == [
        ("open", "Todo"),
        ("open", "In Progress"),
    ]
    assert all(r.query["per_page"] == "100" for r in listings if "dependencies" not in r.path)


async def test_terminal_reads_include_closed_issues_without_terminal_labels(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    labelled = github_server.add_issue("Labelled done", labels=["done"])
    closed = github_server.add_issue("Closed", labels=["todo"], state="closed")
    cancelled = github_server.add_issue("Cancelled", labels=["cancelled"], state="closed")
    github_server.add_issue("Open", labels=["todo"])
    got = await make_tracker().fetch_issues_by_states(["Done", "Cancelled"])
    assert {i.id: i.state for i in got} == {
        str(labelled.number): "done",
        str(closed.number): "Done",
        str(cancelled.number): "cancelled",
    }


async def test_active_state_open_needs_no_labels(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    plain = github_server.add_issue("Plain")
    github_server.add_issue("Labelled", labels=["done"])
    (got,) = await make_tracker(active_states=("open",)).fetch_candidate_issues()
    assert (got.id, got.state) == (str(plain.number), "open")


async def test_link_header_paging_visits_every_page(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    seeded = [github_server.add_issue(f"I{n}", labels=["todo"]) for n in range(12)]
    got = await make_tracker(
        provider={"page_size": 5, "dependencies": False}
    ).fetch_issues_by_states(["Todo"])
    # GitHub lists newest first; the tracker keeps the server's order across pages.
    assert [i.id for i in got] == [str(s.number) for s in reversed(seeded)]
    pages = [r.query.get("page") for r in github_server.requests_to("/issues")]
    assert pages == [None, "2", "3"]


async def test_empty_inputs_make_no_request(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    tracker = make_tracker()
    assert await tracker.fetch_issues_by_states([]) == []
    assert await tracker.fetch_issues_by_ids([]) == []
    assert await make_tracker(active_states=()).fetch_candidate_issues() == []
    assert github_server.requests == []


async def test_refresh_by_ids(github_server: FakeGitHubServer, make_tracker: MakeTracker) -> None:
    a = github_server.add_issue("A", labels=["todo"])
    b = github_server.add_issue("B", labels=["todo"], state="closed")
    pr = github_server.add_pull_request("PR")
    gone = github_server.add_issue("Gone")
    github_server.delete_issue(gone.number)
    moved = github_server.add_issue("Moved")
    github_server.transfer_issue(moved.number, to="octo-org/elsewhere")
    got = await make_tracker().fetch_issues_by_ids(
        [
            str(b.number),
            "999",
            str(pr.number),
            str(gone.number),
            str(moved.number),
            "x",
            str(a.number),
        ]
    )
    assert [(i.id, i.state) for i in got] == [(str(b.number), "Done"), (str(a.number), "todo")]


async def test_refresh_by_ids_fails_on_a_malformed_issue(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    github_server.fail_next("malformed", body={"number": 3, "title": None, "state": "open"})
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_issues_by_ids(["3"])
    assert err.value.code == "github_unknown_payload"


async def test_candidate_reads_drop_malformed_items_and_log_a_count(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"number": 1, "title": "Good", "state": "open", "labels": [{"name": "todo"}]}
    github_server.fail_next(
        "malformed", body=[good, {"number": 2, "state": "open"}, "junk"], paths=["/issues"]
    )
    tracker = make_tracker(active_states=("Todo",), provider={"dependencies": False})
    with caplog.at_level(logging.WARNING, logger="lorenz.trackers.github"):
        got = await tracker.fetch_candidate_issues()
    assert [i.id for i in got] == ["1"]
    assert any("count=2" in r.getMessage() for r in caplog.records)


# -- blockers -------------------------------------------------------------------------------------


async def test_blockers_come_from_the_dependencies_api(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    done = github_server.add_issue("Blocker done", state="closed")
    open_blocker = github_server.add_issue("Blocker open", labels=["in progress"])
    blocked = github_server.add_issue(
        "Blocked", labels=["todo"], blocked_by=[done.number, open_blocker.number]
    )
    tracker = make_tracker()
    candidates = {i.id: i for i in await tracker.fetch_candidate_issues()}
    (got,) = await tracker.fetch_issues_by_ids([str(blocked.number)])
    assert candidates[got.id].blocked_by == got.blocked_by
    assert candidates[str(open_blocker.number)].blocked_by == ()
    repo = github_server.repository
    assert got.blocked_by == (
        BlockerRef(id=str(done.number), identifier=f"{repo}#{done.number}", state="Done"),
        BlockerRef(
            id=str(open_blocker.number),
            identifier=f"{repo}#{open_blocker.number}",
            state="in progress",
        ),
    )
    auth = {r.authorization for r in github_server.requests_to("dependencies")}
    assert auth == {f"Bearer {github_server.token}"}


async def test_no_dependencies_api_means_no_blockers_and_no_more_asking(
    make_tracker: MakeTracker,
) -> None:
    server = FakeGitHubServer(dependencies_api=False)
    async with server:
        for n in range(3):
            server.add_issue(f"I{n}", labels=["todo"], blocked_by=[1])
        tracker = GitHubTracker(
            settings=TrackerSettings(
                kind="github", endpoint=server.url, repository=server.repository
            ),
            token=server.token,
        )
        got = await tracker.fetch_candidate_issues()
        assert [i.blocked_by for i in got] == [(), (), ()]
        assert not tracker.dependencies_available
        asked = len(server.requests_to("dependencies"))
        await tracker.fetch_candidate_issues()
        assert len(server.requests_to("dependencies")) == asked
        assert 1 <= asked <= 3  # concurrent requests may already be in flight
        await tracker.close()


async def test_dependencies_can_be_turned_off(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    github_server.add_issue("I", labels=["todo"])
    await make_tracker(provider={"dependencies": False}).fetch_candidate_issues()
    assert github_server.requests_to("dependencies") == []


# -- routing --------------------------------------------------------------------------------------


async def test_assignee_routing(github_server: FakeGitHubServer, make_tracker: MakeTracker) -> None:
    github_server.add_issue(
        "Mine", labels=["todo"], assignees=["someone", github_server.login.upper()]
    )
    github_server.add_issue("Theirs", labels=["todo"], assignees=["someone"])
    github_server.add_issue("Nobody's", labels=["todo"])
    tracker = make_tracker(assignee="me", provider={"dependencies": False})
    got = await tracker.fetch_candidate_issues()
    assert {i.title: i.dispatchable for i in got} == {
        "Mine": True,
        "Theirs": False,
        "Nobody's": False,
    }
    await tracker.fetch_candidate_issues()
    assert len(github_server.requests_to("/user")) == 1
    got = await make_tracker(
        assignee="someone", provider={"dependencies": False}
    ).fetch_candidate_issues()
    assert {i.title for i in got if i.dispatchable} == {"Mine", "Theirs"}


# -- transport, auth and errors -------------------------------------------------------------------


async def test_headers(github_server: FakeGitHubServer, make_tracker: MakeTracker) -> None:
    await make_tracker().fetch_candidate_issues()
    request = github_server.requests[0]
    assert request.authorization == f"Bearer {github_server.token}"
    assert request.headers["X-GitHub-Api-Version"] == "2022-11-28"
    assert request.headers["Accept"] == "application/vnd.github+json"


async def test_a_bad_token_is_a_status_error_naming_the_setting(make_tracker: MakeTracker) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(token="nope").fetch_candidate_issues()
    assert err.value.code == "github_api_status"
    assert "HTTP 401" in err.value.message
    assert "Bad credentials" in err.value.message
    assert "tracker.api_key" in err.value.message


async def test_an_unknown_repository_is_a_status_error(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    with pytest.raises(TrackerError) as err:
        await make_tracker(repository="octo-org/missing").fetch_candidate_issues()
    assert err.value.code == "github_api_status"
    assert "check tracker.repository" in err.value.message


@pytest.mark.parametrize(
    ("kind", "options", "code", "retryable"),
    [
        ("status", {"status": 502}, "github_api_status", True),
        ("status", {"status": 422}, "github_api_status", False),
        (
            "status",
            {"status": 403, "message": "Resource not accessible"},
            "github_api_status",
            False,
        ),
        ("malformed", {"body": {"not": "a list"}}, "github_unknown_payload", False),
        ("not_json", {}, "github_unknown_payload", False),
        ("disconnect", {}, "github_api_request", True),
    ],
)
async def test_errors_are_classified(
    github_server: FakeGitHubServer,
    make_tracker: MakeTracker,
    kind: str,
    options: dict[str, Any],
    code: str,
    retryable: bool,
) -> None:
    github_server.fail_next(kind, **options)
    with pytest.raises(TrackerError) as err:
        await make_tracker().fetch_candidate_issues()
    assert err.value.code == code
    assert err.value.retryable is retryable
    assert "; " in err.value.message


async def test_an_unreachable_endpoint_is_a_request_error() -> None:
    server = FakeGitHubServer()
    await server.start()
    url = server.url
    await server.stop()
    tracker = GitHubTracker(
        settings=TrackerSettings(kind="github", endpoint=url, repository="o/r"), token="t"
    )
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "github_api_request"
    await tracker.close()


# -- rate limits ----------------------------------------------------------------------------------


async def test_secondary_limit_with_retry_after_waits_and_succeeds(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    github_server.add_issue("I", labels=["todo"])
    github_server.fail_next("secondary", retry_after=2, status=429)
    got = await make_tracker(
        provider={"rate_limit_max_wait_ms": 5000, "dependencies": False}
    ).fetch_candidate_issues()
    assert len(got) == 1
    assert len(sleeps) == 1
    assert 2 <= sleeps[0] <= 2.25


async def test_secondary_limit_without_retry_after_fails_at_once(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    github_server.fail_next("secondary", status=403)
    with pytest.raises(TrackerError) as err:
        await make_tracker(provider={"rate_limit_max_wait_ms": 5000}).fetch_candidate_issues()
    assert err.value.code == "github_rate_limited"
    assert err.value.retry_after_ms == 60000
    assert "secondary rate limit" in err.value.message
    assert sleeps == []


async def test_primary_limit_waits_for_a_near_reset(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    github_server.fail_next("primary", reset_in_s=0.5)
    await make_tracker(provider={"rate_limit_max_wait_ms": 3000}).fetch_candidate_issues()
    assert len(sleeps) == 1
    assert sleeps[0] <= 3


async def test_a_spent_primary_budget_fails_fast_on_the_next_call(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    github_server.add_issue("I", labels=["todo"])
    github_server.set_rate_budget(remaining=1, reset_in_s=3600)
    tracker = make_tracker(active_states=("Todo",), provider={"dependencies": False})
    assert len(await tracker.fetch_candidate_issues()) == 1  # the last request of the budget
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "github_rate_limited"
    assert err.value.retry_after_ms is not None
    assert err.value.retry_after_ms > 3_000_000
    assert len(github_server.requests) == 1  # no request spent on a certain refusal
    assert sleeps == []


async def test_rate_limit_retries_are_bounded(
    github_server: FakeGitHubServer, make_tracker: MakeTracker, sleeps: list[float]
) -> None:
    github_server.fail_next("secondary", times=10, retry_after=1, status=403)
    tracker = make_tracker(provider={"rate_limit_retries": 3, "rate_limit_max_wait_ms": 1500})
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_candidate_issues()
    assert err.value.code == "github_rate_limited"
    assert len(github_server.requests) == 4
    assert len(sleeps) == 3
    assert all(s <= 1.5 for s in sleeps)


# -- configuration and lifecycle ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "token", "code", "key_path"),
    [
        ({"repository": "o/r"}, "", "missing_tracker_api_key", "tracker.api_key"),
        ({}, "t", "missing_tracker_repository", "tracker.repository"),
        ({"repository": "just-a-name"}, "t", "invalid_tracker_repository", "tracker.repository"),
        ({"repository": "o/r/extra"}, "t", "invalid_tracker_repository", "tracker.repository"),
        (
            {"repository": "o/r", "provider": {"page_size": 101}},
            "t",
            "invalid_tracker_config",
            "tracker.provider.page_size",
        ),
    ],
)
def test_configuration_errors(
    settings: dict[str, Any], token: str, code: str, key_path: str
) -> None:
    with pytest.raises(TrackerError) as err:
        GitHubTracker(settings=TrackerSettings(kind="github", **settings), token=token)
    assert err.value.code == code
    assert err.value.key_path == key_path


async def test_defaults_and_close(
    github_server: FakeGitHubServer, make_tracker: MakeTracker
) -> None:
    default = GitHubTracker(settings=TrackerSettings(kind="github", repository="o/r"), token="t")
    assert default.endpoint == "https://api.github.com"
    await default.close()
    tracker = make_tracker()
    await tracker.fetch_candidate_issues()
    await tracker.close()
    with pytest.raises(TrackerError) as err:
        await tracker.fetch_issues_by_ids(["1"])
    assert err.value.code == "tracker_closed"
