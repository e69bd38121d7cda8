"""The GitHub tracker (``tracker.kind: github``): Issues REST, with labels as workflow states.

A GitHub repository has no workflow states, only open and closed, so Lorenz reads states from
labels: an issue's state is its first label whose name is one of the configured active or
terminal states (compared trimmed and lowercased). A closed issue with no terminal label is in
the first terminal state (closing is authoritative, whatever labels were left on it); an open
issue with no state label is in the state ``open``, so ``active_states: [open]`` works on a
repository without any state labels.

Pull requests come back from the issues endpoints too and are skipped. Blockers come from the
issue dependencies API (``…/dependencies/blocked_by``) where the server offers it; a 404 there
means "no dependencies API" and the tracker stops asking for the rest of its life.

Ids are issue numbers as strings (the REST API addresses issues by number); identifiers are
``owner/name#number``. Rate limits (primary: ``x-ratelimit-remaining: 0`` until
``x-ratelimit-reset``; secondary: 403/429 with ``retry-after``) are waited out within the
bounded policy of :mod:`lorenz.trackers.throttling`, else reported as ``github_rate_limited``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from pydantic import Field

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers import httpstack as _httpstack  # noqa: F401 - see its docstring
from lorenz.trackers.base import TrackerError, tracker_settings_of, unchanged
from lorenz.trackers.connections import TrackerConnection
from lorenz.trackers.options import ProviderOptions, parse_provider_options
from lorenz.trackers.payloads import label_names, nonblank, parse_timestamp
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

DEFAULT_GITHUB_ENDPOINT = "https://api.github.com"
GITHUB_TOKEN_ENV = "GITHUB_TOKEN"
API_VERSION = "2022-11-28"
OPEN_STATE = "open"
SECONDARY_LIMIT_WAIT_S = 60.0
"""GitHub's advice when a secondary limit gives no ``retry-after``: wait at least a minute."""
BODY_SNIPPET_CHARS = 500
_REPOSITORY_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class GitHubOptions(ProviderOptions):
    """``tracker.provider`` keys of the GitHub tracker."""

    page_size: Annotated[int, Field(ge=1, le=100)] = 100
    """Items per page (``per_page``)."""

    dependencies: bool = True
    """Read blockers from the issue dependencies API (one request per issue read)."""

    dependency_concurrency: Annotated[int, Field(ge=1, le=16)] = 4
    """Dependency requests in flight at once."""


# -- normalization --------------------------------------------------------------------------------


def _repository_of(item: Mapping[str, Any]) -> str | None:
    """``owner/name`` from an issue's ``repository_url`` (``…/repos/owner/name``)."""
    url = item.get("repository_url")
    if not isinstance(url, str):
        return None
    match = re.search(r"/repos/([^/]+/[^/]+)/?$", url)
    return match.group(1) if match else None


@dataclasses.dataclass(frozen=True, slots=True)
class LabelStates:
    """How labels (and open/closed) map to workflow states for one configuration."""

    active: tuple[str, ...]
    terminal: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: TrackerSettings) -> LabelStates:
        return cls(active=settings.active_states, terminal=settings.terminal_states)

    @property
    def closed_fallback(self) -> str:
        """The state of a closed issue without a terminal label."""
        return self.terminal[0] if self.terminal else "closed"

    def state_of(self, item: Mapping[str, Any]) -> str | None:
        """The issue's workflow state, or ``None`` when its ``state`` is not open/closed."""
        native = item.get("state")
        if native not in ("open", "closed"):
            return None
        labels = label_names(item)
        terminal = {normalize_state(s) for s in self.terminal}
        if native == "closed":
            for label in labels:
                if normalize_state(label) in terminal:
                    return label
            return self.closed_fallback
        known = terminal | {normalize_state(s) for s in self.active}
        for label in labels:
            if normalize_state(label) in known:
                return label
        return OPEN_STATE


