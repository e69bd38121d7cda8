"""A faithful local fake of the GitHub REST endpoints the GitHub tracker uses.

Served by aiohttp on 127.0.0.1, it answers like api.github.com for: the repository issue
listing (``state``, ``labels`` as an AND filter compared case-insensitively, ``per_page``/``page``
with a ``Link`` header, pull requests mixed in), a single issue (404 unknown, 410 deleted, 301
transferred), the issue dependencies listing (``…/dependencies/blocked_by``, or 404 when the
server is told it has no dependencies API) and ``GET /user``; and, for agents that move their own
issues, the write endpoints that change labels (``POST``/``PUT``/``DELETE …/issues/{n}/labels``,
``DELETE …/labels/{name}``) and state (``PATCH …/issues/{n}`` with ``state``/``state_reason``).
Every response carries the ``x-ratelimit-*`` headers of a primary budget; when the budget is
spent it answers 403 the way GitHub does, and secondary limits (403/429 with ``retry-after``)
can be injected along with server errors, malformed payloads and dropped connections. Requests
are recorded (write requests with their JSON body), and besides the tracker's token the server
can accept more (``tokens=``), so an agent can write with credentials of its own.

``async with FakeGitHubServer() as github:`` in a test's loop, or
``with FakeGitHubServer().running_in_thread() as github:`` from synchronous code.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from tests.fakes.loopback import LoopbackFake

DEFAULT_TOKEN = "ghp_fake0123456789abcdefABCDEF012345"
DEFAULT_REPOSITORY = "octo-org/lorenz-fake"
DEFAULT_LOGIN = "octo-viewer"
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DOCS = "https://docs.github.com/rest"


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class FakeGitHubIssue:
    number: int
    title: str
    body: str | None
    labels: list[str]
    state: str = "open"
    state_reason: str | None = None
    assignees: list[str] = dataclasses.field(default_factory=list)
    pull_request: bool = False
    blocked_by: list[int] = dataclasses.field(default_factory=list)
    comments: list[str] = dataclasses.field(default_factory=list)
    """Comment bodies, oldest first."""
    comment_authors: dict[int, str] = dataclasses.field(default_factory=dict)
    """The login of the comment at an index of :attr:`comments` (else the token's login)."""
    comment_times: dict[int, datetime.datetime] = dataclasses.field(default_factory=dict)
    """When the comment at an index was posted (else the fake's epoch)."""
    deleted_comments: set[int] = dataclasses.field(default_factory=set)
    """Indexes of :attr:`comments` that were deleted (no longer listed)."""
    created_at: datetime.datetime = _EPOCH
    updated_at: datetime.datetime = _EPOCH
    deleted: bool = False
    transferred_to: str | None = None


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int = 0
    body: Any = None
    """The decoded JSON body of a write request (``None`` for reads or a body that is not JSON)."""

    @property
    def authorization(self) -> str | None:
        return self.headers.get("Authorization")


@dataclasses.dataclass
class _Failure:
    kind: str
    status: int
    message: str
    body: Any
    retry_after: float | None
    reset_in_s: float
    paths: tuple[str, ...] | None


FAILURE_KINDS = ("status", "secondary", "primary", "malformed", "not_json", "disconnect")


class FakeGitHubServer(LoopbackFake):
    """GitHub's Issues REST API over one seeded repository; see the module docstring."""

    thread_name = "fake-github"

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        repository: str = DEFAULT_REPOSITORY,
        login: str = DEFAULT_LOGIN,
        dependencies_api: bool = True,
        rate_limit: int = 5000,
        tokens: Iterable[str] = (),
    ) -> None:
        """``tokens``: more accepted tokens besides ``token`` (other users or apps, e.g. the
        agent's own token in end-to-end tests); requests record which one they carried."""
        self.token = token
        self.tokens = frozenset(tokens)
        self.repository = repository
        self.login = login
        self.dependencies_api = dependencies_api
        self.rate_limit = rate_limit
        self.requests: list[RecordedRequest] = []
        self._issues: dict[int, FakeGitHubIssue] = {}
        self._numbers = itertools.count(1)
        self._clock = itertools.count(1)
        self._failures: list[_Failure] = []
        self._remaining = rate_limit
        self._reset_at = time.time() + 3600
        self._lock = threading.RLock()

    # -- seeding and moving things ------------------------------------------------------------

    def add_issue(
        self,
        title: str = "Untitled issue",
        *,
        labels: Iterable[str] = (),
        state: str = "open",
        state_reason: str | None = None,
        body: str | None = None,
        assignees: Iterable[str] = (),
        blocked_by: Iterable[int] = (),
        pull_request: bool = False,
    ) -> FakeGitHubIssue:
        """Seed an issue (or, with ``pull_request``, a pull request); numbers count up."""
        with self._lock:
            moment = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            issue = FakeGitHubIssue(
                number=next(self._numbers),
                title=title,
                body=body,
                labels=list(labels),
                state=state,
                state_reason=state_reason or ("completed" if state == "closed" else None),
                assignees=list(assignees),
                pull_request=pull_request,
                blocked_by=list(blocked_by),
                created_at=moment,
                updated_at=moment,
            )
            self._issues[issue.number] = issue
            return issue

    def add_pull_request(self, title: str = "A pull request", **options: Any) -> FakeGitHubIssue:
        return self.add_issue(title, pull_request=True, **options)

    def issue(self, number: int) -> FakeGitHubIssue:
        with self._lock:
            return self._issues[number]

    def set_labels(self, number: int, labels: Iterable[str]) -> None:
        with self._lock:
            issue = self._issues[number]
            issue.labels = list(labels)
            self._touch(issue)

    def close_issue(self, number: int, *, reason: str = "completed") -> None:
        with self._lock:
            issue = self._issues[number]
            issue.state, issue.state_reason = "closed", reason
            self._touch(issue)

    def reopen_issue(self, number: int) -> None:
        with self._lock:
            issue = self._issues[number]
            issue.state, issue.state_reason = "open", "reopened"
            self._touch(issue)

    def add_dependency(self, *, blocked: int, blocker: int) -> None:
        with self._lock:
            self._issues[blocked].blocked_by.append(blocker)

    def delete_issue(self, number: int) -> None:
        """The issue is gone: 410 for the single-issue endpoint, absent from listings."""
        with self._lock:
            self._issues[number].deleted = True

    def transfer_issue(self, number: int, *, to: str) -> None:
        """The issue moved to another repository: 301 for the single-issue endpoint."""
        with self._lock:
            self._issues[number].transferred_to = to

    def add_comment(self, number: int, body: str, *, login: str | None = None) -> int:
        """A comment by ``login`` (default: the token's user), posted now; returns its id."""
        with self._lock:
            issue = self.issue(number)
            issue.comments.append(body)
            index = len(issue.comments) - 1
            issue.comment_authors[index] = login or self.login
            issue.comment_times[index] = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            return self._comment_json(issue, index)["id"]  # type: ignore[no-any-return]

    def delete_comment(self, number: int, comment_id: int) -> None:
        """Delete a comment by id (it is no longer listed)."""
        with self._lock:
            issue = self.issue(number)
            issue.deleted_comments.add(comment_id - issue.number * 100000 - 1)

    def comment_ids(self, number: int) -> list[int]:
        """The ids of the issue's listed comments, oldest first."""
        with self._lock:
            issue = self.issue(number)
            return [
                issue.number * 100000 + i + 1
                for i in range(len(issue.comments))
                if i not in issue.deleted_comments
            ]

    def set_rate_budget(self, *, remaining: int, reset_in_s: float) -> None:
        with self._lock:
            self._remaining = remaining
            self._reset_at = time.time() + reset_in_s

    def fail_next(
        self,
        kind: str,
        *,
        times: int = 1,
        status: int = 500,
        message: str = "Server Error",
        body: Any = None,
        retry_after: float | None = None,
        reset_in_s: float = 0.05,
        paths: Iterable[str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests (whose path contains one of ``paths``) with a
        failure: ``status`` (HTTP ``status``), ``secondary`` (a secondary rate limit: HTTP
        ``status`` 403 or 429, ``retry-after`` when given), ``primary`` (403 with
        ``x-ratelimit-remaining: 0`` resetting ``reset_in_s`` ahead), ``malformed`` (200 with
        ``body``), ``not_json`` or ``disconnect``."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; known: {FAILURE_KINDS}")
        failure = _Failure(
            kind=kind,
            status=status,
            message=message,
            body=body,
            retry_after=retry_after,
            reset_in_s=reset_in_s,
            paths=tuple(paths) if paths is not None else None,
        )
        with self._lock:
            self._failures.extend([failure] * times)

    def requests_to(self, fragment: str) -> list[RecordedRequest]:
        return [r for r in self.requests if fragment in r.path]

    # -- serving ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the fake GitHub server is not running")
        return f"http://127.0.0.1:{self._port}"

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_get("/user", self._user)
        app.router.add_get("/repos/{owner}/{repo}/issues", self._list)
        app.router.add_get("/repos/{owner}/{repo}/issues/{number}", self._single)
        app.router.add_get(
            "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by", self._blocked_by
        )
        app.router.add_patch("/repos/{owner}/{repo}/issues/{number}", self._patch)
        comments = "/repos/{owner}/{repo}/issues/{number}/comments"
        app.router.add_get(comments, self._comments)
        app.router.add_post(comments, self._add_comment)
        labels = "/repos/{owner}/{repo}/issues/{number}/labels"
        app.router.add_post(labels, self._add_labels)
        app.router.add_put(labels, self._set_labels)
        app.router.add_delete(labels, self._clear_labels)
        app.router.add_delete(labels + "/{name}", self._remove_label)

    # -- handlers -----------------------------------------------------------------------------

    async def _user(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._json(200, {"login": self.login, "id": 1001}))

    async def _list(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._listing(request))

    async def _single(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._one(request))

    async def _blocked_by(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._dependencies(request))

    async def _patch(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return self._serve(request, lambda: self._update(request, body), body=body)

    async def _comments(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._comment_listing(request))

    async def _add_comment(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return self._serve(request, lambda: self._comment_write(request, body), body=body)

    async def _add_labels(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return self._serve(
            request, lambda: self._labels_write(request, body, replace=False), body=body
        )

    async def _set_labels(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        return self._serve(
            request, lambda: self._labels_write(request, body, replace=True), body=body
        )

    async def _clear_labels(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._labels_clear(request))

    async def _remove_label(self, request: web.Request) -> web.StreamResponse:
        return self._serve(request, lambda: self._label_remove(request))

    def _serve(self, request: web.Request, answer: Any, *, body: Any = None) -> web.StreamResponse:
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=body,
        )
        with self._lock:
            self.requests.append(record)
            response = self._checked(request, record) or answer()
        if response is _DISCONNECT:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake GitHub dropped the connection")
        assert isinstance(response, web.Response)
        record.status = response.status
        return response

    def _checked(
        self, request: web.Request, record: RecordedRequest
    ) -> web.Response | object | None:
        """Auth, repository, injected failures and the primary budget, in GitHub's order:
        ``None`` to go on, else the answer (a response, or ``_DISCONNECT``)."""
        auth = record.authorization or ""
        scheme, _, credential = auth.partition(" ")
        if scheme.lower() not in ("bearer", "token") or (
            credential != self.token and credential not in self.tokens
        ):
            return self._json(
                401, {"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}
            )
        owner, repo = request.match_info.get("owner"), request.match_info.get("repo")
        if owner is not None and f"{owner}/{repo}".lower() != self.repository.lower():
            return self._not_found()
        failure = self._pop_failure(request.path)
        if failure is not None:
            return self._failure_response(failure)
        if time.time() >= self._reset_at:
            self._remaining, self._reset_at = self.rate_limit, time.time() + 3600
        if self._remaining <= 0:
            return self._primary_limited(self._reset_at)
        self._remaining -= 1
        return None

    def _listing(self, request: web.Request) -> web.Response:
        query = request.query
        state = query.get("state", "open")
        if state not in ("open", "closed", "all"):
            return self._json(
                422, {"message": "Validation Failed", "documentation_url": DOCS, "status": "422"}
            )
        wanted = [w.strip().lower() for w in query.get("labels", "").split(",") if w.strip()]
        # NB: GitHub lists newest first by default (sort=created, direction=desc).
        items = [
            issue
            for issue in sorted(self._issues.values(), key=lambda i: i.number, reverse=True)
            if not issue.deleted
            and issue.transferred_to is None
            and (state == "all" or issue.state == state)
            and all(label in {lb.lower() for lb in issue.labels} for label in wanted)
        ]
        return self._page(request, [self._issue_json(i) for i in items])

    def _one(self, request: web.Request) -> web.Response:
        number = _number(request)
        issue = self._issues.get(number) if number is not None else None
        if issue is None:
            return self._not_found()
        if issue.deleted:
            return self._json(
                410,
                {"message": "This issue was deleted", "documentation_url": DOCS, "status": "410"},
            )
        if issue.transferred_to is not None:
            location = f"{self.url}/repos/{issue.transferred_to}/issues/{issue.number}"
            return web.json_response(
                {"message": "Moved Permanently", "url": location, "documentation_url": DOCS},
                status=301,
                headers={**self._rate_headers(), "Location": location},
            )
        return self._json(200, self._issue_json(issue))

    def _dependencies(self, request: web.Request) -> web.Response:
        if not self.dependencies_api:
            return self._not_found()
        number = _number(request)
        issue = self._issues.get(number) if number is not None else None
        if issue is None or issue.deleted:
            return self._not_found()
        blockers = [self._issues[n] for n in issue.blocked_by if n in self._issues]
        return self._page(request, [self._issue_json(b) for b in blockers if not b.deleted])

    # -- writes -------------------------------------------------------------------------------

    def _writable(self, request: web.Request) -> FakeGitHubIssue | web.Response:
        """The issue a write addresses, or GitHub's answer when there is none to write."""
        number = _number(request)
        issue = self._issues.get(number) if number is not None else None
        if issue is None or issue.transferred_to is not None:
            return self._not_found()
        if issue.deleted:
            return self._json(
                410,
                {"message": "This issue was deleted", "documentation_url": DOCS, "status": "410"},
            )
        return issue

    def _update(self, request: web.Request, body: Any) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        if not isinstance(body, dict):
            return self._invalid("Problems parsing JSON")
        state = body.get("state", issue.state)
        reason = body.get("state_reason")
        if state not in ("open", "closed"):
            return self._invalid(f"state {state!r} is not open or closed")
        if reason not in (None, "completed", "not_planned", "reopened", "duplicate"):
            return self._invalid(f"state_reason {reason!r} is not a valid reason")
        if "labels" in body:
            labels = _label_list(body["labels"])
            if labels is None:
                return self._invalid("labels must be a list of names")
            issue.labels = _merged([], labels)
        for field in ("title", "body"):
            if isinstance(body.get(field), str):
                setattr(issue, field, body[field])
        if state != issue.state or reason is not None:
            issue.state = state
            # GitHub: closing defaults the reason to completed, reopening to reopened.
            issue.state_reason = reason or ("completed" if state == "closed" else "reopened")
        self._touch(issue)
        return self._json(200, self._issue_json(issue))

    def _comment_json(self, issue: FakeGitHubIssue, index: int) -> dict[str, Any]:
        return {
            "id": issue.number * 100000 + index + 1,
            "body": issue.comments[index],
            "user": {"login": issue.comment_authors.get(index, self.login)},
            "created_at": _iso(issue.comment_times.get(index, _EPOCH)),
            "updated_at": _iso(issue.comment_times.get(index, _EPOCH)),
        }

    def _comment_listing(self, request: web.Request) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        return self._page(
            request,
            [
                self._comment_json(issue, i)
                for i in range(len(issue.comments))
                if i not in issue.deleted_comments
            ],
        )

    def _comment_write(self, request: web.Request, body: Any) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        text = body.get("body") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            return self._invalid("body is required")
        issue.comments.append(text)
        issue.comment_times[len(issue.comments) - 1] = _EPOCH + datetime.timedelta(
            seconds=next(self._clock)
        )
        self._touch(issue)
        return self._json(201, self._comment_json(issue, len(issue.comments) - 1))

    def _labels_write(self, request: web.Request, body: Any, *, replace: bool) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        # NB: GitHub takes ``{"labels": [...]}`` or a bare list of names.
        labels = _label_list(body.get("labels") if isinstance(body, dict) else body)
        if labels is None:
            return self._invalid("labels must be a list of names")
        issue.labels = _merged([] if replace else issue.labels, labels)
        self._touch(issue)
        return self._json(200, self._labels_json(issue))

    def _labels_clear(self, request: web.Request) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        issue.labels = []
        self._touch(issue)
        return web.Response(status=204, headers=self._rate_headers())

    def _label_remove(self, request: web.Request) -> web.Response:
        issue = self._writable(request)
        if isinstance(issue, web.Response):
            return issue
        name = request.match_info["name"].lower()
        kept = [label for label in issue.labels if label.lower() != name]
        if len(kept) == len(issue.labels):
            return self._json(
                404,
                {"message": "Label does not exist", "documentation_url": DOCS, "status": "404"},
            )
        issue.labels = kept
        self._touch(issue)
        return self._json(200, self._labels_json(issue))

    def _invalid(self, detail: str) -> web.Response:
        return self._json(
            422,
            {
                "message": "Validation Failed",
                "errors": [{"message": detail}],
                "documentation_url": DOCS,
                "status": "422",
            },
        )

    # -- responses ----------------------------------------------------------------------------

    def _page(self, request: web.Request, items: list[dict[str, Any]]) -> web.Response:
        try:
            per_page = min(MAX_PER_PAGE, int(request.query.get("per_page", DEFAULT_PER_PAGE)))
            page = max(1, int(request.query.get("page", 1)))
        except ValueError:
            return self._json(
                422, {"message": "Validation Failed", "documentation_url": DOCS, "status": "422"}
            )
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]
        links = []

        def link(to_page: int, rel: str) -> str:
            query = {**request.query, "page": str(to_page)}
            return f'<{self.url}{request.path}?{urlencode(query)}>; rel="{rel}"'

        if page > 1:
            links.append(link(page - 1, "prev"))
            links.append(link(1, "first"))
        if page < last:
            links.append(link(page + 1, "next"))
            links.append(link(last, "last"))
        headers = {"Link": ", ".join(links)} if links else {}
        return self._json(200, chunk, headers=headers)

    def _label_json(self, name: str) -> dict[str, Any]:
        return {
            "id": 700000 + abs(hash(name)) % 100000,
            "node_id": f"LA_fake_{name}",
            "url": f"{self.url}/repos/{self.repository}/labels/{name}",
            "name": name,
            "color": "ededed",
            "default": False,
            "description": None,
        }

    def _labels_json(self, issue: FakeGitHubIssue) -> list[dict[str, Any]]:
        return [self._label_json(name) for name in issue.labels]

    def _issue_json(self, issue: FakeGitHubIssue) -> dict[str, Any]:
        api = f"{self.url}/repos/{self.repository}"
        kind = "pull" if issue.pull_request else "issues"
        users = [
            {"login": login, "id": 2000 + i, "type": "User"}
            for i, login in enumerate(issue.assignees)
        ]
        item: dict[str, Any] = {
            "url": f"{api}/issues/{issue.number}",
            "repository_url": api,
            "html_url": f"https://github.com/{self.repository}/{kind}/{issue.number}",
            "id": 900000 + issue.number,
            "node_id": f"I_kwDOFake{issue.number:06d}",
            "number": issue.number,
            "title": issue.title,
            "user": {"login": "octocat", "id": 1, "type": "User"},
            "labels": self._labels_json(issue),
            "state": issue.state,
            "state_reason": issue.state_reason,
            "locked": False,
            "assignee": users[0] if users else None,
            "assignees": users,
            "comments": 0,
            "created_at": _iso(issue.created_at),
            "updated_at": _iso(issue.updated_at),
            "closed_at": _iso(issue.updated_at) if issue.state == "closed" else None,
            "author_association": "OWNER",
            "body": issue.body,
        }
        if issue.pull_request:
            item["pull_request"] = {
                "url": f"{api}/pulls/{issue.number}",
                "html_url": item["html_url"],
                "diff_url": f"{item['html_url']}.diff",
                "patch_url": f"{item['html_url']}.patch",
                "merged_at": None,
            }
        return item

    def _rate_headers(self, *, remaining: int | None = None) -> dict[str, str]:
        left = self._remaining if remaining is None else remaining
        return {
            "x-ratelimit-limit": str(self.rate_limit),
            "x-ratelimit-remaining": str(max(0, left)),
            "x-ratelimit-used": str(self.rate_limit - max(0, left)),
            "x-ratelimit-reset": str(int(self._reset_at)),
            "x-ratelimit-resource": "core",
            "X-GitHub-Api-Version-Selected": "2022-11-28",
        }

    def _json(
        self, status: int, payload: Any, *, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        return web.json_response(
            payload, status=status, headers={**self._rate_headers(), **(headers or {})}
        )

    def _not_found(self) -> web.Response:
        return self._json(404, {"message": "Not Found", "documentation_url": DOCS, "status": "404"})

    def _primary_limited(self, reset_at: float) -> web.Response:
        return web.json_response(
            {
                "message": "API rate limit exceeded for user ID 1001. If you reach out to GitHub "
                "Support for help, please include the request ID.",
                "documentation_url": f"{DOCS}/overview/rate-limits-for-the-rest-api",
                "status": "403",
            },
            status=403,
            headers={
                **self._rate_headers(remaining=0),
                "x-ratelimit-reset": str(int(reset_at) + (1 if reset_at % 1 else 0)),
            },
        )

    def _failure_response(self, failure: _Failure) -> web.Response | object:
        if failure.kind == "disconnect":
            return _DISCONNECT
        if failure.kind == "status":
            return web.json_response(
                {
                    "message": failure.message,
                    "documentation_url": DOCS,
                    "status": str(failure.status),
                },
                status=failure.status,
            )
        if failure.kind == "secondary":
            headers = self._rate_headers()
            if failure.retry_after is not None:
                headers["retry-after"] = f"{failure.retry_after:g}"
            status = failure.status if failure.status in (403, 429) else 403
            return web.json_response(
                {
                    "message": "You have exceeded a secondary rate limit. Please wait a few "
                    "minutes before you try again.",
                    "documentation_url": f"{DOCS}/overview/rate-limits-for-the-rest-api",
                    "status": str(status),
                },
                status=status,
                headers=headers,
            )
        if failure.kind == "primary":
            return self._primary_limited(time.time() + failure.reset_in_s)
        if failure.kind == "not_json":
            return web.Response(status=200, text="<html>unicorn</html>", content_type="text/html")
        return self._json(200, failure.body if failure.body is not None else {"unexpected": True})

    def _pop_failure(self, path: str) -> _Failure | None:
        for index, failure in enumerate(self._failures):
            if failure.paths is None or any(fragment in path for fragment in failure.paths):
                return self._failures.pop(index)
        return None

    def _touch(self, issue: FakeGitHubIssue) -> None:
        issue.updated_at = _EPOCH + datetime.timedelta(seconds=next(self._clock))


_DISCONNECT = object()


def _number(request: web.Request) -> int | None:
    text = request.match_info.get("number", "")
    return int(text) if text.isdigit() else None


async def _json_body(request: web.Request) -> Any:
    """The request's JSON body; ``None`` when it is empty or not JSON (answered 422 later)."""
    raw = await request.read()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _label_list(value: Any) -> list[str] | None:
    """Label names from a write body: strings, or ``{"name": ...}`` objects; else ``None``."""
    if not isinstance(value, list):
        return None
    names: list[str] = []
    for item in value:
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str) or not name.strip():
            return None
        names.append(name)
    return names


def _merged(current: list[str], added: list[str]) -> list[str]:
    """``current`` plus ``added``, without a second copy of a name (compared ignoring case)."""
    out = list(current)
    for name in added:
        if name.lower() not in {existing.lower() for existing in out}:
            out.append(name)
    return out
