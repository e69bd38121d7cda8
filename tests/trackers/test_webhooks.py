"""Webhook verification per sender, with real HMACs computed here the way each sender does."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from lorenz.trackers.webhooks import (
    LINEAR_MAX_SKEW_S,
    MAX_WEBHOOK_BODY_BYTES,
    MAX_WEBHOOK_DEPTH,
    WEBHOOK_BODY_INVALID,
    WEBHOOK_BODY_TOO_DEEP,
    WEBHOOK_BODY_TOO_LARGE,
    WEBHOOK_SIGNATURE_INVALID,
    WEBHOOK_SIGNATURE_MISSING,
    WEBHOOK_STALE,
    DeliveryLog,
    WebhookChange,
    WebhookRefused,
    verify_delivery,
)

SECRET = "whsec-test-0123456789"
NOW = 1_780_000_000.0


def hex_hmac(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def dumps(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def linear_issue(
    action: str = "create", *, at: float = NOW, updated_from: dict[str, Any] | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "action": action,
        "type": "Issue",
        "data": {"id": "8f1e-uuid", "identifier": "ENG-12", "state": {"name": "Todo"}},
        "webhookTimestamp": int(at * 1000),
    }
    if updated_from is not None:
        payload["updatedFrom"] = updated_from
    return payload


def linear_headers(body: bytes, *, delivery: str = "d-1") -> dict[str, str]:
    return {"Linear-Signature": hex_hmac(body), "Linear-Delivery": delivery,
            "Linear-Event": "Issue", "Content-Type": "application/json"}


def verify(kind: str, headers: dict[str, str], body: bytes, *, now: float = NOW) -> Any:
    return verify_delivery(kind=kind, headers=headers, body=body, secret=SECRET, now=now)


def refused(kind: str, headers: dict[str, str], body: bytes, *, now: float = NOW) -> str:
    with pytest.raises(WebhookRefused) as caught:
        verify(kind, headers, body, now=now)
    return caught.value.code


# ----------------------------------------------------------------------------- Linear


def test_linear_signed_issue_creation_names_the_issue() -> None:
    body = dumps(linear_issue())
    event = verify("linear", linear_headers(body), body)
    assert event.kind == "linear"
    assert event.delivery_id == "d-1"
    assert event.change is WebhookChange.CREATED
    assert event.issue_ids == ("8f1e-uuid",)
    assert event.identifiers == ("ENG-12",)
    assert event.state == "Todo"


def test_linear_state_change_removal_and_comment() -> None:
    moved = dumps(linear_issue("update", updated_from={"stateId": "old"}))
    assert verify("linear", linear_headers(moved), moved).change is WebhookChange.STATE_CHANGED
    edited = dumps(linear_issue("update", updated_from={"title": "old"}))
    assert verify("linear", linear_headers(edited), edited).change is WebhookChange.UPDATED
    removed = dumps(linear_issue("remove"))
    assert verify("linear", linear_headers(removed), removed).change is WebhookChange.REMOVED
    comment = dumps({"action": "create", "type": "Comment", "webhookTimestamp": int(NOW * 1000),
                     "data": {"id": "c-1", "issueId": "8f1e-uuid", "body": "hi"}})
    event = verify("linear", linear_headers(comment), comment)
    assert (event.change, event.issue_ids) == (WebhookChange.UPDATED, ("8f1e-uuid",))
    project = dumps({"action": "update", "type": "Project", "webhookTimestamp": int(NOW * 1000),
                     "data": {"id": "p-1"}})
    event = verify("linear", linear_headers(project), project)
    assert event.change is WebhookChange.OTHER
    assert not event.names_issues


def test_linear_refuses_missing_wrong_and_tampered_signatures() -> None:
    body = dumps(linear_issue())
    headers = linear_headers(body)
    del headers["Linear-Signature"]
    assert refused("linear", headers, body) == WEBHOOK_SIGNATURE_MISSING
    wrong = linear_headers(body) | {"Linear-Signature": hex_hmac(body, "another-secret")}
    assert refused("linear", wrong, body) == WEBHOOK_SIGNATURE_INVALID
    tampered = body.replace(b"ENG-12", b"ENG-13")
    assert refused("linear", linear_headers(body), tampered) == WEBHOOK_SIGNATURE_INVALID
    non_ascii = linear_headers(body) | {"Linear-Signature": "é" * 64}
    assert refused("linear", non_ascii, body) == WEBHOOK_SIGNATURE_INVALID


def test_linear_refuses_stale_future_and_untimed_deliveries() -> None:
    old = dumps(linear_issue(at=NOW - LINEAR_MAX_SKEW_S - 1))
    assert refused("linear", linear_headers(old), old) == WEBHOOK_STALE
    future = dumps(linear_issue(at=NOW + LINEAR_MAX_SKEW_S + 1))
    assert refused("linear", linear_headers(future), future) == WEBHOOK_STALE
    untimed = dumps({"action": "create", "type": "Issue", "data": {"id": "x"}})
    assert refused("linear", linear_headers(untimed), untimed) == WEBHOOK_STALE
    edge = dumps(linear_issue(at=NOW - LINEAR_MAX_SKEW_S + 1))
    assert verify("linear", linear_headers(edge), edge).change is WebhookChange.CREATED


def test_headers_are_matched_whatever_their_case() -> None:
    body = dumps(linear_issue())
    lower = {name.lower(): value for name, value in linear_headers(body).items()}
    assert verify("linear", lower, body).delivery_id == "d-1"


# ----------------------------------------------------------------------------- GitHub


def github(
    event: str, payload: dict[str, Any], *, delivery: str = "g-1"
) -> tuple[dict[str, str], bytes]:
    body = dumps(payload)
    return {"X-Hub-Signature-256": "sha256=" + hex_hmac(body), "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery}, body


ISSUE = {"number": 7, "state": "open", "title": "t"}
REPO = {"full_name": "acme/app"}


@pytest.mark.parametrize(
    ("event", "action", "change"),
    [
        ("issues", "opened", WebhookChange.CREATED),
        ("issues", "reopened", WebhookChange.STATE_CHANGED),
        ("issues", "closed", WebhookChange.STATE_CHANGED),
        ("issues", "labeled", WebhookChange.STATE_CHANGED),
        ("issues", "edited", WebhookChange.UPDATED),
        ("issues", "deleted", WebhookChange.REMOVED),
        ("issue_comment", "created", WebhookChange.UPDATED),
    ],
)
def test_github_issue_events(event: str, action: str, change: WebhookChange) -> None:
    headers, body = github(event, {"action": action, "issue": ISSUE, "repository": REPO})
    verified = verify("github", headers, body)
    assert verified.change is change
    assert verified.issue_ids == ("7",)
    assert verified.identifiers == ("acme/app#7",)
    assert verified.event == event
    assert verified.delivery_id == "g-1"


def test_github_ping_is_verified_and_names_nothing() -> None:
    headers, body = github("ping", {"zen": "Keep it logically awesome.", "hook_id": 1})
    event = verify("github", headers, body)
    assert event.change is WebhookChange.OTHER
    assert not event.names_issues


def test_github_refusals() -> None:
    headers, body = github("issues", {"action": "opened", "issue": ISSUE, "repository": REPO})
    assert refused("github", {k: v for k, v in headers.items() if "Signature" not in k},
                   body) == WEBHOOK_SIGNATURE_MISSING
    bare = headers | {"X-Hub-Signature-256": hex_hmac(body)}  # no "sha256=" prefix
    assert refused("github", bare, body) == WEBHOOK_SIGNATURE_INVALID
    sha1 = headers | {"X-Hub-Signature-256": "sha1=" + hex_hmac(body)}
    assert refused("github", sha1, body) == WEBHOOK_SIGNATURE_INVALID
    # NB: a Linear-style signature is not GitHub's: the header names are per sender.
    linear_style = {"Linear-Signature": hex_hmac(body), "X-GitHub-Event": "issues"}
    assert refused("github", linear_style, body) == WEBHOOK_SIGNATURE_MISSING


# ----------------------------------------------------------------------------- GitLab


def gitlab(payload: dict[str, Any], **headers: str) -> tuple[dict[str, str], bytes]:
    return {"X-Gitlab-Token": SECRET, "X-Gitlab-Event": "Issue Hook", **headers}, dumps(payload)


def test_gitlab_issue_hook_and_token() -> None:
    payload: dict[str, Any] = {"object_kind": "issue",
                               "project": {"path_with_namespace": "grp/app"},
                               "object_attributes": {"id": 9001, "iid": 4, "action": "reopen",
                                     "state": "opened"}}
    headers, body = gitlab(payload, **{"Idempotency-Key": "idem-1",
                                       "X-Gitlab-Event-UUID": "uuid-1"})
    event = verify("gitlab", headers, body)
    assert event.change is WebhookChange.STATE_CHANGED
    assert event.issue_ids == ("9001",)
    assert event.identifiers == ("grp/app#4",)
    assert event.delivery_id == "idem-1"  # Idempotency-Key first, the event UUID otherwise
    del headers["Idempotency-Key"]
    assert verify("gitlab", headers, body).delivery_id == "uuid-1"
    del headers["X-Gitlab-Event-UUID"]
    assert verify("gitlab", headers, body).delivery_id.startswith("sha256:")
    labels = {**payload, "object_attributes": {**payload["object_attributes"],
                                               "action": "update"},
              "changes": {"labels": {"previous": [], "current": []}}}
    headers, body = gitlab(labels)
    assert verify("gitlab", headers, body).change is WebhookChange.STATE_CHANGED


def test_gitlab_refuses_a_missing_or_wrong_token() -> None:
    headers, body = gitlab({"object_kind": "issue", "object_attributes": {"id": 1, "iid": 1}})
    assert refused("gitlab", {"X-Gitlab-Event": "Issue Hook"}, body) == WEBHOOK_SIGNATURE_MISSING
    assert refused("gitlab", headers | {"X-Gitlab-Token": SECRET + "x"},
                   body) == WEBHOOK_SIGNATURE_INVALID
    assert refused("gitlab", headers | {"X-Gitlab-Token": hex_hmac(body)},
                   body) == WEBHOOK_SIGNATURE_INVALID


def test_gitlab_note_on_an_issue_names_the_issue() -> None:
    headers, body = gitlab({"object_kind": "note", "issue": {"id": 5, "iid": 2},
                            "project": {"path_with_namespace": "grp/app"},
                            "object_attributes": {"note": "hi"}}, **{"X-Gitlab-Event": "Note Hook"})
    event = verify("gitlab", headers, body)
    assert (event.change, event.identifiers) == (WebhookChange.UPDATED, ("grp/app#2",))


# ----------------------------------------------------------------------------- Jira


def jira(payload: dict[str, Any], *, delivery: str = "j-1") -> tuple[dict[str, str], bytes]:
    body = dumps(payload)
    return {"X-Hub-Signature": "sha256=" + hex_hmac(body),
            "X-Atlassian-Webhook-Identifier": delivery}, body


JIRA_ISSUE = {"id": "10001", "key": "PROJ-3", "fields": {"status": {"name": "In Progress"}}}


def test_jira_signed_events() -> None:
    headers, body = jira({"webhookEvent": "jira:issue_created", "issue": JIRA_ISSUE})
    event = verify("jira", headers, body)
    assert event.change is WebhookChange.CREATED
    assert (event.issue_ids, event.identifiers) == (("10001",), ("PROJ-3",))
    assert event.state == "In Progress"
    assert event.delivery_id == "j-1"
    headers, body = jira({"webhookEvent": "jira:issue_updated", "issue": JIRA_ISSUE,
                          "changelog": {"items": [{"field": "status", "toString": "Done"}]}})
    assert verify("jira", headers, body).change is WebhookChange.STATE_CHANGED
    headers, body = jira({"webhookEvent": "jira:issue_updated", "issue": JIRA_ISSUE,
                          "changelog": {"items": [{"field": "summary"}]}})
    assert verify("jira", headers, body).change is WebhookChange.UPDATED
    headers, body = jira({"webhookEvent": "jira:issue_deleted", "issue": JIRA_ISSUE})
    assert verify("jira", headers, body).change is WebhookChange.REMOVED


def test_jira_refusals() -> None:
    headers, body = jira({"webhookEvent": "jira:issue_created", "issue": JIRA_ISSUE})
    assert refused("jira", {"X-Atlassian-Webhook-Identifier": "j"}, body) == (
        WEBHOOK_SIGNATURE_MISSING
    )
    # NB: GitHub's header is not Jira's, even with the same value.
    assert refused("jira", {"X-Hub-Signature-256": headers["X-Hub-Signature"]}, body) == (
        WEBHOOK_SIGNATURE_MISSING
    )
    assert refused("jira", headers | {"X-Hub-Signature": "sha256=" + "0" * 64}, body) == (
        WEBHOOK_SIGNATURE_INVALID
    )


# ----------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("kind", ["linear", "github", "jira"])
def test_oversized_bodies_are_refused_before_the_signature_is_computed(kind: str) -> None:
    body = b" " * (MAX_WEBHOOK_BODY_BYTES + 1)
    signature = hex_hmac(body)
    headers = {"Linear-Signature": signature, "X-Hub-Signature-256": "sha256=" + signature,
               "X-Hub-Signature": "sha256=" + signature}
    assert refused(kind, headers, body) == WEBHOOK_BODY_TOO_LARGE


def test_signed_bodies_that_are_too_deep_or_not_json_objects_are_refused() -> None:
    deep = b"[" * (MAX_WEBHOOK_DEPTH + 1) + b"]" * (MAX_WEBHOOK_DEPTH + 1)
    headers, _ = github("issues", {})
    sign = {"X-Hub-Signature-256": "sha256=" + hex_hmac(deep), "X-GitHub-Event": "issues"}
    assert refused("github", headers | sign, deep) == WEBHOOK_BODY_TOO_DEEP
    # Brackets inside strings do not count.
    text = dumps({"title": "[" * 500})
    sign = {"X-Hub-Signature-256": "sha256=" + hex_hmac(text), "X-GitHub-Event": "issues"}
    assert verify("github", sign, text).change is WebhookChange.OTHER
    for bad in (b"[1, 2]", b"not json", b"\xff\xfe", b""):
        sign = {"X-Hub-Signature-256": "sha256=" + hex_hmac(bad), "X-GitHub-Event": "issues"}
        assert refused("github", sign, bad) == WEBHOOK_BODY_INVALID


def test_wrong_types_in_a_signed_payload_never_raise() -> None:
    payload: dict[str, Any] = {
        "action": ["x"], "issue": {"number": True, "state": 3}, "repository": "nope"
    }
    headers, body = github("issues", payload)
    assert verify("github", headers, body).change is WebhookChange.OTHER
    payload = {"webhookEvent": 5, "issue": {"id": {"x": 1}, "key": "K-1"},
               "changelog": {"items": ["s", 3]}}
    headers, body = jira(payload)
    assert verify("jira", headers, body).identifiers == ("K-1",)


def test_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="files"):
        verify("files", {}, b"{}")


# ----------------------------------------------------------------------------- replays


def test_delivery_log_refuses_replays_within_its_ttl_and_stays_bounded() -> None:
    log = DeliveryLog(ttl_s=60.0, max_entries=3)
    assert log.record(kind="github", delivery_id="a", now=0.0)
    assert not log.record(kind="github", delivery_id="a", now=59.0)
    assert log.record(kind="linear", delivery_id="a", now=1.0)  # per kind
    assert log.record(kind="github", delivery_id="a", now=61.0)  # expired: taken again
    for name in ("b", "c", "d", "e"):
        log.record(kind="github", delivery_id=name, now=62.0)
    assert len(log) == 3
    assert not log.seen(kind="github", delivery_id="b", now=62.0)  # the oldest went first
    log.forget(kind="github", delivery_id="e")
    assert log.record(kind="github", delivery_id="e", now=63.0)
