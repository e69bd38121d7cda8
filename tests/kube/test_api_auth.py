"""The operator's HTTP API authenticates with Kubernetes tokens and authorizes per namespace."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig

pytestmark = pytest.mark.cluster


def call(
    operator: OperatorProcess,
    path: str,
    *,
    token: str | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    assert operator.url is not None
    request = urllib.request.Request(f"{operator.url}{path}", method=method, data=None)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


def service_account(kube: Kube, name: str, *, verbs: list[str] | None = None) -> str:
    """A ServiceAccount (with a Role on Workflows when ``verbs``), and a token for it."""
    kube.cluster.kubectl("create", "serviceaccount", name, "-n", kube.namespace)
    if verbs:
        manifests = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": name},
             "rules": [{"apiGroups": ["lorenz.dev"], "resources": ["workflows"],
                        "verbs": verbs}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name,
                           "namespace": kube.namespace}]},
        ]
        kube.cluster.kubectl(
            "apply", "-n", kube.namespace, "-f", "-", input=yaml.safe_dump_all(manifests)
        )
    return kube.cluster.kubectl("create", "token", name, "-n", kube.namespace).stdout.strip()


def test_the_api_needs_a_token_whose_user_may_read_that_workflow(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators(
        "guarded", namespaces=(kube.namespace,),
        extra_args=("--api-auth", "kubernetes", "--api-open-paths", "/healthz"),
    )
    kube.apply(rig.workflow("secured"))
    wait_until(lambda: kube.holder("secured") == "guarded" or None, timeout=60,
               message="the operator leads")
    reader = service_account(kube, "reader", verbs=["get", "list"])
    stranger = service_account(kube, "stranger")
    state = f"/api/v1/workflows/{kube.namespace}/secured/state"

    status, body = call(operator, state)
    assert status == 401
    assert body["error"]["code"] == "unauthenticated"
    status, body = call(operator, state, token="not-a-token")
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    status, body = call(operator, state, token=stranger)
    assert (status, body["error"]["code"]) == (403, "forbidden")
    assert "stranger" in body["error"]["message"]

    status, body = wait_until(
        lambda: ((r := call(operator, state, token=reader))[0] == 200 and r) or None,
        timeout=60, message="the reader sees the runtime's state",
    )
    assert "poll" in body
    status, body = call(operator, "/api/v1/workflows", token=reader)
    assert [row["name"] for row in body["workflows"]] == ["secured"]
    status, body = call(operator, "/api/v1/workflows", token=stranger)
    assert (status, body["workflows"]) == (200, [])  # other namespaces stay invisible

    refresh = f"/api/v1/workflows/{kube.namespace}/secured/refresh"
    status, body = call(operator, refresh, token=reader, method="POST")
    assert (status, body["error"]["code"]) == (403, "forbidden")  # refresh needs patch
    status, body = call(operator, refresh, token=reader, method="POST",
                        headers={"Origin": "https://evil.example"})
    assert (status, body["error"]["code"]) == (403, "cross_origin_refused")

    status, _ = call(operator, "/metrics", token=reader)
    assert status == 403  # a non-resource URL needs its own grant
    status, body = call(operator, "/healthz")
    assert status == 200  # an open path
    # Open to any Pod that reaches the port: ok or not, nothing about the Workflows (#37).
    assert body == {"status": "ok"}
