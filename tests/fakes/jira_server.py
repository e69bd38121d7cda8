"""A faithful local fake of the Jira Cloud REST v3 endpoints the Jira tracker uses.

Served by aiohttp on 127.0.0.1, it answers like a Jira Cloud site (``https://<site>.atlassian.net``)
for one or more projects:

- ``GET /rest/api/3/search/jql`` — the enhanced JQL search: ``jql``, ``maxResults`` (capped),
  ``fields`` (comma-separated; ``*all``/``*navigable`` too), ``nextPageToken``; the answer is
  ``{"issues": [...], "nextPageToken": ..., "isLast": ...}`` and, like the real service, the
  last page leaves ``nextPageToken`` out. A stale or foreign token is a 400. The JQL subset
  understood is what the tracker and an agent plausibly send: ``project = X``, ``status in
  (...)``/``status = X``, ``id in (...)``, ``key = X``, ``labels = X``, ``issuetype = X``,
  ``assignee = currentUser()``, ``!=``, ``AND``, parentheses and ``ORDER BY``; anything else is
  a 400 with Jira's error body, and an unknown project or status name a 400 like Jira's "The
  value 'X' does not exist for the field 'status'." (one message per unknown value).
- ``POST /rest/api/3/issue/bulkfetch`` — ``issueIdsOrKeys`` (at most 100), ``fields``; issues
  not found are simply not returned; ``issueErrors`` can be injected.
- ``GET /rest/api/3/issue/{idOrKey}`` (``fields``), ``PUT`` (``update.labels`` add/remove/set,
  ``fields.labels``/``summary``) → 204.
- ``GET``/``POST /rest/api/3/issue/{idOrKey}/transitions`` — the workflow's transitions from the
  current status (``{"transitions": [{"id", "name", "to": {status}, "isAvailable", ...}]}``),
  ``POST {"transition": {"id"}}`` → 204, an invalid id → 400.
- ``GET``/``POST /rest/api/3/issue/{idOrKey}/comment`` — ``startAt``/``maxResults``/``total``
  paging; bodies must be ADF documents (``{"type": "doc", "version": 1, ...}``), else 400.
- ``DELETE /rest/api/3/issue/{idOrKey}/comment/{id}`` → 204 (for agents tidying up).
- ``GET /rest/api/3/myself``.

Auth is HTTP basic (email + API token); anything else is a 401 with Jira's text body. Every
response carries ``X-RateLimit-Limit``/``X-RateLimit-Remaining``; a spent budget (or an injected
``rate_limit`` failure) answers 429 with ``Retry-After``, ``X-RateLimit-Reset`` (ISO 8601) and
``RateLimit-Reason``. Failures (status, malformed, not JSON, disconnect, 503 with Retry-After,
an oversized body) can be injected per path. Requests are recorded with their JSON bodies.

``async with FakeJiraServer() as jira:`` in a test's loop, or
``with FakeJiraServer().running_in_thread() as jira:`` from synchronous code.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import itertools
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from tests.fakes.loopback import LoopbackFake

DEFAULT_EMAIL = "lorenz-bot@example.com"
DEFAULT_TOKEN = "ATATT3xFfGF0fake0123456789abcdefABCDEF"
DEFAULT_PROJECT = "ENG"
DEFAULT_ACCOUNT_ID = "5b10ac8d82e05b22cc7d4ef5"
DEFAULT_MAX_RESULTS = 50
MAX_RESULTS_LIMIT = 100
BULK_FETCH_LIMIT = 100
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

STATUS_CATEGORIES = {
    "new": {"id": 2, "key": "new", "colorName": "blue-gray", "name": "To Do"},
    "indeterminate": {
        "id": 4, "key": "indeterminate", "colorName": "yellow", "name": "In Progress"
    },
    "done": {"id": 3, "key": "done", "colorName": "green", "name": "Done"},
}
DEFAULT_STATUSES = {
    "To Do": "new",
    "Todo": "new",
    "In Progress": "indeterminate",
    "In Review": "indeterminate",
    "Done": "done",
    "Cancelled": "done",
}
"""Status name → status category key of the fake's workflow (every status reachable from every
other, the way a simplified team-managed workflow works)."""


def _jira_time(moment: datetime.datetime) -> str:
    """Jira's timestamp format: ``2026-01-01T00:00:01.000+0000``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")


