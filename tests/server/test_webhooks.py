"""``POST /api/v1/webhooks/<kind>`` over real HTTP: a real server, a real runtime, and for Linear
the Linear fake as the tracker (its request log is how tracker reads are counted).

The poll interval is 10 minutes in these tests, so a run that starts (or stops) within the
test's bounds can only have been started (or stopped) by a delivery.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lorenz.config import TrackerKind
from lorenz.model import RefreshReceipt
from lorenz.server.app import WEBHOOKS_KEY
from lorenz.server.webhooks import REFRESH_MIN_GAP_S, RefreshCoalescer
from lorenz.trackers import LinearTracker, MemoryTracker
from lorenz.trackers.webhooks import (
    LINEAR_MAX_SKEW_S,
    MAX_WEBHOOK_BODY_BYTES,
    MAX_WEBHOOK_DEPTH,
)
from lorenz.workflow import load_workflow
from tests.fakes.linear_server import FakeLinearServer
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.server.helpers import WAITING_AGENT, Served, make_rig, release, serve
from tests.waiting import wait_until_async

SECRET = "whsec-server-test-7d1f0c"
TEN_MINUTES_MS = 600_000


def hex_hmac(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def linear_delivery(
    issue_id: str, identifier: str, *, action: str = "create", delivery: str,
    at: float | None = None, updated_from: dict[str, Any] | None = None,
) -> tuple[dict[str, str], bytes]:
    payload: dict[str, Any] = {
        "action": action, "type": "Issue",
        "data": {"id": issue_id, "identifier": identifier},
        "webhookTimestamp": int((time.time() if at is None else at) * 1000),
    }
    if updated_from is not None:
        payload["updatedFrom"] = updated_from
    body = json.dumps(payload).encode()
    return {"Content-Type": "application/json", "Linear-Signature": hex_hmac(body),
            "Linear-Delivery": delivery, "Linear-Event": "Issue"}, body


async def linear_served(tmp_path: Path, linear: FakeLinearServer, **tracker: Any) -> Served:
    """A runtime on the Linear fake with webhooks on and a 10-minute poll, served."""
    agent = write_agent(tmp_path, "agent", WAITING_AGENT)
    path = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": "linear", "endpoint": linear.url, "api_key": linear.api_key,
                    "project_slug": linear.project_slug, "webhook_secret": SECRET, **tracker},
        "polling": {"interval_ms": TEN_MINUTES_MS},
    })
    settings = load_workflow(path, environ={}).settings
    client = LinearTracker(settings=settings, api_key=linear.api_key, endpoint=linear.url)
    return await serve(build_rig(path, tracker=client))


async def started(served: Served) -> asyncio.Task[None]:
    """Start the runtime loop and wait until its first tick is over (it then sleeps 10 min)."""
    task = asyncio.get_running_loop().create_task(served.rig.runtime.start())
    await wait_until_async(
        lambda: bool(served.rig.of_type("poll_completed")),
        timeout=30,
        what='bool(served.rig.of_type("poll_completed"))',
    )
    return task


async def post(
    http: aiohttp.ClientSession, served: Served, kind: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{served.url}/api/v1/webhooks/{kind}", data=body,
                         headers=headers) as response:
        return response.status, await response.json()


def code(document: dict[str, Any]) -> str:
    value: str = document["error"]["code"]
    return value


async def metric(http: aiohttp.ClientSession, served: Served, outcome: str) -> float:
    async with http.get(f"{served.url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("lorenz_webhook_requests_total{") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_started_for(served: Served, identifier: str) -> bool:
    return any(e.get("issue_identifier") == identifier or identifier in json.dumps(e)
               for e in served.rig.of_type("run_started"))


def idle(served: Served) -> bool:
    return served.rig.runtime.poll_status().status == "idle"


# ----------------------------------------------------------------------------- off and routing


async def test_the_route_is_off_without_a_webhook_secret(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await serve(make_rig(tmp_path, issues=[]))
    headers, body = linear_delivery("x", "ENG-1", delivery="d")
    status, document = await post(http, served, "linear", headers, body)
    assert (status, code(document)) == (404, "webhook_not_found")
    assert "tracker.webhook_secret" in document["error"]["message"]
    assert await metric(http, served, "webhook_not_found") == 1


async def test_a_kind_that_is_not_the_workflows_tracker_is_404(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    served = await linear_served(tmp_path, linear_server)
    polls = served.rig.runtime.poll_count
    body = b'{"action": "opened", "issue": {"number": 1}}'
    for kind in ("github", "gitlab", "jira", "files", "memory", "nope"):
        status, document = await post(
            http, served, kind, {"X-Hub-Signature-256": "sha256=" + hex_hmac(body),
                                 "X-Gitlab-Token": SECRET, "Content-Type": "application/json"},
            body,
        )
        assert (status, code(document)) == (404, "webhook_not_found"), kind
    assert served.rig.runtime.poll_count == polls
    assert not served.rig.of_type("refresh_requested")


async def test_no_bearer_token_and_no_same_origin_needed_but_host_and_type_still_checked(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    served = await linear_served(tmp_path, linear_server)
    issue = linear_server.add_issue(title="From a browser?")
    headers, body = linear_delivery(issue.id, issue.identifier, delivery="o-1")
    # A cross-site Origin does not matter to a signed delivery (no token either).
    status, _ = await post(http, served, "linear",
                           headers | {"Origin": "https://linear.app",
                                      "Sec-Fetch-Site": "cross-site"}, body)
    assert status == 202
    headers, body = linear_delivery(issue.id, issue.identifier, delivery="o-2")
    status, document = await post(http, served, "linear", headers | {"Host": "evil.example"},
                                  body)
    assert (status, code(document)) == (403, "host_not_allowed")
    headers, body = linear_delivery(issue.id, issue.identifier, delivery="o-3")
    status, document = await post(http, served, "linear",
                                  headers | {"Content-Type": "text/plain"}, body)
    assert (status, code(document)) == (415, "unsupported_media_type")
    # The exemption is the route's, not a path prefix's: other POST routes still need a token.
    async with http.post(f"{served.url}/api/v1/refresh") as response:
        assert response.status == 401


# ----------------------------------------------------------------------------- refusals


async def test_bad_missing_stale_oversized_deep_and_replayed_deliveries_change_nothing(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    served = await linear_served(tmp_path, linear_server)
    await served.rig.runtime.poll_once()
    issue = linear_server.add_issue(title="Watched")
    polls, reads = served.rig.runtime.poll_count, len(linear_server.requests)

    headers, body = linear_delivery(issue.id, issue.identifier, delivery="r-1")
    unsigned = {k: v for k, v in headers.items() if k != "Linear-Signature"}
    wrong = headers | {"Linear-Signature": hex_hmac(body, "not-the-secret")}
    stale_headers, stale_body = linear_delivery(
        issue.id, issue.identifier, delivery="r-2", at=time.time() - LINEAR_MAX_SKEW_S - 5
    )
    big = b'{"pad": "' + b"x" * MAX_WEBHOOK_BODY_BYTES + b'"}'
    deep = b"[" * (MAX_WEBHOOK_DEPTH + 1) + b"]" * (MAX_WEBHOOK_DEPTH + 1)
    cases = [
        ("missing", unsigned, body, 401, "webhook_signature_missing"),
        ("wrong", wrong, body, 401, "webhook_signature_invalid"),
        ("tampered", headers, body.replace(b"create", b"remove"), 401,
         "webhook_signature_invalid"),
        ("stale", stale_headers, stale_body, 400, "webhook_stale"),
        ("oversized", headers | {"Linear-Signature": hex_hmac(big)}, big, 400,
         "webhook_body_too_large"),
        ("deep", headers | {"Linear-Signature": hex_hmac(deep)}, deep, 400,
         "webhook_body_too_deep"),
        ("not json", headers | {"Linear-Signature": hex_hmac(b"[]")}, b"[]", 400,
         "webhook_body_invalid"),
    ]
    for name, case_headers, case_body, status, expected in cases:
        got, document = await post(http, served, "linear", case_headers, case_body)
        assert (got, code(document)) == (status, expected), name
        assert document["error"]["message"], name
        assert await metric(http, served, expected) >= 1, name

    # Chunked (no Content-Length) and over the cap: cut off while reading.
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_WEBHOOK_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    async with http.post(f"{served.url}/api/v1/webhooks/linear", data=chunks(),
                         headers=headers) as response:
        assert response.status == 400
        assert code(await response.json()) == "webhook_body_too_large"

    assert served.rig.runtime.poll_count == polls
    assert len(linear_server.requests) == reads
    assert not served.rig.of_type("refresh_requested")

    # The good one is taken once; the same delivery again is a replay, and queues nothing.
    status, document = await post(http, served, "linear", headers, body)
    assert status == 202, document
    assert document["event"]["identifiers"] == [issue.identifier]
    await wait_until_async(
        lambda: served.rig.runtime.poll_count > polls,
        timeout=15.0,
        what="served.rig.runtime.poll_count > polls",
    )
    await wait_until_async(lambda: idle(served), timeout=15.0, what="idle(served)")
    refreshes = len(served.rig.of_type("refresh_requested"))
    status, document = await post(http, served, "linear", headers, body)
    assert (status, code(document)) == (400, "webhook_replayed")
    assert len(served.rig.of_type("refresh_requested")) == refreshes
    assert await metric(http, served, "accepted") == 1
    assert await metric(http, served, "webhook_replayed") == 1


# ------------------------------------------------------------------- starting and stopping


async def test_a_verified_creation_starts_the_agent_long_before_the_poll_would(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    served = await linear_served(tmp_path, linear_server)
    loop_task = await started(served)
    assert served.rig.runtime.settings.polling.interval_ms == TEN_MINUTES_MS
    assert not served.rig.of_type("run_started")

    issue = linear_server.add_issue(title="Pushed", state="Todo")
    headers, body = linear_delivery(issue.id, issue.identifier, delivery="s-1")
    sent = time.monotonic()
    status, document = await post(http, served, "linear", headers, body)
    assert status == 202, document
    assert document["refresh"]["queued"] is True
    # NB: only the delivery can explain a start before the 10-minute poll.
    await wait_until_async(
        lambda: run_started_for(served, issue.identifier),
        timeout=30,
        what="run_started_for(served, issue.identifier)",
    )
    latency = time.monotonic() - sent
    assert latency < TEN_MINUTES_MS / 1000.0
    release(served.rig, issue.identifier)
    served.rig.runtime.stop()
    await asyncio.wait_for(loop_task, timeout=60)


async def test_a_verified_move_to_a_terminal_state_stops_the_run(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    issue = linear_server.add_issue(title="Will be done elsewhere", state="Todo")
    served = await linear_served(tmp_path, linear_server)
    loop_task = await started(served)
    await wait_until_async(
        lambda: run_started_for(served, issue.identifier),
        timeout=30,
        what="run_started_for(served, issue.identifier)",
    )

    linear_server.set_state(issue.id, "Done")
    headers, body = linear_delivery(issue.id, issue.identifier, action="update",
                                    delivery="t-1", updated_from={"stateId": "old"})
    status, document = await post(http, served, "linear", headers, body)
    assert status == 202, document
    assert document["event"]["change"] == "state_changed"
    # As reconciliation does: the turn in progress gets its grace, then the run is stopped.
    stops = ("run_finishing", "run_canceled", "workspace_cleanup")
    await wait_until_async(
        lambda: any(
            '"terminal"' in json.dumps(event)
            for kind in stops
            for event in served.rig.of_type(kind)
        ),
        timeout=30,
        what="a stop event that names the terminal state",
    )
    served.rig.runtime.stop()
    await asyncio.wait_for(loop_task, timeout=60)


async def test_a_burst_of_a_thousand_deliveries_costs_few_tracker_reads(
    tmp_path: Path, http: aiohttp.ClientSession, linear_server: FakeLinearServer
) -> None:
    served = await linear_served(tmp_path, linear_server)
    loop_task = await started(served)
    issue = linear_server.add_issue(title="Edited a thousand times", state="Backlog")
    polls, reads = served.rig.runtime.poll_count, len(linear_server.requests)

    connector = aiohttp.TCPConnector(limit=50)
    async with aiohttp.ClientSession(connector=connector) as burst:

        async def one(n: int) -> int:
            headers, body = linear_delivery(issue.id, issue.identifier, action="update",
                                            delivery=f"b-{n}", updated_from={"title": "t"})
            async with burst.post(f"{served.url}/api/v1/webhooks/linear", data=body,
                                  headers=headers) as response:
                return response.status

        started_at = time.monotonic()
        statuses = await asyncio.gather(*(one(n) for n in range(1000)))
        burst_s = time.monotonic() - started_at
    assert statuses == [202] * 1000
    intake = served.server.app[WEBHOOKS_KEY] if served.server.app is not None else None
    assert intake is not None
    # Wait for the trailing refresh and the passes it queued to be over.
    await asyncio.sleep(REFRESH_MIN_GAP_S * 2)
    await wait_until_async(lambda: idle(served), timeout=30, what="idle(served)")
    ticks = served.rig.runtime.poll_count - polls
    tracker_reads = len(linear_server.requests) - reads
    # At most one refresh per gap (plus the leading one), each a pass of a couple of reads.
    allowed_refreshes = int(burst_s / REFRESH_MIN_GAP_S) + 2
    assert 1 <= intake.refreshes.asked <= allowed_refreshes
    assert 1 <= ticks <= allowed_refreshes
    assert tracker_reads <= 4 * allowed_refreshes
    assert tracker_reads < 100, (tracker_reads, burst_s)
    assert await metric(http, served, "accepted") == 1000
    served.rig.runtime.stop()
    await asyncio.wait_for(loop_task, timeout=60)


# ----------------------------------------------------------------------------- each sender


def github_headers(body: bytes, delivery: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": "sha256=" + hex_hmac(body)}


def gitlab_headers(body: bytes, delivery: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Gitlab-Event": "Issue Hook",
            "X-Gitlab-Token": SECRET, "Idempotency-Key": delivery}


def jira_headers(body: bytes, delivery: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Atlassian-Webhook-Identifier": delivery,
            "X-Hub-Signature": "sha256=" + hex_hmac(body)}


SENDERS = {
    "github": (github_headers, {"action": "reopened", "repository": {"full_name": "acme/app"},
                                "issue": {"number": 7, "state": "open"}},
               {"repository": "acme/app"}),
    "gitlab": (gitlab_headers, {"object_kind": "issue",
                                "project": {"path_with_namespace": "grp/app"},
                                "object_attributes": {"id": 70, "iid": 7, "action": "reopen"}},
               {"project_slug": "grp/app"}),
    "jira": (jira_headers, {"webhookEvent": "jira:issue_created",
                            "issue": {"id": "10007", "key": "PROJ-7"}},
             {"project_slug": "PROJ"}),
}
assert set(SENDERS) <= {kind.value for kind in TrackerKind}, "every sender is a tracker kind"


@pytest.mark.parametrize("kind", sorted(SENDERS))
async def test_each_senders_good_signature_is_taken_over_http(
    tmp_path: Path, http: aiohttp.ClientSession, kind: str
) -> None:
    make_headers, payload, tracker = SENDERS[kind]
    agent = write_agent(tmp_path, "agent", WAITING_AGENT)
    path = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": kind, "api_key": "tok-0123456789", "webhook_secret": SECRET,
                    **tracker},
    })
    settings = load_workflow(path, environ={}).settings
    # NB: the webhook path never reads the delivery's tracker; the memory tracker serves the
    # refresh it queues.
    served = await serve(build_rig(path, tracker=MemoryTracker([], settings=settings)))
    body = json.dumps(payload).encode()
    status, document = await post(http, served, kind, make_headers(body, "ok-1"), body)
    assert status == 202, document
    assert document["event"]["kind"] == kind
    assert document["event"]["issue_ids"]
    await wait_until_async(
        lambda: bool(served.rig.of_type("refresh_requested")),
        timeout=15.0,
        what='bool(served.rig.of_type("refresh_requested"))',
    )
    wrong = body.replace(b"7", b"8")
    status, document = await post(http, served, kind, make_headers(body, "ok-2"), wrong)
    if kind == "gitlab":
        # NB: GitLab's token does not cover the body: a changed body with the right token is
        # GitLab's word, like any other delivery of it.
        assert status == 202
    else:
        assert (status, code(document)) == (401, "webhook_signature_invalid")


# ----------------------------------------------------------------------------- the settings


def test_a_webhook_secret_makes_the_poll_a_five_minute_backstop(tmp_path: Path) -> None:
    def interval(tracker: str, polling: str, env: dict[str, str]) -> int:
        path = tmp_path / "WORKFLOW.md"
        path.write_text(f"---\ntracker:\n  kind: memory\n{tracker}{polling}---\nprompt\n",
                        encoding="utf-8")
        return load_workflow(path, environ=env).settings.polling.interval_ms

    secret = "  webhook_secret: $HOOK\n"
    explicit = "polling:\n  interval_ms: 1000\n"
    assert interval("", "", {}) == 30_000
    assert interval(secret, "", {"HOOK": SECRET}) == 300_000
    # Explicit wins; an unset or empty $VAR is no secret at all.
    assert interval(secret, explicit, {"HOOK": SECRET}) == 1000
    assert interval(secret, "", {}) == 30_000
    assert interval(secret, "", {"HOOK": ""}) == 30_000


async def test_the_coalescer_asks_at_once_then_once_per_gap() -> None:
    asked: list[float] = []

    def request() -> RefreshReceipt:
        asked.append(time.monotonic())
        return RefreshReceipt(queued=True, coalesced=False,
                              requested_at=datetime.datetime.now(datetime.UTC),
                              operations=("poll", "reconcile"))

    coalescer = RefreshCoalescer(request=request, min_gap_s=0.2)
    assert not coalescer.ask().coalesced
    assert len(asked) == 1  # the leading edge: at once
    for _ in range(50):
        assert coalescer.ask().coalesced
    assert len(asked) == 1
    await wait_until_async(lambda: len(asked) == 2, timeout=5, what="len(asked) == 2")
    assert asked[1] - asked[0] >= 0.19
    coalescer.ask()
    coalescer.close()  # a trailing refresh not yet due is dropped
    await asyncio.sleep(0.3)
    assert len(asked) == 2


async def github_served(tmp_path: Path) -> Served:
    agent = write_agent(tmp_path, "agent", WAITING_AGENT)
    path = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": "github", "repository": "acme/app", "api_key": "tok-0123456789",
                    "webhook_secret": SECRET},
    })
    settings = load_workflow(path, environ={}).settings
    return await serve(build_rig(path, tracker=MemoryTracker([], settings=settings)))


async def test_a_delivery_about_no_issue_is_answered_and_ignored(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await github_served(tmp_path)
    body = json.dumps({"zen": "Design for failure.", "hook_id": 12}).encode()
    headers = github_headers(body, "ping-1") | {"X-GitHub-Event": "ping"}
    status, document = await post(http, served, "github", headers, body)
    assert status == 202
    assert document["refresh"] is None
    assert document["event"]["change"] == "other"
    assert not served.rig.of_type("refresh_requested")
    assert await metric(http, served, "ignored") == 1


async def test_a_stopped_runtime_answers_503_and_takes_the_retry_later(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await github_served(tmp_path)
    make_headers, payload, _ = SENDERS["github"]
    body = json.dumps(payload).encode()
    served.rig.runtime.stop()
    status, document = await post(http, served, "github", make_headers(body, "late-1"), body)
    assert (status, code(document)) == (503, "orchestrator_unavailable")
    intake = served.server.app[WEBHOOKS_KEY] if served.server.app is not None else None
    assert intake is not None
    assert not intake.deliveries.seen(kind="github", delivery_id="late-1", now=time.time())
