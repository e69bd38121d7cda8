"""The operator's webhook Service on the real API server: ``POST /webhooks/<ns>/<workflow>``.

A real ``lorenz operator`` process (``--webhook-port 0``) leads a Workflow whose tracker is the
Linear fake and whose ``tracker.webhookSecretRef`` names a Secret; the test signs deliveries
the way Linear does. With ``webhookSecretRef`` set, polling is the 5-minute backstop, so a run
that starts within the test's bounds after the first poll was started by the delivery.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import wait_until
from tests.fakes.linear_server import FakeLinearServer
from tests.kube.operators import Kube, OperatorProcess, Rig

pytestmark = pytest.mark.cluster

SECRET = "whsec-operator-test-51c0de"
WEBHOOK_BACKSTOP_MS = 300_000


@pytest.fixture
def linear() -> Iterator[FakeLinearServer]:
    with FakeLinearServer().running_in_thread() as server:
        yield server


def webhook_url(operator: OperatorProcess) -> str:
    found = re.findall(r"Operator running identity=\S+ namespaces=\S+ api=\S+ webhooks=(\S+)",
                       operator.log())
    assert found, operator.log()
    assert found[-1] != "off"
    return str(found[-1])


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def linear_delivery(
    issue_id: str, identifier: str, *, delivery: str, secret: str = SECRET
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({
        "action": "create", "type": "Issue",
        "data": {"id": issue_id, "identifier": identifier},
        "webhookTimestamp": int(time.time() * 1000),
    }).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"Content-Type": "application/json", "Linear-Signature": signature,
                  "Linear-Delivery": delivery, "Linear-Event": "Issue"}


def webhook_metric(operator: OperatorProcess, workflow: str, outcome: str) -> float:
    total = 0.0
    for line in str(operator.get("/metrics")).splitlines():
        if (line.startswith("lorenz_webhook_requests_total{")
                and f'workflow="{workflow}"' in line and f'outcome="{outcome}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def linear_workflow(
    kube: Kube, rig: Rig, linear: FakeLinearServer, name: str, *, webhooks: bool = True
) -> dict[str, Any]:
    """A Workflow on the Linear fake, its token (and webhook secret) in a Secret; the agent
    logs its start and works 30 s (a clean exit that leaves the issue where it was)."""
    tracker: dict[str, Any] = {
        "kind": "linear", "endpoint": linear.url, "projectSlug": linear.project_slug,
        "apiKeySecretRef": {"name": "linear", "key": "token"},
    }
    if webhooks:
        tracker["webhookSecretRef"] = {"name": "linear", "key": "webhook"}
    else:
        # NB: a project of its own: polled every 30 s, it must not run the test's issues.
        linear.add_project("unhooked-project")
        tracker["projectSlug"] = "unhooked-project"
    manifest = rig.workflow(name, seconds=30.0, agent_env={"AGENT_NOOP": "1"},
                            extra={"tracker": tracker, "polling": {}})
    return manifest


def create_secret(kube: Kube, linear: FakeLinearServer) -> None:
    kube.cluster.kubectl(
        "create", "secret", "generic", "linear", "-n", kube.namespace,
        f"--from-literal=token={linear.api_key}", f"--from-literal=webhook={SECRET}",
    )


def state_of(operator: OperatorProcess, namespace: str, name: str) -> dict[str, Any]:
    state: dict[str, Any] = operator.get(f"/api/v1/workflows/{namespace}/{name}/state")
    return state


def first_poll_done(operator: OperatorProcess, namespace: str, name: str) -> int:
    """The tick count once the first tick has *ended*.

    NB: ``count`` goes up as a tick starts; a test that adds an issue right after the count
    moved may see it picked up by that same first tick's candidate read (a loaded machine)."""

    def ticks() -> int | None:
        try:
            poll = state_of(operator, namespace, name)["poll"]
        except urllib.error.HTTPError:
            return None  # not led yet (409)
        count = int(poll["count"])
        return count if count >= 1 and poll["status"] == "idle" else None

    return wait_until(ticks, timeout=90, message=f"the first poll of {name}")