def adf(text: str) -> dict[str, Any]:
    """A plain text as a one-paragraph ADF document (for seeding)."""
    return {
        "type": "doc",
        "version": 1,
        "content": [{"type": "paragraph", "content": [{"type": "text", "text": text}]}],
    }


def adf_text(document: Any) -> str:
    """Every text node of an ADF document, concatenated (for assertions)."""
    if isinstance(document, dict):
        own = document.get("text") if document.get("type") == "text" else ""
        return (own or "") + "".join(adf_text(c) for c in document.get("content") or [])
    return ""


@dataclasses.dataclass
class FakeJiraIssue:
    id: int
    key: str
    project: str
    summary: str
    status: str
    description: Any = None
    """ADF document (or ``None``)."""
    labels: list[str] = dataclasses.field(default_factory=list)
    priority: str | None = "Medium"
    assignee: str | None = None
    issue_type: str = "Task"
    blocked_by: list[str] = dataclasses.field(default_factory=list)
    """Keys of the issues that block this one (a ``Blocks`` link, seen inward from here)."""
    comments: list[Any] = dataclasses.field(default_factory=list)
    """Comment bodies (ADF), oldest first."""
    comment_authors: dict[int, str] = dataclasses.field(default_factory=dict)
    """The account id of the comment at an index of :attr:`comments` (else the token's)."""
    comment_times: dict[int, datetime.datetime] = dataclasses.field(default_factory=dict)
    """When the comment at an index was posted (else the fake's epoch)."""
    created: datetime.datetime = _EPOCH
    updated: datetime.datetime = _EPOCH


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    status: int = 0
    body: Any = None

    @property
    def authorization(self) -> str | None:
        return self.headers.get("Authorization")


@dataclasses.dataclass
class _Failure:
    kind: str
    status: int
    body: Any
    retry_after: float | None
    paths: tuple[str, ...] | None


FAILURE_KINDS = ("status", "rate_limit", "busy", "malformed", "not_json", "disconnect", "huge")


class JqlError(ValueError):
    """The JQL is outside the fake's subset or names something unknown (Jira answers 400 with
    one error message per problem)."""

    def __init__(self, *messages: str) -> None:
        super().__init__(" ".join(messages))
        self.messages = list(messages)


