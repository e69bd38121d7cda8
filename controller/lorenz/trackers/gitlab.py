"""The GitLab tracker (``tracker.kind: gitlab``): REST v4 issues of one project.

A GitLab issue is ``opened`` or ``closed``; anything finer is a label. So a workflow either
lives with those two (``active_states: [opened]``) or names a label scope
(``tracker.provider.state_label_scope: status``) and keeps its states in scoped labels
(``status::todo``, ``status::in progress``): an open issue's state is the value of its first
label in that scope that names a configured state, else ``opened``; a closed issue's state is
its terminal scoped label, else the first terminal state (closing is authoritative, whatever
labels were left on it). The same rules as the GitHub tracker, with GitLab's spelling.

The project is ``tracker.project_slug``: its numeric id or its full path (``group/sub/app``,
URL-encoded on the wire). Ids are issue ``iid`` s as strings (a project addresses its issues by
them); identifiers are the issue's full reference (``group/app#12``). Blockers come from issue
links whose ``link_type`` is ``is_blocked_by`` (the other issue blocks this one). Notes are the
comments. Listings are offset-paged, following ``Link: rel="next"`` or ``X-Next-Page``, with a
bound on pages and on each response's size.

Rate limits: a 429 waits ``Retry-After`` (else ``RateLimit-Reset``/``RateLimit-ResetTime``) within
the bounded policy of :mod:`lorenz.trackers.throttling`, else fails as ``gitlab_rate_limited``;
a success with ``RateLimit-Remaining: 0`` makes the next request wait for the reset first.

The agent's host-side tool ``gitlab_api`` runs here too (:meth:`GitLabTracker.call_gitlab_api`):
one REST call under ``/api/v4`` of the configured instance with the tracker's token, its method
on an allow-list and its path confined to the configured project unless the workflow widens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import quote, unquote

import httpx
from pydantic import Field

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers import httpstack as _httpstack  # noqa: F401 - see its docstring
from lorenz.trackers.base import TrackerError, tracker_settings_of, unchanged
from lorenz.trackers.connections import TrackerConnection
from lorenz.trackers.gitlab_payloads import (
    API_PREFIX,
    OPENED_STATE,
    TOOL_REFUSED_PARAMETERS,
    error_message,
    full_reference,
    positive_int,
    tool_query,
)
from lorenz.trackers.gitlab_payloads import LabelStates as LabelStates
from lorenz.trackers.gitlab_payloads import normalize_issue as normalize_issue
from lorenz.trackers.gitlab_payloads import tool_path_segments as tool_path_segments
from lorenz.trackers.options import ProviderOptions, parse_provider_options
from lorenz.trackers.payloads import label_names, nonblank
from lorenz.trackers.questions import (
    ReadComment,
    TrackerReply,
    has_question_marker,
    question_comment,
    read_rest_comment,
    replies_after,
)
from lorenz.trackers.throttling import (
    RateLimitExhausted,
    RateLimitHit,
    Sleep,
    Throttle,
    parse_retry_after,
    seconds_until_epoch,
)
from lorenz.trackers.writes import MAX_COMMENT_PAGES, has_marker, with_marker

logger = logging.getLogger(__name__)

DEFAULT_GITLAB_ENDPOINT = "https://gitlab.com"
GITLAB_TOKEN_ENV = "GITLAB_TOKEN"
BLOCKED_BY_LINK = "is_blocked_by"
MAX_TOOL_BODY_BYTES = 1024 * 1024
"""Largest JSON body the agent may send through ``gitlab_api``."""
TOOL_HEADERS = ("x-next-page", "x-page", "x-per-page", "x-total", "x-total-pages", "link")
"""Response headers handed to the agent with a ``gitlab_api`` answer (paging)."""
_PROJECT_PATH_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)+$")
_SCOPE_RE = re.compile(r"^[^:,]+(::[^:,]+)*$")

HttpMethod = Literal["GET", "POST", "PUT", "DELETE"]
DEFAULT_API_METHODS: tuple[HttpMethod, ...] = ("GET", "POST", "PUT")


class GitLabOptions(ProviderOptions):
    """``tracker.provider`` keys of the GitLab tracker."""

    page_size: Annotated[int, Field(ge=1, le=100)] = 100
    """Items per page (``per_page``; GitLab's maximum is 100)."""

    max_pages: Annotated[int, Field(ge=1, le=1000)] = 50
    """Pages one listing may take; a longer one fails as ``gitlab_too_many_pages``."""

    max_response_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 8 * 1024 * 1024
    """Largest response body read; a larger one fails as ``gitlab_response_too_large``."""

    state_label_scope: str | None = None
    """Scope of the labels that carry workflow states (``status`` reads ``status::todo`` as the
    state ``todo``); unset: states are only ``opened`` and closed."""

    links: bool = True
    """Read blockers from issue links (one request per issue read)."""

    link_concurrency: Annotated[int, Field(ge=1, le=16)] = 4
    """Issue-link requests in flight at once."""

    api_methods: list[HttpMethod] = Field(default_factory=lambda: list(DEFAULT_API_METHODS))
    """HTTP methods the agent's ``gitlab_api`` tool may use."""

    api_scope: Literal["project", "instance"] = "project"
    """``project``: ``gitlab_api`` paths must stay under ``/projects/<this project>``;
    ``instance``: any path under ``/api/v4`` of this instance."""


# -- the client -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Listing:
    """One listing request of :meth:`GitLabTracker.fetch_issues_by_states`."""

    state: str | None
    """``opened``, ``closed``, or ``None`` for both."""
    labels: str | None = None


class GitLabTracker:
    """Reads (and, for the terminal actions, writes) the issues of one project."""

    def __init__(
        self,
        *,
        settings: WorkflowSettings | TrackerSettings,
        token: str,
        endpoint: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        tracker = tracker_settings_of(settings)
        if not token or not token.strip():
            raise TrackerError(
                f"no GitLab token; set tracker.api_key or {GITLAB_TOKEN_ENV}",
                code=ErrorCode.MISSING_TRACKER_API_KEY,
                key_path="tracker.api_key",
            )
        project = (tracker.project_slug or "").strip().strip("/")
        if not project:
            raise TrackerError(
                "no GitLab project; set tracker.project_slug to its path (group/app) or "
                "numeric id",
                code=ErrorCode.MISSING_TRACKER_PROJECT_SLUG,
                key_path="tracker.project_slug",
            )
        if not (project.isdigit() or _PROJECT_PATH_RE.match(project)) or any(
            segment in (".", "..") for segment in project.split("/")
        ):
            raise TrackerError(
                f"tracker.project_slug {project!r} is neither a project path nor a numeric "
                "id; write it like group/app or 4711",
                code=ErrorCode.INVALID_TRACKER_PROJECT_SLUG,
                key_path="tracker.project_slug",
            )
        self.options = parse_provider_options(GitLabOptions, tracker.provider, kind="gitlab")
        scope = self.options.state_label_scope
        if scope is not None and (not scope.strip() or not _SCOPE_RE.match(scope.strip())):
            raise TrackerError(
                f"tracker.provider.state_label_scope {scope!r} is not a label scope; write "
                "it like status (for labels status::todo)",
                code=ErrorCode.INVALID_TRACKER_CONFIG,
                key_path="tracker.provider.state_label_scope",
            )
        unreachable = [s for s in tracker.active_states if normalize_state(s) != OPENED_STATE]
        if scope is None and unreachable:
            # NB: without a scope no issue is ever in such a state: nothing would be dispatched.
            raise TrackerError(
                f"GitLab issues are only opened or closed without state labels, so active state "
                f"{unreachable[0]!r} is never reached; set active_states: [opened] or "
                "tracker.provider.state_label_scope (e.g. status for status::todo labels)",
                code=ErrorCode.GITLAB_STATES_NEED_LABEL_SCOPE,
                key_path="tracker.active_states",
            )
        self._settings = tracker
        self._token = token.strip()
        self.project = project
        self._project_ref = project if project.isdigit() else quote(project, safe="")
        base = (endpoint or tracker.endpoint or DEFAULT_GITLAB_ENDPOINT).strip()
        parsed = httpx.URL(base) if re.match(r"^https?://[^/\s]+", base) else None
        if parsed is None or parsed.query or parsed.fragment:
            raise TrackerError(
                f"tracker.endpoint {base!r} is not a GitLab instance URL; write it like "
                "https://gitlab.example.com",
                code=ErrorCode.INVALID_TRACKER_ENDPOINT,
                key_path="tracker.endpoint",
            )
        self._api = _api_base(base)
        self._states = LabelStates.from_settings(
            tracker, scope=scope.strip() if scope is not None else None
        )
        self._connection = TrackerConnection(
            shared=http_client,
            tracker="GitLab",
            timeout_ms=self.options.timeout_ms,
            headers={"User-Agent": "lorenz"},
        )
        self._wall_clock = wall_clock
        self._throttle = Throttle(policy=self.options.rate_limit_policy(), sleep=sleep)
        assignee = (tracker.assignee or "").strip()
        self._assignee = assignee or None
        self._viewer_username: str | None = None
        self._own_user: tuple[str | None] | None = None
        """The token's username for questions (``(None,)``: GitLab did not say), asked once."""
        self._project_identity: tuple[int, str] | None = None
        self._links_available = self.options.links

    @property
    def api_base(self) -> str:
        """``<endpoint>/api/v4``."""
        return self._api

    @property
    def links_available(self) -> bool:
        """False once the server answered 404 for the issue links API (or it is turned off)."""
        return self._links_available

    # -- TrackerClient ------------------------------------------------------------------------

    async def fetch_candidate_issues(self) -> list[Issue]:
        return await self.fetch_issues_by_states(self._settings.active_states)

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        wanted = {normalize_state(s): s for s in states if s.strip()}
        if not wanted:
            return []
        route = await self._routing()
        items: dict[Any, Any] = {}
        for listing in self._listings(wanted):
            for item in await self._list_issues(listing):
                iid = positive_int(item.get("iid")) if isinstance(item, Mapping) else None
                # NB: items without an iid cannot be de-duplicated; they are malformed anyway.
                items.setdefault(iid if iid is not None else object(), item)
        issues: list[Issue] = []
        dropped = 0
        for item in items.values():
            issue = normalize_issue(item, project=self.project, states=self._states)
            if issue is None:
                dropped += 1
            elif issue.state_key in wanted:
                issues.append(route(issue))
        if dropped:
            logger.warning("dropped malformed GitLab issues project=%s count=%d",
                           self.project, dropped)
        return await self._with_blockers(issues)

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        # NB: ids this tracker never hands out (not an iid) are simply not visible here.
        wanted = list(dict.fromkeys(i for i in ids if i.isascii() and i.isdigit() and int(i) > 0))
        if not wanted:
            return []
        route = await self._routing()
        found: dict[str, Issue] = {}
        size = self.options.page_size
        for start in range(0, len(wanted), size):
            batch = wanted[start : start + size]
            params: dict[str, Any] = {"iids[]": batch, "per_page": size}
            for item in await self._paged(self._project_path("/issues"), params,
                                          what="issues by iid"):
                issue = normalize_issue(item, project=self.project, states=self._states)
                if issue is None:
                    # NB: leaving it out would read as "gone" and stop its run; fail instead.
                    raise TrackerError(
                        f"GitLab returned a malformed issue in {self.project} (no iid, title or "
                        "opened/closed state); retry later",
                        code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
                    )
                if issue.id in batch:
                    found[issue.id] = route(issue)
        return await self._with_blockers([found[i] for i in wanted if i in found])

    async def close(self) -> None:
        await self._connection.close()

    # -- reading ------------------------------------------------------------------------------

    def _listings(self, wanted: Mapping[str, str]) -> list[_Listing]:
        """The listing requests that together return every issue in the wanted states."""
        terminal = {normalize_state(s) for s in self._states.terminal}
        fallback = normalize_state(self._states.closed_fallback)
        listings: list[_Listing] = []
        for key, name in wanted.items():
            if key == OPENED_STATE:
                listings.append(_Listing(state="opened"))
                continue
            if key == fallback:
                listings.append(_Listing(state="closed"))
            if self._states.scope is not None:
                # NB: a non-terminal label on a closed issue never makes it active (closed
                # issues are terminal), so only terminal states need closed issues listed.
                listings.append(
                    _Listing(state=None if key in terminal else "opened",
                             labels=self._states.label_for(name))
                )
        return list(dict.fromkeys(listings))

    async def _list_issues(self, listing: _Listing) -> list[Any]:
        params: dict[str, Any] = {
            "per_page": self.options.page_size,
            "order_by": "created_at",
            "sort": "asc",
        }
        if listing.state is not None:
            params["state"] = listing.state
        if listing.labels is not None:
            params["labels"] = listing.labels
        return await self._paged(self._project_path("/issues"), params, what="issue listing")

    async def _paged(
        self,
        path: str,
        params: Mapping[str, Any],
        *,
        what: str,
        absent: Collection[int] = (),
    ) -> list[Any]:
        """Every item of an offset-paged listing (``Link: rel="next"``, else ``X-Next-Page``),
        at most ``max_pages`` pages."""
        url = f"{self._api}{path}"
        query: Mapping[str, Any] | None = params
        items: list[Any] = []
        for _ in range(self.options.max_pages):
            response = await self._request(url, params=query, what=what, absent=absent)
            if response.status_code in absent:
                raise _Absent(response.status_code, no_route=_no_such_route(response))
            page = self._json(response, what=what)
            if not isinstance(page, list):
                raise TrackerError(
                    f"GitLab's {what} is not a JSON list; check tracker.endpoint",
                    code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
                )
            items.extend(page)
            next_url = response.links.get("next", {}).get("url")
            if next_url:
                if not next_url.startswith(f"{self._api}/"):
                    raise TrackerError(
                        f"GitLab's next-page link for {what} leaves {self._api}; check "
                        "tracker.endpoint (it must be the URL clients reach the instance at)",
                        code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
                    )
                url, query = next_url, None  # the next link carries the query
                continue
            next_page = response.headers.get("x-next-page", "").strip()
            if not next_page.isdigit():
                return items
            url, query = f"{self._api}{path}", {**params, "page": int(next_page)}
        raise TrackerError(
            f"GitLab's {what} has more than {self.options.max_pages} pages; raise "
            "tracker.provider.max_pages or narrow the states",
            code=ErrorCode.GITLAB_TOO_MANY_PAGES,
        )

    async def _with_blockers(self, issues: list[Issue]) -> list[Issue]:
        if not issues or not self._links_available:
            return issues
        gate = asyncio.Semaphore(self.options.link_concurrency)

        async def one(issue: Issue) -> Issue:
            async with gate:
                if not self._links_available:
                    return issue
                return await self._blockers_of(issue)

        return list(await asyncio.gather(*(one(issue) for issue in issues)))

    async def _blockers_of(self, issue: Issue) -> Issue:
        try:
            items = await self._paged(
                self._project_path(f"/issues/{issue.id}/links"),
                {"per_page": self.options.page_size},
                what=f"links of {issue.identifier}",
                absent=(404,),
            )
        except _Absent as absent:
            # NB: an issue deleted since it was read answers 404 too, with GitLab's "message";
            # only a route the server does not know ("error") means it has no links API.
            if not absent.no_route:
                return issue
            if self._links_available:
                self._links_available = False
                logger.info("GitLab has no issue links API here; blockers are not read "
                            "project=%s endpoint=%s", self.project, self._api)
            return issue
        own_project = issue.native_ref.get("project_id") if issue.native_ref else None
        blockers = []
        for item in items:
            if not isinstance(item, Mapping) or item.get("link_type") != BLOCKED_BY_LINK:
                continue
            iid = positive_int(item.get("iid"))
            if iid is None:
                continue
            project_id = item.get("project_id")
            same_project = own_project is None or project_id == own_project
            identifier = full_reference(item) or (
                f"{self.project}#{iid}" if same_project else f"project {project_id}#{iid}"
            )
            blockers.append(
                BlockerRef(
                    id=str(iid) if same_project else identifier,
                    identifier=identifier,
                    state=self._states.state_of(item),
                )
            )
        return dataclasses.replace(issue, blocked_by=tuple(blockers))

    async def _routing(self) -> Callable[[Issue], Issue]:
        if self._assignee is None:
            return unchanged
        target = self._assignee
        if target.lower() == "me":
            target = await self._viewer()
        wanted = target.casefold()

        def route(issue: Issue) -> Issue:
            usernames = [issue.assignee_id] if issue.assignee_id else []
            if issue.native_ref and isinstance(issue.native_ref.get("assignees"), list):
                usernames = list(issue.native_ref["assignees"])
            if any(name.casefold() == wanted for name in usernames):
                return issue
            return dataclasses.replace(issue, dispatchable=False)

        return route

    async def _viewer(self) -> str:
        # NB: cached per tracker instance; a reload builds a new instance and asks again.
        if self._viewer_username is None:
            _, body = await self._get_json("/user", what="the token's user")
            username = nonblank(body.get("username")) if isinstance(body, Mapping) else None
            if username is None:
                raise TrackerError(
                    "GitLab did not say who the token belongs to; set tracker.assignee to a "
                    "username instead of 'me'",
                    code=ErrorCode.MISSING_GITLAB_VIEWER_IDENTITY,
                    key_path="tracker.assignee",
                )
            self._viewer_username = username
        return self._viewer_username

    # -- terminal actions (retry.terminal_action) ----------------------------------------------

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """One note (skipped when one already carries ``key``'s marker) and/or one label
        (``add_labels``, which creates a missing label). See :mod:`lorenz.trackers.writes`."""
        base = self._project_path(f"/issues/{issue.id}")
        wrote = False
        if label is not None and normalize_state(label) not in issue.labels:
            await self._write("PUT", base, {"add_labels": label.strip()},
                              what="escalation label")
            wrote = True
        if comment is not None and not await self._has_note_marker(base, key=key):
            await self._write("POST", f"{base}/notes", {"body": with_marker(comment, key=key)},
                              what="escalation note")
            wrote = True
        return wrote

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """Swap the issue's scoped state labels for ``state`` and close (terminal ``state``) or
        reopen it; without a label scope only ``opened`` and terminal states can be reached."""
        base = self._project_path(f"/issues/{issue.id}")
        _, item = await self._get_json(base, what=f"issue {issue.identifier}")
        if not isinstance(item, Mapping) or item.get("state") not in ("opened", "closed"):
            raise TrackerError(
                f"GitLab returned a malformed issue {issue.identifier}; retry later",
                code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
            )
        target = normalize_state(state)
        terminal = target in {normalize_state(s) for s in self._states.terminal}
        changes: dict[str, Any] = {}
        if self._states.scope is not None:
            names = label_names(item)
            stale = [
                n for n in names
                if self._states.is_state_label(n)
                and normalize_state(self._states.state_in_label(n)) != target
            ]
            if stale:
                changes["remove_labels"] = ",".join(stale)
            has_target = any(
                normalize_state(self._states.state_in_label(n)) == target for n in names
            )
            if target != OPENED_STATE and not has_target:
                changes["add_labels"] = self._states.label_for(state)
        elif not terminal and target != OPENED_STATE:
            raise TrackerError(
                f"GitLab issues without state labels are only opened or closed, not {state!r}; "
                "set tracker.provider.state_label_scope or choose a terminal state",
                code=ErrorCode.GITLAB_STATE_UNREACHABLE,
                key_path="tracker.provider.state_label_scope",
            )
        if terminal and item["state"] != "closed":
            changes["state_event"] = "close"
        elif not terminal and item["state"] == "closed":
            changes["state_event"] = "reopen"
        if changes:
            await self._write("PUT", base, changes, what=f"moving the issue to {state!r}")

    async def _has_note_marker(self, base: str, *, key: str) -> bool:
        query: Mapping[str, Any] = {"per_page": 100, "sort": "asc"}
        async with contextlib.aclosing(self._note_pages(base, params=query)) as pages:
            async for page in pages:
                if any(isinstance(n, Mapping) and has_marker(n.get("body"), key=key) for n in page):
                    return True
        return False

    async def _note_pages(
        self, base: str, *, params: Mapping[str, Any]
    ) -> AsyncGenerator[list[Any], None]:
        """The issue's notes page by page, following ``x-next-page`` (bounded pages).

        Shared by the marker check of escalations and the question reader, so both page and
        reject a non-list answer alike; each passes its own ``params`` (order, sort).
        """
        url = f"{self._api}{base}/notes"
        query = params
        for _ in range(MAX_COMMENT_PAGES):
            response = await self._request(url, params=query, what="issue notes", absent=())
            page = self._json(response, what="issue notes")
            if not isinstance(page, list):
                raise TrackerError(
                    "GitLab's issue notes are not a JSON list; check tracker.endpoint",
                    code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
                )
            yield page
            next_page = response.headers.get("x-next-page", "").strip()
            if not next_page.isdigit():
                return
            query = {**params, "page": int(next_page)}

    # -- questions (lorenz.trackers.questions) -------------------------------------------------

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """One note with ``key``'s marker, skipped when a note already carries it."""
        base = self._project_path(f"/issues/{issue.id}")
        notes = await self._question_notes(base)
        if any(has_question_marker(note.body, key=key) for note in notes):
            return False
        await self._write("POST", f"{base}/notes", {"body": question_comment(body, key=key)},
                          what="question note")
        return True

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The notes after the question, without system notes and Lorenz's own (marked, or by
        the token's user); the author is the note author's username."""
        notes = await self._question_notes(self._project_path(f"/issues/{issue.id}"))
        own = await self._own_username()
        return replies_after(notes, key=key, own_ids=[own] if own else [])

    async def _question_notes(self, base: str) -> list[ReadComment]:
        """The issue's notes by people, oldest first (bounded pages; system notes, which
        GitLab writes for label and state changes, and malformed ones skipped)."""
        query: Mapping[str, Any] = {"per_page": 100, "sort": "asc", "order_by": "created_at"}
        notes: list[ReadComment] = []
        async for page in self._note_pages(base, params=query):
            for item in page:
                if isinstance(item, Mapping) and item.get("system") is True:
                    continue
                note = read_rest_comment(item, author_key="author", name_key="username")
                if note is not None:
                    notes.append(note)
        return notes

    async def _own_username(self) -> str | None:
        """The token's username (``GET /user``), asked once; ``None`` when GitLab does not say
        (a job token has no user; Lorenz's notes are still told by their marker)."""
        if self._viewer_username is not None:
            return self._viewer_username
        if self._own_user is None:
            _, body = await self._get_json("/user", what="the token's user", absent=(403, 404))
            username = nonblank(body.get("username")) if isinstance(body, Mapping) else None
            self._own_user = (username,)
        return self._own_user[0]

    async def _write(self, method: str, path: str, body: Any, *, what: str) -> None:
        await self._request(
            f"{self._api}{path}", params=None, what=what, absent=(), method=method, json=body
        )

    # -- the agent's tool (gitlab_api) ----------------------------------------------------------

    async def call_gitlab_api(
        self,
        *,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """One REST call for the agent: ``{"status", "headers", "body"}``. A refused call (method,
        path, size) raises :class:`TrackerError` with ``gitlab_api_*`` codes and sends nothing."""
        verb = method.strip().upper() if isinstance(method, str) else ""
        if verb not in self.options.api_methods:
            raise TrackerError(
                f"method {method!r} is not allowed for gitlab_api; allowed: "
                f"{', '.join(self.options.api_methods)} (tracker.provider.api_methods)",
                code=ErrorCode.GITLAB_API_METHOD_REFUSED,
            )
        relative = await self._tool_path(path)
        params = tool_query(query)
        if body is not None and verb in ("GET", "DELETE"):
            raise TrackerError(
                f"gitlab_api {verb} takes no body; put parameters in `query`",
                code=ErrorCode.GITLAB_API_BODY_REFUSED,
            )
        if isinstance(body, Mapping) and TOOL_REFUSED_PARAMETERS & {str(k).lower() for k in body}:
            raise TrackerError(
                "gitlab_api bodies must not carry sudo or credentials; the call runs as the "
                "orchestrator's token",
                code=ErrorCode.GITLAB_API_BODY_REFUSED,
            )
        if body is not None and len(json.dumps(body)) > MAX_TOOL_BODY_BYTES:
            raise TrackerError(
                f"gitlab_api body is larger than {MAX_TOOL_BODY_BYTES} bytes; send less",
                code=ErrorCode.GITLAB_API_BODY_TOO_LARGE,
            )
        refused = tuple(s for s in range(300, 600) if s != 429)
        response = await self._request(
            f"{self._api}{relative}", params=params, what=f"gitlab_api {verb} {relative}",
            absent=refused, method=verb, json=body,
        )
        try:
            payload: Any = response.json() if response.content else None
        except ValueError:
            payload = response.text
        headers = {h: response.headers[h] for h in TOOL_HEADERS if h in response.headers}
        return {"status": response.status_code, "headers": headers, "body": payload}

    async def _tool_path(self, path: Any) -> str:
        """``path`` checked and made relative to ``/api/v4`` (see :func:`tool_path_segments`)."""
        segments = tool_path_segments(path)
        if self.options.api_scope == "project":
            if len(segments) < 2 or segments[0] != "projects":
                raise TrackerError(
                    f"gitlab_api path {path!r} is outside /projects/{self._project_ref}; "
                    "address this project's resources (tracker.provider.api_scope: project)",
                    code=ErrorCode.GITLAB_API_PATH_REFUSED,
                )
            if not await self._is_own_project(unquote(segments[1])):
                raise TrackerError(
                    f"gitlab_api path {path!r} names another project; only "
                    f"/projects/{self._project_ref}/... is allowed (tracker.provider.api_scope)",
                    code=ErrorCode.GITLAB_API_PATH_REFUSED,
                )
        return "/" + "/".join(segments)

    async def _is_own_project(self, reference: str) -> bool:
        """Whether ``reference`` (a numeric id or a full path) names the configured project."""
        if reference.casefold() == self.project.casefold():
            return True
        if self._project_identity is None:
            _, item = await self._get_json(self._project_path(""), what="the project")
            project_id = positive_int(item.get("id")) if isinstance(item, Mapping) else None
            full_path = nonblank(item.get("path_with_namespace")) if isinstance(
                item, Mapping) else None
            if project_id is None or full_path is None:
                raise TrackerError(
                    "GitLab returned a malformed project (no id or path_with_namespace); "
                    "check tracker.endpoint",
                    code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
                )
            self._project_identity = (project_id, full_path)
        project_id, full_path = self._project_identity
        return reference == str(project_id) or reference.casefold() == full_path.casefold()

    # -- HTTP ---------------------------------------------------------------------------------

    def _project_path(self, suffix: str) -> str:
        return f"/projects/{self._project_ref}{suffix}"

    def _http(self) -> httpx.AsyncClient:
        return self._connection.client()

    async def _get_json(
        self, path: str, *, what: str, absent: Collection[int] = ()
    ) -> tuple[int, Any]:
        response = await self._request(f"{self._api}{path}", params=None, what=what,
                                       absent=absent)
        if response.status_code in absent:
            return response.status_code, None
        return response.status_code, self._json(response, what=what)

    def _json(self, response: httpx.Response, *, what: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise TrackerError(
                f"GitLab's answer to {what} is not JSON; check tracker.endpoint",
                code=ErrorCode.GITLAB_UNKNOWN_PAYLOAD,
            ) from None

    async def _request(
        self,
        url: str,
        *,
        params: Mapping[str, Any] | None,
        what: str,
        absent: Collection[int],
        method: str = "GET",
        json: Any = None,
    ) -> httpx.Response:
        try:
            return await self._throttle.run(
                lambda: self._send(
                    url, params=params, what=what, absent=absent, method=method, json=json
                )
            )
        except RateLimitExhausted as exc:
            raise TrackerError(
                f"GitLab rate limit hit for {what}: {exc.detail}; Lorenz retries on a later "
                "tick (poll less often if this persists)",
                code=ErrorCode.GITLAB_RATE_LIMITED,
                retryable=True,
                retry_after_ms=exc.retry_after_ms,
            ) from None

    async def _send(
        self,
        url: str,
        *,
        params: Mapping[str, Any] | None,
        what: str,
        absent: Collection[int],
        method: str = "GET",
        json: Any = None,
    ) -> httpx.Response:
        client = self._http()
        # NB: the token travels only in this header; it is never logged nor put in a message.
        headers = {"PRIVATE-TOKEN": self._token, "Accept": "application/json"}
        try:
            request = client.build_request(method, url, params=params, headers=headers,
                                           json=json)
            response = await self._bounded(client, request, what=what)
        except httpx.HTTPError as exc:
            raise TrackerError(
                f"request to GitLab failed for {what}: {type(exc).__name__}; check the network "
                "and tracker.endpoint",
                code=ErrorCode.GITLAB_API_REQUEST,
                retryable=True,
            ) from exc
        status = response.status_code
        now = self._wall_clock()
        reset_in = seconds_until_epoch(response.headers.get("ratelimit-reset"), now=now)
        if reset_in is None:
            reset_in = parse_retry_after(response.headers.get("ratelimit-resettime"), now=now)
        if status == 429:
            retry_after = parse_retry_after(response.headers.get("retry-after"), now=now)
            delay = retry_after if retry_after is not None else reset_in
            message = error_message(response)
            logger.warning("GitLab rate limited request=%s status=%d delay_s=%s",
                           what, status, delay)
            raise RateLimitHit(f"HTTP 429 {message}", delay_s=delay)
        if response.headers.get("ratelimit-remaining", "").strip() == "0" and reset_in:
            self._throttle.budget_spent(delay_s=reset_in, reason="GitLab rate limit spent")
        if 200 <= status < 300 or status in absent:
            return response
        hint = (
            f"check tracker.api_key or {GITLAB_TOKEN_ENV} (a token with the api scope)"
            if status in (401, 403)
            else "check tracker.project_slug"
            if status == 404
            else "retry later or check tracker.endpoint"
        )
        raise TrackerError(
            f"GitLab answered HTTP {status} for {what}: {error_message(response)}; {hint}",
            code=ErrorCode.GITLAB_API_STATUS,
            retryable=status >= 500,
        )

    async def _bounded(
        self, client: httpx.AsyncClient, request: httpx.Request, *, what: str
    ) -> httpx.Response:
        """The response with its body read, at most ``max_response_bytes`` of it."""
        limit = self.options.max_response_bytes
        response = await client.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise TrackerError(
                        f"GitLab's answer to {what} is larger than {limit} bytes; lower "
                        "tracker.provider.page_size or raise max_response_bytes",
                        code=ErrorCode.GITLAB_RESPONSE_TOO_LARGE,
                    )
                chunks.append(chunk)
        finally:
            await response.aclose()
        # NB: the body is decoded already; the copy must not claim an encoding or length.
        headers = [
            (k, v) for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(
            response.status_code, headers=headers, content=b"".join(chunks), request=request
        )


class _Absent(Exception):
    def __init__(self, status: int, *, no_route: bool) -> None:
        super().__init__(status)
        self.status = status
        self.no_route = no_route


def _no_such_route(response: httpx.Response) -> bool:
    """Whether a 404 means "no such endpoint" (``{"error": "404 Not Found"}``) rather than "no
    such resource" (``{"message": "404 … Not Found"}``)."""
    try:
        body = response.json()
    except ValueError:
        return True  # not GitLab's API answering at all
    return not (isinstance(body, Mapping) and "message" in body)


def _api_base(endpoint: str) -> str:
    """``<instance>/api/v4`` from an instance URL (with or without the ``/api/v4`` suffix)."""
    base = endpoint.strip().rstrip("/")
    if base.endswith(API_PREFIX):
        base = base[: -len(API_PREFIX)]
    return f"{base}{API_PREFIX}"


