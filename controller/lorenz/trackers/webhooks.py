"""Tracker webhook deliveries: is a request really from its sender, and what is it about.

A tracker that can push tells Lorenz at once that an issue changed, instead of Lorenz finding out
at the next poll. But the route that takes those pushes is reachable by anyone who can reach the
server, so nothing in a delivery counts before it is verified the way its sender signs it:

* ``linear``: ``Linear-Signature`` is the hex HMAC-SHA256 of the raw body under the webhook's
  signing secret, and the body's ``webhookTimestamp`` (milliseconds) must be within
  :data:`LINEAR_MAX_SKEW_S` of now; delivery id ``Linear-Delivery``;
* ``github``: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``; delivery id
  ``X-GitHub-Delivery``, event ``X-GitHub-Event``;
* ``gitlab``: ``X-Gitlab-Token`` is the secret itself; event ``X-Gitlab-Event``, delivery id
  ``Idempotency-Key`` (GitLab 17.4+), else ``X-Gitlab-Event-UUID``;
* ``jira`` (Jira Cloud admin webhooks with a secret): ``X-Hub-Signature: sha256=<hex HMAC-SHA256
  of the raw body>``; delivery id ``X-Atlassian-Webhook-Identifier`` (unchanged across retries).

Verification needs only the headers, the raw bytes, the secret and the time: no tracker client,
no runtime, no HTTP framework. So the single-host route (``lorenz.server.webhooks``) and a future
operator-wide webhook Service verify with the same :func:`verify_delivery`, and keep replays out
with the same :class:`DeliveryLog`.

Every comparison of a secret or a signature is constant-time (:func:`hmac.compare_digest`). The
body is bounded before anything reads it: :data:`MAX_WEBHOOK_BODY_BYTES`, then a nesting depth
of :data:`MAX_WEBHOOK_DEPTH` measured before ``json.loads`` sees it (so a bracket bomb never
reaches the parser's recursion).

A verified delivery becomes a :class:`WebhookEvent`: which issues it names (ids and
identifiers as the sender spells them) and what happened to them (:class:`WebhookChange`).
Deliveries that name no issue (GitHub's ``ping``, a Linear project update) are verified events
too, with no issues: answered, and nothing else happens.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError

MAX_WEBHOOK_BODY_BYTES = 1024 * 1024
"""Largest delivery body taken (issue payloads are a few to a few hundred KiB; Jira's carry
every field of the issue)."""
MAX_WEBHOOK_DEPTH = 64
"""Deepest nesting of arrays and objects a delivery body may have."""
LINEAR_MAX_SKEW_S = 60.0
"""How far Linear's ``webhookTimestamp`` may be from now (either way) before a delivery is stale."""
MAX_ID_CHARS = 200
"""Longest delivery id, event name or issue id kept (longer ones are cut)."""

WEBHOOK_SIGNATURE_MISSING = ErrorCode.WEBHOOK_SIGNATURE_MISSING
WEBHOOK_SIGNATURE_INVALID = ErrorCode.WEBHOOK_SIGNATURE_INVALID
WEBHOOK_STALE = ErrorCode.WEBHOOK_STALE
WEBHOOK_BODY_TOO_LARGE = ErrorCode.WEBHOOK_BODY_TOO_LARGE
WEBHOOK_BODY_TOO_DEEP = ErrorCode.WEBHOOK_BODY_TOO_DEEP
WEBHOOK_BODY_INVALID = ErrorCode.WEBHOOK_BODY_INVALID
WEBHOOK_REPLAYED = ErrorCode.WEBHOOK_REPLAYED

UNAUTHENTICATED_CODES = frozenset({WEBHOOK_SIGNATURE_MISSING, WEBHOOK_SIGNATURE_INVALID})
"""Refusals that mean "not from the sender" (HTTP 401); every other refusal is a 400."""

WEBHOOK_REFUSAL_CODES: tuple[str, ...] = (
    WEBHOOK_SIGNATURE_MISSING,
    WEBHOOK_SIGNATURE_INVALID,
    WEBHOOK_STALE,
    WEBHOOK_BODY_TOO_LARGE,
    WEBHOOK_BODY_TOO_DEEP,
    WEBHOOK_BODY_INVALID,
    WEBHOOK_REPLAYED,
)
"""Every code a refused delivery can carry (docs/webhooks.md lists them)."""


