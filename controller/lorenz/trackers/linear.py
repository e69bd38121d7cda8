"""The Linear tracker (``tracker.kind: linear``): GraphQL over httpx.

Three reads cover what the runtime needs: issues of the configured project in some states
(candidates, and terminal issues for start-up clean-up), issues by id (reconciliation), and
``viewer { id }`` once when ``tracker.assignee`` is ``me``. Each response is classified into one
of a few stable error codes so the runtime can keep live runs through a transient failure.

The agents' ``linear_graphql`` tool runs through :meth:`LinearTracker.execute_graphql` with the
same credentials, rate-limit handling and error codes; it insists on exactly one operation per
document, so an agent cannot smuggle a batch past whoever reads the transcript.

Construction is cheap (the HTTP client is opened on first use), so a reload builds a new tracker
from the new settings and closes the old one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import httpx
from pydantic import Field

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings, WorkflowSettings
from lorenz.model import Issue
from lorenz.trackers import httpstack as _httpstack  # noqa: F401 - see its docstring
from lorenz.trackers.base import TrackerError, tracker_settings_of, unchanged
from lorenz.trackers.connections import TrackerConnection
from lorenz.trackers.linear_issues import nodes_of
from lorenz.trackers.linear_issues import normalize_issue as normalize_issue
from lorenz.trackers.linear_issues import parse_priority as parse_priority
from lorenz.trackers.options import ProviderOptions, parse_provider_options
from lorenz.trackers.payloads import as_mapping, nonblank
from lorenz.trackers.questions import (
    ReadComment,
    TrackerReply,
    has_question_marker,
    parse_comment_time,
    question_comment,
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

if TYPE_CHECKING:
    import graphql

logger = logging.getLogger(__name__)

DEFAULT_LINEAR_ENDPOINT = "https://api.linear.app/graphql"
LINEAR_API_KEY_ENV = "LINEAR_API_KEY"
RATELIMITED = "RATELIMITED"
BODY_SNIPPET_BYTES = 1000
CURSOR_RESTARTS = 2
"""How often one state scan starts again from its first page after Linear refused a cursor."""


class LinearOptions(ProviderOptions):
    """``tracker.provider`` keys of the Linear tracker."""

    page_size: Annotated[int, Field(ge=1, le=250)] = 50
    """Issues per page (and per id batch)."""

    relation_page_size: Annotated[int, Field(ge=1, le=250)] = 50
    """Inverse relations read per issue (blockers beyond this are not seen)."""

    label_page_size: Annotated[int, Field(ge=1, le=250)] = 50
    """Labels read per issue."""


# -- queries --------------------------------------------------------------------------------------

ISSUE_FIELDS = """
fragment LorenzIssueFields on Issue {
  id
  identifier
  title
  description
  priority
  state { name type }
  branchName
  url
  assignee { id }
  labels(first: $labelFirst) { nodes { name } }
  inverseRelations(first: $relationFirst) {
    nodes { type issue { id identifier state { name } } }
  }
  team { key }
  createdAt
  updatedAt
}
"""

ISSUES_BY_STATES_QUERY = (
    """
query LorenzIssuesByStates(
  $projectSlug: String!
  $stateNames: [String!]!
  $first: Int!
  $relationFirst: Int!
  $labelFirst: Int!
  $after: String
) {
  issues(
    filter: {project: {slugId: {eq: $projectSlug}}, state: {name: {in: $stateNames}}}
    first: $first
    after: $after
  ) {
    nodes { ...LorenzIssueFields }
    pageInfo { hasNextPage endCursor }
  }
}
"""
    + ISSUE_FIELDS
)

ISSUES_BY_IDS_QUERY = (
    """