class FakeJiraServer(LoopbackFake):
    """Jira Cloud REST v3 over seeded projects; see the module docstring."""

    thread_name = "fake-jira"

    def __init__(
        self,
        *,
        email: str = DEFAULT_EMAIL,
        token: str = DEFAULT_TOKEN,
        project: str = DEFAULT_PROJECT,
        projects: Iterable[str] = (),
        account_id: str = DEFAULT_ACCOUNT_ID,
        statuses: Mapping[str, str] | None = None,
        rate_limit: int = 10000,
    ) -> None:
        self.email = email
        self.token = token
        self.project = project
        self.projects = {project, *projects}
        self.account_id = account_id
        self.statuses = dict(statuses or DEFAULT_STATUSES)
        self.rate_limit = rate_limit
        self.requests: list[RecordedRequest] = []
        self.issue_errors: list[dict[str, Any]] = []
        """Answered as ``issueErrors`` by the next bulk fetch (then cleared)."""
        self.unavailable_transitions: set[str] = set()
        """Target status names whose transitions are listed with ``isAvailable: false``."""
        self._issues: dict[int, FakeJiraIssue] = {}
        self._ids = itertools.count(10001)
        self._numbers: dict[str, itertools.count[int]] = {}
        self._clock = itertools.count(1)
        self._failures: list[_Failure] = []
        self._remaining = rate_limit
        self._reset_at = time.time() + 60
        self._tokens: dict[str, tuple[str, int]] = {}
        self._lock = threading.RLock()
        self.user_emails: dict[str, str] = {}
        """E-mail addresses other accounts show (Jira hides them unless the user allows)."""

    # -- seeding and moving things ------------------------------------------------------------

    def add_issue(
        self,
        summary: str = "Untitled issue",
        *,
        status: str = "To Do",
        project: str | None = None,
        description: Any = None,
        labels: Iterable[str] = (),
        priority: str | None = "Medium",
        assignee: str | None = None,
        issue_type: str = "Task",
        blocked_by: Iterable[str] = (),
    ) -> FakeJiraIssue:
        """Seed an issue; ids count up from 10001, keys per project from 1. A ``description``
        string is stored as a one-paragraph ADF document."""
        with self._lock:
            project_key = project or self.project
            self.projects.add(project_key)
            number = next(self._numbers.setdefault(project_key, itertools.count(1)))
            moment = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            issue = FakeJiraIssue(
                id=next(self._ids),
                key=f"{project_key}-{number}",
                project=project_key,
                summary=summary,
                status=status,
                description=adf(description) if isinstance(description, str) else description,
                labels=list(labels),
                priority=priority,
                assignee=assignee,
                issue_type=issue_type,
                blocked_by=list(blocked_by),
                created=moment,
                updated=moment,
            )
            self._issues[issue.id] = issue
            return issue

    def issue(self, id_or_key: int | str) -> FakeJiraIssue:
        with self._lock:
            found = self._find(str(id_or_key))
            if found is None:
                raise KeyError(id_or_key)
            return found

    def set_status(self, id_or_key: int | str, status: str) -> None:
        with self._lock:
            issue = self.issue(id_or_key)
            issue.status = status
            self._touch(issue)

    def delete_issue(self, id_or_key: int | str) -> None:
        with self._lock:
            del self._issues[self.issue(id_or_key).id]

    def move_issue(self, id_or_key: int | str, *, to_project: str) -> FakeJiraIssue:
        """Move the issue to another project: a new key, the same id."""
        with self._lock:
            issue = self.issue(id_or_key)
            self.projects.add(to_project)
            number = next(self._numbers.setdefault(to_project, itertools.count(1)))
            issue.project, issue.key = to_project, f"{to_project}-{number}"
            self._touch(issue)
            return issue

    def comment_texts(self, id_or_key: int | str) -> list[str]:
        with self._lock:
            return [adf_text(body) for body in self.issue(id_or_key).comments if body is not None]

    def add_comment(
        self, id_or_key: int | str, text: str | dict[str, Any], *, account_id: str | None = None
    ) -> str:
        """A comment (plain text or an ADF document) by ``account_id`` (default: the token's
        account), posted now; returns its id."""
        with self._lock:
            issue = self.issue(id_or_key)
            issue.comments.append(adf(text) if isinstance(text, str) else text)
            index = len(issue.comments) - 1
            issue.comment_authors[index] = account_id or self.account_id
            issue.comment_times[index] = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            return str(issue.id * 1000 + index)

    def delete_comment(self, id_or_key: int | str, comment_id: str) -> None:
        """Delete a comment by id (it is no longer listed)."""
        with self._lock:
            issue = self.issue(id_or_key)
            issue.comments[int(comment_id) - issue.id * 1000] = None

    def comment_ids(self, id_or_key: int | str) -> list[str]:
        """The ids of the issue's listed comments, oldest first."""
        with self._lock:
            issue = self.issue(id_or_key)
            return [
                str(issue.id * 1000 + i) for i, c in enumerate(issue.comments) if c is not None
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
        body: Any = None,
        retry_after: float | None = None,
        paths: Iterable[str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests (whose path contains one of ``paths``) with a
        failure: ``status`` (HTTP ``status`` with Jira's error body), ``rate_limit`` (429 with
        ``Retry-After`` when given and ``X-RateLimit-Reset``), ``busy`` (503 with
        ``Retry-After``), ``malformed`` (200 with ``body``), ``not_json``, ``disconnect`` or
        ``huge`` (a 200 JSON body of several megabytes)."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; known: {FAILURE_KINDS}")
        failure = _Failure(
            kind=kind,
            status=status,
            body=body,
            retry_after=retry_after,
            paths=tuple(paths) if paths is not None else None,
        )
        with self._lock:
            self._failures.extend([failure] * times)

    def requests_to(self, fragment: str, *, method: str | None = None) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if fragment in r.path and (method is None or r.method == method)
        ]

    # -- serving ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the fake Jira server is not running")
        return f"http://127.0.0.1:{self._port}"

    def _add_routes(self, app: web.Application) -> None:
        api = "/rest/api/3"
        app.router.add_get(f"{api}/myself", self._myself)
        app.router.add_get(f"{api}/search/jql", self._search)
        app.router.add_post(f"{api}/issue/bulkfetch", self._bulkfetch)
        app.router.add_get(f"{api}/issue/{{key}}", self._get_issue)
        app.router.add_put(f"{api}/issue/{{key}}", self._edit_issue)
        app.router.add_get(f"{api}/issue/{{key}}/transitions", self._transitions)
        app.router.add_post(f"{api}/issue/{{key}}/transitions", self._transition)
        app.router.add_get(f"{api}/issue/{{key}}/comment", self._comments)
        app.router.add_post(f"{api}/issue/{{key}}/comment", self._add_comment)
        app.router.add_delete(f"{api}/issue/{{key}}/comment/{{comment}}", self._delete_comment)

    async def _myself(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._json(200, self._user_json()))

    async def _search(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._search_answer(request))

    async def _bulkfetch(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda body: self._bulk_answer(body), read_body=True)

    async def _get_issue(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._issue_answer(request))

    async def _edit_issue(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda body: self._edit(request, body), read_body=True)

    async def _transitions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._transition_listing(request))

    async def _transition(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(
            request, lambda body: self._do_transition(request, body), read_body=True
        )

    async def _comments(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._comment_listing(request))

    async def _add_comment(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(
            request, lambda body: self._comment_write(request, body), read_body=True
        )

    async def _delete_comment(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, lambda _: self._comment_delete(request))

    async def _serve(
        self, request: web.Request, answer: Any, *, read_body: bool = False
    ) -> web.StreamResponse:
        body: Any = None
        raw = await request.read() if read_body else b""
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = _NOT_JSON
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=None if body is _NOT_JSON else body,
        )
        with self._lock:
            self.requests.append(record)
            response = self._checked(request, record)
            if response is None:
                if body is _NOT_JSON:
                    response = self._errors(400, ["Unexpected character in the request body."])
                else:
                    response = answer(body)
        if response is _DISCONNECT:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake Jira dropped the connection")
        assert isinstance(response, web.Response)
        record.status = response.status
        return response

    def _checked(self, request: web.Request, record: RecordedRequest) -> web.Response | object:
        """Auth, injected failures and the rate budget, in that order: ``None`` to go on."""
        if not self._authorized(record.authorization or ""):
            # NB: Jira Cloud answers a bad basic credential with a plain-text 401.
            return web.Response(
                status=401,
                text="Client must be authenticated to access this resource.",
                headers={"WWW-Authenticate": 'Basic realm="protected-area"'},
            )
        failure = self._pop_failure(request.path)
        if failure is not None:
            return self._failure_response(failure)
        if time.time() >= self._reset_at:
            self._remaining, self._reset_at = self.rate_limit, time.time() + 60
        if self._remaining <= 0:
            return self._rate_limited(max(0.0, self._reset_at - time.time()))
        self._remaining -= 1
        return None

    def _authorized(self, header: str) -> bool:
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(credential, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return False
        return decoded == f"{self.email}:{self.token}"

    # -- reads --------------------------------------------------------------------------------

    def _search_answer(self, request: web.Request) -> web.Response:
        query = request.query
        jql = query.get("jql", "")
        token = query.get("nextPageToken")
        try:
            max_results = int(query.get("maxResults", DEFAULT_MAX_RESULTS))
        except ValueError:
            return self._errors(400, ["The value of 'maxResults' is not a number."])
        max_results = max(1, min(MAX_RESULTS_LIMIT, max_results))
        start = 0
        if token is not None:
            remembered = self._tokens.get(token)
            if remembered is None or remembered[0] != jql:
                return self._errors(400, ["The provided next page token is invalid or expired."])
            start = remembered[1]
        try:
            matches = self._run_jql(jql)
        except JqlError as exc:
            return self._errors(400, exc.messages)
        chunk = matches[start : start + max_results]
        fields = _requested_fields(query.get("fields"))
        answer: dict[str, Any] = {
            "issues": [self._issue_json(issue, fields) for issue in chunk],
        }
        if start + max_results < len(matches):
            next_token = f"tok-{len(self._tokens) + 1}-{start + max_results}"
            self._tokens[next_token] = (jql, start + max_results)
            answer["nextPageToken"] = next_token
            answer["isLast"] = False
        else:
            answer["isLast"] = True
        return self._json(200, answer)

    def _bulk_answer(self, body: Any) -> web.Response:
        ids = body.get("issueIdsOrKeys") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return self._errors(400, ["issueIdsOrKeys must be a non-empty list of ids or keys."])
        if len(ids) > BULK_FETCH_LIMIT:
            return self._errors(
                400, [f"You can request up to {BULK_FETCH_LIMIT} issues in a single call."]
            )
        fields = body.get("fields")
        wanted = _requested_fields(",".join(fields) if isinstance(fields, list) else None)
        found = {
            issue.id: issue for issue in (self._find(i) for i in ids) if issue is not None
        }
        errors, self.issue_errors = self.issue_errors, []
        return self._json(
            200,
            {
                # Jira returns the issues in ascending id order.
                "issues": [self._issue_json(found[k], wanted) for k in sorted(found)],
                "issueErrors": errors,
            },
        )

    def _issue_answer(self, request: web.Request) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        return self._json(200, self._issue_json(issue, _requested_fields(
            request.query.get("fields"))))

    def _transition_listing(self, request: web.Request) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        return self._json(200, {"expand": "transitions", "transitions": self._transitions_of(
            issue)})

    def _comment_listing(self, request: web.Request) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        try:
            start = max(0, int(request.query.get("startAt", 0)))
            size = max(1, min(100, int(request.query.get("maxResults", 50))))
        except ValueError:
            return self._errors(400, ["startAt and maxResults must be numbers."])
        present = [(i, c) for i, c in enumerate(issue.comments) if c is not None]
        order = request.query.get("orderBy", "created").lstrip("+")
        if order not in ("created", "-created"):
            return self._errors(400, [f"Invalid orderBy value: {order}"])
        if order == "-created":
            present.reverse()
        chunk = present[start : start + size]
        return self._json(
            200,
            {
                "startAt": start,
                "maxResults": size,
                "total": len(present),
                "comments": [self._comment_json(issue, i) for i, _ in chunk],
            },
        )

    # -- writes -------------------------------------------------------------------------------

    def _edit(self, request: web.Request, body: Any) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        if not isinstance(body, dict):
            return self._errors(400, ["No content to map due to end-of-input."])
        labels = list(issue.labels)
        fields: dict[str, Any] = body["fields"] if isinstance(body.get("fields"), dict) else {}
        update: dict[str, Any] = body["update"] if isinstance(body.get("update"), dict) else {}
        if "labels" in fields:
            if not _valid_labels(fields["labels"]):
                return self._field_error("labels", "The label must not contain spaces.")
            labels = list(fields["labels"])
        for operation in update.get("labels", []) if isinstance(update.get("labels"), list) else []:
            if not isinstance(operation, dict) or len(operation) != 1:
                return self._field_error("labels", "Each operation takes one verb.")
            [(verb, value)] = operation.items()
            names = value if verb == "set" else [value]
            if verb not in ("add", "remove", "set") or not _valid_labels(names):
                return self._field_error("labels", "The label must not contain spaces.")
            if verb == "add" and value not in labels:
                labels.append(value)
            elif verb == "remove":
                labels = [label for label in labels if label != value]
            elif verb == "set":
                labels = list(names)
        if isinstance(fields.get("summary"), str):
            issue.summary = fields["summary"]
        issue.labels = labels
        self._touch(issue)
        return web.Response(status=204, headers=self._rate_headers())

    def _do_transition(self, request: web.Request, body: Any) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        transition = body.get("transition") if isinstance(body, dict) else None
        wanted = transition.get("id") if isinstance(transition, dict) else None
        for offered in self._transitions_of(issue):
            if offered["id"] == wanted and offered["isAvailable"]:
                issue.status = offered["to"]["name"]
                self._touch(issue)
                return web.Response(status=204, headers=self._rate_headers())
        return self._errors(
            400, [f"Transition id '{wanted}' is not valid for this issue."]
        )

    def _comment_write(self, request: web.Request, body: Any) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        document = body.get("body") if isinstance(body, dict) else None
        if not (
            isinstance(document, dict)
            and document.get("type") == "doc"
            and document.get("version") == 1
            and isinstance(document.get("content"), list)
        ):
            return self._field_error("comment", "Comment body is not valid!")
        issue.comments.append(document)
        issue.comment_times[len(issue.comments) - 1] = _EPOCH + datetime.timedelta(
            seconds=next(self._clock)
        )
        self._touch(issue)
        return self._json(201, self._comment_json(issue, len(issue.comments) - 1))

    def _comment_delete(self, request: web.Request) -> web.Response:
        issue = self._find(request.match_info["key"])
        if issue is None:
            return self._no_issue()
        comment = request.match_info["comment"]
        index = int(comment) - issue.id * 1000 if comment.isdigit() else -1
        if not 0 <= index < len(issue.comments) or issue.comments[index] is None:
            return self._errors(404, ["Can not find a comment for the id: " + comment + "."])
        issue.comments[index] = None
        self._touch(issue)
        return web.Response(status=204, headers=self._rate_headers())

    # -- JQL ----------------------------------------------------------------------------------

    def _run_jql(self, jql: str) -> list[FakeJiraIssue]:
        parts = re.split(r"(?i)\border\s+by\b", jql, maxsplit=1)
        where, order = parts[0], parts[1] if len(parts) > 1 else ""
        predicate = _JqlParser(where, server=self).parse()
        found = [issue for issue in self._issues.values() if predicate(issue)]
        descending = bool(re.search(r"(?i)\bdesc\b", order or ""))
        return sorted(found, key=lambda i: (i.created, i.id), reverse=descending)

    # -- shapes -------------------------------------------------------------------------------

    def _find(self, id_or_key: str) -> FakeJiraIssue | None:
        if id_or_key.isdigit():
            return self._issues.get(int(id_or_key))
        for issue in self._issues.values():
            if issue.key.lower() == id_or_key.lower():
                return issue
        return None

    def _status_json(self, name: str) -> dict[str, Any]:
        category = STATUS_CATEGORIES[self.statuses.get(name, "indeterminate")]
        status_id = 10000 + sorted(self.statuses).index(name) if name in self.statuses else 19999
        return {
            "self": f"{self.url}/rest/api/3/status/{status_id}",
            "description": "",
            "iconUrl": f"{self.url}/images/icons/statuses/generic.png",
            "name": name,
            "id": str(status_id),
            "statusCategory": {"self": f"{self.url}/rest/api/3/statuscategory/{category['id']}",
                               **category},
        }

    def _user_json(self, account_id: str | None = None) -> dict[str, Any]:
        account = account_id or self.account_id
        return {
            "self": f"{self.url}/rest/api/3/user?accountId={account}",
            "accountId": account,
            "accountType": "atlassian",
            "emailAddress": (
                self.email if account == self.account_id else self.user_emails.get(account)
            ),
            "displayName": "Lorenz Bot" if account == self.account_id else f"User {account[:6]}",
            "active": True,
            "timeZone": "Etc/UTC",
        }

    def _link_json(self, issue: FakeJiraIssue, blocker_key: str) -> dict[str, Any] | None:
        blocker = self._find(blocker_key)
        if blocker is None:
            return None
        return {
            "id": str(issue.id * 10 + (blocker.id % 10)),
            "self": f"{self.url}/rest/api/3/issueLink/{issue.id}",
            "type": {
                "id": "10000",
                "name": "Blocks",
                "inward": "is blocked by",
                "outward": "blocks",
                "self": f"{self.url}/rest/api/3/issueLinkType/10000",
            },
            "inwardIssue": {
                "id": str(blocker.id),
                "key": blocker.key,
                "self": f"{self.url}/rest/api/3/issue/{blocker.id}",
                "fields": {
                    "summary": blocker.summary,
                    "status": self._status_json(blocker.status),
                    "priority": {"name": blocker.priority} if blocker.priority else None,
                    "issuetype": {"name": "Task", "subtask": False},
                },
            },
        }

    def _outward_links(self, issue: FakeJiraIssue) -> list[dict[str, Any]]:
        """Links where ``issue`` blocks another (seen from the blocker: ``outwardIssue``)."""
        links = []
        for other in self._issues.values():
            if issue.key in other.blocked_by:
                links.append(
                    {
                        "id": str(other.id * 10 + (issue.id % 10)),
                        "type": {"id": "10000", "name": "Blocks", "inward": "is blocked by",
                                 "outward": "blocks"},
                        "outwardIssue": {
                            "id": str(other.id),
                            "key": other.key,
                            "fields": {"summary": other.summary,
                                       "status": self._status_json(other.status)},
                        },
                    }
                )
        return links

    def _issue_json(self, issue: FakeJiraIssue, fields: set[str] | None) -> dict[str, Any]:
        links = [self._link_json(issue, key) for key in issue.blocked_by]
        every: dict[str, Any] = {
            "summary": issue.summary,
            "description": issue.description,
            "status": self._status_json(issue.status),
            "labels": list(issue.labels),
            "priority": (
                {"self": f"{self.url}/rest/api/3/priority/3", "name": issue.priority, "id": "3"}
                if issue.priority
                else None
            ),
            "assignee": self._user_json(issue.assignee) if issue.assignee else None,
            "created": _jira_time(issue.created),
            "updated": _jira_time(issue.updated),
            "issuelinks": [link for link in links if link] + self._outward_links(issue),
            "project": {
                "self": f"{self.url}/rest/api/3/project/{issue.project}",
                "id": str(10000 + sorted(self.projects).index(issue.project)),
                "key": issue.project,
                "name": f"Project {issue.project}",
                "projectTypeKey": "software",
            },
            "issuetype": {"name": issue.issue_type, "subtask": False},
        }
        chosen = every if fields is None else {k: v for k, v in every.items() if k in fields}
        return {
            "expand": "renderedFields,names,schema,operations,editmeta,changelog",
            "id": str(issue.id),
            "self": f"{self.url}/rest/api/3/issue/{issue.id}",
            "key": issue.key,
            "fields": chosen,
        }

    def _transitions_of(self, issue: FakeJiraIssue) -> list[dict[str, Any]]:
        offered = []
        for index, name in enumerate(sorted(self.statuses)):
            if name == issue.status:
                continue
            offered.append(
                {
                    "id": str(11 + index * 10),
                    "name": f"Move to {name}",
                    "to": self._status_json(name),
                    "hasScreen": False,
                    "isGlobal": True,
                    "isInitial": False,
                    "isAvailable": name not in self.unavailable_transitions,
                    "isConditional": False,
                    "isLooped": False,
                }
            )
        return offered

    def _comment_json(self, issue: FakeJiraIssue, index: int) -> dict[str, Any]:
        return {
            "self": f"{self.url}/rest/api/3/issue/{issue.id}/comment/{issue.id * 1000 + index}",
            "id": str(issue.id * 1000 + index),
            "author": self._user_json(issue.comment_authors.get(index)),
            "body": issue.comments[index],
            "created": _jira_time(issue.comment_times.get(index, _EPOCH)),
            "updated": _jira_time(issue.comment_times.get(index, _EPOCH)),
            "jsdPublic": True,
        }

    # -- responses ----------------------------------------------------------------------------

    def _rate_headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.rate_limit),
            "X-RateLimit-Remaining": str(max(0, self._remaining)),
            "X-RateLimit-NearLimit": "true" if self._remaining < self.rate_limit // 5 else "false",
        }

    def _json(
        self, status: int, payload: Any, *, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        return web.json_response(
            payload, status=status, headers={**self._rate_headers(), **(headers or {})}
        )

    def _errors(self, status: int, messages: list[str]) -> web.Response:
        return self._json(status, {"errorMessages": messages, "errors": {}})

    def _field_error(self, field: str, message: str) -> web.Response:
        return self._json(400, {"errorMessages": [], "errors": {field: message}})

    def _no_issue(self) -> web.Response:
        return self._errors(404, ["Issue does not exist or you do not have permission to see it."])

    def _rate_limited(self, retry_after: float | None) -> web.Response:
        headers = {**self._rate_headers(), "X-RateLimit-Remaining": "0",
                   "RateLimit-Reason": "jira-burst-based"}
        if retry_after is not None:
            headers["Retry-After"] = str(max(0, round(retry_after)))
            reset = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=retry_after)
            headers["X-RateLimit-Reset"] = reset.strftime("%Y-%m-%dT%H:%MZ")
        return web.Response(status=429, text="Rate limit exceeded.", headers=headers)

    def _failure_response(self, failure: _Failure) -> web.Response | object:
        if failure.kind == "disconnect":
            return _DISCONNECT
        if failure.kind == "status":
            return self._errors(failure.status, [f"Injected failure {failure.status}."])
        if failure.kind == "rate_limit":
            return self._rate_limited(failure.retry_after)
        if failure.kind == "busy":
            return web.Response(
                status=503,
                text="Service Unavailable",
                headers={"Retry-After": f"{failure.retry_after or 1:g}"},
            )
        if failure.kind == "not_json":
            return web.Response(status=200, text="<html>Atlassian</html>", content_type="text/html")
        if failure.kind == "huge":
            return self._json(200, {"issues": [], "padding": "x" * (20 * 1024 * 1024)})
        return self._json(200, failure.body if failure.body is not None else {"unexpected": True})

    def _pop_failure(self, path: str) -> _Failure | None:
        for index, failure in enumerate(self._failures):
            if failure.paths is None or any(fragment in path for fragment in failure.paths):
                return self._failures.pop(index)
        return None

    def _touch(self, issue: FakeJiraIssue) -> None:
        issue.updated = _EPOCH + datetime.timedelta(seconds=1000 + next(self._clock))


