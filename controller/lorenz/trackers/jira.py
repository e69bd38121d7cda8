"""The Jira tracker (``tracker.kind: jira``): Jira Cloud REST v3 over httpx.

One site (``tracker.endpoint``, e.g. ``https://example.atlassian.net``), one project
(``tracker.project_slug`` is the project key, e.g. ``ENG``), HTTP basic auth with an Atlassian
account's email and API token. The reads the runtime needs map onto two endpoints:

- candidates and terminal issues: the enhanced JQL search (``GET /rest/api/3/search/jql``),
  ``project = KEY AND status in (...)``, paged with ``nextPageToken`` until ``isLast``; status
  names the site does not have (JQL refuses them) are left out;
- issues by id (reconciliation): the bulk fetch (``POST /rest/api/3/issue/bulkfetch``), up to
  100 ids a request; an id Jira does not return (deleted, no permission, moved to another
  project) is absent, and a per-issue error in ``issueErrors`` fails the call (retryable).

Issue ids are Jira's numeric issue ids (stable when an issue is re-keyed), identifiers the keys.
States are status names (compared trimmed and lowercased, like every tracker). Blockers are the
issue links of type ``Blocks`` (configurable) seen from the blocked side: a link that carries an
``inwardIssue`` ("is blocked by") names a blocker, and Jira embeds its status, so no further
request is needed. Descriptions come as Atlassian Document Format and are read as plain text
(:mod:`lorenz.trackers.jira_adf`).

The terminal actions move an issue through the workflow's transitions (``GET``/``POST
…/issue/{id}/transitions``: the transition whose target status has the wanted name), add a
label with an ``update`` of the issue, and post an ADF comment whose last line is the escalation
marker (Jira renders no HTML comment invisibly, so the marker shows as a short code line).

Rate limits: Jira answers 429 with ``Retry-After`` (seconds) and ``X-RateLimit-Reset`` (an ISO
8601 time), and some 503s carry ``Retry-After`` too; both are waited out within the bounded
policy of :mod:`lorenz.trackers.throttling`, else reported as ``jira_rate_limited``. A
success with ``X-RateLimit-Remaining: 0`` makes the next request wait for the reset.

The agents' ``jira_rest`` tool runs through :meth:`JiraTracker.execute_jira_rest`: one REST call
under ``/rest/api/3/`` of the configured site, with an allowed method, a validated path and
bounded request and response sizes. The token never leaves this process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from pydantic import Field

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers import httpstack as _httpstack  # noqa: F401 - see its docstring
from lorenz.trackers.base import TrackerError, tracker_settings_of, unchanged
from lorenz.trackers.connections import TrackerConnection
from lorenz.trackers.jira_adf import adf_to_text, text_to_adf
from lorenz.trackers.jira_payloads import (
    API_PREFIX,
    ISSUE_ID_RE,
    error_message,
    error_messages,
    labels_of,
    query_params,
    snippet,
    status_name,
)
from lorenz.trackers.jira_payloads import jql_string as jql_string
from lorenz.trackers.jira_payloads import normalize_issue as normalize_issue
from lorenz.trackers.jira_payloads import reset_delay as reset_delay
from lorenz.trackers.jira_payloads import validate_rest_path as validate_rest_path
from lorenz.trackers.options import ProviderOptions, parse_provider_options
from lorenz.trackers.payloads import as_mapping, nonblank, parse_timestamp
from lorenz.trackers.questions import (
    ReadComment,
    TrackerReply,
    bounded_question,
    has_question_marker,
    question_marker,
    replies_after,
)
from lorenz.trackers.throttling import (
    RateLimitExhausted,
    RateLimitHit,
    Sleep,
    Throttle,
    parse_retry_after,
)
from lorenz.trackers.writes import MAX_COMMENT_PAGES, escalation_marker, has_marker

logger = logging.getLogger(__name__)

JIRA_API_TOKEN_ENV = "JIRA_API_TOKEN"
JIRA_EMAIL_ENV = "JIRA_EMAIL"
BULK_FETCH_MAX = 100
"""Ids per bulk fetch request (Jira's limit for a request that asks for these fields)."""
COMMENT_PAGE_SIZE = 100
MAX_JQL_FILTER_CHARS = 2000
ISSUE_FIELDS = (
    "summary",
    "description",
    "status",
    "labels",
    "priority",
    "assignee",
    "created",
    "updated",
    "issuelinks",
    "project",
)
"""The fields every issue read asks for (nothing else is transferred)."""
REST_METHODS = ("GET", "POST", "PUT", "DELETE")
_PROJECT_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,254}$")
_UNKNOWN_STATUS_RE = re.compile(r"The value '(.+)' does not exist for the field 'status'")