def normalize_issue(item: Any, *, repository: str, states: LabelStates) -> Issue | None:
    """A REST issue object as an :class:`Issue`; ``None`` when malformed. Pull requests must
    be filtered out before (they are not malformed, just not issues)."""
    if not isinstance(item, Mapping):
        return None
    number = item.get("number")
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        return None
    title = nonblank(item.get("title"))
    state = states.state_of(item)
    if title is None or state is None:
        return None
    assignees = item.get("assignees")
    logins = [
        a["login"]
        for a in (assignees if isinstance(assignees, list) else [])
        if isinstance(a, Mapping) and nonblank(a.get("login"))
    ]
    if not logins:
        single = item.get("assignee")
        if isinstance(single, Mapping) and nonblank(single.get("login")):
            logins = [single["login"]]
    native_ref: dict[str, Any] = {"repository": repository, "number": number}
    for key in ("node_id", "state", "state_reason"):
        if isinstance(item.get(key), str):
            native_ref[key] = item[key]
    if isinstance(item.get("id"), int) and not isinstance(item.get("id"), bool):
        native_ref["database_id"] = item["id"]
    if len(logins) > 1:
        native_ref["assignees"] = logins
    body = item.get("body")
    return Issue(
        id=str(number),
        identifier=f"{repository}#{number}",
        title=title,
        state=state,
        description=body if isinstance(body, str) else None,
        url=nonblank(item.get("html_url")),
        labels=tuple(label_names(item)),
        created_at=parse_timestamp(item.get("created_at")),
        updated_at=parse_timestamp(item.get("updated_at")),
        assignee_id=logins[0] if logins else None,
        native_ref=native_ref,
    )


def is_pull_request(item: Any) -> bool:
    return isinstance(item, Mapping) and "pull_request" in item


# -- the client -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Listing:
    """One listing request of :meth:`GitHubTracker.fetch_issues_by_states`."""

    state: str
    labels: str | None = None