_DISCONNECT = object()
_NOT_JSON = object()


def _requested_fields(value: str | None) -> set[str] | None:
    """``fields`` as a set; ``None`` means all (``*all``, ``*navigable`` or not given)."""
    if value is None:
        return None
    names = {name.strip() for name in value.split(",") if name.strip()}
    if not names or names & {"*all", "*navigable"}:
        return None
    return names


def _valid_labels(names: Any) -> bool:
    return isinstance(names, list) and all(
        isinstance(n, str) and n and not any(c.isspace() for c in n) for n in names
    )


class _JqlParser:
    """A recursive-descent reader of the fake's JQL subset (see the module docstring)."""

    _TOKEN = re.compile(
        r'\s*(?:(?P<string>"(?:[^"\\]|\\.)*")|(?P<op>!=|=|,|\(|\))|'
        r"(?P<word>[A-Za-z0-9_.\-]+(?:\(\))?))"
    )

    def __init__(self, text: str, *, server: FakeJiraServer) -> None:
        self.server = server
        self.tokens: list[tuple[str, str]] = []
        position = 0
        text = text.strip()
        while position < len(text):
            match = self._TOKEN.match(text, position)
            if match is None or match.end() == position:
                raise JqlError(f"Error in the JQL Query: unexpected character at {position}.")
            kind = match.lastgroup or ""
            value = match.group(kind)
            if kind == "string":
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            self.tokens.append((kind, value))
            position = match.end()
            while position < len(text) and text[position].isspace():
                position += 1
        self.index = 0

    def parse(self) -> Any:
        if not self.tokens:
            return lambda issue: True
        predicate = self._and()
        if self.index != len(self.tokens):
            raise JqlError(f"Error in the JQL Query: unexpected '{self.tokens[self.index][1]}'.")
        return predicate

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise JqlError("Error in the JQL Query: the query ended too early.")
        self.index += 1
        return token

    def _and(self) -> Any:
        parts = [self._term()]
        while (token := self._peek()) is not None and token[1].upper() == "AND":
            self.index += 1
            parts.append(self._term())
        return lambda issue: all(part(issue) for part in parts)

    def _term(self) -> Any:
        token = self._peek()
        if token == ("op", "("):
            self.index += 1
            inner = self._and()
            if self._take() != ("op", ")"):
                raise JqlError("Error in the JQL Query: expected ')'.")
            return inner
        field = self._take()[1].lower()
        operator = self._take()[1].lower()
        if operator == "in":
            values = self._list()
        elif operator in ("=", "!="):
            values = [self._value()]
        else:
            raise JqlError(f"Error in the JQL Query: the operator '{operator}' is not supported.")
        negate = operator == "!="
        check = self._field_check(field, values)
        return (lambda issue: not check(issue)) if negate else check

    def _list(self) -> list[str]:
        if self._take() != ("op", "("):
            raise JqlError("Error in the JQL Query: expected '(' after 'in'.")
        values = [self._value()]
        while (token := self._take()) == ("op", ","):
            values.append(self._value())
        if token != ("op", ")"):
            raise JqlError("Error in the JQL Query: expected ')'.")
        return values

    def _value(self) -> str:
        kind, value = self._take()
        if kind == "op":
            raise JqlError(f"Error in the JQL Query: unexpected '{value}'.")
        return value

    def _field_check(self, field: str, values: list[str]) -> Any:
        server = self.server
        lowered = {v.lower() for v in values}
        if field == "project":
            known = {p.lower() for p in server.projects}
            for value in values:
                if value.lower() not in known:
                    raise JqlError(
                        f"The value '{value}' does not exist for the field 'project'."
                    )
            return lambda issue: issue.project.lower() in lowered
        if field == "status":
            # NB: like Jira, a status name the site does not have is an error, not "no match".
            known_statuses = {name.lower() for name in server.statuses}
            unknown = [v for v in values if v.lower() not in known_statuses]
            if unknown:
                raise JqlError(
                    *(f"The value '{v}' does not exist for the field 'status'." for v in unknown)
                )
            return lambda issue: issue.status.lower() in lowered
        if field in ("id", "issue", "key", "issuekey"):
            return lambda issue: str(issue.id) in values or issue.key.lower() in lowered
        if field in ("issuetype", "type"):
            return lambda issue: issue.issue_type.lower() in lowered
        if field == "labels":
            return lambda issue: any(label.lower() in lowered for label in issue.labels)
        if field == "assignee":
            wanted = {server.account_id if v == "currentuser()" else v for v in lowered}
            return lambda issue: (issue.assignee or "").lower() in {w.lower() for w in wanted}
        raise JqlError(f"Field '{field}' does not exist or you do not have permission to view it.")