def test_a_signed_delivery_starts_its_issue_and_a_forged_one_changes_nothing(
    kube: Kube, rig: Rig, linear: FakeLinearServer,
    operators: Callable[..., OperatorProcess],
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,),
                         extra_args=("--webhook-port", "0"))
    url = webhook_url(operator)
    create_secret(kube, linear)
    kube.apply(linear_workflow(kube, rig, linear, "hooked"))
    kube.apply(linear_workflow(kube, rig, linear, "unhooked", webhooks=False))
    ticks = first_poll_done(operator, kube.namespace, "hooked")
    first_poll_done(operator, kube.namespace, "unhooked")
    state = state_of(operator, kube.namespace, "hooked")
    assert state["poll"]["interval_ms"] == WEBHOOK_BACKSTOP_MS, state["poll"]
    hooked = f"{url}/webhooks/{kube.namespace}/hooked"
    display = f"{kube.namespace}/hooked"

    issue = linear.add_issue("ENG-7", title="Pushed", state="Todo")

    # A forged delivery: 401, coded, counted, and no refresh.
    body, headers = linear_delivery(issue.id, issue.identifier, delivery="d-forged",
                                    secret="not-the-secret")
    status, document = post(hooked, body, headers)
    assert (status, document["error"]["code"]) == (401, "webhook_signature_invalid")
    assert webhook_metric(operator, display, "webhook_signature_invalid") == 1
    # An unknown Workflow: 404.
    body, headers = linear_delivery(issue.id, issue.identifier, delivery="d-unknown")
    status, document = post(f"{url}/webhooks/{kube.namespace}/nosuch", body, headers)
    assert (status, document["error"]["code"]) == (404, "workflow_not_found")
    # A Workflow without tracker.webhookSecretRef: its route is off.
    status, document = post(f"{url}/webhooks/{kube.namespace}/unhooked", body, headers)
    assert (status, document["error"]["code"]) == (404, "webhook_not_found")
    assert int(state_of(operator, kube.namespace, "hooked")["poll"]["count"]) == ticks
    assert not rig.runs()
    assert not kube.items("claims")

    # The signed delivery: accepted, and its issue's run starts long before the 5 min poll.
    body, headers = linear_delivery(issue.id, issue.identifier, delivery="d-signed")
    sent = time.time()
    status, document = post(hooked, body, headers)
    assert status == 202, document
    assert document["accepted"] is True
    assert document["event"]["identifiers"] == ["ENG-7"]
    run = wait_until(
        lambda: next((r for r in rig.runs() if r.slot.startswith(issue.id)), None),
        timeout=60, message="the delivery started ENG-7's run",
    )
    assert run.started - sent < 60
    assert webhook_metric(operator, display, "accepted") == 1
    # The same delivery again: a replay, refused.
    status, document = post(hooked, body, headers)
    assert (status, document["error"]["code"]) == (400, "webhook_replayed")


def test_a_replica_that_does_not_lead_forwards_to_the_leader_or_answers_503(
    kube: Kube, rig: Rig, linear: FakeLinearServer,
    operators: Callable[..., OperatorProcess],
) -> None:
    """Two replicas share one webhook port (as Pods behind one Service do) on two loopback
    addresses; the follower forwards to the address the leader advertises.

    NB: one shard, so the first replica keeps it (its fair share) when the second joins."""
    port = free_port()
    leader = operators("leader", namespaces=(kube.namespace,), shards=1, extra_args=(
        "--webhook-port", str(port), "--api-host", "127.0.0.2",
        "--advertise-url", "http://127.0.0.2:1"))
    create_secret(kube, linear)
    kube.apply(linear_workflow(kube, rig, linear, "shared"))
    first_poll_done(leader, kube.namespace, "shared")
    follower = operators("follower", namespaces=(kube.namespace,), shards=1, extra_args=(
        "--webhook-port", str(port), "--api-host", "127.0.0.3",
        "--advertise-url", "http://127.0.0.3:1"))

    def leader_seen() -> bool | None:
        rows = follower.get("/api/v1/workflows")["workflows"]
        return any(r["name"] == "shared" and not r["leading"]
                   and r["leader_endpoint"] == "http://127.0.0.2:1" for r in rows) or None

    wait_until(leader_seen, timeout=60, message="the follower sees the leader's endpoint")
    issue = linear.add_issue("ENG-8", title="Forwarded", state="Todo")
    follower_url = f"{webhook_url(follower)}/webhooks/{kube.namespace}/shared"

    # Already forwarded once: never again; 503, coded, with Retry-After.
    body, headers = linear_delivery(issue.id, issue.identifier, delivery="d-looped")
    status, document = post(follower_url, body,
                            {**headers, "X-Lorenz-Webhook-Forwarded": "elsewhere"})
    assert (status, document["error"]["code"]) == (503, "webhook_not_led_here")
    assert not rig.runs()

    body, headers = linear_delivery(issue.id, issue.identifier, delivery="d-forwarded")
    status, document = post(follower_url, body, headers)
    assert status == 202, document
    wait_until(
        lambda: next((r for r in rig.runs() if r.slot.startswith(issue.id)), None),
        timeout=60, message="the forwarded delivery started ENG-8's run",
    )
    assert webhook_metric(leader, f"{kube.namespace}/shared", "accepted") == 1
    assert "webhook forwarded" in follower.log()


def test_admission_keeps_webhook_secret_refs_to_webhook_trackers(
    kube: Kube, rig: Rig
) -> None:
    manifest = rig.workflow("files-hook")
    manifest["spec"]["tracker"]["webhookSecretRef"] = {"name": "hook", "key": "secret"}
    refused = refused_apply(kube, manifest)
    assert "tracker.webhookSecretRef only applies" in refused
    manifest = rig.workflow("leaky", extra={
        "tracker": {"kind": "github", "repository": "acme/app",
                    "apiKeySecretRef": {"name": "gh", "key": "token"},
                    "webhookSecretRef": {"name": "hook", "key": "secret"}},
        "worker": {"podTemplate": {"envFromSecrets": ["hook"]}},
    })
    refused = refused_apply(kube, manifest)
    assert "must not name the tracker's Secret (tracker.webhookSecretRef)" in refused


def refused_apply(kube: Kube, manifest: dict[str, Any]) -> str:
    """kubectl apply that the API server must refuse; its error text."""
    answer = kube.cluster.kubectl(
        "apply", "-n", kube.namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert answer.returncode != 0, answer.stdout
    return answer.stderr


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