class GitHubTracker:
    """Reads the issues of one repository; see the module docstring."""

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
                f"no GitHub token; set tracker.api_key or {GITHUB_TOKEN_ENV}",
                code=ErrorCode.MISSING_TRACKER_API_KEY,
                key_path="tracker.api_key",
            )
        repository = (tracker.repository or "").strip()
        if not repository:
            raise TrackerError(
                "no GitHub repository; set tracker.repository to owner/name",
                code=ErrorCode.MISSING_TRACKER_REPOSITORY,
                key_path="tracker.repository",
            )
        if not _REPOSITORY_RE.match(repository):
            raise TrackerError(
                f"tracker.repository {repository!r} is not owner/name; write it like octo/app",
                code=ErrorCode.INVALID_TRACKER_REPOSITORY,
                key_path="tracker.repository",
            )
        self._settings = tracker
        self._token = token.strip()
        self.repository = repository
        self._endpoint = (endpoint or tracker.endpoint or DEFAULT_GITHUB_ENDPOINT).rstrip("/")
        self.options = parse_provider_options(GitHubOptions, tracker.provider, kind="github")
        self._states = LabelStates.from_settings(tracker)
        self._connection = TrackerConnection(
            shared=http_client,
            tracker="GitHub",
            timeout_ms=self.options.timeout_ms,
            headers={"User-Agent": "lorenz"},
        )
        self._wall_clock = wall_clock
        self._throttle = Throttle(policy=self.options.rate_limit_policy(), sleep=sleep)
        assignee = (tracker.assignee or "").strip()
        self._assignee = assignee or None
        self._viewer_login: str | None = None
        self._own_user: tuple[str | None] | None = None
        """The token's login for questions (``(None,)``: GitHub would not say), asked once."""
        self._dependencies_available = self.options.dependencies

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def dependencies_available(self) -> bool:
        """False once the server answered 404 for the dependencies API (or it is turned off)."""
        return self._dependencies_available

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
                number = item.get("number") if isinstance(item, Mapping) else None
                # Items without a number cannot be de-duplicated; they are malformed anyway.
                key = number if isinstance(number, int) else object()
                items.setdefault(key, item)
        issues: list[Issue] = []
        dropped = 0
        for item in items.values():
            if is_pull_request(item):
                continue
            issue = normalize_issue(item, repository=self.repository, states=self._states)
            if issue is None:
                dropped += 1
            elif issue.state_key in wanted:
                issues.append(route(issue))
        if dropped:
            logger.warning(
                "dropped malformed GitHub issues repository=%s count=%d", self.repository, dropped
            )
        return await self._with_blockers(issues)

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        wanted = list(dict.fromkeys(i for i in ids if i))
        if not wanted:
            return []
        route = await self._routing()
        issues: list[Issue] = []
        for issue_id in wanted:
            if not issue_id.isdigit():
                continue  # not an id this tracker hands out, so not visible here
            status, item = await self._get_json(
                f"/repos/{self.repository}/issues/{int(issue_id)}",
                absent=(301, 404, 410),
                what=f"issue {issue_id}",
            )
            if status != 200 or is_pull_request(item):
                continue
            issue = normalize_issue(item, repository=self.repository, states=self._states)
            if issue is None:
                # NB: leaving it out would read as "gone" and stop its run; fail instead.
                raise TrackerError(
                    f"GitHub returned a malformed issue {self.repository}#{issue_id} (no number, "
                    "title or open/closed state); retry later",
                    code=ErrorCode.GITHUB_UNKNOWN_PAYLOAD,
                )
            issues.append(route(issue))
        return await self._with_blockers(issues)

    async def close(self) -> None:
        await self._connection.close()

    # -- reading ------------------------------------------------------------------------------

    def _listings(self, wanted: Mapping[str, str]) -> list[_Listing]:
        """The listing requests that together return every issue in the wanted states."""
        terminal = {normalize_state(s) for s in self._states.terminal}
        listings: list[_Listing] = []
        for key, name in wanted.items():
            if key == OPEN_STATE:
                listings.append(_Listing(state="open"))
                continue
            # NB: a non-terminal label on a closed issue never makes it active (closed issues are
            # terminal), so only terminal states need closed issues listed.
            listings.append(_Listing(state="all" if key in terminal else "open", labels=name))
            if key == normalize_state(self._states.closed_fallback):
                listings.append(_Listing(state="closed"))
        return list(dict.fromkeys(listings))

    # -- terminal actions (retry.terminal_action) ----------------------------------------------

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """One comment (skipped when one already carries ``key``'s marker) and/or one label
        (``POST …/labels``, which creates a missing label). See :mod:`lorenz.trackers.writes`."""
        base = f"/repos/{self.repository}/issues/{issue.id}"
        wrote = False
        if label is not None and label.strip().lower() not in issue.labels:
            await self._write("POST", f"{base}/labels", {"labels": [label.strip()]},
                              what="escalation label")
            wrote = True
        if comment is not None and not await self._has_comment_marker(base, key=key):
            await self._write("POST", f"{base}/comments", {"body": with_marker(comment, key=key)},
                              what="escalation comment")
            wrote = True
        return wrote

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """Swap the issue's state labels for ``state``; a terminal ``state`` also closes the
        issue as not planned (GitHub states are labels plus open/closed, see the module)."""
        base = f"/repos/{self.repository}/issues/{issue.id}"
        _, item = await self._get_json(base, what=f"issue {issue.identifier}")
        names = label_names(item) if isinstance(item, Mapping) else []
        target = normalize_state(state)
        states = {normalize_state(s) for s in (*self._states.active, *self._states.terminal)}
        for name in names:
            if normalize_state(name) in states and normalize_state(name) != target:
                await self._write("DELETE", f"{base}/labels/{quote(name, safe='')}", None,
                                  what="state label removal")
        if target not in {normalize_state(n) for n in names}:
            await self._write("POST", f"{base}/labels", {"labels": [state.strip()]},
                              what="state label")
        if target in {normalize_state(s) for s in self._states.terminal}:
            await self._write("PATCH", base, {"state": "closed", "state_reason": "not_planned"},
                              what="closing the issue")

    async def _has_comment_marker(self, base: str, *, key: str) -> bool:
        async with contextlib.aclosing(self._comment_pages(base)) as pages:
            async for page in pages:
                if any(isinstance(c, Mapping) and has_marker(c.get("body"), key=key) for c in page):
                    return True
        return False

    async def _comment_pages(self, base: str) -> AsyncGenerator[list[Any], None]:
        """The issue's comments page by page, following ``Link: next`` (bounded pages).

        Shared by the marker check of escalations and the question reader, so both page and
        reject a non-list answer alike.
        """
        url = f"{self._endpoint}{base}/comments"
        query: Mapping[str, str | int] | None = {"per_page": 100}
        for _ in range(MAX_COMMENT_PAGES):
            response = await self._request(url, params=query, what="issue comments", absent=())
            page = self._json(response, what="issue comments")
            if not isinstance(page, list):
                raise TrackerError(
                    "GitHub's issue comments are not a JSON list; check tracker.endpoint",
                    code=ErrorCode.GITHUB_UNKNOWN_PAYLOAD,
                )
            yield page
            next_url = response.links.get("next", {}).get("url")
            if not next_url:
                return
            url, query = next_url, None

    # -- questions (lorenz.trackers.questions) -------------------------------------------------

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """One comment with ``key``'s marker, skipped when a comment already carries it."""
        base = f"/repos/{self.repository}/issues/{issue.id}"
        comments = await self._question_comments(base)
        if any(has_question_marker(comment.body, key=key) for comment in comments):
            return False
        await self._write("POST", f"{base}/comments", {"body": question_comment(body, key=key)},
                          what="question comment")
        return True

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The comments after the question, without Lorenz's own (marked, or by the token's
        login); the author is the commenter's login."""
        comments = await self._question_comments(f"/repos/{self.repository}/issues/{issue.id}")
        own = await self._own_login()
        return replies_after(comments, key=key, own_ids=[own] if own else [])

    async def _question_comments(self, base: str) -> list[ReadComment]:
        """The issue's comments, oldest first (bounded pages; malformed ones skipped)."""
        comments: list[ReadComment] = []
        async for page in self._comment_pages(base):
            for item in page:
                comment = read_rest_comment(item, author_key="user", name_key="login")
                if comment is not None:
                    comments.append(comment)
        return comments

    async def _own_login(self) -> str | None:
        """The token's login (``GET /user``), asked once; ``None`` when GitHub refuses to say
        (an app installation token gets 403 there; its comments are told by their marker)."""
        if self._viewer_login is not None:
            return self._viewer_login
        if self._own_user is None:
            _, body = await self._get_json("/user", what="the token's user", absent=(403,))
            login = nonblank(body.get("login")) if isinstance(body, Mapping) else None
            self._own_user = (login,)
        return self._own_user[0]

    async def _write(self, method: str, path: str, body: Any, *, what: str) -> None:
        await self._request(
            f"{self._endpoint}{path}", params=None, what=what, absent=(), method=method, json=body
        )

    async def _list_issues(self, listing: _Listing) -> list[Any]:
        params: dict[str, str | int] = {"state": listing.state, "per_page": self.options.page_size}
        if listing.labels is not None:
            params["labels"] = listing.labels
        return await self._paged(f"/repos/{self.repository}/issues", params, what="issue listing")

    async def _paged(
        self,
        path: str,
        params: Mapping[str, str | int],
        *,
        what: str,
        absent: Collection[int] = (),
    ) -> list[Any]:
        """Every item of a paged listing, following ``Link: <…>; rel="next"``."""
        url: str = f"{self._endpoint}{path}"
        query: Mapping[str, str | int] | None = params
        items: list[Any] = []
        while True:
            response = await self._request(url, params=query, what=what, absent=absent)
            if response.status_code in absent:
                raise _Absent(response.status_code)
            page = self._json(response, what=what)
            if not isinstance(page, list):
                raise TrackerError(
                    f"GitHub's {what} is not a JSON list; check tracker.endpoint",
                    code=ErrorCode.GITHUB_UNKNOWN_PAYLOAD,
                )
            items.extend(page)
            next_url = response.links.get("next", {}).get("url")
            if not next_url:
                return items
            url, query = next_url, None  # the next link carries the query

    async def _with_blockers(self, issues: list[Issue]) -> list[Issue]:
        if not issues or not self._dependencies_available:
            return issues
        gate = asyncio.Semaphore(self.options.dependency_concurrency)

        async def one(issue: Issue) -> Issue:
            async with gate:
                if not self._dependencies_available:
                    return issue
                return await self._blockers_of(issue)

        return list(await asyncio.gather(*(one(issue) for issue in issues)))

    async def _blockers_of(self, issue: Issue) -> Issue:
        path = f"/repos/{self.repository}/issues/{issue.id}/dependencies/blocked_by"
        try:
            items = await self._paged(
                path,
                {"per_page": self.options.page_size},
                what=f"dependencies of {issue.identifier}",
                absent=(404, 410),
            )
        except _Absent as absent:
            if absent.status == 404 and self._dependencies_available:
                self._dependencies_available = False
                logger.info(
                    "GitHub has no issue dependencies API here; blockers are not read "
                    "repository=%s endpoint=%s",
                    self.repository,
                    self._endpoint,
                )
            return issue
        blockers = []
        for item in items:
            if not isinstance(item, Mapping):
                continue
            number = item.get("number")
            if isinstance(number, bool) or not isinstance(number, int):
                continue
            repository = _repository_of(item) or self.repository
            identifier = f"{repository}#{number}"
            same_repo = repository.lower() == self.repository.lower()
            blockers.append(
                BlockerRef(
                    id=str(number) if same_repo else identifier,
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
            logins = [issue.assignee_id] if issue.assignee_id else []
            if issue.native_ref and isinstance(issue.native_ref.get("assignees"), list):
                logins = list(issue.native_ref["assignees"])
            if any(login.casefold() == wanted for login in logins):
                return issue
            return dataclasses.replace(issue, dispatchable=False)

        return route

    async def _viewer(self) -> str:
        # NB: cached per tracker instance; a reload builds a new instance and asks again.
        if self._viewer_login is None:
            _, body = await self._get_json("/user", what="the token's user")
            login = nonblank(body.get("login")) if isinstance(body, Mapping) else None
            if login is None:
                raise TrackerError(
                    "GitHub did not say who the token belongs to; set tracker.assignee to a "
                    "login instead of 'me'",
                    code=ErrorCode.MISSING_GITHUB_VIEWER_IDENTITY,
                    key_path="tracker.assignee",
                )
            self._viewer_login = login
        return self._viewer_login

    # -- HTTP ---------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        return self._connection.client()

    async def _get_json(
        self, path: str, *, what: str, absent: Collection[int] = ()
    ) -> tuple[int, Any]:
        response = await self._request(
            f"{self._endpoint}{path}", params=None, what=what, absent=absent
        )
        if response.status_code in absent:
            return response.status_code, None
        return response.status_code, self._json(response, what=what)

    def _json(self, response: httpx.Response, *, what: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise TrackerError(
                f"GitHub's answer to {what} is not JSON; check tracker.endpoint",
                code=ErrorCode.GITHUB_UNKNOWN_PAYLOAD,
            ) from None

    async def _request(
        self,
        url: str,
        *,
        params: Mapping[str, str | int] | None,
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
                f"GitHub rate limit hit for {what}: {exc.detail}; Lorenz retries on a later "
                "tick (poll less often if this persists)",
                code=ErrorCode.GITHUB_RATE_LIMITED,
                retryable=True,
                retry_after_ms=exc.retry_after_ms,
            ) from None

    async def _send(
        self,
        url: str,
        *,
        params: Mapping[str, str | int] | None,
        what: str,
        absent: Collection[int],
        method: str = "GET",
        json: Any = None,
    ) -> httpx.Response:
        client = self._http()
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
        }
        try:
            response = await client.request(
                method, url, params=params, headers=headers, json=json
            )
        except httpx.HTTPError as exc:
            raise TrackerError(
                f"request to GitHub failed for {what}: {type(exc).__name__}: {exc}; "
                "check the network and tracker.endpoint",
                code=ErrorCode.GITHUB_API_REQUEST,
                retryable=True,
            ) from exc
        status = response.status_code
        now = self._wall_clock()
        remaining = response.headers.get("x-ratelimit-remaining")
        reset_in = seconds_until_epoch(response.headers.get("x-ratelimit-reset"), now=now)
        if status in (403, 429):
            retry_after = parse_retry_after(response.headers.get("retry-after"), now=now)
            message = _message(response)
            if retry_after is not None:
                raise self._limited(what, status, message, retry_after)
            if remaining == "0":
                raise self._limited(what, status, message, reset_in)
            if status == 429 or "rate limit" in message.lower():
                raise self._limited(what, status, message, SECONDARY_LIMIT_WAIT_S)
        if remaining == "0" and reset_in:
            self._throttle.budget_spent(delay_s=reset_in, reason="GitHub primary rate limit spent")
        if 200 <= status < 300 or status in absent:
            return response
        hint = (
            f"check tracker.api_key or {GITHUB_TOKEN_ENV} and its repository access"
            if status in (401, 403)
            else "check tracker.repository"
            if status == 404
            else "retry later or check tracker.endpoint"
        )
        raise TrackerError(
            f"GitHub answered HTTP {status} for {what}: {_message(response)}; {hint}",
            code=ErrorCode.GITHUB_API_STATUS,
            retryable=status >= 500,
        )

    def _limited(self, what: str, status: int, message: str, delay: float | None) -> RateLimitHit:
        logger.warning("GitHub rate limited request=%s status=%d delay_s=%s", what, status, delay)
        return RateLimitHit(f"HTTP {status} {message}", delay_s=delay)


class _Absent(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        return str(body["message"])
    text = " ".join(response.text.split())
    return text[:BODY_SNIPPET_CHARS] or response.reason_phrase