class JiraOptions(ProviderOptions):
    """``tracker.provider`` keys of the Jira tracker."""

    page_size: Annotated[int, Field(ge=1, le=100)] = 50
    """Issues per search page (``maxResults``)."""

    max_pages: Annotated[int, Field(ge=1, le=1000)] = 100
    """Most search pages read for one state scan; a longer scan fails with
    ``jira_too_many_pages`` rather than reading without end."""

    jql: Annotated[str | None, Field(max_length=MAX_JQL_FILTER_CHARS)] = None
    """Extra JQL ``AND``-ed to every search (e.g. ``component = Backend``); no ``ORDER BY``."""

    blocker_link_type: Annotated[str, Field(min_length=1, max_length=255)] = "Blocks"
    """The issue link type whose inward side ("is blocked by") names blockers."""

    max_response_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 16 * 1024 * 1024
    """Largest response body read; a bigger one fails with ``jira_response_too_large``."""

    tool_methods: Annotated[tuple[str, ...], Field(strict=False)] = ("GET", "POST", "PUT")
    """HTTP methods the agents' ``jira_rest`` tool may use (of GET, POST, PUT, DELETE)."""

    tool_max_body_bytes: Annotated[int, Field(ge=0, le=4 * 1024 * 1024)] = 256 * 1024
    """Largest JSON body the ``jira_rest`` tool sends."""

    tool_max_response_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 1024 * 1024
    """Largest response the ``jira_rest`` tool hands back to the agent."""


# -- the client -----------------------------------------------------------------------------------


