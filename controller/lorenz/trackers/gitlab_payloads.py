"""GitLab's answers read into Lorenz's terms, and the ``gitlab_api`` tool's input checked.

Kept apart from the client (:mod:`lorenz.trackers.gitlab`), which owns the HTTP exchange,
paging, rate limits and writes. Here are pure functions of one payload: an issue of a listing
into an :class:`~lorenz.model.Issue` (its state from ``opened``/``closed`` and the scoped state
labels of :class:`LabelStates`), GitLab's error bodies into one line, and the validation of an
agent's ``gitlab_api`` path and query (so a call stays under ``/api/v4`` of the configured
instance and cannot impersonate or pass credentials). Every reader is defensive: an odd field
becomes ``None`` or is skipped, and a malformed issue is dropped rather than failing a poll.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import httpx

from lorenz.codes import ErrorCode
from lorenz.config import TrackerSettings
from lorenz.model import Issue
from lorenz.model.issues import normalize_state
from lorenz.trackers.base import TrackerError
from lorenz.trackers.payloads import label_names, nonblank, parse_timestamp

API_PREFIX = "/api/v4"
OPENED_STATE = "opened"
BODY_SNIPPET_CHARS = 500
MAX_TOOL_PATH_CHARS = 2048
TOOL_REFUSED_PARAMETERS = frozenset({"sudo", "private_token", "access_token", "job_token"})
"""Parameters ``gitlab_api`` never passes: impersonation (``sudo``) and other credentials."""


# -- normalization --------------------------------------------------------------------------------


def positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def full_reference(item: Mapping[str, Any]) -> str | None:
    references = item.get("references")
    if isinstance(references, Mapping):
        return nonblank(references.get("full"))
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class LabelStates:
    """How scoped labels (and opened/closed) map to workflow states for one configuration."""

    active: tuple[str, ...]
    terminal: tuple[str, ...]
    scope: str | None

    @classmethod
    def from_settings(cls, settings: TrackerSettings, *, scope: str | None) -> LabelStates:
        return cls(active=settings.active_states, terminal=settings.terminal_states, scope=scope)

    @property
    def closed_fallback(self) -> str:
        """The state of a closed issue without a terminal label."""
        return self.terminal[0] if self.terminal else "closed"

    def label_for(self, state: str) -> str:
        """The scoped label that carries ``state`` (only with a scope)."""
        return f"{self.scope}::{state.strip()}"

    def state_in_label(self, label: str) -> str | None:
        """The state a label carries (``status::todo`` → ``todo``), if it is in the scope."""
        if self.scope is None:
            return None
        prefix = f"{normalize_state(self.scope)}::"
        if not normalize_state(label).startswith(prefix):
            return None
        value = label.strip()[len(prefix) :].strip()
        return value or None

    def state_of(self, item: Mapping[str, Any]) -> str | None:
        """The issue's workflow state, or ``None`` when its ``state`` is not opened/closed."""
        native = item.get("state")
        if native not in ("opened", "closed"):
            return None
        labelled = [s for s in map(self.state_in_label, label_names(item)) if s is not None]
        terminal = {normalize_state(s) for s in self.terminal}
        if native == "closed":
            for state in labelled:
                if normalize_state(state) in terminal:
                    return state
            return self.closed_fallback
        known = terminal | {normalize_state(s) for s in self.active}
        for state in labelled:
            if normalize_state(state) in known:
                return state
        return OPENED_STATE

    def is_state_label(self, label: str) -> bool:
        return self.state_in_label(label) is not None


def normalize_issue(item: Any, *, project: str, states: LabelStates) -> Issue | None:
    """A REST issue object as an :class:`Issue`; ``None`` when malformed."""
    if not isinstance(item, Mapping):
        return None
    iid = positive_int(item.get("iid"))
    title = nonblank(item.get("title"))
    state = states.state_of(item)
    if iid is None or title is None or state is None:
        return None
    assignees = item.get("assignees")
    usernames = [
        a["username"]
        for a in (assignees if isinstance(assignees, list) else [])
        if isinstance(a, Mapping) and nonblank(a.get("username"))
    ]
    if not usernames:
        single = item.get("assignee")
        if isinstance(single, Mapping) and nonblank(single.get("username")):
            usernames = [single["username"]]
    native_ref: dict[str, Any] = {"project": project, "iid": iid, "state": item["state"]}
    for key in ("id", "project_id", "moved_to_id"):
        if positive_int(item.get(key)) is not None:
            native_ref[key] = item[key]
    if len(usernames) > 1:
        native_ref["assignees"] = usernames
    description = item.get("description")
    return Issue(
        id=str(iid),
        identifier=full_reference(item) or f"{project}#{iid}",
        title=title,
        state=state,
        description=description if isinstance(description, str) else None,
        url=nonblank(item.get("web_url")),
        labels=tuple(label_names(item)),
        created_at=parse_timestamp(item.get("created_at")),
        updated_at=parse_timestamp(item.get("updated_at")),
        assignee_id=usernames[0] if usernames else None,
        native_ref=native_ref,
    )


