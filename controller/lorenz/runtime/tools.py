"""Host-side tools offered to agents, executed with the tracker's credentials.

The agent never sees the tracker token: it asks for ``linear_graphql`` and the runtime runs the
operation itself. Only trackers that can execute raw GraphQL offer the tool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from lorenz.tasks import run_to_completion
from lorenz.trackers import GraphQLTool, TrackerClient

LINEAR_GRAPHQL = "linear_graphql"


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


def tracker_tools(tracker: TrackerClient) -> GraphQLToolHandler | None:
    """The tool handler for this tracker, or ``None`` when it offers no tools."""
    if callable(getattr(tracker, "execute_graphql", None)):
        # NB: checked structurally just above; the Protocol is not runtime-checkable.
        return GraphQLToolHandler(tracker=cast("GraphQLTool", tracker))
    return None
