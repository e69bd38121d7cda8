"""Linear's issue nodes read into Lorenz's :class:`~lorenz.model.Issue`: the payload parsing.

Kept apart from the client (:mod:`lorenz.trackers.linear`), which owns the HTTP exchange,
pagination, rate limits and writes: what a node of the GraphQL answer means (priority,
timestamps, blockers from inverse ``blocks`` relations, the assignee) is a pure function of the
node, tested on its own. Every reader is defensive: an odd field becomes ``None`` or is skipped,
a node without an id or an identifier is dropped, so one malformed issue cannot fail a poll.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers.payloads import as_mapping, nonblank, parse_timestamp

# -- normalization --------------------------------------------------------------------------------


def optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def nodes_of(connection: Any) -> list[Mapping[str, Any]]:
    nodes = as_mapping(connection).get("nodes")
    if not isinstance(nodes, list):
        return []
    return [node for node in nodes if isinstance(node, Mapping)]


def parse_priority(value: Any) -> int | None:
    """Linear priorities: 1 urgent … 4 low; 0 ("no priority") and anything odd become ``None``.

    NB: the schema types ``priority`` as ``Float``; integral floats are accepted.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value > 0:
        return value
    return None


def normalize_issue(node: Any) -> Issue | None:
    """An issue node as an :class:`Issue`; ``None`` when a required field is missing or blank.

    Optional fields that are unusable become ``None`` or empty, never a reason to drop the issue.
    """
    if not isinstance(node, Mapping):
        return None
    state = as_mapping(node.get("state"))
    issue_id = nonblank(node.get("id"))
    identifier = nonblank(node.get("identifier"))
    title = nonblank(node.get("title"))
    state_name = nonblank(state.get("name"))
    if issue_id is None or identifier is None or title is None or state_name is None:
        return None
    blockers = []
    for relation in nodes_of(node.get("inverseRelations")):
        if normalize_state(optional_str(relation.get("type"))) != "blocks":
            continue
        blocker = relation.get("issue")
        if not isinstance(blocker, Mapping):
            continue
        blockers.append(
            BlockerRef(
                id=nonblank(blocker.get("id")),
                identifier=nonblank(blocker.get("identifier")),
                state=nonblank(as_mapping(blocker.get("state")).get("name")),
            )
        )
    assignee_id = nonblank(as_mapping(node.get("assignee")).get("id"))
    native_ref: dict[str, Any] = {"id": issue_id}
    if state_type := nonblank(state.get("type")):
        native_ref["state_type"] = state_type
    if team_key := nonblank(as_mapping(node.get("team")).get("key")):
        native_ref["team_key"] = team_key
    return Issue(
        id=issue_id,
        identifier=identifier,
        title=title,
        state=state_name,
        description=optional_str(node.get("description")),
        priority=parse_priority(node.get("priority")),
        branch_name=nonblank(node.get("branchName")),
        url=nonblank(node.get("url")),
        labels=tuple(
            name for label in nodes_of(node.get("labels")) if (name := nonblank(label.get("name")))
        ),
        blocked_by=tuple(blockers),
        created_at=parse_timestamp(node.get("createdAt")),
        updated_at=parse_timestamp(node.get("updatedAt")),
        assignee_id=assignee_id.strip() if assignee_id else None,
        native_ref=native_ref,
    )