# -- the gitlab_api tool's input, GitLab's error bodies -------------------------------------------


def tool_path_segments(path: Any) -> list[str]:
    """The segments of a ``gitlab_api`` path under ``/api/v4`` (still URL-encoded), or a
    ``gitlab_api_path_refused`` error: only a plain absolute path on this instance passes."""

    def refuse(why: str) -> TrackerError:
        return TrackerError(
            f"gitlab_api path {str(path)[:200]!r} refused: {why}; give a path like "
            "/projects/group%2Fapp/issues/1/notes, parameters in `query`",
            code=ErrorCode.GITLAB_API_PATH_REFUSED,
        )

    if not isinstance(path, str) or not path.strip():
        raise refuse("it must be a non-empty string")
    if len(path) > MAX_TOOL_PATH_CHARS:
        raise refuse(f"longer than {MAX_TOOL_PATH_CHARS} characters")
    if not path.startswith("/"):
        raise refuse("it must start with / (a URL or host is not accepted)")
    if any(c in path for c in "?#\\") or any(ord(c) <= 32 or ord(c) == 127 for c in path):
        raise refuse("it must not hold ?, #, backslashes, spaces or control characters")
    relative: str = path
    if relative == API_PREFIX or relative.startswith(f"{API_PREFIX}/"):
        relative = relative[len(API_PREFIX) :]
    segments = relative.split("/")[1:]
    if not segments or any(not s for s in segments):
        raise refuse("empty segments (//) are not accepted")
    for segment in segments:
        decoded = unquote(segment)
        # NB: decoded too, so %2e%2e cannot climb out where a server decodes before routing.
        if decoded in (".", "..") or any(part in (".", "..") for part in decoded.split("/")):
            raise refuse("dot segments are not accepted")
        if "\\" in decoded or any(ord(c) < 32 for c in decoded):
            raise refuse("encoded backslashes or control characters are not accepted")
    return segments


def tool_query(query: Any) -> dict[str, str | list[str]] | None:
    if query is None:
        return None
    if not isinstance(query, Mapping):
        raise TrackerError(
            "gitlab_api `query` must be an object",
            code=ErrorCode.GITLAB_API_QUERY_INVALID,
        )
    params: dict[str, str | list[str]] = {}
    for name, value in query.items():
        if str(name).lower() in TOOL_REFUSED_PARAMETERS:
            raise TrackerError(
                f"gitlab_api query parameter {name!r} is not allowed (impersonation or "
                "credentials); the call runs as the orchestrator's token",
                code=ErrorCode.GITLAB_API_QUERY_INVALID,
            )
        if isinstance(value, list) and all(_scalar(v) for v in value):
            params[str(name)] = [_text(v) for v in value]
        elif _scalar(value):
            params[str(name)] = _text(value)
        else:
            raise TrackerError(
                f"gitlab_api query parameter {name!r} must be a string, number, boolean or a "
                "list of them",
                code=ErrorCode.GITLAB_API_QUERY_INVALID,
            )
    return params


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def _text(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def error_message(response: httpx.Response) -> str:
    """GitLab's error text: ``message`` (a string or a field→errors object), or ``error``."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str):
            return message[:BODY_SNIPPET_CHARS]
        if isinstance(message, Mapping | list):
            return json.dumps(message)[:BODY_SNIPPET_CHARS]
        error = body.get("error")
        if isinstance(error, str):
            detail = body.get("error_description")
            text = f"{error}: {detail}" if isinstance(detail, str) else error
            return text[:BODY_SNIPPET_CHARS]
    text = " ".join(response.text.split())
    return text[:BODY_SNIPPET_CHARS] or response.reason_phrase
