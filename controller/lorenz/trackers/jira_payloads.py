"""Jira's answers read into Lorenz's terms, and the ``jira_rest`` tool's input checked.

Kept apart from the client (:mod:`lorenz.trackers.jira`), which owns the HTTP exchange, paging,
rate limits and writes. Here are pure functions of one payload: an issue of a search answer
into an :class:`~lorenz.model.Issue` (status, priority by name, labels, ``Blocks`` links seen
from the blocked side), Jira's timestamps and rate-limit reset, its error bodies into one line,
and the validation of an agent's ``jira_rest`` path and query (so a call cannot leave
``/rest/api/3/`` of the configured site). Every reader is defensive: an odd field becomes
``None`` or is skipped, and a malformed issue is dropped rather than failing a poll.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from lorenz.codes import ErrorCode
from lorenz.model import BlockerRef, Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers.base import TrackerError
from lorenz.trackers.jira_adf import adf_to_text
from lorenz.trackers.payloads import as_mapping, nonblank, parse_timestamp

API_PREFIX = "/rest/api/3/"
BODY_SNIPPET_CHARS = 500
PRIORITY_BY_NAME = {"highest": 1, "high": 2, "medium": 3, "low": 4, "lowest": 5}
"""Jira's default priority scheme on Lorenz's scale (1 most urgent); other names → ``None``."""
ISSUE_ID_RE = re.compile(r"^[0-9]{1,19}$")
PATH_RE = re.compile(r"^/rest/api/3/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")
ISO_MINUTES_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2})(Z|[+-]\d{2}:?\d{2})?$")


# -- normalization --------------------------------------------------------------------------------


def parse_priority(value: Any) -> int | None:
    name = nonblank(as_mapping(value).get("name"))
    return PRIORITY_BY_NAME.get(name.strip().lower()) if name else None


def status_name(fields: Mapping[str, Any]) -> str | None:
    return nonblank(as_mapping(fields.get("status")).get("name"))


def labels_of(fields: Mapping[str, Any]) -> list[str]:
    labels = fields.get("labels")
    if not isinstance(labels, list):
        return []
    return [label for label in labels if isinstance(label, str) and label.strip()]


def _blockers(fields: Mapping[str, Any], *, link_type: str) -> list[BlockerRef]:
    links = fields.get("issuelinks")
    if not isinstance(links, list):
        return []
    wanted = normalize_state(link_type)
    blockers: list[BlockerRef] = []
    for link in links:
        link = as_mapping(link)
        if normalize_state(str(as_mapping(link.get("type")).get("name") or "")) != wanted:
            continue
        # NB: seen from this issue, a link carrying ``inwardIssue`` reads "this issue <inward
        # name> that one": for Blocks, "is blocked by". ``outwardIssue`` is an issue it blocks.
        other = as_mapping(link.get("inwardIssue"))
        key = nonblank(other.get("key"))
        other_id = nonblank(other.get("id"))
        if key is None and other_id is None:
            continue
        blockers.append(
            BlockerRef(
                id=other_id,
                identifier=key,
                state=status_name(as_mapping(other.get("fields"))),
            )
        )
    return blockers


def normalize_issue(item: Any, *, site: str, link_type: str = "Blocks") -> Issue | None:
    """A REST issue object (``id``, ``key``, ``fields``) as an :class:`Issue`; ``None`` when
    the id, key, summary or status is missing."""
    if not isinstance(item, Mapping):
        return None
    issue_id = item.get("id")
    if isinstance(issue_id, int) and not isinstance(issue_id, bool):
        issue_id = str(issue_id)
    key = nonblank(item.get("key"))
    fields = as_mapping(item.get("fields"))
    title = nonblank(fields.get("summary"))
    state = status_name(fields)
    if not isinstance(issue_id, str) or not ISSUE_ID_RE.match(issue_id) or key is None:
        return None
    if title is None or state is None:
        return None
    assignee = nonblank(as_mapping(fields.get("assignee")).get("accountId"))
    status = as_mapping(fields.get("status"))
    native_ref: dict[str, Any] = {"key": key, "project": _project_key(item)}
    category = nonblank(as_mapping(status.get("statusCategory")).get("key"))
    if category is not None:
        native_ref["status_category"] = category
    return Issue(
        id=issue_id,
        identifier=key,
        title=title,
        state=state,
        description=adf_to_text(fields.get("description")),
        priority=parse_priority(fields.get("priority")),
        url=f"{site}/browse/{quote(key, safe='-')}",
        labels=tuple(labels_of(fields)),
        blocked_by=tuple(_blockers(fields, link_type=link_type)),
        created_at=parse_timestamp(fields.get("created")),
        updated_at=parse_timestamp(fields.get("updated")),
        assignee_id=assignee,
        native_ref=native_ref,
    )


def _project_key(item: Mapping[str, Any]) -> str | None:
    project = nonblank(as_mapping(as_mapping(item.get("fields")).get("project")).get("key"))
    if project is not None:
        return project
    key = nonblank(item.get("key"))
    return key.rpartition("-")[0] or None if key else None


def jql_string(value: str) -> str:
    """``value`` as a JQL string literal (double quotes; backslash and quote escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def reset_delay(value: str | None, *, now: float) -> float | None:
    """``X-RateLimit-Reset`` (an ISO 8601 time, Jira writes ``yyyy-MM-ddTHH:mmZ``) as seconds
    from now."""
    if value is None:
        return None
    text = value.strip()
    match = ISO_MINUTES_RE.match(text)
    if match:
        zone = match.group(2) or "Z"
        text = match.group(1) + ":00" + ("+00:00" if zone == "Z" else zone)
    moment = parse_timestamp(text)
    if moment is None:
        return None
    return max(0.0, moment.timestamp() - now)


# -- the jira_rest tool's input, Jira's error bodies ----------------------------------------------


def validate_rest_path(path: Any) -> str:
    """The part of an agent's ``path`` after ``/rest/api/3/``; :class:`TrackerError` when it
    could leave the API (another host, a ``..``, an encoded separator) or is not a plain path."""
    if not isinstance(path, str) or not path.strip():
        raise TrackerError(
            "`path` must be a non-empty string like /rest/api/3/issue/ENG-1",
            code=ErrorCode.INVALID_JIRA_REST_CALL,
        )
    text = path.strip()
    problem = None
    if len(text) > 2000:
        problem = "is longer than 2000 characters"
    elif not PATH_RE.match(text):
        problem = (
            "must start with /rest/api/3/ and hold only URL path characters (no scheme, host, "
            "query or fragment: put parameters in `query`)"
        )
    else:
        lowered = text.lower()
        segments = text.split("/")
        if "//" in text or any(s in (".", "..") for s in segments):
            problem = "must not contain empty, '.' or '..' segments"
        elif any(code in lowered for code in ("%2e", "%2f", "%5c", "%00", "%25")):
            problem = "must not contain encoded dots, slashes, backslashes, NULs or percents"
    if problem is not None:
        raise TrackerError(f"jira_rest path {problem}", code=ErrorCode.INVALID_JIRA_REST_CALL)
    return text[len(API_PREFIX) :]


def query_params(query: Any) -> dict[str, str | int] | None:
    if query is None:
        return None
    if not isinstance(query, Mapping) or len(query) > 50:
        raise TrackerError(
            "`query` must be an object of at most 50 parameters",
            code=ErrorCode.INVALID_JIRA_REST_CALL,
        )
    params: dict[str, str | int] = {}
    for name, value in query.items():
        if isinstance(value, bool):
            params[str(name)] = "true" if value else "false"
        elif isinstance(value, (str, int)):
            params[str(name)] = value
        elif isinstance(value, float):
            params[str(name)] = str(value)
        else:
            raise TrackerError(
                f"query parameter {name!r} must be a string, number or boolean",
                code=ErrorCode.INVALID_JIRA_REST_CALL,
            )
    return params


def error_messages(content: bytes) -> list[str]:
    """Jira's ``{"errorMessages": [...], "errors": {field: message}}`` as a list (at most 50)."""
    try:
        body = json.loads(content)
    except ValueError:
        return []
    parts: list[str] = []
    if isinstance(body, Mapping):
        messages = body.get("errorMessages")
        if isinstance(messages, list):
            parts.extend(m for m in messages if isinstance(m, str))
        errors = body.get("errors")
        if isinstance(errors, Mapping):
            parts.extend(f"{k}: {v}" for k, v in errors.items() if isinstance(v, str))
        if not parts and isinstance(body.get("message"), str):
            parts.append(body["message"])
    return parts[:50]


def error_message(content: bytes) -> str:
    """Jira's error body as one line (the raw body, cut, when it is not Jira's shape)."""
    parts = error_messages(content)
    if parts:
        return snippet("; ".join(parts))
    return snippet(content.decode("utf-8", errors="replace"))


def snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat[:BODY_SNIPPET_CHARS]
