"""A faithful local fake of Linear's GraphQL API, for tests, benchmarks and end-to-end runs.

Lorenz cannot reach Linear from here, so its Linear client is tested against this server
instead: a real aiohttp server on 127.0.0.1 that parses every request with graphql-core,
VALIDATES it against a subset of Linear's own schema (``linear_schema.graphql``, taken from the
public SDK), and executes it with graphql-core against seeded issues. A query our client sends
that Linear would reject is rejected here too (HTTP 400, ``GRAPHQL_VALIDATION_FAILED``), and
recorded in :attr:`FakeLinearServer.rejected`.

What it imitates, besides the schema: the raw ``Authorization: <key>`` header (a wrong key, or
the key with ``Bearer``, gets Linear's authentication error), Relay pagination with opaque
cursors, inverse ``blocks`` relations, the ``X-RateLimit-*`` headers with a request budget that
answers ``RATELIMITED`` when spent, and injectable failures (HTTP 5xx, GraphQL errors,
``RATELIMITED``, malformed payloads, dropped connections).

Use it as ``async with FakeLinearServer() as linear:`` inside a test's event loop, or
``with FakeLinearServer().running_in_thread() as linear:`` from synchronous code (benchmarks,
tests that drive a subprocess); both give :attr:`FakeLinearServer.url`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import graphql
from aiohttp import web

from tests.fakes.loopback import LoopbackFake

SCHEMA_PATH = Path(__file__).with_name("linear_schema.graphql")
SDK_VERSION = "98.0.0"
DEFAULT_API_KEY = "lin_api_fake_0123456789abcdef"
DEFAULT_PROJECT_SLUG = "lorenz-fake-0c79b11b75ea"
DEFAULT_TEAM_KEY = "ENG"
DEFAULT_VIEWER_ID = "user-viewer-0001"
DEFAULT_PAGE = 50
MAX_PAGE = 250
DEFAULT_STATES: tuple[tuple[str, str], ...] = (
    ("Backlog", "backlog"),
    ("Todo", "unstarted"),
    ("In Progress", "started"),
    ("Human Review", "started"),
    ("Done", "completed"),
    ("Canceled", "canceled"),
    ("Duplicate", "canceled"),
)
PRIORITY_LABELS = {0: "No priority", 1: "Urgent", 2: "High", 3: "Medium", 4: "Low"}
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
_IDS = uuid.UUID("6a1d7c52-6f1e-4f8e-9a55-2d1c1c1f0a00")


@functools.cache
def load_linear_schema() -> graphql.GraphQLSchema:
    """The trimmed Linear schema the fake validates against."""
    return graphql.build_schema(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate_linear_document(query: str) -> list[str]:
    """Messages of every parse or validation error of ``query`` against the Linear schema."""
    try:
        document = graphql.parse(query)
    except graphql.GraphQLError as exc:
        return [exc.message]
    return [error.message for error in graphql.validate(load_linear_schema(), document)]


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _stable_id(kind: str, name: str) -> str:
    return str(uuid.uuid5(_IDS, f"{kind}:{name}"))


# -- the board ------------------------------------------------------------------------------------


@dataclasses.dataclass
class FakeTeam:
    id: str
    key: str
    name: str


@dataclasses.dataclass
class FakeState:
    id: str
    name: str
    type: str
    team_key: str
    position: float


@dataclasses.dataclass
class FakeUser:
    id: str
    name: str
    email: str


@dataclasses.dataclass
class FakeProject:
    id: str
    name: str
    slug_id: str


@dataclasses.dataclass
class FakeLabel:
    id: str
    name: str
    team_key: str | None = None
    """``None`` for a workspace label."""


@dataclasses.dataclass
class FakeRelation:
    id: str
    type: str
    issue_id: str
    """The issue the relation belongs to (for ``blocks``: the blocker)."""
    related_issue_id: str
    """The other issue (for ``blocks``: the blocked one)."""
    created_at: datetime.datetime


@dataclasses.dataclass
class FakeComment:
    id: str
    issue_id: str
    body: str
    user_id: str | None
    created_at: datetime.datetime


@dataclasses.dataclass
class FakeIssue:
    id: str
    identifier: str
    number: int
    title: str
    state_id: str
    team_key: str
    project_slug: str | None
    description: str | None = None
    priority: int = 0
    branch_name: str = ""
    assignee_id: str | None = None
    label_ids: list[str] = dataclasses.field(default_factory=list)
    created_at: datetime.datetime = _EPOCH
    updated_at: datetime.datetime = _EPOCH


@dataclasses.dataclass
class RecordedRequest:
    """One HTTP request the fake received, as it arrived."""

    headers: dict[str, str]
    body: Any
    query: str | None
    variables: dict[str, Any]
    operation_name: str | None
    status: int = 0
    validation_errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def authorization(self) -> str | None:
        return self.headers.get("Authorization")


@dataclasses.dataclass
class _Failure:
    kind: str
    status: int
    message: str
    body: Any
    reset_in_s: float
    operations: frozenset[str] | None


FAILURE_KINDS = ("status", "graphql_errors", "ratelimited", "malformed", "not_json", "disconnect")


class FakeLinearServer(LoopbackFake):
    """Linear's GraphQL endpoint over seeded data; see the module docstring."""

    thread_name = "fake-linear"

    def __init__(
        self,
        *,
        api_key: str = DEFAULT_API_KEY,
        project_slug: str = DEFAULT_PROJECT_SLUG,
        viewer_id: str = DEFAULT_VIEWER_ID,
        team_key: str = DEFAULT_TEAM_KEY,
        request_limit: int = 5000,
    ) -> None:
        self.api_key = api_key
        self.project_slug = project_slug
        self.viewer_id = viewer_id
        self.requests: list[RecordedRequest] = []
        self.after_answer: Callable[[RecordedRequest], None] | None = None
        """Called with each request once it is answered (under the server's lock): a test's
        way to change the board between two requests of one client call."""
        self._lock = threading.RLock()
        self._failures: list[_Failure] = []
        self._teams: dict[str, FakeTeam] = {}
        self._states: dict[str, FakeState] = {}
        self._users: dict[str, FakeUser] = {}
        self._projects: dict[str, FakeProject] = {}
        self._labels: dict[str, FakeLabel] = {}
        self._issues: dict[str, FakeIssue] = {}
        self._relations: dict[str, FakeRelation] = {}
        self._comments: dict[str, FakeComment] = {}
        self._comment_numbers = itertools.count()
        self.created_labels: list[str] = []
        """Names of the labels clients created (``issueLabelCreate``)."""
        self._numbers: dict[str, itertools.count[int]] = {}
        self._clock = itertools.count(1)
        self._sync_id = itertools.count(1000)
        self.request_limit = request_limit
        self._requests_remaining = request_limit
        self._requests_reset_at = time.time() + 3600.0
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self.add_team(team_key)
        self.add_user(viewer_id, name="Viewer", email="viewer@example.com")
        self.add_project(project_slug, name="Lorenz fake project")

    # -- seeding and moving things ------------------------------------------------------------

    def add_team(self, key: str, *, name: str | None = None) -> FakeTeam:
        with self._lock:
            team = FakeTeam(id=_stable_id("team", key), key=key, name=name or f"Team {key}")
            self._teams[key] = team
            self._numbers.setdefault(key, itertools.count(1))
            for position, (state_name, state_type) in enumerate(DEFAULT_STATES):
                self.add_state(state_name, state_type=state_type, team=key, position=position)
            return team

    def add_state(
        self, name: str, *, state_type: str, team: str = DEFAULT_TEAM_KEY, position: float = 99
    ) -> FakeState:
        with self._lock:
            state = FakeState(
                id=_stable_id("state", f"{team}/{name}"),
                name=name,
                type=state_type,
                team_key=team,
                position=position,
            )
            self._states[state.id] = state
            return state

    def add_user(self, user_id: str, *, name: str = "", email: str = "") -> FakeUser:
        with self._lock:
            user = FakeUser(
                id=user_id, name=name or user_id, email=email or f"{user_id}@example.com"
            )
            self._users[user_id] = user
            return user

    def add_project(self, slug_id: str, *, name: str = "") -> FakeProject:
        with self._lock:
            project = FakeProject(
                id=_stable_id("project", slug_id), name=name or slug_id, slug_id=slug_id
            )
            self._projects[slug_id] = project
            return project

    def add_issue(
        self,
        identifier: str | None = None,
        *,
        title: str = "Untitled issue",
        state: str = "Todo",
        description: str | None = None,
        priority: int = 0,
        labels: Iterable[str] = (),
        assignee: str | None = None,
        project: str | None = None,
        in_project: bool = True,
        team: str = DEFAULT_TEAM_KEY,
        blocked_by: Iterable[str] = (),
        issue_id: str | None = None,
        created_at: datetime.datetime | None = None,
    ) -> FakeIssue:
        """Seed an issue (in ``project``, default the server's project; ``in_project=False`` puts
        it outside every project). ``assignee`` is a user id (created on the fly); ``blocked_by``
        names issues (ids or identifiers) that block it."""
        with self._lock:
            if team not in self._teams:
                self.add_team(team)
            number = next(self._numbers[team])
            identifier = identifier or f"{team}-{number}"
            moment = created_at or _EPOCH + datetime.timedelta(seconds=next(self._clock))
            if assignee is not None and assignee not in self._users:
                self.add_user(assignee)
            slug = (project or self.project_slug) if in_project else None
            if slug is not None and slug not in self._projects:
                self.add_project(slug)
            issue = FakeIssue(
                id=issue_id or _stable_id("issue", identifier),
                identifier=identifier,
                number=number,
                title=title,
                state_id=self._state_named(state, team).id,
                team_key=team,
                project_slug=slug,
                description=description,
                priority=priority,
                branch_name=f"{identifier.lower()}-{'-'.join(title.lower().split())[:40]}",
                assignee_id=assignee,
                label_ids=[self._label(name).id for name in labels],
                created_at=moment,
                updated_at=moment,
            )
            self._issues[issue.id] = issue
            for blocker in blocked_by:
                self.add_relation(blocker, issue.id, relation_type="blocks")
            return issue

    def add_relation(
        self, issue: str, related: str, *, relation_type: str = "blocks"
    ) -> FakeRelation:
        """``issue`` <type> ``related`` (``blocks``: ``issue`` blocks ``related``)."""
        with self._lock:
            source, target = self.issue(issue), self.issue(related)
            relation = FakeRelation(
                id=_stable_id("relation", f"{source.id}/{relation_type}/{target.id}"),
                type=relation_type,
                issue_id=source.id,
                related_issue_id=target.id,
                created_at=_EPOCH + datetime.timedelta(seconds=next(self._clock)),
            )
            self._relations[relation.id] = relation
            return relation

    def issue(self, id_or_identifier: str) -> FakeIssue:
        with self._lock:
            if id_or_identifier in self._issues:
                return self._issues[id_or_identifier]
            for issue in self._issues.values():
                if issue.identifier == id_or_identifier:
                    return issue
            raise KeyError(f"no issue {id_or_identifier!r} on the fake Linear board")

    @property
    def issues(self) -> list[FakeIssue]:
        with self._lock:
            return list(self._issues.values())

    def state_of(self, id_or_identifier: str) -> str:
        with self._lock:
            return self._states[self.issue(id_or_identifier).state_id].name

    def set_state(self, id_or_identifier: str, state: str) -> None:
        with self._lock:
            issue = self.issue(id_or_identifier)
            issue.state_id = self._state_named(state, issue.team_key).id
            self._touch(issue)

    def update_issue(self, id_or_identifier: str, **changes: Any) -> FakeIssue:
        """Change plain fields (``title``, ``description``, ``priority``, ``assignee_id``, ...)."""
        with self._lock:
            issue = self.issue(id_or_identifier)
            if "labels" in changes:
                changes["label_ids"] = [self._label(n).id for n in changes.pop("labels")]
            for key, value in changes.items():
                if not hasattr(issue, key):
                    raise AttributeError(f"FakeIssue has no field {key!r}")
                setattr(issue, key, value)
            self._touch(issue)
            return issue

    def remove_issue(self, id_or_identifier: str) -> None:
        """Delete an issue (it stops being visible to every query)."""
        with self._lock:
            issue = self.issue(id_or_identifier)
            del self._issues[issue.id]
            for relation_id in [
                r.id
                for r in self._relations.values()
                if issue.id in (r.issue_id, r.related_issue_id)
            ]:
                del self._relations[relation_id]

    def labels_on(self, id_or_identifier: str) -> list[str]:
        """The names of an issue's labels."""
        with self._lock:
            issue = self._find_issue(id_or_identifier)
            return [self._label_by_id(label_id).name for label_id in issue.label_ids]

    def comments_on(self, id_or_identifier: str) -> list[str]:
        with self._lock:
            issue = self.issue(id_or_identifier)
            return [c.body for c in self._comments.values() if c.issue_id == issue.id]

    def add_comment(
        self, id_or_identifier: str, body: str, *, user_id: str | None = None
    ) -> str:
        """A comment on the issue by ``user_id`` (a seeded user; default: the API key's
        viewer), posted now (after every earlier comment); returns its id."""
        with self._lock:
            issue = self.issue(id_or_identifier)
            author = user_id if user_id is not None else self.viewer_id
            if author not in self._users:
                raise KeyError(f"no user {author!r}; add_user() first")
            comment = FakeComment(
                id=_stable_id("comment", f"{issue.id}/{next(self._comment_numbers)}"),
                issue_id=issue.id,
                body=body,
                user_id=author,
                created_at=_EPOCH + datetime.timedelta(seconds=next(self._clock)),
            )
            self._comments[comment.id] = comment
            return comment.id

    def delete_comment(self, comment_id: str) -> None:
        """Delete a comment (it no longer shows in the issue's comments)."""
        with self._lock:
            del self._comments[comment_id]

    def comment_ids_on(self, id_or_identifier: str) -> list[str]:
        """The ids of an issue's comments, oldest first."""
        with self._lock:
            issue = self.issue(id_or_identifier)
            return [c.id for c in self._comments.values() if c.issue_id == issue.id]

    def set_request_budget(self, *, remaining: int, reset_in_s: float) -> None:
        """Spend the request budget down to ``remaining``; it refills ``reset_in_s`` from now.
        While it is below zero every request is answered ``RATELIMITED``."""
        with self._lock:
            self._requests_remaining = remaining
            self._requests_reset_at = time.time() + reset_in_s

    def fail_next(
        self,
        kind: str,
        *,
        times: int = 1,
        status: int = 500,
        message: str = "Internal server error",
        body: Any = None,
        reset_in_s: float = 0.05,
        operations: Iterable[str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests (of ``operations``, by operation name) with a
        failure: ``status`` (HTTP ``status``), ``graphql_errors`` (200 with ``errors``),
        ``ratelimited`` (Linear's HTTP 400 ``RATELIMITED`` with reset headers ``reset_in_s``
        ahead), ``malformed`` (200 with ``body`` or an odd ``data``), ``not_json`` (200 with
        HTML) or ``disconnect`` (the connection closes without a response)."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; known: {FAILURE_KINDS}")
        failure = _Failure(
            kind=kind,
            status=status,
            message=message,
            body=body,
            reset_in_s=reset_in_s,
            operations=frozenset(operations) if operations is not None else None,
        )
        with self._lock:
            self._failures.extend([failure] * times)

    @property
    def rejected(self) -> list[RecordedRequest]:
        """Requests whose document failed to parse or validate against the schema."""
        return [r for r in self.requests if r.validation_errors]

    def requests_for(self, operation_name: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.operation_name == operation_name]

    # -- serving ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the fake Linear server is not running")
        return f"http://127.0.0.1:{self._port}/graphql"

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/graphql", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        query = body.get("query") if isinstance(body, dict) else None
        variables = body.get("variables") if isinstance(body, dict) else None
        operation_name = body.get("operationName") if isinstance(body, dict) else None
        record = RecordedRequest(
            headers=dict(request.headers),
            body=body,
            query=query if isinstance(query, str) else None,
            variables=variables if isinstance(variables, dict) else {},
            operation_name=operation_name if isinstance(operation_name, str) else None,
        )
        with self._lock:
            self.requests.append(record)
            response = self._answer(request, record)
            if self.after_answer is not None:
                self.after_answer(record)
        if response is None:  # an injected disconnect
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake Linear dropped the connection")
        record.status = response.status
        return response

    def _answer(self, request: web.Request, record: RecordedRequest) -> web.Response | None:
        if record.authorization != self.api_key:
            return self._auth_error()
        if not isinstance(record.body, dict):
            return self._json(
                400, {"errors": [_error("POST body sent invalid JSON.", "BAD_USER_INPUT")]}
            )
        if not record.query:
            return self._json(
                400, {"errors": [_error("Must provide query string.", "BAD_USER_INPUT")]}
            )
        try:
            document = graphql.parse(record.query)
        except graphql.GraphQLError as exc:
            record.validation_errors = [exc.message]
            return self._json(400, {"errors": [_error(exc.message, "GRAPHQL_PARSE_FAILED", exc)]})
        problems = graphql.validate(load_linear_schema(), document)
        if problems:
            record.validation_errors = [p.message for p in problems]
            errors = [_error(p.message, "GRAPHQL_VALIDATION_FAILED", p) for p in problems]
            return self._json(400, {"errors": errors})
        if record.operation_name is None:
            names = [
                d.name.value
                for d in document.definitions
                if isinstance(d, graphql.OperationDefinitionNode) and d.name
            ]
            record.operation_name = names[0] if len(names) == 1 else None

        failure = self._pop_failure(record.operation_name)
        if failure is not None:
            return self._failure_response(failure)
        if not self._spend_request():
            return self._ratelimited(self._requests_reset_at - time.time())

        result = graphql.execute_sync(
            load_linear_schema(),
            document,
            root_value=self._root(),
            variable_values=record.variables,
            operation_name=record.operation_name,
        )
        payload: dict[str, Any] = {}
        if result.errors:
            payload["errors"] = [_formatted(e) for e in result.errors]
        payload["data"] = result.data
        return self._json(200, payload)

    # -- responses ----------------------------------------------------------------------------

    def _rate_headers(self, *, remaining: int | None = None) -> dict[str, str]:
        left = self._requests_remaining if remaining is None else remaining
        reset_ms = int(self._requests_reset_at * 1000)
        return {
            "X-RateLimit-Requests-Limit": str(self.request_limit),
            "X-RateLimit-Requests-Remaining": str(max(0, left)),
            "X-RateLimit-Requests-Reset": str(reset_ms),
            "X-Complexity": "1",
            "X-RateLimit-Complexity-Limit": "3000000",
            "X-RateLimit-Complexity-Remaining": "2999999",
            "X-RateLimit-Complexity-Reset": str(reset_ms),
        }

    def _json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        return web.json_response(
            payload, status=status, headers={**self._rate_headers(), **(headers or {})}
        )

    def _auth_error(self) -> web.Response:
        error = {
            "message": "Authentication required, not authenticated",
            "extensions": {
                "type": "authentication error",
                "code": "AUTHENTICATION_ERROR",
                "statusCode": 401,
                "userError": True,
                "userPresentableMessage": "You need to authenticate to access this operation.",
            },
        }
        return web.json_response({"errors": [error]}, status=401)

    def _ratelimited(self, reset_in_s: float) -> web.Response:
        reset_ms = int((time.time() + max(0.0, reset_in_s)) * 1000)
        error = {
            "message": "Rate limit exceeded",
            "extensions": {
                "type": "ratelimited",
                "code": "RATELIMITED",
                "statusCode": 429,
                "userError": True,
                "userPresentableMessage": "You have exceeded the rate limit. Try again later.",
            },
        }
        # NB: Linear has been seen answering RATELIMITED with HTTP 400, not 429.
        return web.json_response(
            {"errors": [error]},
            status=400,
            headers={
                **self._rate_headers(remaining=0),
                "X-RateLimit-Requests-Reset": str(reset_ms),
            },
        )

    def _failure_response(self, failure: _Failure) -> web.Response | None:
        if failure.kind == "disconnect":
            return None
        if failure.kind == "status":
            return web.Response(status=failure.status, text=failure.message)
        if failure.kind == "graphql_errors":
            return self._json(
                200, {"data": None, "errors": [_error(failure.message, "INTERNAL_ERROR")]}
            )
        if failure.kind == "ratelimited":
            return self._ratelimited(failure.reset_in_s)
        if failure.kind == "not_json":
            return web.Response(status=200, text="<html>gateway</html>", content_type="text/html")
        body = failure.body if failure.body is not None else {"data": {"issues": {"nodes": "?"}}}
        return self._json(200, body)

    def _pop_failure(self, operation_name: str | None) -> _Failure | None:
        for index, failure in enumerate(self._failures):
            if failure.operations is None or operation_name in failure.operations:
                return self._failures.pop(index)
        return None

    def _spend_request(self) -> bool:
        if time.time() >= self._requests_reset_at:
            self._requests_remaining = self.request_limit
            self._requests_reset_at = time.time() + 3600.0
        if self._requests_remaining <= 0:
            return False
        self._requests_remaining -= 1
        return True

    # -- resolvers ----------------------------------------------------------------------------

    def _root(self) -> dict[str, Any]:
        return {
            "issues": lambda info, **args: self._connection(
                [
                    self._issue_view(i)
                    for i in self._issues.values()
                    if self._issue_matches(args.get("filter"), i)
                ],
                args,
            ),
            "issue": lambda info, **args: self._issue_view(self._find_issue(args["id"])),
            "viewer": lambda info, **args: self._user_view(self._users[self.viewer_id]),
            "workflowStates": lambda info, **args: self._connection(
                [
                    self._state_view(s)
                    for s in self._states.values()
                    if self._state_matches(args.get("filter"), s)
                ],
                args,
            ),
            "issueLabels": lambda info, **args: self._connection(
                [
                    self._label_view(label)
                    for label in self._labels.values()
                    if self._label_matches(args.get("filter"), label)
                ],
                args,
            ),
            "issueLabelCreate": lambda info, **args: self._label_create(args["input"]),
            "issueUpdate": lambda info, **args: self._issue_update(args["id"], args["input"]),
            "commentCreate": lambda info, **args: self._comment_create(args["input"]),
        }

    def _connection(self, items: list[dict[str, Any]], args: Mapping[str, Any]) -> dict[str, Any]:
        first, last = args.get("first"), args.get("last")
        for name, value in (("first", first), ("last", last)):
            if value is not None and not 0 <= value <= MAX_PAGE:
                raise graphql.GraphQLError(
                    f"Argument `{name}` must be between 0 and {MAX_PAGE}",
                    extensions={
                        "code": "INVALID_INPUT",
                        "type": "invalid input",
                        "userError": True,
                    },
                )
        start, end = 0, len(items)
        if args.get("after") is not None:
            start = self._cursor_index(items, args["after"]) + 1
        if args.get("before") is not None:
            end = self._cursor_index(items, args["before"])
        window = items[start:end]
        if first is None and last is None:
            first = DEFAULT_PAGE
        page = window if first is None else window[:first]
        has_next = len(window) > first if first is not None else end < len(items)
        if last is not None:
            page = page[-last:] if last else []
        has_previous = start > 0 or (len(page) < len(window) and page[-1:] == window[-1:])
        cursors = [self._cursor(item) for item in page]
        return {
            "nodes": page,
            "edges": [{"node": n, "cursor": c} for n, c in zip(page, cursors, strict=True)],
            "pageInfo": {
                "hasNextPage": has_next,
                "hasPreviousPage": has_previous,
                "startCursor": cursors[0] if cursors else None,
                "endCursor": cursors[-1] if cursors else None,
            },
        }

    @staticmethod
    def _cursor(item: Mapping[str, Any]) -> str:
        return f"cursor:{item['id']}"

    def _cursor_index(self, items: list[dict[str, Any]], cursor: str) -> int:
        for index, item in enumerate(items):
            if self._cursor(item) == cursor:
                return index
        raise graphql.GraphQLError(
            "Invalid cursor",
            extensions={"code": "INVALID_INPUT", "type": "invalid input", "userError": True},
        )

    def _find_issue(self, id_or_identifier: str) -> FakeIssue:
        try:
            return self.issue(id_or_identifier)
        except KeyError:
            raise graphql.GraphQLError(
                "Entity not found: Issue",
                extensions={
                    "code": "INVALID_INPUT",
                    "type": "invalid input",
                    "userError": True,
                    "userPresentableMessage": "Could not find referenced Issue.",
                },
            ) from None

    def _issue_view(self, issue: FakeIssue) -> dict[str, Any]:
        def relations(outgoing: bool) -> Callable[..., dict[str, Any]]:
            def resolve(info: Any, **args: Any) -> dict[str, Any]:
                found = [
                    self._relation_view(r)
                    for r in self._relations.values()
                    if (r.issue_id if outgoing else r.related_issue_id) == issue.id
                    and r.issue_id in self._issues
                    and r.related_issue_id in self._issues
                ]
                return self._connection(found, args)

            return resolve

        project = self._projects.get(issue.project_slug) if issue.project_slug else None
        assignee = self._users.get(issue.assignee_id) if issue.assignee_id else None
        return {
            "id": issue.id,
            "identifier": issue.identifier,
            "number": issue.number,
            "title": issue.title,
            "description": issue.description,
            "priority": issue.priority,
            "priorityLabel": PRIORITY_LABELS.get(issue.priority, "No priority"),
            "state": lambda info, **args: self._state_view(self._states[issue.state_id]),
            "branchName": issue.branch_name,
            "url": f"https://linear.app/fake/issue/{issue.identifier}",
            "assignee": (lambda info, **args: self._user_view(assignee)) if assignee else None,
            "labels": lambda info, **args: self._connection(
                [self._label_view(self._label_by_id(i)) for i in issue.label_ids], args
            ),
            "relations": relations(outgoing=True),
            "inverseRelations": relations(outgoing=False),
            "project": (lambda info, **args: self._project_view(project)) if project else None,
            "team": lambda info, **args: self._team_view(self._teams[issue.team_key]),
            "comments": lambda info, **args: self._connection(
                [self._comment_view(c) for c in self._comments.values() if c.issue_id == issue.id],
                args,
            ),
            "createdAt": _iso(issue.created_at),
            "updatedAt": _iso(issue.updated_at),
            "archivedAt": None,
        }

    def _state_view(self, state: FakeState) -> dict[str, Any]:
        return {
            "id": state.id,
            "name": state.name,
            "type": state.type,
            "color": "#bec2c8",
            "position": state.position,
            "description": None,
            "team": lambda info, **args: self._team_view(self._teams[state.team_key]),
            "createdAt": _iso(_EPOCH),
            "updatedAt": _iso(_EPOCH),
            "archivedAt": None,
        }

    def _team_view(self, team: FakeTeam) -> dict[str, Any]:
        return {
            "id": team.id,
            "key": team.key,
            "name": team.name,
            "states": lambda info, **args: self._connection(
                [
                    self._state_view(s)
                    for s in self._states.values()
                    if s.team_key == team.key and self._state_matches(args.get("filter"), s)
                ],
                args,
            ),
            "createdAt": _iso(_EPOCH),
            "updatedAt": _iso(_EPOCH),
            "archivedAt": None,
        }

    def _user_view(self, user: FakeUser) -> dict[str, Any]:
        return {
            "id": user.id,
            "name": user.name,
            "displayName": user.name,
            "email": user.email,
            "active": True,
            "isMe": user.id == self.viewer_id,
            "url": f"https://linear.app/fake/profiles/{user.id}",
            "createdAt": _iso(_EPOCH),
            "updatedAt": _iso(_EPOCH),
            "archivedAt": None,
        }

    def _project_view(self, project: FakeProject) -> dict[str, Any]:
        return {
            "id": project.id,
            "name": project.name,
            "slugId": project.slug_id,
            "url": f"https://linear.app/fake/project/{project.slug_id}",
            "description": "",
            "createdAt": _iso(_EPOCH),
            "updatedAt": _iso(_EPOCH),
            "archivedAt": None,
        }

    def _label_view(self, label: FakeLabel) -> dict[str, Any]:
        return {
            "id": label.id,
            "name": label.name,
            "color": "#5e6ad2",
            "description": None,
            "team": self._team_view(self._teams[label.team_key]) if label.team_key else None,
            "createdAt": _iso(_EPOCH),
            "updatedAt": _iso(_EPOCH),
            "archivedAt": None,
        }

    def _relation_view(self, relation: FakeRelation) -> dict[str, Any]:
        return {
            "id": relation.id,
            "type": relation.type,
            "issue": lambda info, **args: self._issue_view(self._issues[relation.issue_id]),
            "relatedIssue": lambda info, **args: self._issue_view(
                self._issues[relation.related_issue_id]
            ),
            "createdAt": _iso(relation.created_at),
            "updatedAt": _iso(relation.created_at),
            "archivedAt": None,
        }

    def _comment_view(self, comment: FakeComment) -> dict[str, Any]:
        user = self._users.get(comment.user_id) if comment.user_id else None
        return {
            "id": comment.id,
            "body": comment.body,
            "url": f"https://linear.app/fake/comment/{comment.id}",
            "issue": lambda info, **args: self._issue_view(self._issues[comment.issue_id]),
            "user": (lambda info, **args: self._user_view(user)) if user else None,
            "createdAt": _iso(comment.created_at),
            "updatedAt": _iso(comment.created_at),
            "archivedAt": None,
        }

    # -- mutations ----------------------------------------------------------------------------

    def _issue_update(self, issue_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        issue = self._find_issue(issue_id)
        if "stateId" in changes:
            state = self._states.get(changes["stateId"])
            if state is None or state.team_key != issue.team_key:
                raise graphql.GraphQLError(
                    "Entity not found: WorkflowState",
                    extensions={
                        "code": "INVALID_INPUT",
                        "type": "invalid input",
                        "userError": True,
                    },
                )
            issue.state_id = state.id
        for field, attribute in (
            ("title", "title"),
            ("description", "description"),
            ("assigneeId", "assignee_id"),
            ("priority", "priority"),
        ):
            if field in changes:
                setattr(issue, attribute, changes[field])
        if changes.get("labelIds") is not None:
            issue.label_ids = list(changes["labelIds"])
        for label_id in changes.get("addedLabelIds") or ():
            if label_id not in issue.label_ids:
                issue.label_ids.append(label_id)
        for label_id in changes.get("removedLabelIds") or ():
            if label_id in issue.label_ids:
                issue.label_ids.remove(label_id)
        self._touch(issue)
        return {
            "success": True,
            "lastSyncId": float(next(self._sync_id)),
            "issue": self._issue_view(issue),
        }

    def _label_create(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        name = str(changes.get("name") or "").strip()
        team_key: str | None = None
        if changes.get("teamId"):
            team_key = next(
                (t.key for t in self._teams.values() if t.id == changes["teamId"]), None
            )
            if team_key is None:
                raise graphql.GraphQLError(
                    "Entity not found: Team",
                    extensions={"code": "INVALID_INPUT", "type": "invalid input",
                                "userError": True},
                )
        if not name or any(
            label.name.lower() == name.lower() and label.team_key == team_key
            for label in self._labels.values()
        ):
            raise graphql.GraphQLError(
                "duplicate label name" if name else "name must not be empty",
                extensions={"code": "INVALID_INPUT", "type": "invalid input", "userError": True},
            )
        label = FakeLabel(id=_stable_id("label", f"{team_key}/{name}"), name=name,
                          team_key=team_key)
        self._labels[f"{team_key}/{name}" if team_key else name] = label
        self.created_labels.append(name)
        return {"success": True, "lastSyncId": float(next(self._sync_id)),
                "issueLabel": self._label_view(label)}

    def _label_matches(self, where: Mapping[str, Any] | None, label: FakeLabel) -> bool:
        if not where:
            return True
        for key, condition in where.items():
            if key == "name" and not _compare(condition, label.name):
                return False
            if key == "id" and not _compare(condition, label.id):
                return False
            if key in ("and", "or"):
                results = [self._label_matches(part, label) for part in condition]
                if (key == "and" and not all(results)) or (key == "or" and not any(results)):
                    return False
        return True

    def _comment_create(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        issue = self._find_issue(changes.get("issueId") or "")
        comment = FakeComment(
            id=_stable_id("comment", f"{issue.id}/{next(self._comment_numbers)}"),
            issue_id=issue.id,
            body=changes.get("body") or "",
            user_id=self.viewer_id,
            created_at=_EPOCH + datetime.timedelta(seconds=next(self._clock)),
        )
        self._comments[comment.id] = comment
        return {
            "success": True,
            "lastSyncId": float(next(self._sync_id)),
            "comment": self._comment_view(comment),
        }

    # -- filters ------------------------------------------------------------------------------

    def _issue_matches(self, where: Mapping[str, Any] | None, issue: FakeIssue) -> bool:
        if not where:
            return True
        for key, condition in where.items():
            if condition is None:
                continue
            if key == "and":
                ok = all(self._issue_matches(part, issue) for part in condition)
            elif key == "or":
                ok = any(self._issue_matches(part, issue) for part in condition)
            elif key == "id":
                ok = _compare(condition, issue.id)
            elif key == "number":
                ok = _compare(condition, issue.number)
            elif key == "title":
                ok = _compare(condition, issue.title)
            elif key == "priority":
                ok = _compare(condition, issue.priority)
            elif key in ("createdAt", "updatedAt"):
                moment = issue.created_at if key == "createdAt" else issue.updated_at
                ok = _compare(condition, moment)
            elif key == "state":
                ok = self._state_matches(condition, self._states[issue.state_id])
            elif key == "team":
                ok = self._team_matches(condition, self._teams[issue.team_key])
            elif key == "project":
                project = self._projects.get(issue.project_slug) if issue.project_slug else None
                ok = _entity_matches(
                    condition,
                    project,
                    lambda p, k: {"id": p.id, "slugId": p.slug_id, "name": p.name}[k],
                )
            elif key == "assignee":
                user = self._users.get(issue.assignee_id) if issue.assignee_id else None
                ok = _entity_matches(
                    condition,
                    user,
                    lambda u, k: {
                        "id": u.id,
                        "isMe": u.id == self.viewer_id,
                        "email": u.email,
                        "name": u.name,
                        "displayName": u.name,
                    }[k],
                )
            elif key == "labels":
                ok = self._labels_match(condition, [self._label_by_id(i) for i in issue.label_ids])
            else:
                raise _unsupported(f"IssueFilter.{key}")
            if not ok:
                return False
        return True

    def _state_matches(self, where: Mapping[str, Any] | None, state: FakeState) -> bool:
        if not where:
            return True
        for key, condition in where.items():
            if condition is None:
                continue
            if key == "and":
                ok = all(self._state_matches(part, state) for part in condition)
            elif key == "or":
                ok = any(self._state_matches(part, state) for part in condition)
            elif key in ("id", "name", "type"):
                ok = _compare(condition, getattr(state, key))
            elif key == "team":
                ok = self._team_matches(condition, self._teams[state.team_key])
            else:
                raise _unsupported(f"WorkflowStateFilter.{key}")
            if not ok:
                return False
        return True

    def _team_matches(self, where: Mapping[str, Any], team: FakeTeam) -> bool:
        return _entity_matches(
            where, team, lambda t, k: {"id": t.id, "key": t.key, "name": t.name}[k]
        )

    def _labels_match(self, where: Mapping[str, Any], labels: list[FakeLabel]) -> bool:
        def one(label_where: Mapping[str, Any], label: FakeLabel) -> bool:
            return _entity_matches(
                label_where, label, lambda lb, k: {"id": lb.id, "name": lb.name}[k]
            )

        for key, condition in where.items():
            if condition is None:
                continue
            if key == "and":
                ok = all(self._labels_match(part, labels) for part in condition)
            elif key == "or":
                ok = any(self._labels_match(part, labels) for part in condition)
            elif key == "null":
                ok = (not labels) == condition
            elif key == "some":
                ok = any(one(condition, label) for label in labels)
            elif key == "every":
                ok = all(one(condition, label) for label in labels)
            elif key in ("id", "name"):
                ok = any(one({key: condition}, label) for label in labels)
            else:
                raise _unsupported(f"IssueLabelCollectionFilter.{key}")
            if not ok:
                return False
        return True

    # -- helpers ------------------------------------------------------------------------------

    def _state_named(self, name: str, team: str) -> FakeState:
        for state in self._states.values():
            if state.team_key == team and state.name == name:
                return state
        raise KeyError(f"team {team} has no state {name!r}")

    def _label(self, name: str) -> FakeLabel:
        label = self._labels.get(name)
        if label is None:
            label = FakeLabel(id=_stable_id("label", name), name=name)
            self._labels[name] = label
        return label

    def _label_by_id(self, label_id: str) -> FakeLabel:
        for label in self._labels.values():
            if label.id == label_id:
                return label
        return FakeLabel(id=label_id, name=label_id)

    def _touch(self, issue: FakeIssue) -> None:
        issue.updated_at = _EPOCH + datetime.timedelta(seconds=next(self._clock))


# -- filter comparators -----------------------------------------------------------------------


def _unsupported(what: str) -> graphql.GraphQLError:
    return graphql.GraphQLError(
        f"the fake Linear server does not implement {what}; extend tests/fakes/linear_server.py",
        extensions={"code": "FAKE_UNSUPPORTED"},
    )


def _comparable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    return value


def _compare(comparator: Mapping[str, Any], value: Any) -> bool:
    """Linear's comparator inputs (``eq``, ``in``, ``containsIgnoreCase``, ``gt``, ...)."""
    for op, operand in comparator.items():
        if operand is None and op != "null":
            continue
        text = value if isinstance(value, str) else str(value)
        if op == "eq":
            ok = (
                value == operand
                if not isinstance(value, datetime.datetime)
                else value == _comparable(operand)
            )
        elif op == "neq":
            ok = value != operand
        elif op == "in":
            ok = value in operand
        elif op == "nin":
            ok = value not in operand
        elif op == "null":
            ok = (value is None) == operand
        elif op == "eqIgnoreCase":
            ok = text.lower() == operand.lower()
        elif op == "neqIgnoreCase":
            ok = text.lower() != operand.lower()
        elif op == "contains":
            ok = operand in text
        elif op == "notContains":
            ok = operand not in text
        elif op in ("containsIgnoreCase", "containsIgnoreCaseAndAccent"):
            ok = operand.lower() in text.lower()
        elif op == "notContainsIgnoreCase":
            ok = operand.lower() not in text.lower()
        elif op == "startsWith":
            ok = text.startswith(operand)
        elif op == "startsWithIgnoreCase":
            ok = text.lower().startswith(operand.lower())
        elif op == "notStartsWith":
            ok = not text.startswith(operand)
        elif op == "endsWith":
            ok = text.endswith(operand)
        elif op == "notEndsWith":
            ok = not text.endswith(operand)
        elif op in ("gt", "gte", "lt", "lte"):
            left, right = value, _comparable(operand)
            ok = {
                "gt": left > right,
                "gte": left >= right,
                "lt": left < right,
                "lte": left <= right,
            }[op]
        else:
            raise _unsupported(f"comparator {op}")
        if not ok:
            return False
    return True


def _entity_matches(
    where: Mapping[str, Any], entity: Any, field: Callable[[Any, str], Any]
) -> bool:
    for key, condition in where.items():
        if condition is None:
            continue
        if key == "and":
            ok = all(_entity_matches(part, entity, field) for part in condition)
        elif key == "or":
            ok = any(_entity_matches(part, entity, field) for part in condition)
        elif key == "null":
            ok = (entity is None) == condition
        elif entity is None:
            ok = False
        else:
            try:
                value = field(entity, key)
            except KeyError:
                raise _unsupported(f"filter field {key}") from None
            ok = _compare(condition, value)
        if not ok:
            return False
    return True


def _error(message: str, code: str, source: graphql.GraphQLError | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"message": message, "extensions": {"code": code}}
    if source is not None and source.locations:
        error["locations"] = [{"line": loc.line, "column": loc.column} for loc in source.locations]
    return error


def _formatted(error: graphql.GraphQLError) -> dict[str, Any]:
    formatted = dict(error.formatted)
    formatted.setdefault("extensions", {"code": "INTERNAL_ERROR"})
    return formatted