class WebhookRefused(LorenzError):
    """A delivery that is not taken; ``code`` says why (one of :data:`WEBHOOK_REFUSAL_CODES`)."""

    code = WEBHOOK_SIGNATURE_INVALID

    @property
    def unauthenticated(self) -> bool:
        """Whether the sender could not be verified (as opposed to a bad or repeated body)."""
        return self.code in UNAUTHENTICATED_CODES


class WebhookChange(enum.StrEnum):
    """What a delivery says happened to the issues it names."""

    CREATED = "created"
    UPDATED = "updated"
    STATE_CHANGED = "state_changed"
    """State (or, for GitHub and GitLab, labels, which may be states) or open/closed changed."""
    REMOVED = "removed"
    OTHER = "other"
    """Nothing about an issue (a ping, a project or cycle update)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookEvent:
    """A verified delivery."""

    kind: str
    """The sender's tracker kind (``linear``, ``github``, ``gitlab``, ``jira``)."""
    delivery_id: str
    """The sender's delivery id, or ``sha256:<hex of the body>`` when it sent none."""
    event: str
    """The sender's own event name (``Issue``, ``issues``, ``Issue Hook``,
    ``jira:issue_updated``...)."""
    change: WebhookChange
    issue_ids: tuple[str, ...] = ()
    """Issue ids as the sender spells them (Linear's UUID, GitHub's number, GitLab's global id,
    Jira's numeric id)."""
    identifiers: tuple[str, ...] = ()
    """Human identifiers (``ENG-12``, ``owner/repo#7``, ``group/project#7``, ``PROJ-3``)."""
    state: str | None = None
    """The issue's state after the change, when the payload says it."""

    @property
    def names_issues(self) -> bool:
        return bool(self.issue_ids or self.identifiers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "delivery_id": self.delivery_id,
            "event": self.event,
            "change": self.change.value,
            "issue_ids": list(self.issue_ids),
            "identifiers": list(self.identifiers),
            "state": self.state,
        }


Headers = Mapping[str, str]
"""Request headers; looked up case-insensitively (a plain dict with any spelling works)."""


def verify_delivery(
    *, kind: str, headers: Headers, body: bytes, secret: str, now: float
) -> WebhookEvent:
    """The verified event of one delivery, or :class:`WebhookRefused`.

    ``kind``: one of :data:`WEBHOOK_KINDS`; ``now``: seconds since the epoch. The order is
    fixed: size, signature over the raw bytes, then (only for a verified body) depth, JSON,
    freshness and what it names. An unsigned body is never parsed.
    """
    sender = SENDERS.get(kind)
    if sender is None:
        raise ValueError(f"no webhook sender {kind!r}; known: {', '.join(WEBHOOK_KINDS)}")
    if len(body) > MAX_WEBHOOK_BODY_BYTES:
        raise body_too_large(len(body))
    lookup = _Headers(headers)
    sender.authenticate(lookup, body, secret)
    payload = _parse(body)
    sender.check_fresh(payload, now)
    return sender.describe(lookup, payload, body)


def body_too_large(size: int | None) -> WebhookRefused:
    told = f"{size} bytes" if size is not None else "the body"
    return WebhookRefused(
        f"{told} is more than the {MAX_WEBHOOK_BODY_BYTES} bytes a webhook delivery may carry; "
        "subscribe the webhook to issue events only",
        code=WEBHOOK_BODY_TOO_LARGE,
    )


# ----------------------------------------------------------------------------- replay guard


