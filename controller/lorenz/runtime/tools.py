"""Host-side tools offered to agents, executed with the tracker's credentials.

The agent never sees the tracker token: it asks for ``linear_graphql`` (or ``gitlab_api``,
``jira_rest``) and the runtime runs the operation itself. Only trackers that can execute raw
GraphQL offer ``linear_graphql``; the GitLab tracker offers ``gitlab_api`` and the Jira tracker
``jira_rest``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from lorenz.tasks import run_to_completion
from lorenz.trackers import GraphQLTool, TrackerClient

if TYPE_CHECKING:
    from lorenz.trackers import GitLabTracker, JiraTracker

LINEAR_GRAPHQL = "linear_graphql"
GITLAB_API = "gitlab_api"
JIRA_REST = "jira_rest"


class GraphQLToolHandler:
    """Offers ``linear_graphql``: one GraphQL operation per call against the tracker."""

    def __init__(self, *, tracker: GraphQLTool) -> None:
        self._tracker = tracker

    def tool_specs(self) -> list[dict[str, Any]]:
        return [
            {
                "name": LINEAR_GRAPHQL,
                "description": (
                    "Run one GraphQL query or mutation against the issue tracker with the "
                    "orchestrator's credentials. Exactly one operation per call."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "One GraphQL operation."},
                        "variables": {"type": "object", "description": "Operation variables."},
                    },
                    "required": ["query"],
                    "additionalProperties": False,
                },
            }
        ]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if name != LINEAR_GRAPHQL:
            return {"success": False, "output": f"unknown tool {name!r}; offered: {LINEAR_GRAPHQL}"}
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "output": "`query` must be a non-empty string"}
        variables = arguments.get("variables") or {}
        if not isinstance(variables, Mapping):
            return {"success": False, "output": "`variables` must be an object"}
        try:
            # NB: a run cancelled mid-request (stopped, stalled, its issue closed) must not cut
            # the request in half: it completes, then the cancellation goes on.
            body = await run_to_completion(
                self._tracker.execute_graphql(query=query, variables=dict(variables))
            )
        except Exception as exc:  # noqa: BLE001 - the agent gets the error as the tool's output
            return {"success": False, "output": str(exc)}
        success = not body.get("errors")
        return {"success": success, "output": json.dumps(body)}


class GitLabApiToolHandler:
    """Offers ``gitlab_api``: one REST call under ``/api/v4`` of the tracker's instance, with the
    method allow-list and path rules of :meth:`GitLabTracker.call_gitlab_api`."""

    def __init__(self, *, tracker: GitLabTracker) -> None:
        self._tracker = tracker

    def tool_specs(self) -> list[dict[str, Any]]:
        methods = list(self._tracker.options.api_methods)
        return [
            {
                "name": GITLAB_API,
                "description": (
                    "Make one GitLab REST API v4 call with the orchestrator's credentials. "
                    f"`path` is relative to /api/v4 (e.g. /projects/"
                    f"{self._tracker.project.replace('/', '%2F')}/issues/1/notes); "
                    f"methods: {', '.join(methods)}."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "method": {"type": "string", "enum": methods},
                        "path": {"type": "string", "description": "Path under /api/v4."},
                        "query": {"type": "object", "description": "Query parameters."},
                        "body": {"type": "object", "description": "JSON body (POST/PUT)."},
                    },
                    "required": ["method", "path"],
                    "additionalProperties": False,
                },
            }
        ]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if name != GITLAB_API:
            return {"success": False, "output": f"unknown tool {name!r}; offered: {GITLAB_API}"}
        try:
            # NB: as for linear_graphql, a cancelled run lets the request complete first.
            answer = await run_to_completion(
                self._tracker.call_gitlab_api(
                    method=arguments.get("method", ""),
                    path=arguments.get("path", ""),
                    query=arguments.get("query"),
                    body=arguments.get("body"),
                )
            )
        except Exception as exc:  # noqa: BLE001 - the agent gets the error as the tool's output
            return {"success": False, "output": str(exc)}
        return {"success": 200 <= answer["status"] < 300, "output": json.dumps(answer)}


class JiraRestToolHandler:
    """Offers ``jira_rest``: one REST call under ``/rest/api/3/`` of the configured Jira site.

    The tracker checks the method against its allow-list and the path against the site (see
    :meth:`lorenz.trackers.jira.JiraTracker.execute_jira_rest`); an HTTP error status is a
    failed call whose output still carries Jira's answer, for the agent to read.
    """

    def __init__(self, *, tracker: JiraTracker) -> None:
        self._tracker = tracker

    def tool_specs(self) -> list[dict[str, Any]]:
        methods = list(self._tracker.options.tool_methods)
        return [
            {
                "name": JIRA_REST,
                "description": (
                    "Make one Jira Cloud REST v3 call against the issue tracker's site with the "
                    "orchestrator's credentials. `path` starts with /rest/api/3/ (e.g. "
                    "/rest/api/3/issue/ENG-1/comment); rich text (comments, descriptions) is "
                    f"Atlassian Document Format. Methods: {', '.join(methods)}."
                ),
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "method": {"type": "string", "enum": methods},
                        "path": {"type": "string", "description": "Path under /rest/api/3/."},
                        "query": {"type": "object", "description": "Query parameters."},
                        "body": {"description": "JSON request body (POST/PUT)."},
                    },
                    "required": ["method", "path"],
                    "additionalProperties": False,
                },
            }
        ]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if name != JIRA_REST:
            return {"success": False, "output": f"unknown tool {name!r}; offered: {JIRA_REST}"}
        query = arguments.get("query")
        if query is not None and not isinstance(query, Mapping):
            return {"success": False, "output": "`query` must be an object"}
        try:
            # NB: like linear_graphql, a cancelled run lets the request finish first.
            result = await run_to_completion(
                self._tracker.execute_jira_rest(
                    method=str(arguments.get("method") or ""),
                    path=arguments.get("path"),  # type: ignore[arg-type] # validated there
                    query=query,
                    body=arguments.get("body"),
                )
            )
        except Exception as exc:  # noqa: BLE001 - the agent gets the error as the tool's output
            return {"success": False, "output": str(exc)}
        status = result.get("status")
        success = isinstance(status, int) and 200 <= status < 300
        return {"success": success, "output": json.dumps(result)}


def tracker_tools(
    tracker: TrackerClient,
) -> GraphQLToolHandler | GitLabApiToolHandler | JiraRestToolHandler | None:
    """The tool handler for this tracker, or ``None`` when it offers no tools."""
    # NB: each kind is told by the method its tool calls, as GraphQL's Protocol (not
    # runtime-checkable) always was: an ``isinstance`` against the GitLab or Jira adapter would
    # import that adapter into every process that polls another tracker (issue #35).
    if callable(getattr(tracker, "call_gitlab_api", None)):
        return GitLabApiToolHandler(tracker=cast("GitLabTracker", tracker))
    if callable(getattr(tracker, "execute_graphql", None)):
        return GraphQLToolHandler(tracker=cast("GraphQLTool", tracker))
    if callable(getattr(tracker, "execute_jira_rest", None)):
        return JiraRestToolHandler(tracker=cast("JiraTracker", tracker))
    return None