class JiraTracker:
    """Reads the issues of one Jira Cloud project; see the module docstring."""

    def __init__(
        self,
        *,
        settings: WorkflowSettings | TrackerSettings,
        email: str,
        token: str,
        endpoint: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        tracker = tracker_settings_of(settings)
        if not token or not token.strip():
            raise TrackerError(
                f"no Jira API token; set tracker.api_key or {JIRA_API_TOKEN_ENV}",
                code=ErrorCode.MISSING_TRACKER_API_KEY,
                key_path="tracker.api_key",
            )
        if not email or not email.strip():
            raise TrackerError(
                f"no Jira account email; set tracker.email or {JIRA_EMAIL_ENV} (the Atlassian "
                "account the API token belongs to)",
                code=ErrorCode.MISSING_TRACKER_EMAIL,
                key_path="tracker.email",
            )
        site = (endpoint or tracker.endpoint or "").strip().rstrip("/")
        if not site:
            raise TrackerError(
                "no Jira site; set tracker.endpoint to the site URL, like "
                "https://example.atlassian.net",
                code=ErrorCode.MISSING_TRACKER_ENDPOINT,
                key_path="tracker.endpoint",
            )
        parts = urlsplit(site)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise TrackerError(
                f"tracker.endpoint {site!r} is not a site URL; write it like "
                "https://example.atlassian.net",
                code=ErrorCode.INVALID_TRACKER_ENDPOINT,
                key_path="tracker.endpoint",
            )
        project = (tracker.project_slug or "").strip()
        if not project:
            raise TrackerError(
                "no Jira project; set tracker.project_slug to the project key (like ENG)",
                code=ErrorCode.MISSING_TRACKER_PROJECT_SLUG,
                key_path="tracker.project_slug",
            )
        if not _PROJECT_KEY_RE.match(project):
            raise TrackerError(
                f"tracker.project_slug {project!r} is not a Jira project key; use the key "
                "issue keys start with (ENG for ENG-12)",
                code=ErrorCode.INVALID_TRACKER_PROJECT_SLUG,
                key_path="tracker.project_slug",
            )
        self._settings = tracker
        self.project_key = project.upper()
        self._site = site
        self._authorization = "Basic " + base64.b64encode(
            f"{email.strip()}:{token.strip()}".encode()
        ).decode("ascii")
        self.options = parse_provider_options(JiraOptions, tracker.provider, kind="jira")
        bad_methods = [m for m in self.options.tool_methods if m not in REST_METHODS]
        if bad_methods:
            raise TrackerError(
                f"tracker.provider.tool_methods has {bad_methods[0]!r}; use some of "
                f"{', '.join(REST_METHODS)}",
                code=ErrorCode.INVALID_TRACKER_CONFIG,
                key_path="tracker.provider.tool_methods",
            )
        self._connection = TrackerConnection(
            shared=http_client,
            tracker="Jira",
            timeout_ms=self.options.timeout_ms,
            headers={"User-Agent": "lorenz"},
        )
        self._wall_clock = wall_clock
        self._throttle = Throttle(policy=self.options.rate_limit_policy(), sleep=sleep)
        assignee = (tracker.assignee or "").strip()
        self._assignee = assignee or None
        self._viewer_id: str | None = None
        self._own_user: tuple[str | None] | None = None
        """The token's account id for questions (``(None,)``: Jira did not say), asked once."""
        self._unknown_statuses: set[str] = set()
        """Configured state names (normalized) the site said it has no status for."""

    @property
    def endpoint(self) -> str:
        return self._site

    # -- TrackerClient ------------------------------------------------------------------------

    async def fetch_candidate_issues(self) -> list[Issue]:
        return await self.fetch_issues_by_states(self._settings.active_states)

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        wanted = {normalize_state(s): s.strip() for s in states if s.strip()}
        if not wanted:
            return []
        route = await self._routing()
        items = await self._search_states(wanted)
        issues: list[Issue] = []
        seen: set[str] = set()
        dropped = 0
        for item in items:
            issue = normalize_issue(
                item, site=self._site, link_type=self.options.blocker_link_type
            )
            if issue is None:
                dropped += 1
            elif issue.state_key in wanted and issue.id not in seen:
                seen.add(issue.id)
                issues.append(route(issue))
        if dropped:
            logger.warning(
                "dropped malformed Jira issues project=%s count=%d", self.project_key, dropped
            )
        return issues

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        # Ids this tracker never hands out (not numeric) cannot be visible here.
        wanted = list(dict.fromkeys(i for i in ids if i and ISSUE_ID_RE.match(i)))
        if not wanted:
            return []
        route = await self._routing()
        found: dict[str, Issue] = {}
        for start in range(0, len(wanted), BULK_FETCH_MAX):
            batch = wanted[start : start + BULK_FETCH_MAX]
            body = await self._request_json(
                "POST",
                "issue/bulkfetch",
                json_body={"issueIdsOrKeys": batch, "fields": list(ISSUE_FIELDS)},
                what="issues by id",
            )
            errors = body.get("issueErrors")
            if isinstance(errors, list) and errors:
                raise TrackerError(
                    f"Jira could not return {len(errors)} of the issues asked for "
                    f"({snippet(json.dumps(errors[:3]))}); Lorenz retries on the next tick",
                    code=ErrorCode.JIRA_ISSUE_ERRORS,
                    retryable=True,
                )
            items = body.get("issues")
            if not isinstance(items, list):
                raise TrackerError(
                    "Jira's bulk fetch answer has no issues list; check tracker.endpoint",
                    code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
                )
            for item in items:
                issue = normalize_issue(
                    item, site=self._site, link_type=self.options.blocker_link_type
                )
                if issue is None:
                    # NB: leaving it out would read as "gone" and stop its run; fail instead.
                    raise TrackerError(
                        "Jira returned a malformed issue (no id, key, summary or status); "
                        "retry later",
                        code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
                    )
                project = issue.native_ref.get("project") if issue.native_ref else None
                if str(project or "").upper() != self.project_key:
                    continue  # moved to another project: not visible in this scope
                found[issue.id] = route(issue)
        return [found[i] for i in wanted if i in found]

    async def close(self) -> None:
        await self._connection.close()

    # -- reading ------------------------------------------------------------------------------

    async def _search_states(self, wanted: Mapping[str, str]) -> list[Any]:
        """The search for issues in the ``wanted`` statuses, leaving out names the site does
        not have.

        NB: JQL refuses a status name the site has never heard of ("The value 'Canceled' does
        not exist for the field 'status'.") instead of matching nothing, and the default
        terminal states name several a Jira project rarely has all of. Such names hold no
        issues by definition, so they are dropped (remembered for this instance's life, logged
        once) and the search is sent again.
        """
        while True:
            names = [n for key, n in wanted.items() if key not in self._unknown_statuses]
            if not names:
                return []
            jql = (
                f"project = {jql_string(self.project_key)} AND status in "
                f"({', '.join(jql_string(name) for name in names)})"
            )
            if self.options.jql and self.options.jql.strip():
                jql = f"{jql} AND ({self.options.jql.strip()})"
            jql += " ORDER BY created ASC"
            try:
                return await self._search(jql)
            except JiraStatusError as exc:
                unknown = {
                    normalize_state(match.group(1))
                    for message in exc.messages
                    if (match := _UNKNOWN_STATUS_RE.search(message))
                } & set(wanted)
                if exc.status != 400 or not unknown:
                    raise
                self._unknown_statuses |= unknown
                logger.warning(
                    "Jira has no status named %s; left out of searches project=%s",
                    ", ".join(sorted(wanted[key] for key in unknown)),
                    self.project_key,
                )

    async def _search(self, jql: str) -> list[Any]:
        """Every issue the JQL finds, page by page (``nextPageToken`` until ``isLast``)."""
        params: dict[str, str | int] = {
            "jql": jql,
            "maxResults": self.options.page_size,
            "fields": ",".join(ISSUE_FIELDS),
        }
        items: list[Any] = []
        tokens_seen: set[str] = set()
        for _ in range(self.options.max_pages):
            body = await self._request_json("GET", "search/jql", params=params, what="issue search")
            page = body.get("issues")
            if not isinstance(page, list):
                raise TrackerError(
                    "Jira's search answer has no issues list; check tracker.endpoint",
                    code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
                )
            items.extend(page)
            token = body.get("nextPageToken")
            # NB: the last page may omit nextPageToken, or send it as null, and may or may not
            # say isLast; either one ends the scan.
            if body.get("isLast") is True or not isinstance(token, str) or not token:
                return items
            if token in tokens_seen:
                raise TrackerError(
                    "Jira's search repeated a page token; retry later",
                    code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
                    retryable=True,
                )
            tokens_seen.add(token)
            params = {**params, "nextPageToken": token}
        raise TrackerError(
            f"Jira's search for project {self.project_key} has more than "
            f"{self.options.max_pages} pages; narrow it with tracker.provider.jql or raise "
            "tracker.provider.max_pages",
            code=ErrorCode.JIRA_TOO_MANY_PAGES,
            key_path="tracker.provider.max_pages",
        )

    async def _routing(self) -> Callable[[Issue], Issue]:
        if self._assignee is None:
            return unchanged
        target = self._assignee
        if target.lower() == "me":
            target = await self._viewer()

        def route(issue: Issue) -> Issue:
            if issue.assignee_id == target:
                return issue
            return dataclasses.replace(issue, dispatchable=False)

        return route

    async def _viewer(self) -> str:
        # NB: cached per tracker instance; a reload builds a new instance and asks again.
        if self._viewer_id is None:
            body = await self._request_json("GET", "myself", what="the token's user")
            account = nonblank(body.get("accountId"))
            if account is None:
                raise TrackerError(
                    "Jira did not say who the token belongs to; set tracker.assignee to an "
                    "account id instead of 'me'",
                    code=ErrorCode.MISSING_JIRA_VIEWER_IDENTITY,
                    key_path="tracker.assignee",
                )
            self._viewer_id = account
        return self._viewer_id

    # -- terminal actions (retry.terminal_action) ----------------------------------------------

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """One ADF comment ending in ``key``'s marker (skipped when a comment already carries
        it) and/or one label (``update.labels.add``). See :mod:`lorenz.trackers.writes`."""
        base = f"issue/{issue.id}"
        wrote = False
        name = label.strip() if label is not None else ""
        if name and any(ch.isspace() for ch in name):
            raise TrackerError(
                f"Jira labels cannot contain spaces ({name!r}); set retry.escalate.label to a "
                "label without spaces",
                code=ErrorCode.INVALID_JIRA_LABEL,
                key_path="retry.escalate.label",
            )
        if name:
            # NB: the labels as they are now, not as ``issue`` was read: a replay must see the
            # label its first run added.
            current = await self._request_json(
                "GET", base, params={"fields": "labels"}, what=f"labels of {issue.identifier}"
            )
            have = {existing.lower() for existing in labels_of(as_mapping(current.get("fields")))}
            if name.lower() not in have:
                await self._request(
                    "PUT", base, json_body={"update": {"labels": [{"add": name}]}},
                    what="escalation label",
                )
                wrote = True
        if comment is not None and not await self._has_comment_marker(base, key=key):
            document = text_to_adf(comment, code_line=escalation_marker(key))
            await self._request(
                "POST", f"{base}/comment", json_body={"body": document},
                what="escalation comment",
            )
            wrote = True
        return wrote

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """Run the transition that leads to the status named ``state``; nothing when the issue
        is in it already."""
        target = normalize_state(state)
        current = await self._request_json(
            "GET", f"issue/{issue.id}", params={"fields": "status"},
            what=f"issue {issue.identifier}",
        )
        if normalize_state(status_name(as_mapping(current.get("fields"))) or "") == target:
            return
        listing = await self._request_json(
            "GET", f"issue/{issue.id}/transitions", what=f"transitions of {issue.identifier}"
        )
        transitions = listing.get("transitions")
        if not isinstance(transitions, list):
            raise TrackerError(
                "Jira's transitions answer has no transitions list; check tracker.endpoint",
                code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
            )
        for transition in transitions:
            transition = as_mapping(transition)
            to_name = nonblank(as_mapping(transition.get("to")).get("name"))
            transition_id = nonblank(transition.get("id"))
            if to_name is None or transition_id is None or normalize_state(to_name) != target:
                continue
            if transition.get("isAvailable") is False:
                continue
            await self._request(
                "POST", f"issue/{issue.id}/transitions",
                json_body={"transition": {"id": transition_id}},
                what=f"transition of {issue.identifier} to {state.strip()}",
            )
            return
        reachable = (nonblank(as_mapping(as_mapping(t).get("to")).get("name")) for t in transitions)
        names = sorted({name for name in reachable if name is not None})
        raise TrackerError(
            f"no transition leads {issue.identifier} to {state.strip()!r} (it can go to: "
            f"{', '.join(names) or 'nothing'}); set retry.cancel_state to one of those",
            code=ErrorCode.TRACKER_STATE_NOT_FOUND,
            key_path="retry.cancel_state",
        )

    async def _has_comment_marker(self, base: str, *, key: str) -> bool:
        async with contextlib.aclosing(self._comment_pages(base, params={})) as pages:
            async for items in pages:
                for item in items:
                    if has_marker(adf_to_text(as_mapping(item).get("body")), key=key):
                        return True
        return False

    async def _comment_pages(
        self, base: str, *, params: Mapping[str, Any]
    ) -> AsyncGenerator[list[Any], None]:
        """The issue's comments page by page, by ``startAt`` until ``total`` (bounded pages).

        Shared by the marker check of escalations and the question reader, so both page and
        reject an answer without a comments list alike; ``params`` adds e.g. ``orderBy``.
        """
        start = 0
        for _ in range(MAX_COMMENT_PAGES):
            page = await self._request_json(
                "GET",
                f"{base}/comment",
                params={"startAt": start, "maxResults": COMMENT_PAGE_SIZE, **params},
                what="issue comments",
            )
            items = page.get("comments")
            if not isinstance(items, list):
                raise TrackerError(
                    "Jira's comments answer has no comments list; check tracker.endpoint",
                    code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
                )
            yield items
            total = page.get("total")
            start += len(items)
            if not items or not isinstance(total, int) or start >= total:
                return

    # -- questions (lorenz.trackers.questions) -------------------------------------------------

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """One ADF comment ending in ``key``'s marker (as a code line, like an escalation),
        skipped when a comment already carries it."""
        base = f"issue/{issue.id}"
        comments = await self._question_comments(base)
        if any(has_question_marker(comment.body, key=key) for comment in comments):
            return False
        document = text_to_adf(bounded_question(body), code_line=question_marker(key))
        await self._request(
            "POST", f"{base}/comment", json_body={"body": document}, what="question comment"
        )
        return True

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The comments after the question (ADF rendered to text), without Lorenz's own
        (marked, or by the token's account); the author is the e-mail address when Jira shows
        it, else the account id."""
        comments = await self._question_comments(f"issue/{issue.id}")
        own = await self._own_account()
        return replies_after(comments, key=key, own_ids=[own] if own else [])

    async def _question_comments(self, base: str) -> list[ReadComment]:
        """The issue's comments, oldest first (bounded pages; malformed ones skipped)."""
        comments: list[ReadComment] = []
        async for items in self._comment_pages(base, params={"orderBy": "created"}):
            for item in items:
                item = as_mapping(item)
                comment_id = nonblank(item.get("id"))
                created_at = parse_timestamp(item.get("created"))
                text = adf_to_text(item.get("body"))
                if comment_id is None or created_at is None or text is None:
                    continue
                author = as_mapping(item.get("author"))
                account = nonblank(author.get("accountId"))
                comments.append(
                    ReadComment(
                        comment_id=comment_id,
                        body=text,
                        author=nonblank(author.get("emailAddress")) or account or "",
                        author_id=account,
                        created_at=created_at,
                    )
                )
        return comments

    async def _own_account(self) -> str | None:
        """The token's account id (``GET myself``), asked once; ``None`` when Jira does not
        say (Lorenz's comments are still told by their marker)."""
        if self._viewer_id is not None:
            return self._viewer_id
        if self._own_user is None:
            body = await self._request_json("GET", "myself", what="the token's user")
            self._own_user = (nonblank(body.get("accountId")),)
        return self._own_user[0]

    # -- the agents' tool ---------------------------------------------------------------------

    async def execute_jira_rest(
        self,
        *,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """One REST call for an agent: ``{"status": int, "body": <JSON or text>}``.

        ``path`` must be under ``/rest/api/3/`` of the configured site (no scheme, host, query,
        fragment, ``..`` or encoded separators); ``method`` one of the allowed methods. A
        refused call raises :class:`TrackerError` (``invalid_jira_rest_call``) without a
        request; an HTTP error status comes back as the result, for the agent to read.
        """
        verb = method.strip().upper() if isinstance(method, str) else ""
        if verb not in self.options.tool_methods:
            raise TrackerError(
                f"method {method!r} is not allowed for jira_rest; use one of "
                f"{', '.join(self.options.tool_methods)}",
                code=ErrorCode.INVALID_JIRA_REST_CALL,
            )
        relative = validate_rest_path(path)
        params = query_params(query)
        if body is not None:
            if verb in ("GET", "DELETE"):
                raise TrackerError(
                    f"jira_rest sends no body with {verb}; put parameters in `query`",
                    code=ErrorCode.INVALID_JIRA_REST_CALL,
                )
            size = len(json.dumps(body).encode())
            if size > self.options.tool_max_body_bytes:
                raise TrackerError(
                    f"the jira_rest body is {size} bytes, more than the "
                    f"{self.options.tool_max_body_bytes} allowed; send less",
                    code=ErrorCode.INVALID_JIRA_REST_CALL,
                )
        response, content = await self._exchange(
            verb,
            relative,
            params=params,
            json_body=body,
            what=f"jira_rest {verb} {path}",
            accept_errors=True,
            limit=self.options.tool_max_response_bytes,
        )
        parsed: Any
        if not content:
            parsed = None
        else:
            try:
                parsed = json.loads(content)
            except ValueError:
                parsed = content.decode("utf-8", errors="replace")
        return {"status": response.status_code, "body": parsed}

    # -- HTTP ---------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        return self._connection.client()

    async def _request_json(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str | int] | None = None,
        json_body: Any = None,
    ) -> Mapping[str, Any]:
        _, content = await self._exchange(
            method, path, params=params, json_body=json_body, what=what
        )
        try:
            body = json.loads(content)
        except ValueError:
            raise TrackerError(
                f"Jira's answer to {what} is not JSON; check tracker.endpoint (the site URL, "
                "without /rest/...)",
                code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
            ) from None
        if not isinstance(body, Mapping):
            raise TrackerError(
                f"Jira's answer to {what} is not a JSON object; check tracker.endpoint",
                code=ErrorCode.JIRA_UNKNOWN_PAYLOAD,
            )
        return body

    async def _request(
        self, method: str, path: str, *, what: str, json_body: Any = None
    ) -> None:
        await self._exchange(method, path, params=None, json_body=json_body, what=what)

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None,
        json_body: Any,
        what: str,
        accept_errors: bool = False,
        limit: int | None = None,
    ) -> tuple[httpx.Response, bytes]:
        try:
            return await self._throttle.run(
                lambda: self._send(
                    method,
                    f"{self._site}{API_PREFIX}{path}",
                    params=params,
                    json_body=json_body,
                    what=what,
                    accept_errors=accept_errors,
                    limit=limit or self.options.max_response_bytes,
                )
            )
        except RateLimitExhausted as exc:
            raise TrackerError(
                f"Jira rate limit hit for {what}: {exc.detail}; Lorenz retries on a later tick "
                "(poll less often if this persists)",
                code=ErrorCode.JIRA_RATE_LIMITED,
                retryable=True,
                retry_after_ms=exc.retry_after_ms,
            ) from None

    async def _send(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str | int] | None,
        json_body: Any,
        what: str,
        accept_errors: bool,
        limit: int,
    ) -> tuple[httpx.Response, bytes]:
        client = self._http()
        headers = {"Authorization": self._authorization, "Accept": "application/json"}
        request = client.build_request(
            method, url, params=params, headers=headers, json=json_body
        )
        try:
            response = await client.send(request, stream=True)
            try:
                content = await _read_bounded(response, limit=limit)
            finally:
                await response.aclose()
        except _TooLarge:
            raise TrackerError(
                f"Jira's answer to {what} is larger than {limit} bytes; ask for less (a "
                "smaller tracker.provider.page_size)",
                code=ErrorCode.JIRA_RESPONSE_TOO_LARGE,
            ) from None
        except httpx.HTTPError as exc:
            raise TrackerError(
                f"request to Jira failed for {what}: {type(exc).__name__}; check the network "
                "and tracker.endpoint",
                code=ErrorCode.JIRA_API_REQUEST,
                retryable=True,
            ) from exc
        status = response.status_code
        now = self._wall_clock()
        retry_after = parse_retry_after(response.headers.get("Retry-After"), now=now)
        reset_in = reset_delay(response.headers.get("X-RateLimit-Reset"), now=now)
        if status == 429 or (status == 503 and retry_after is not None):
            delay = retry_after if retry_after is not None else reset_in
            reason = response.headers.get("RateLimit-Reason") or "rate limited"
            logger.warning(
                "Jira rate limited request=%s status=%d reason=%s delay_s=%s",
                what, status, reason, delay,
            )
            raise RateLimitHit(f"HTTP {status} {reason}", delay_s=delay)
        if response.headers.get("X-RateLimit-Remaining") == "0" and reset_in:
            self._throttle.budget_spent(delay_s=reset_in, reason="Jira rate limit budget spent")
        if 200 <= status < 300 or accept_errors:
            return response, content
        hint = (
            "check tracker.email and tracker.api_key (an API token of that account)"
            if status == 401
            else "check that the account may browse and edit the project"
            if status == 403
            else "check tracker.project_slug, tracker.provider.jql and tracker.endpoint"
            if status == 400
            else "check tracker.project_slug and tracker.endpoint"
            if status == 404
            else "retry later or check tracker.endpoint"
        )
        message = error_message(content) or response.reason_phrase
        raise JiraStatusError(
            f"Jira answered HTTP {status} for {what}: {message}; {hint}",
            messages=error_messages(content),
            status=status,
        )


class _TooLarge(Exception):
    """A body read past its byte bound (turned into ``jira_response_too_large`` by the caller)."""


class JiraStatusError(TrackerError):
    """``jira_api_status`` with Jira's own error messages kept apart (for callers that can
    recover from a specific one)."""

    def __init__(self, message: str, *, messages: Sequence[str], status: int) -> None:
        super().__init__(message, code=ErrorCode.JIRA_API_STATUS, retryable=status >= 500)
        self.messages = tuple(messages)
        self.status = status


async def _read_bounded(response: httpx.Response, *, limit: int) -> bytes:
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