class DeliveryLog:
    """Delivery ids seen recently, to refuse a delivery that comes again (bounded, with a TTL).

    An entry lives ``ttl_s`` seconds; beyond ``max_entries`` the oldest go first. NB: a replay
    older than the TTL (or pushed out by a flood) gets through, and costs one coalesced refresh:
    the tracker is read, not trusted, so a replayed event changes nothing by itself.
    """

    def __init__(self, *, ttl_s: float = 24 * 3600.0, max_entries: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._expiry: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def seen(self, *, kind: str, delivery_id: str, now: float) -> bool:
        """Whether this delivery was recorded and has not expired."""
        self._expire(now)
        return (kind, delivery_id) in self._expiry

    def record(self, *, kind: str, delivery_id: str, now: float) -> bool:
        """Record a delivery; ``False`` if it was already there (a replay)."""
        if self.seen(kind=kind, delivery_id=delivery_id, now=now):
            return False
        self._expiry[(kind, delivery_id)] = now + self._ttl_s
        while len(self._expiry) > self._max_entries:
            self._expiry.popitem(last=False)
        return True

    def forget(self, *, kind: str, delivery_id: str) -> None:
        """Drop a delivery again (it was taken but could not be acted on: let a retry in)."""
        self._expiry.pop((kind, delivery_id), None)

    def _expire(self, now: float) -> None:
        # NB: entries are in insertion order and share one TTL, so expiry order is that order.
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                break
            del self._expiry[key]


def replayed(delivery_id: str) -> WebhookRefused:
    return WebhookRefused(
        f"delivery {delivery_id[:MAX_ID_CHARS]!r} was already taken; nothing to do again",
        code=WEBHOOK_REPLAYED,
    )


# ----------------------------------------------------------------------------- the senders


class _Headers:
    """Case-insensitive view of request headers."""

    def __init__(self, headers: Headers) -> None:
        self._headers = {str(k).lower(): str(v) for k, v in headers.items()}

    def get(self, name: str) -> str | None:
        value = self._headers.get(name.lower())
        return value.strip() if value is not None and value.strip() else None


@dataclasses.dataclass(frozen=True, slots=True)
class _Sender:
    kind: str
    authenticate: Callable[[_Headers, bytes, str], None]
    describe: Callable[[_Headers, Mapping[str, Any], bytes], WebhookEvent]
    check_fresh: Callable[[Mapping[str, Any], float], None]


def sign(body: bytes, secret: str) -> str:
    """The hex HMAC-SHA256 of ``body`` under ``secret`` (what Linear, GitHub and Jira send)."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def _missing(header: str, where: str) -> WebhookRefused:
    return WebhookRefused(
        f"the delivery has no {header} header; set the secret on the {where} webhook",
        code=WEBHOOK_SIGNATURE_MISSING,
    )


def _invalid(header: str) -> WebhookRefused:
    return WebhookRefused(
        f"the {header} header does not match the body under tracker.webhook_secret; set the same "
        "secret on both sides",
        code=WEBHOOK_SIGNATURE_INVALID,
    )


def _hmac_header(*, header: str, prefix: str, where: str) -> Callable[[_Headers, bytes, str], None]:
    def authenticate(headers: _Headers, body: bytes, secret: str) -> None:
        presented = headers.get(header)
        if presented is None:
            raise _missing(header, where)
        if prefix:
            scheme, _, presented = presented.partition("=")
            if scheme.strip().lower() != prefix:
                raise _invalid(header)
        expected = sign(body, secret)
        # NB: compare as bytes; a non-ASCII header value must fail, not raise TypeError.
        if not hmac.compare_digest(
            presented.strip().lower().encode("utf-8"), expected.encode("ascii")
        ):
            raise _invalid(header)

    return authenticate


def _gitlab_token(headers: _Headers, body: bytes, secret: str) -> None:
    presented = headers.get("X-Gitlab-Token")
    if presented is None:
        raise _missing("X-Gitlab-Token", "GitLab")
    if not hmac.compare_digest(presented.encode("utf-8"), secret.strip().encode("utf-8")):
        raise _invalid("X-Gitlab-Token")


def _always_fresh(payload: Mapping[str, Any], now: float) -> None:
    return None


def _linear_fresh(payload: Mapping[str, Any], now: float) -> None:
    stamp = payload.get("webhookTimestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise WebhookRefused(
            "the Linear delivery has no numeric webhookTimestamp; send Linear's own deliveries "
            "only",
            code=WEBHOOK_STALE,
        )
    skew = abs(now - float(stamp) / 1000.0)
    if skew > LINEAR_MAX_SKEW_S:
        raise WebhookRefused(
            f"the Linear delivery's webhookTimestamp is {skew:.0f} s away from this host's clock "
            f"(more than {LINEAR_MAX_SKEW_S:.0f} s); check the clock (NTP) if this repeats",
            code=WEBHOOK_STALE,
        )


# ----------------------------------------------------------------------------- parsing

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def _depth_exceeds(body: bytes, limit: int) -> bool:
    depth = 0
    for match in _BRACKETS.finditer(_JSON_STRING.sub(b'""', body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth = max(depth - 1, 0)
    return False


def _parse(body: bytes) -> Mapping[str, Any]:
    if _depth_exceeds(body, MAX_WEBHOOK_DEPTH):
        raise WebhookRefused(
            f"the delivery nests deeper than {MAX_WEBHOOK_DEPTH} levels; it is not a tracker's",
            code=WEBHOOK_BODY_TOO_DEEP,
        )
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        raise WebhookRefused(
            "the delivery is not a UTF-8 JSON object; configure the webhook to send JSON "
            "(GitHub: content type application/json)",
            code=WEBHOOK_BODY_INVALID,
        )
    return payload


def _text(value: Any) -> str | None:
    """A string or integer id as text (cut to :data:`MAX_ID_CHARS`); anything else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()[:MAX_ID_CHARS]
    return None


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _delivery_id(headers: _Headers, names: tuple[str, ...], body: bytes) -> str:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value[:MAX_ID_CHARS]
    # NB: no id from the sender: the body itself (its timestamps make it unique per event).
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _ids(*values: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(text for text in map(_text, values) if text is not None))


# ----------------------------------------------------------------------------- what it names


def _describe_linear(headers: _Headers, payload: Mapping[str, Any], body: bytes) -> WebhookEvent:
    kind = _text(payload.get("type")) or _text(headers.get("Linear-Event")) or ""
    action = _text(payload.get("action")) or ""
    data = _object(payload.get("data"))
    delivery = _delivery_id(headers, ("Linear-Delivery",), body)
    if kind == "Issue":
        changed = _object(payload.get("updatedFrom"))
        moved = "stateId" in changed
        change = {"create": WebhookChange.CREATED, "remove": WebhookChange.REMOVED}.get(
            action, WebhookChange.STATE_CHANGED if moved else WebhookChange.UPDATED
        )
        return WebhookEvent(
            kind="linear", delivery_id=delivery, event=kind, change=change,
            issue_ids=_ids(data.get("id")), identifiers=_ids(data.get("identifier")),
            state=_text(_object(data.get("state")).get("name")),
        )
    # Comments, labels on an issue, attachments...: they name the issue they belong to.
    issue = _object(data.get("issue"))
    ids = _ids(data.get("issueId"), issue.get("id"))
    if ids:
        return WebhookEvent(
            kind="linear", delivery_id=delivery, event=kind or "unknown",
            change=WebhookChange.UPDATED, issue_ids=ids,
            identifiers=_ids(issue.get("identifier")),
        )
    return WebhookEvent(kind="linear", delivery_id=delivery, event=kind or "unknown",
                        change=WebhookChange.OTHER)


_GITHUB_ISSUE_ACTIONS = {
    "opened": WebhookChange.CREATED,
    "deleted": WebhookChange.REMOVED,
    "transferred": WebhookChange.REMOVED,
    "closed": WebhookChange.STATE_CHANGED,
    "reopened": WebhookChange.STATE_CHANGED,
    "labeled": WebhookChange.STATE_CHANGED,
    "unlabeled": WebhookChange.STATE_CHANGED,
}


def _describe_github(headers: _Headers, payload: Mapping[str, Any], body: bytes) -> WebhookEvent:
    event = (headers.get("X-GitHub-Event") or "unknown")[:MAX_ID_CHARS]
    delivery = _delivery_id(headers, ("X-GitHub-Delivery",), body)
    issue = _object(payload.get("issue"))
    number = _text(issue.get("number"))
    if event not in ("issues", "issue_comment") or number is None:
        return WebhookEvent(kind="github", delivery_id=delivery, event=event,
                            change=WebhookChange.OTHER)
    action = _text(payload.get("action")) or ""
    change = (
        _GITHUB_ISSUE_ACTIONS.get(action, WebhookChange.UPDATED)
        if event == "issues" else WebhookChange.UPDATED
    )
    repository = _text(_object(payload.get("repository")).get("full_name"))
    return WebhookEvent(
        kind="github", delivery_id=delivery, event=event, change=change,
        issue_ids=(number,),
        identifiers=(f"{repository}#{number}",) if repository else (),
        state=_text(issue.get("state")),
    )


_GITLAB_ISSUE_ACTIONS = {
    "open": WebhookChange.CREATED,
    "close": WebhookChange.STATE_CHANGED,
    "reopen": WebhookChange.STATE_CHANGED,
}


def _describe_gitlab(headers: _Headers, payload: Mapping[str, Any], body: bytes) -> WebhookEvent:
    event = (headers.get("X-Gitlab-Event") or _text(payload.get("object_kind")) or "unknown")
    event = event[:MAX_ID_CHARS]
    delivery = _delivery_id(headers, ("Idempotency-Key", "X-Gitlab-Event-UUID"), body)
    object_kind = _text(payload.get("object_kind"))
    attributes = _object(payload.get("object_attributes"))
    path = _text(_object(payload.get("project")).get("path_with_namespace"))
    if object_kind in ("issue", "work_item"):
        action = _text(attributes.get("action")) or ""
        changes = _object(payload.get("changes"))
        change = _GITLAB_ISSUE_ACTIONS.get(
            action,
            WebhookChange.STATE_CHANGED
            if "labels" in changes or "state_id" in changes
            else WebhookChange.UPDATED,
        )
        issue: Mapping[str, Any] = attributes
    elif object_kind == "note" and payload.get("issue") is not None:
        change, issue = WebhookChange.UPDATED, _object(payload.get("issue"))
    else:
        return WebhookEvent(kind="gitlab", delivery_id=delivery, event=event,
                            change=WebhookChange.OTHER)
    iid = _text(issue.get("iid"))
    return WebhookEvent(
        kind="gitlab", delivery_id=delivery, event=event, change=change,
        issue_ids=_ids(issue.get("id")),
        identifiers=(f"{path}#{iid}",) if path and iid else _ids(iid),
        state=_text(issue.get("state")),
    )


def _describe_jira(headers: _Headers, payload: Mapping[str, Any], body: bytes) -> WebhookEvent:
    event = (_text(payload.get("webhookEvent")) or "unknown")[:MAX_ID_CHARS]
    delivery = _delivery_id(headers, ("X-Atlassian-Webhook-Identifier",), body)
    issue = _object(payload.get("issue"))
    ids, keys = _ids(issue.get("id")), _ids(issue.get("key"))
    if not (ids or keys):
        return WebhookEvent(kind="jira", delivery_id=delivery, event=event,
                            change=WebhookChange.OTHER)
    if event == "jira:issue_created":
        change = WebhookChange.CREATED
    elif event == "jira:issue_deleted":
        change = WebhookChange.REMOVED
    else:
        items = _object(payload.get("changelog")).get("items")
        fields = {
            _object(item).get("field") for item in (items if isinstance(items, list) else [])
        }
        change = WebhookChange.STATE_CHANGED if "status" in fields else WebhookChange.UPDATED
    status = _object(_object(issue.get("fields")).get("status")).get("name")
    return WebhookEvent(kind="jira", delivery_id=delivery, event=event, change=change,
                        issue_ids=ids, identifiers=keys, state=_text(status))


SENDERS: Mapping[str, _Sender] = {
    "linear": _Sender(
        kind="linear",
        authenticate=_hmac_header(header="Linear-Signature", prefix="", where="Linear"),
        describe=_describe_linear,
        check_fresh=_linear_fresh,
    ),
    "github": _Sender(
        kind="github",
        authenticate=_hmac_header(header="X-Hub-Signature-256", prefix="sha256", where="GitHub"),
        describe=_describe_github,
        check_fresh=_always_fresh,
    ),
    "gitlab": _Sender(
        kind="gitlab",
        authenticate=_gitlab_token,
        describe=_describe_gitlab,
        check_fresh=_always_fresh,
    ),
    "jira": _Sender(
        kind="jira",
        authenticate=_hmac_header(header="X-Hub-Signature", prefix="sha256", where="Jira"),
        describe=_describe_jira,
        check_fresh=_always_fresh,
    ),
}

WEBHOOK_KINDS: tuple[str, ...] = tuple(SENDERS)
"""Tracker kinds whose webhooks can be verified."""