query LorenzIssuesByIds(
  $ids: [ID!]!
  $projectSlug: String!
  $first: Int!
  $relationFirst: Int!
  $labelFirst: Int!
) {
  issues(
    filter: {id: {in: $ids}, project: {slugId: {eq: $projectSlug}}}
    first: $first
  ) {
    nodes { ...LorenzIssueFields }
  }
}
"""
    + ISSUE_FIELDS
)

VIEWER_QUERY = "query LorenzViewer { viewer { id } }"

ESCALATION_CONTEXT_QUERY = (
    "query LorenzEscalationContext($id: String!, $after: String, $first: Int!) {"
    " issue(id: $id) { id team { id } labels(first: 100) { nodes { id name } }"
    " comments(first: $first, after: $after) { nodes { body }"
    " pageInfo { hasNextPage endCursor } } } }"
)
LABELS_BY_NAME_QUERY = (
    "query LorenzLabelsByName($name: String!) {"
    " issueLabels(filter: {name: {eqIgnoreCase: $name}}, first: 50) {"
    " nodes { id name team { id } } } }"
)
CREATE_LABEL_MUTATION = (
    "mutation LorenzCreateLabel($name: String!, $teamId: String) {"
    " issueLabelCreate(input: {name: $name, teamId: $teamId}) { success issueLabel { id } } }"
)
ADD_LABEL_MUTATION = (
    "mutation LorenzAddLabel($id: String!, $labelId: String!) {"
    " issueUpdate(id: $id, input: {addedLabelIds: [$labelId]}) { success } }"
)
COMMENT_MUTATION = (
    "mutation LorenzEscalationComment($id: String!, $body: String!) {"
    " commentCreate(input: {issueId: $id, body: $body}) { success } }"
)
TEAM_STATE_QUERY = (
    "query LorenzTeamState($id: String!, $name: String!) {"
    " issue(id: $id) { id state { name } team { id"
    " states(filter: {name: {eqIgnoreCase: $name}}, first: 10) { nodes { id name } } } } }"
)
MOVE_ISSUE_MUTATION = (
    "mutation LorenzMoveIssue($id: String!, $stateId: String!) {"
    " issueUpdate(id: $id, input: {stateId: $stateId}) { success } }"
)
QUESTION_COMMENTS_QUERY = (
    "query LorenzQuestionComments($id: String!, $after: String, $first: Int!) {"
    " issue(id: $id) { id comments(first: $first, after: $after) {"
    " nodes { id body createdAt user { id name displayName email } }"
    " pageInfo { hasNextPage endCursor } } } }"
)
QUESTION_COMMENT_MUTATION = (
    "mutation LorenzQuestionComment($id: String!, $body: String!) {"
    " commentCreate(input: {issueId: $id, body: $body}) { success } }"
)

QUERIES = {
    "LorenzIssuesByStates": ISSUES_BY_STATES_QUERY,
    "LorenzIssuesByIds": ISSUES_BY_IDS_QUERY,
    "LorenzViewer": VIEWER_QUERY,
    "LorenzEscalationContext": ESCALATION_CONTEXT_QUERY,
    "LorenzLabelsByName": LABELS_BY_NAME_QUERY,
    "LorenzCreateLabel": CREATE_LABEL_MUTATION,
    "LorenzAddLabel": ADD_LABEL_MUTATION,
    "LorenzEscalationComment": COMMENT_MUTATION,
    "LorenzTeamState": TEAM_STATE_QUERY,
    "LorenzMoveIssue": MOVE_ISSUE_MUTATION,
    "LorenzQuestionComments": QUESTION_COMMENTS_QUERY,
    "LorenzQuestionComment": QUESTION_COMMENT_MUTATION,
}
"""Every document the tracker itself sends, by operation name (tests validate each one)."""


# -- the client -----------------------------------------------------------------------------------


def _snippet(text: str) -> str:
    """A response body for an error message: whitespace collapsed, at most 1000 bytes."""
    collapsed = " ".join(text.split())
    raw = collapsed.encode("utf-8")
    if len(raw) <= BODY_SNIPPET_BYTES:
        return collapsed
    return raw[:BODY_SNIPPET_BYTES].decode("utf-8", errors="ignore") + "…"


def _refused_cursor(err: TrackerError) -> bool:
    """Whether a failed page read is Linear refusing its ``after`` cursor."""
    return err.code == ErrorCode.LINEAR_GRAPHQL_ERRORS and "cursor" in str(err).lower()


def _graphql_errors(body: Any) -> list[Mapping[str, Any]]:
    if not isinstance(body, Mapping):
        return []
    errors = body.get("errors")
    if not isinstance(errors, list):
        return []
    return [error if isinstance(error, Mapping) else {"message": str(error)} for error in errors]


def _error_code(error: Mapping[str, Any]) -> str | None:
    code = as_mapping(error.get("extensions")).get("code")
    return code if isinstance(code, str) else None


def _describe_errors(errors: list[Mapping[str, Any]]) -> str:
    parts = []
    for error in errors[:3]:
        message = error.get("message")
        code = _error_code(error)
        text = message if isinstance(message, str) else json.dumps(error)[:200]
        parts.append(f"{text} ({code})" if code else text)
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def count_operations(
    query: str,
) -> tuple[graphql.DocumentNode, list[graphql.OperationDefinitionNode]]:
    """Parse ``query`` and list its operations; a syntax error is ``invalid_graphql_operation``."""
    # NB: imported here so that reading issues does not need graphql-core, only the agent tool.
    import graphql

    try:
        document = graphql.parse(query)
    except graphql.GraphQLError as exc:
        raise TrackerError(
            f"the GraphQL document does not parse: {exc.message}; send one valid operation",
            code=ErrorCode.INVALID_GRAPHQL_OPERATION,
        ) from None
    operations = [
        definition
        for definition in document.definitions
        if isinstance(definition, graphql.OperationDefinitionNode)
    ]
    return document, operations


class LinearTracker:
    """Reads one Linear project; see the module docstring."""

    def __init__(
        self,
        *,
        settings: WorkflowSettings | TrackerSettings,
        api_key: str,
        endpoint: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        sleep: Sleep = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        tracker = tracker_settings_of(settings)
        if not api_key or not api_key.strip():
            raise TrackerError(
                f"no Linear API key; set tracker.api_key or {LINEAR_API_KEY_ENV}",
                code=ErrorCode.MISSING_TRACKER_API_KEY,
                key_path="tracker.api_key",
            )
        if not tracker.project_slug or not tracker.project_slug.strip():
            raise TrackerError(
                "no Linear project; set tracker.project_slug to the project's slugId "
                "(the last segment of the project URL)",
                code=ErrorCode.MISSING_TRACKER_PROJECT_SLUG,
                key_path="tracker.project_slug",
            )
        self._settings = tracker
        self._api_key = api_key.strip()
        self._project_slug = tracker.project_slug.strip()
        self._endpoint = endpoint or tracker.endpoint or DEFAULT_LINEAR_ENDPOINT
        self.options = parse_provider_options(LinearOptions, tracker.provider, kind="linear")
        self._connection = TrackerConnection(
            shared=http_client,
            tracker="Linear",
            timeout_ms=self.options.timeout_ms,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        self._wall_clock = wall_clock
        self._throttle = Throttle(policy=self.options.rate_limit_policy(), sleep=sleep)
        assignee = (tracker.assignee or "").strip()
        self._assignee = assignee or None
        self._viewer_id: str | None = None
        self._own_user: tuple[str | None] | None = None
        """The token's user id for questions (``(None,)``: Linear did not say), asked once."""

    @property
    def endpoint(self) -> str:
        return self._endpoint

    # -- TrackerClient ------------------------------------------------------------------------

    async def fetch_candidate_issues(self) -> list[Issue]:
        return await self.fetch_issues_by_states(self._settings.active_states)

    async def fetch_issues_by_states(self, states: Sequence[str]) -> list[Issue]:
        names = list(dict.fromkeys(s for s in states if s.strip()))
        if not names:
            return []
        route = await self._routing()
        issues: list[Issue] = []
        dropped = 0
        after: str | None = None
        restarts = 0
        while True:
            try:
                data = await self._query(
                    ISSUES_BY_STATES_QUERY,
                    {
                        "projectSlug": self._project_slug,
                        "stateNames": names,
                        "first": self.options.page_size,
                        "relationFirst": self.options.relation_page_size,
                        "labelFirst": self.options.label_page_size,
                        "after": after,
                    },
                    operation_name="LorenzIssuesByStates",
                )
            except TrackerError as err:
                # NB: a cursor names the last issue of the page before; when that issue leaves
                # the filter between two pages (an agent moved it to Done), the cursor may be
                # refused. The scan starts again from its first page, a bounded number of
                # times, rather than failing the whole poll.
                if after is None or restarts >= CURSOR_RESTARTS or not _refused_cursor(err):
                    raise
                restarts += 1
                logger.debug(
                    "Linear refused a page cursor; scanning again project=%s states=%s",
                    self._project_slug,
                    names,
                )
                issues.clear()
                dropped = 0
                after = None
                continue
            connection = self._issues_connection(data, operation="LorenzIssuesByStates")
            for node in connection["nodes"]:
                issue = normalize_issue(node)
                if issue is None:
                    dropped += 1
                else:
                    issues.append(route(issue))
            page = connection.get("pageInfo")
            if not isinstance(page, Mapping):
                raise TrackerError(
                    "Linear returned issues without pageInfo; check tracker.endpoint",
                    code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
                )
            if page.get("hasNextPage") is not True:
                break
            cursor = page.get("endCursor")
            if not isinstance(cursor, str) or not cursor:
                raise TrackerError(
                    "Linear said there is a next page but gave no endCursor; retry later",
                    code=ErrorCode.LINEAR_MISSING_END_CURSOR,
                    retryable=True,
                )
            after = cursor
        if dropped:
            logger.warning(
                "dropped malformed Linear issues project=%s states=%s count=%d",
                self._project_slug,
                names,
                dropped,
            )
        return issues

    async def fetch_issues_by_ids(self, ids: Sequence[str]) -> list[Issue]:
        wanted = list(dict.fromkeys(i for i in ids if i))
        if not wanted:
            return []
        route = await self._routing()
        found: dict[str, Issue] = {}
        size = self.options.page_size
        for start in range(0, len(wanted), size):
            batch = wanted[start : start + size]
            data = await self._query(
                ISSUES_BY_IDS_QUERY,
                {
                    "ids": batch,
                    "projectSlug": self._project_slug,
                    "first": len(batch),
                    "relationFirst": self.options.relation_page_size,
                    "labelFirst": self.options.label_page_size,
                },
                operation_name="LorenzIssuesByIds",
            )
            connection = self._issues_connection(data, operation="LorenzIssuesByIds")
            for node in connection["nodes"]:
                issue = normalize_issue(node)
                if issue is None:
                    # NB: leaving it out would read as "gone" and stop its run; fail instead.
                    raise TrackerError(
                        "Linear returned a malformed issue (missing id, identifier, title or "
                        "state) while refreshing by id; retry later",
                        code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
                    )
                found[issue.id] = route(issue)
        return [found[i] for i in wanted if i in found]

    async def close(self) -> None:
        await self._connection.close()

    # -- terminal actions (retry.terminal_action) ----------------------------------------------

    async def escalate_issue(
        self, issue: Issue, *, key: str, comment: str | None, label: str | None
    ) -> bool:
        """One comment (``commentCreate``, skipped when a comment carries ``key``'s marker)
        and/or one label (found by name, team or workspace, else created in the issue's team;
        added with ``issueUpdate.addedLabelIds``). See :mod:`lorenz.trackers.writes`."""
        team_id, labels, bodies = await self._escalation_context(issue.id)
        wrote = False
        if label is not None and label.strip().lower() not in {n.lower() for n in labels}:
            label_id = await self._label_id(label.strip(), team_id=team_id)
            await self._write(
                ADD_LABEL_MUTATION, {"id": issue.id, "labelId": label_id},
                operation_name="LorenzAddLabel", field="issueUpdate",
            )
            wrote = True
        if comment is not None and not any(has_marker(body, key=key) for body in bodies):
            await self._write(
                COMMENT_MUTATION, {"id": issue.id, "body": with_marker(comment, key=key)},
                operation_name="LorenzEscalationComment", field="commentCreate",
            )
            wrote = True
        return wrote

    async def move_issue_to_state(self, issue: Issue, *, state: str) -> None:
        """``issueUpdate(stateId:)`` with the issue's team's state named ``state``."""
        data = await self._query(
            TEAM_STATE_QUERY, {"id": issue.id, "name": state.strip()},
            operation_name="LorenzTeamState",
        )
        found = as_mapping(data.get("issue"))
        current = nonblank(as_mapping(found.get("state")).get("name"))
        if current is not None and current.strip().lower() == state.strip().lower():
            return
        states = nodes_of(as_mapping(as_mapping(found.get("team")).get("states")))
        state_id = next((nonblank(node.get("id")) for node in states), None)
        if state_id is None:
            raise TrackerError(
                f"the team of {issue.identifier} has no state {state!r}; set retry.cancel_state "
                "to one of the team's workflow states",
                code=ErrorCode.TRACKER_STATE_NOT_FOUND,
                key_path="retry.cancel_state",
            )
        await self._write(
            MOVE_ISSUE_MUTATION, {"id": issue.id, "stateId": state_id},
            operation_name="LorenzMoveIssue", field="issueUpdate",
        )

    async def _escalation_context(self, issue_id: str) -> tuple[str | None, list[str], list[str]]:
        """The issue's team id, label names, and comment bodies (bounded pages)."""
        team_id: str | None = None
        labels: list[str] = []
        bodies: list[str] = []
        after: str | None = None
        for _ in range(MAX_COMMENT_PAGES):
            data = await self._query(
                ESCALATION_CONTEXT_QUERY, {"id": issue_id, "after": after, "first": 100},
                operation_name="LorenzEscalationContext",
            )
            found = as_mapping(data.get("issue"))
            team_id = nonblank(as_mapping(found.get("team")).get("id"))
            labels = [str(n.get("name")) for n in nodes_of(as_mapping(found.get("labels")))]
            comments = as_mapping(found.get("comments"))
            bodies.extend(str(n.get("body") or "") for n in nodes_of(comments))
            page = as_mapping(comments.get("pageInfo"))
            after = nonblank(page.get("endCursor"))
            if not page.get("hasNextPage") or after is None:
                break
        return team_id, labels, bodies

    async def _label_id(self, name: str, *, team_id: str | None) -> str:
        data = await self._query(
            LABELS_BY_NAME_QUERY, {"name": name}, operation_name="LorenzLabelsByName"
        )
        for node in nodes_of(as_mapping(data.get("issueLabels"))):
            owner = nonblank(as_mapping(node.get("team")).get("id"))
            label_id = nonblank(node.get("id"))
            if label_id is not None and (owner is None or owner == team_id):
                return label_id
        created = await self._write(
            CREATE_LABEL_MUTATION, {"name": name, "teamId": team_id},
            operation_name="LorenzCreateLabel", field="issueLabelCreate",
        )
        label_id = nonblank(as_mapping(created.get("issueLabel")).get("id"))
        if label_id is None:
            raise TrackerError(
                "Linear created the escalation label but did not say its id; retry later",
                code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
            )
        return label_id

    async def _write(
        self, query: str, variables: dict[str, Any], *, operation_name: str, field: str
    ) -> Mapping[str, Any]:
        data = await self._query(query, variables, operation_name=operation_name)
        payload = as_mapping(data.get(field))
        if payload.get("success") is not True:
            raise TrackerError(
                f"Linear did not apply {operation_name}; check the API key's write access",
                code=ErrorCode.LINEAR_WRITE_FAILED,
            )
        return payload

    # -- questions (lorenz.trackers.questions) -------------------------------------------------

    async def post_question(self, issue: Issue, *, key: str, body: str) -> bool:
        """``commentCreate`` with ``key``'s marker, skipped when a comment carries it."""
        comments = await self._question_comments(issue)
        if any(has_question_marker(comment.body, key=key) for comment in comments):
            return False
        await self._write(
            QUESTION_COMMENT_MUTATION, {"id": issue.id, "body": question_comment(body, key=key)},
            operation_name="LorenzQuestionComment", field="commentCreate",
        )
        return True

    async def replies_after_question(
        self, issue: Issue, *, key: str
    ) -> list[TrackerReply] | None:
        """The comments after the question, without Lorenz's own (marked, or by the API key's
        user); the author is the user's e-mail, else display name, else name."""
        comments = await self._question_comments(issue)
        own = await self._own_user_id()
        return replies_after(comments, key=key, own_ids=[own] if own else [])

    async def _question_comments(self, issue: Issue) -> list[ReadComment]:
        """The issue's comments (bounded pages; one without a time or body is skipped)."""
        comments: list[ReadComment] = []
        after: str | None = None
        for _ in range(MAX_COMMENT_PAGES):
            data = await self._query(
                QUESTION_COMMENTS_QUERY, {"id": issue.id, "after": after, "first": 100},
                operation_name="LorenzQuestionComments",
            )
            found = data.get("issue")
            if not isinstance(found, Mapping):
                raise TrackerError(
                    f"Linear did not return issue {issue.identifier} with its comments; "
                    "check that it still exists",
                    code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
                )
            connection = as_mapping(found.get("comments"))
            for node in nodes_of(connection):
                comment_id = nonblank(node.get("id"))
                created_at = parse_comment_time(node.get("createdAt"))
                body = node.get("body")
                if comment_id is None or created_at is None or not isinstance(body, str):
                    continue
                user = as_mapping(node.get("user"))
                comments.append(
                    ReadComment(
                        comment_id=comment_id,
                        body=body,
                        author=nonblank(user.get("email"))
                        or nonblank(user.get("displayName"))
                        or nonblank(user.get("name"))
                        or "",
                        author_id=nonblank(user.get("id")),
                        created_at=created_at,
                    )
                )
            page = as_mapping(connection.get("pageInfo"))
            after = nonblank(page.get("endCursor"))
            if not page.get("hasNextPage") or after is None:
                break
        return comments

    async def _own_user_id(self) -> str | None:
        """The API key's user id (``viewer``), asked once; ``None`` when Linear does not say."""
        if self._viewer_id is not None:
            return self._viewer_id
        if self._own_user is None:
            data = await self._query(VIEWER_QUERY, {}, operation_name="LorenzViewer")
            self._own_user = (nonblank(as_mapping(data.get("viewer")).get("id")),)
        return self._own_user[0]

    # -- the linear_graphql tool --------------------------------------------------------------

    async def execute_graphql(
        self, *, query: str, variables: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run one GraphQL operation with this tracker's credentials; return the response body
        (``data`` and/or ``errors``) as Linear sent it."""
        _, operations = count_operations(query)
        if len(operations) != 1:
            raise TrackerError(
                f"the document has {len(operations)} operations; send exactly one per call",
                code=ErrorCode.INVALID_GRAPHQL_OPERATION,
            )
        name = operations[0].name.value if operations[0].name else None
        return await self._post(query, dict(variables or {}), operation_name=name)

    # -- internals ----------------------------------------------------------------------------

    async def _routing(self) -> Callable[[Issue], Issue]:
        """The function that sets ``dispatchable`` from ``tracker.assignee``."""
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
            data = await self._query(VIEWER_QUERY, {}, operation_name="LorenzViewer")
            viewer_id = nonblank(as_mapping(data.get("viewer")).get("id"))
            if viewer_id is None:
                raise TrackerError(
                    "Linear did not say who the API key belongs to; set tracker.assignee to "
                    "a user id instead of 'me'",
                    code=ErrorCode.MISSING_LINEAR_VIEWER_IDENTITY,
                    key_path="tracker.assignee",
                )
            self._viewer_id = viewer_id.strip()
        return self._viewer_id

    def _issues_connection(self, data: Mapping[str, Any], *, operation: str) -> dict[str, Any]:
        connection = data.get("issues")
        if not isinstance(connection, Mapping) or not isinstance(connection.get("nodes"), list):
            raise TrackerError(
                f"Linear's answer to {operation} has no issues.nodes list; check tracker.endpoint",
                code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
            )
        return dict(connection)

    async def _query(
        self, query: str, variables: dict[str, Any], *, operation_name: str
    ) -> Mapping[str, Any]:
        """A strict read: any ``errors`` entry fails the call, ``data`` must be an object."""
        body = await self._post(query, variables, operation_name=operation_name)
        errors = _graphql_errors(body)
        if errors:
            raise TrackerError(
                f"Linear rejected {operation_name}: {_describe_errors(errors)}; check "
                "tracker.project_slug and the state names, or retry later",
                code=ErrorCode.LINEAR_GRAPHQL_ERRORS,
            )
        data = body.get("data")
        if not isinstance(data, Mapping):
            raise TrackerError(
                f"Linear's answer to {operation_name} has no data object; check tracker.endpoint",
                code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
            )
        return data

    async def _post(
        self, query: str, variables: dict[str, Any], *, operation_name: str | None
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"query": query, "variables": variables}
        if operation_name:
            payload["operationName"] = operation_name
        what = operation_name or "the GraphQL operation"
        try:
            return await self._throttle.run(lambda: self._send(payload, what=what))
        except RateLimitExhausted as exc:
            raise TrackerError(
                f"Linear rate limit hit for {what}: {exc.detail}; Lorenz retries on a later "
                "tick (poll less often if this persists)",
                code=ErrorCode.LINEAR_RATE_LIMITED,
                retryable=True,
                retry_after_ms=exc.retry_after_ms,
            ) from None

    def _http(self) -> httpx.AsyncClient:
        return self._connection.client()

    async def _send(self, payload: dict[str, Any], *, what: str) -> dict[str, Any]:
        client = self._http()
        try:
            # NB: a personal API key goes in raw, without "Bearer " (that prefix is for OAuth).
            response = await client.post(
                self._endpoint, json=payload, headers={"Authorization": self._api_key}
            )
        except httpx.HTTPError as exc:
            raise TrackerError(
                f"request to Linear failed for {what}: {type(exc).__name__}: {exc}; "
                "check the network and tracker.endpoint",
                code=ErrorCode.LINEAR_API_REQUEST,
                retryable=True,
            ) from exc
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        errors = _graphql_errors(body)
        limited = response.status_code == 429 or any(_error_code(e) == RATELIMITED for e in errors)
        if not limited:
            self._note_budget(response.headers)
        else:
            logger.warning("Linear rate limited operation=%s status=%d", what, response.status_code)
            raise RateLimitHit(
                f"HTTP {response.status_code} {_describe_errors(errors) or 'rate limited'}",
                delay_s=self._hinted_delay(response.headers),
            )
        if response.status_code != 200:
            hint = (
                "check tracker.api_key"
                if response.status_code in (401, 403)
                else "retry later or check tracker.endpoint"
            )
            logger.warning(
                "Linear answered with HTTP %d operation=%s body=%s",
                response.status_code,
                what,
                _snippet(response.text),
            )
            raise TrackerError(
                f"Linear answered HTTP {response.status_code} for {what}: "
                f"{_snippet(response.text)}; {hint}",
                code=ErrorCode.LINEAR_API_STATUS,
                retryable=response.status_code >= 500,
            )
        if not isinstance(body, dict):
            raise TrackerError(
                f"Linear's answer to {what} is not a JSON object; check tracker.endpoint",
                code=ErrorCode.LINEAR_UNKNOWN_PAYLOAD,
            )
        return body

    def _budgets(self, headers: httpx.Headers) -> Iterator[tuple[str, float | None]]:
        """``(budget, seconds until reset)`` for each budget the headers say is spent."""
        now = self._wall_clock()
        for budget in ("Requests", "Complexity"):
            remaining = headers.get(f"X-RateLimit-{budget}-Remaining")
            if remaining is None:
                continue
            try:
                spent = float(remaining) <= 0
            except ValueError:
                continue
            if spent:
                reset = headers.get(f"X-RateLimit-{budget}-Reset")
                yield budget.lower(), seconds_until_epoch(reset, now=now)

    def _note_budget(self, headers: httpx.Headers) -> None:
        for budget, delay in self._budgets(headers):
            if delay is not None and delay > 0:
                self._throttle.budget_spent(
                    delay_s=delay, reason=f"Linear {budget} budget is spent"
                )

    def _hinted_delay(self, headers: httpx.Headers) -> float | None:
        delays = [delay for _, delay in self._budgets(headers) if delay is not None]
        if delays:
            return max(delays)
        retry_after = parse_retry_after(headers.get("Retry-After"), now=self._wall_clock())
        if retry_after is not None:
            return retry_after
        resets = [
            seconds_until_epoch(headers.get(f"X-RateLimit-{b}-Reset"), now=self._wall_clock())
            for b in ("Requests", "Complexity")
        ]
        known = [r for r in resets if r is not None]
        return max(known) if known else None
