"""A faithful local fake of the GitLab REST v4 endpoints the GitLab tracker (and its tool) uses.

Served by aiohttp on 127.0.0.1 under ``/api/v4``, it answers like a GitLab instance for one
seeded project, addressed by numeric id or URL-encoded full path (``group%2Fapp``): the project
itself; its issue listing (``state`` opened/closed or both, ``labels`` as an AND filter, ``iids[]``,
``order_by``/``sort``, offset paging with ``per_page`` ≤ 100 and the ``X-Page``/``X-Next-Page``/
``X-Total``… headers plus a ``Link`` header, which can be switched off); a single issue and its
edit (``PUT`` with ``add_labels``/``remove_labels``/``labels``/``state_event``); notes (list,
create); issue links (list with ``link_type`` seen from the issue asked about, create with
``relates_to``/``blocks``/``is_blocked_by``) or 404 when told the links API is absent; and
``GET /user``. Every response carries the ``RateLimit-*`` headers of a per-minute budget; a spent
budget answers 429 with ``Retry-After`` and Rack::Attack's plain-text body. Failures (statuses,
429s with or without ``Retry-After``, malformed or non-JSON bodies, oversized bodies, dropped
connections) can be injected. Auth is the ``PRIVATE-TOKEN`` header (or ``Authorization:
Bearer``); a wrong one is 401 ``{"message": "401 Unauthorized"}``. Requests are recorded.

``async with FakeGitLabServer() as gitlab:`` in a test's loop, or
``with FakeGitLabServer().running_in_thread() as gitlab:`` from synchronous code.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import itertools
import json
import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from aiohttp import web

from tests.fakes.loopback import LoopbackFake

DEFAULT_TOKEN = "glpat-fake0123456789abcdef"
DEFAULT_PROJECT = "lorenz-group/fake-app"
DEFAULT_PROJECT_ID = 4711
DEFAULT_USERNAME = "lorenz-bot"
DEFAULT_PER_PAGE = 20
MAX_PER_PAGE = 100
LINK_TYPES = ("relates_to", "blocks", "is_blocked_by")
_INVERSE = {"relates_to": "relates_to", "blocks": "is_blocked_by", "is_blocked_by": "blocks"}
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclasses.dataclass
class FakeGitLabIssue:
    iid: int
    title: str
    description: str | None
    labels: list[str]
    state: str = "opened"
    assignees: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    """Note bodies, oldest first."""
    note_authors: dict[int, str] = dataclasses.field(default_factory=dict)
    """The username of the note at an index of :attr:`notes` (else the token's user)."""
    note_times: dict[int, datetime.datetime] = dataclasses.field(default_factory=dict)
    """When the note at an index was posted (else the fake's epoch)."""
    system_notes: set[int] = dataclasses.field(default_factory=set)
    """Indexes of system notes (GitLab's own "added label ~x" and the like)."""
    deleted_notes: set[int] = dataclasses.field(default_factory=set)
    """Indexes of deleted notes (no longer listed)."""
    created_at: datetime.datetime = _EPOCH
    updated_at: datetime.datetime = _EPOCH
    deleted: bool = False


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str
    """The raw path (percent-encoding kept)."""
    query: dict[str, str]
    query_items: list[tuple[str, str]]
    headers: dict[str, str]
    status: int = 0
    body: Any = None


@dataclasses.dataclass
class _Failure:
    kind: str
    status: int
    message: str
    body: Any
    retry_after: float | None
    paths: tuple[str, ...] | None


FAILURE_KINDS = ("status", "throttled", "malformed", "not_json", "oversized", "disconnect")


class FakeGitLabServer(LoopbackFake):
    """GitLab's REST v4 issues API over one seeded project; see the module docstring."""

    thread_name = "fake-gitlab"

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        project: str = DEFAULT_PROJECT,
        project_id: int = DEFAULT_PROJECT_ID,
        username: str = DEFAULT_USERNAME,
        links_api: bool = True,
        link_header: bool = True,
        rate_limit: int = 2000,
    ) -> None:
        self.token = token
        self.project = project
        self.project_id = project_id
        self.username = username
        self.links_api = links_api
        self.link_header = link_header
        """Whether paged answers carry a ``Link`` header (else only ``X-Next-Page`` & co.)."""
        self.rate_limit = rate_limit
        self.requests: list[RecordedRequest] = []
        self._issues: dict[int, FakeGitLabIssue] = {}
        self._links: list[tuple[int, int, str, int]] = []
        """(source iid, target iid, link type as created, link id)."""
        self._iids = itertools.count(1)
        self._link_ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._failures: list[_Failure] = []
        self._observed = 0
        self._reset_at = time.time() + 60
        self._lock = threading.RLock()

    # -- seeding and moving things ------------------------------------------------------------

    def add_issue(
        self,
        title: str = "Untitled issue",
        *,
        labels: Iterable[str] = (),
        state: str = "opened",
        description: str | None = None,
        assignees: Iterable[str] = (),
    ) -> FakeGitLabIssue:
        with self._lock:
            moment = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            issue = FakeGitLabIssue(
                iid=next(self._iids),
                title=title,
                description=description,
                labels=list(labels),
                state=state,
                assignees=list(assignees),
                created_at=moment,
                updated_at=moment,
            )
            self._issues[issue.iid] = issue
            return issue

    def add_note(
        self, iid: int, body: str, *, username: str | None = None, system: bool = False
    ) -> int:
        """A note by ``username`` (default: the token's user), posted now; returns its id.
        ``system``: a note GitLab itself writes (label and state changes)."""
        with self._lock:
            issue = self._issues[iid]
            issue.notes.append(body)
            index = len(issue.notes) - 1
            issue.note_authors[index] = username or self.username
            issue.note_times[index] = _EPOCH + datetime.timedelta(seconds=next(self._clock))
            if system:
                issue.system_notes.add(index)
            return issue.iid * 10000 + index + 1

    def delete_note(self, iid: int, note_id: int) -> None:
        """Delete a note by id (it is no longer listed)."""
        with self._lock:
            self._issues[iid].deleted_notes.add(note_id - iid * 10000 - 1)

    def note_ids(self, iid: int) -> list[int]:
        """The ids of the issue's listed notes, oldest first."""
        with self._lock:
            issue = self._issues[iid]
            return [
                iid * 10000 + i + 1 for i in range(len(issue.notes)) if i not in issue.deleted_notes
            ]

    def issue(self, iid: int) -> FakeGitLabIssue:
        with self._lock:
            return self._issues[iid]

    def set_labels(self, iid: int, labels: Iterable[str]) -> None:
        with self._lock:
            self._issues[iid].labels = list(labels)
            self._touch(self._issues[iid])

    def close_issue(self, iid: int) -> None:
        with self._lock:
            self._issues[iid].state = "closed"
            self._touch(self._issues[iid])

    def delete_issue(self, iid: int) -> None:
        with self._lock:
            self._issues[iid].deleted = True

    def add_link(self, *, source: int, target: int, link_type: str = "relates_to") -> None:
        """Link two issues as the web UI would (``source`` ``link_type`` ``target``)."""
        if link_type not in LINK_TYPES:
            raise ValueError(f"unknown link type {link_type!r}")
        with self._lock:
            self._links.append((source, target, link_type, next(self._link_ids)))

    def set_rate_budget(self, *, remaining: int, reset_in_s: float) -> None:
        with self._lock:
            self._observed = self.rate_limit - remaining
            self._reset_at = time.time() + reset_in_s

    def fail_next(
        self,
        kind: str,
        *,
        times: int = 1,
        status: int = 500,
        message: str = "500 Internal Server Error",
        body: Any = None,
        retry_after: float | None = None,
        paths: Iterable[str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests (whose path contains one of ``paths``) with
        ``status`` (HTTP ``status`` with ``body``, default ``{"message": message}``),
        ``throttled`` (429, with ``Retry-After`` when given), ``malformed`` (200 with
        ``body``), ``not_json``, ``oversized`` (200 with a ~2 MiB JSON list) or ``disconnect``."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}; known: {FAILURE_KINDS}")
        failure = _Failure(kind, status, message, body, retry_after,
                           tuple(paths) if paths is not None else None)
        with self._lock:
            self._failures.extend([failure] * times)

    def requests_to(self, fragment: str) -> list[RecordedRequest]:
        return [r for r in self.requests if fragment in r.path]

    # -- serving ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("the fake GitLab server is not running")
        return f"http://127.0.0.1:{self._port}"

    @property
    def encoded_project(self) -> str:
        return self.project.replace("/", "%2F")

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        if request.method in ("POST", "PUT"):
            raw = await request.read()
            body = _decode_body(raw, request.content_type)
        raw_path = request.raw_path.split("?", 1)[0]
        record = RecordedRequest(
            method=request.method,
            path=raw_path,
            query=dict(request.query),
            query_items=list(request.query.items()),
            headers=dict(request.headers),
            body=body,
        )
        with self._lock:
            self.requests.append(record)
            response = self._checked(request, record) or self._route(request, raw_path, body)
        if response is _DISCONNECT:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake GitLab dropped the connection")
        assert isinstance(response, web.Response)
        record.status = response.status
        return response

    def _checked(self, request: web.Request, record: RecordedRequest) -> web.Response | object:
        token = record.headers.get("PRIVATE-TOKEN")
        if token is None:
            scheme, _, credential = record.headers.get("Authorization", "").partition(" ")
            token = credential if scheme.lower() == "bearer" else None
        if token != self.token:
            return self._json(401, {"message": "401 Unauthorized"})
        failure = self._pop_failure(record.path)
        if failure is not None:
            return self._failure_response(failure)
        if time.time() >= self._reset_at:
            self._observed, self._reset_at = 0, time.time() + 60
        if self._observed >= self.rate_limit:
            return self._throttled(retry_after=max(1, round(self._reset_at - time.time())))
        self._observed += 1
        return None

    def _route(self, request: web.Request, raw_path: str, body: Any) -> web.Response:
        parts = raw_path.split("/")[1:]
        if parts[:2] != ["api", "v4"]:
            return self._json(404, {"error": "404 Not Found"})
        parts = parts[2:]
        method = request.method
        if parts == ["user"] and method == "GET":
            return self._json(200, {"id": 31, "username": self.username, "name": "Lorenz Bot",
                                    "state": "active"})
        if len(parts) < 2 or parts[0] != "projects":
            return self._json(404, {"error": "404 Not Found"})
        reference = unquote(parts[1])
        if reference != str(self.project_id) and reference.lower() != self.project.lower():
            return self._json(404, {"message": "404 Project Not Found"})
        rest = parts[2:]
        if not rest and method == "GET":
            return self._json(200, self._project_json())
        if rest == ["issues"] and method == "GET":
            return self._listing(request)
        if len(rest) >= 2 and rest[0] == "issues" and rest[1].isdigit():
            issue = self._issues.get(int(rest[1]))
            if issue is None or issue.deleted:
                return self._json(404, {"message": "404 Not found"})
            tail = rest[2:]
            if not tail and method == "GET":
                return self._json(200, self._issue_json(issue))
            if not tail and method == "PUT":
                return self._edit(issue, body)
            if tail == ["notes"] and method == "GET":
                notes = [
                    self._note_json(issue, i)
                    for i in range(len(issue.notes))
                    if i not in issue.deleted_notes
                ]
                if request.query.get("sort", "desc") == "desc":
                    notes.reverse()
                return self._page(request, notes)
            if tail == ["notes"] and method == "POST":
                return self._add_note(issue, body)
            if tail == ["links"] and self.links_api and method == "GET":
                return self._page(request, self._links_of(issue.iid))
            if tail == ["links"] and self.links_api and method == "POST":
                return self._add_link(issue, body)
        return self._json(404, {"error": "404 Not Found"})

    # -- reads --------------------------------------------------------------------------------

    def _listing(self, request: web.Request) -> web.Response:
        query = request.query
        state = query.get("state", "all")
        if state not in ("opened", "closed", "all"):
            return self._json(400, {"error": "state does not have a valid value"})
        wanted = [w.strip().lower() for w in query.get("labels", "").split(",") if w.strip()]
        iids = {int(v) for v in query.getall("iids[]", []) if v.isdigit()}
        items = [
            issue
            for issue in self._issues.values()
            if not issue.deleted
            and (state == "all" or issue.state == state)
            and all(label in {lb.lower() for lb in issue.labels} for label in wanted)
            and (not iids or issue.iid in iids)
        ]
        order_by = query.get("order_by", "created_at")
        if order_by not in ("created_at", "updated_at", "priority", "due_date", "title"):
            return self._json(400, {"error": "order_by does not have a valid value"})
        field = "updated_at" if order_by == "updated_at" else "created_at"
        items.sort(key=lambda i: (getattr(i, field), i.iid),
                   reverse=query.get("sort", "desc") == "desc")
        return self._page(request, [self._issue_json(i) for i in items])

    def _links_of(self, iid: int) -> list[dict[str, Any]]:
        linked = []
        for source, target, link_type, link_id in self._links:
            if source == iid:
                other, seen_as = target, link_type
            elif target == iid:
                other, seen_as = source, _INVERSE[link_type]
            else:
                continue
            issue = self._issues.get(other)
            if issue is None or issue.deleted:
                continue
            linked.append({**self._issue_json(issue), "issue_link_id": link_id,
                           "link_type": seen_as, "link_created_at": _iso(_EPOCH),
                           "link_updated_at": _iso(_EPOCH)})
        return linked

    # -- writes -------------------------------------------------------------------------------

    def _edit(self, issue: FakeGitLabIssue, body: Any) -> web.Response:
        if not isinstance(body, dict):
            return self._json(400, {"error": "400 Bad request"})
        event = body.get("state_event")
        if event is not None and event not in ("close", "reopen"):
            return self._json(400, {"error": "state_event does not have a valid value"})
        if "labels" in body:
            issue.labels = _merged([], _names(body["labels"]))
        if "add_labels" in body:
            issue.labels = _merged(issue.labels, _names(body["add_labels"]))
        if "remove_labels" in body:
            removed = {n.lower() for n in _names(body["remove_labels"])}
            issue.labels = [n for n in issue.labels if n.lower() not in removed]
        for field in ("title", "description"):
            if isinstance(body.get(field), str):
                setattr(issue, field, body[field])
        if event == "close":
            issue.state = "closed"
        elif event == "reopen":
            issue.state = "opened"
        self._touch(issue)
        return self._json(200, self._issue_json(issue))

    def _add_note(self, issue: FakeGitLabIssue, body: Any) -> web.Response:
        text = body.get("body") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            return self._json(400, {"error": "body is missing"})
        issue.notes.append(text)
        issue.note_times[len(issue.notes) - 1] = _EPOCH + datetime.timedelta(
            seconds=next(self._clock)
        )
        self._touch(issue)
        return self._json(201, self._note_json(issue, len(issue.notes) - 1))

    def _add_link(self, issue: FakeGitLabIssue, body: Any) -> web.Response:
        if not isinstance(body, dict):
            return self._json(400, {"error": "target_project_id is missing"})
        link_type = body.get("link_type", "relates_to")
        target_iid = str(body.get("target_issue_iid", ""))
        target = self._issues.get(int(target_iid)) if target_iid.isdigit() else None
        if link_type not in LINK_TYPES:
            return self._json(400, {"error": "link_type does not have a valid value"})
        if target is None or str(body.get("target_project_id")) not in (
            str(self.project_id), self.project
        ):
            return self._json(404, {"message": "404 Not found"})
        self._links.append((issue.iid, target.iid, link_type, next(self._link_ids)))
        return self._json(201, {"source_issue": self._issue_json(issue),
                                "target_issue": self._issue_json(target),
                                "link_type": link_type})

    # -- responses ----------------------------------------------------------------------------

    def _page(self, request: web.Request, items: list[dict[str, Any]]) -> web.Response:
        try:
            per_page = min(MAX_PER_PAGE, max(1, int(request.query.get("per_page",
                                                                      DEFAULT_PER_PAGE))))
            page = max(1, int(request.query.get("page", 1)))
        except ValueError:
            return self._json(400, {"error": "per_page is invalid"})
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = {
            "X-Page": str(page),
            "X-Per-Page": str(per_page),
            "X-Next-Page": str(page + 1) if page < last else "",
            "X-Prev-Page": str(page - 1) if page > 1 else "",
            "X-Total": str(len(items)),
            "X-Total-Pages": str(last),
        }
        if self.link_header:

            def link(to_page: int, rel: str) -> str:
                query = [(k, v) for k, v in request.query.items() if k != "page"]
                query.append(("page", str(to_page)))
                raw_path = request.raw_path.split("?", 1)[0]
                return f'<{self.url}{raw_path}?{urlencode(query)}>; rel="{rel}"'

            links = []
            if page > 1:
                links.append(link(page - 1, "prev"))
            if page < last:
                links.append(link(page + 1, "next"))
            links.append(link(1, "first"))
            links.append(link(last, "last"))
            headers["Link"] = ", ".join(links)
        return self._json(200, chunk, headers=headers)

    def _project_json(self) -> dict[str, Any]:
        return {
            "id": self.project_id,
            "name": self.project.rsplit("/", 1)[-1],
            "path": self.project.rsplit("/", 1)[-1],
            "path_with_namespace": self.project,
            "web_url": f"https://gitlab.example.com/{self.project}",
        }

    def _user_json(self, username: str, index: int) -> dict[str, Any]:
        return {"id": 100 + index, "username": username, "name": username.title(),
                "state": "active", "web_url": f"https://gitlab.example.com/{username}"}

    def _issue_json(self, issue: FakeGitLabIssue) -> dict[str, Any]:
        users = [self._user_json(u, i) for i, u in enumerate(issue.assignees)]
        return {
            "id": 90000 + issue.iid,
            "iid": issue.iid,
            "project_id": self.project_id,
            "title": issue.title,
            "description": issue.description,
            "state": issue.state,
            "created_at": _iso(issue.created_at),
            "updated_at": _iso(issue.updated_at),
            "closed_at": _iso(issue.updated_at) if issue.state == "closed" else None,
            "labels": list(issue.labels),
            "milestone": None,
            "assignees": users,
            "assignee": users[0] if users else None,
            "author": self._user_json("reporter", 0),
            "type": "ISSUE",
            "issue_type": "issue",
            "user_notes_count": len(issue.notes),
            "confidential": False,
            "web_url": f"https://gitlab.example.com/{self.project}/-/issues/{issue.iid}",
            "references": {"short": f"#{issue.iid}", "relative": f"#{issue.iid}",
                           "full": f"{self.project}#{issue.iid}"},
            "moved_to_id": None,
        }

    def _note_json(self, issue: FakeGitLabIssue, index: int) -> dict[str, Any]:
        return {
            "id": issue.iid * 10000 + index + 1,
            "type": None,
            "body": issue.notes[index],
            "author": self._user_json(issue.note_authors.get(index, self.username), 0),
            "created_at": _iso(issue.note_times.get(index, _EPOCH)),
            "updated_at": _iso(issue.note_times.get(index, _EPOCH)),
            "system": index in issue.system_notes,
            "noteable_id": 90000 + issue.iid,
            "noteable_type": "Issue",
            "noteable_iid": issue.iid,
            "project_id": self.project_id,
        }

    def _rate_headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.rate_limit),
            "RateLimit-Observed": str(self._observed),
            "RateLimit-Remaining": str(max(0, self.rate_limit - self._observed)),
            "RateLimit-Reset": str(int(self._reset_at)),
            "RateLimit-ResetTime": email.utils.formatdate(self._reset_at, usegmt=True),
        }

    def _json(self, status: int, payload: Any, *, headers: dict[str, str] | None = None
              ) -> web.Response:
        return web.json_response(payload, status=status,
                                 headers={**self._rate_headers(), **(headers or {})})

    def _throttled(self, *, retry_after: float | None) -> web.Response:
        headers = self._rate_headers()
        if retry_after is not None:
            headers["Retry-After"] = f"{retry_after:g}"
        return web.Response(status=429, text="Retry later\n", content_type="text/plain",
                            headers=headers)

    def _failure_response(self, failure: _Failure) -> web.Response | object:
        if failure.kind == "disconnect":
            return _DISCONNECT
        if failure.kind == "status":
            return self._json(failure.status, failure.body if failure.body is not None
                              else {"message": failure.message})
        if failure.kind == "throttled":
            return self._throttled(retry_after=failure.retry_after)
        if failure.kind == "not_json":
            return web.Response(status=200, text="<html>sign in</html>", content_type="text/html")
        if failure.kind == "oversized":
            return self._json(200, [{"iid": i, "title": "x" * 1000} for i in range(2100)])
        return self._json(200, failure.body if failure.body is not None else {"unexpected": 1})

    def _pop_failure(self, path: str) -> _Failure | None:
        for index, failure in enumerate(self._failures):
            if failure.paths is None or any(fragment in path for fragment in failure.paths):
                return self._failures.pop(index)
        return None

    def _touch(self, issue: FakeGitLabIssue) -> None:
        issue.updated_at = _EPOCH + datetime.timedelta(seconds=next(self._clock))


_DISCONNECT = object()


def _decode_body(raw: bytes, content_type: str) -> Any:
    """A write's parameters: JSON, or a form (GitLab takes both); ``None`` when empty."""
    if not raw:
        return None
    if content_type == "application/x-www-form-urlencoded":
        return dict(parse_qsl(raw.decode()))
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _names(value: Any) -> list[str]:
    """Label names from a write: a comma-separated string or a list of names."""
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    if isinstance(value, list):
        return [n.strip() for n in value if isinstance(n, str) and n.strip()]
    return []


def _merged(current: list[str], added: list[str]) -> list[str]:
    out = list(current)
    for name in added:
        if name.lower() not in {existing.lower() for existing in out}:
            out.append(name)
    return out
