"""Ask, answer, resume in the operator, end to end: a real ``lorenz operator`` process runs a
Workflow whose agent is the scripted Codex app-server. Its question shows on the Claim
(``kubectl get claims``: phase ``WaitingForInput``, the question in the status), the answer
comes through the ``lorenz.dev/answer`` annotation, the leader takes and removes it, and the
resumed run resumes the same thread in the same workspace with the answer in its input.

NB: the runs are ``worker.kind: local`` (the agent script is on this machine); the same flow
with runs in Pods, their workspace claim and session store kept while the issue waits, is
tests/node/test_pod_questions.py (the real node)."""

from __future__ import annotations

import json
import shlex
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, write_issue
from tests.kube.test_api_auth import service_account
from tests.runtime.questions_rig import FAKE_CODEX, asking_scenario

pytestmark = pytest.mark.cluster


def codex_spec(rig: Rig, scenarios: Path) -> dict[str, Any]:
    command = (
        " ".join(shlex.quote(str(p)) for p in (sys.executable, FAKE_CODEX))
        + f' {shlex.quote(str(scenarios))}/"$LORENZ_ISSUE_IDENTIFIER".json'
    )
    return {
        "agent": {"kind": "codex", "maxConcurrentAgents": 1, "maxTurns": 1},
        "agents": {
            "codex": {
                "protocol": "codex-app-server",
                "command": command,
                "stallTimeoutMs": 60000,
                "turnTimeoutMs": 60000,
            }
        },
        "input": {"answerTemplate": "Answer: {{ answer }}"},
    }


def received(record: Path, method: str) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    rows = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    return [
        row["received"].get("params") or {}
        for row in rows
        if isinstance(row.get("received"), dict) and row["received"].get("method") == method
    ]


def test_a_question_waits_on_its_claim_and_the_answer_annotation_resumes_the_thread(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (tmp_path / "records").mkdir()
    scenario = asking_scenario(tmp_path, "T-1")
    (scenarios / "T-1.json").write_text(json.dumps(scenario), encoding="utf-8")
    record = Path(scenario["record"])
    write_issue(rig.issues_of("ask"), "T-1")
    kube.apply(rig.workflow("ask", extra=codex_spec(rig, scenarios)))

    def waiting_claim() -> dict[str, Any] | None:
        claims = kube.items("claims")
        return next(
            (c for c in claims if (c.get("status") or {}).get("phase") == "WaitingForInput"),
            None,
        )

    claim = wait_until(waiting_claim, timeout=90, message="a WaitingForInput Claim")
    question = claim["status"]["question"]
    assert question["text"] == "Database — Which database should the cache use?"
    assert question["options"] == ["Redis", "Postgres"]
    assert question["sessionId"] == "thr-T-1"
    (row,) = kube.table("claims", "-o", "wide")
    assert row["PHASE"] == "WaitingForInput"
    assert row["QUESTION"].startswith("Database")
    (started,) = received(record, "thread/start")
    workspace = started["cwd"]

    name = claim["metadata"]["name"]
    kube.cluster.kubectl(
        "annotate", "claim", name, "-n", kube.namespace, "lorenz.dev/answer=Postgres, please."
    )
    resumed = wait_until(
        lambda: received(record, "thread/resume") or None,
        timeout=90, message="the thread resumed",
    )
    assert resumed[0]["threadId"] == "thr-T-1"
    assert resumed[0]["cwd"] == workspace
    turns = received(record, "turn/start")
    texts = [json.dumps(turn.get("input")) for turn in turns]
    assert any("Answer: Postgres, please." in text for text in texts), texts

    def annotation_gone() -> bool | None:
        annotations = kube.get("claim", name)["metadata"].get("annotations") or {}
        return "lorenz.dev/answer" not in annotations or None

    wait_until(annotation_gone, timeout=30, message="the answer annotation removed")
    wait_until(
        lambda: "InputAnswered" in kube.reasons("ask") or None,
        timeout=30, message="an InputAnswered Event",
    )


def test_an_answer_annotation_on_a_claim_that_does_not_wait_is_refused_and_removed(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("busy"), "TASK-1")
    kube.apply(rig.workflow("busy", seconds=30.0))
    claim = wait_until(
        lambda: next(
            (c for c in kube.items("claims")
             if (c.get("status") or {}).get("phase") == "Running"),
            None,
        ),
        timeout=60, message="a Running Claim",
    )
    name = claim["metadata"]["name"]
    kube.cluster.kubectl("annotate", "claim", name, "-n", kube.namespace, "lorenz.dev/answer=yes")

    def annotation_gone() -> bool | None:
        annotations = kube.get("claim", name)["metadata"].get("annotations") or {}
        return "lorenz.dev/answer" not in annotations or None

    wait_until(annotation_gone, timeout=30, message="the refused annotation removed")
    refused = [e for e in kube.events("busy") if e["reason"] == "AnswerRefused"]
    assert refused
    assert "issue_not_waiting" in refused[0]["message"]
    assert kube.get("claim", name)["status"]["phase"] == "Running"


def ask(kube: Kube, rig: Rig, tmp_path: Path, name: str) -> tuple[dict[str, Any], Path]:
    """Apply Workflow ``name`` whose T-1 asks; return its waiting Claim and the agent record."""
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (tmp_path / "records").mkdir()
    scenario = asking_scenario(tmp_path, "T-1")
    (scenarios / "T-1.json").write_text(json.dumps(scenario), encoding="utf-8")
    write_issue(rig.issues_of(name), "T-1")
    kube.apply(rig.workflow(name, extra=codex_spec(rig, scenarios)))
    claim = wait_until(
        lambda: next(
            (c for c in kube.items("claims")
             if (c.get("status") or {}).get("phase") == "WaitingForInput"),
            None,
        ),
        timeout=90, message="a WaitingForInput Claim",
    )
    return claim, Path(scenario["record"])


def post(
    operator: OperatorProcess, path: str, body: object, *, token: str | None = None
) -> tuple[int, Any]:
    assert operator.url is not None
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"{operator.url}{path}", data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_operators_answer_route_resumes_the_waiting_issue(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,))
    _, record = ask(kube, rig, tmp_path, "routed")
    route = f"/api/v1/workflows/{kube.namespace}/routed/issues/T-1/answer"
    status, body = post(operator, route, {"txt": "x"})
    assert (status, body["error"]["code"]) == (400, "invalid_request_body")
    status, body = post(
        operator, f"/api/v1/workflows/{kube.namespace}/nope/issues/T-1/answer", {"text": "x"}
    )
    assert (status, body["error"]["code"]) == (404, "workflow_not_found")
    status, body = post(operator, route, {"text": "Redis"})
    assert status == 202, body
    assert body["session_ids"] == ["thr-T-1"]
    resumed = wait_until(
        lambda: received(record, "thread/resume") or None,
        timeout=90, message="the thread resumed",
    )
    assert resumed[0]["threadId"] == "thr-T-1"
    status, body = post(operator, route, {"text": "Redis"})
    assert (status, body["error"]["code"]) == (404, "issue_not_waiting")


def test_an_answer_left_while_no_leader_runs_is_taken_by_the_next_leader(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    first = operators("first", namespaces=(kube.namespace,))
    claim, record = ask(kube, rig, tmp_path, "failover")
    first.kill()
    first.wait()
    name = claim["metadata"]["name"]
    kube.cluster.kubectl(
        "annotate", "claim", name, "-n", kube.namespace, "lorenz.dev/answer=Postgres"
    )
    operators("second", namespaces=(kube.namespace,))
    resumed = wait_until(
        lambda: received(record, "thread/resume") or None,
        timeout=120, message="the next leader resumed the thread",
    )
    assert resumed[0]["threadId"] == "thr-T-1"
    (started,) = received(record, "thread/start")[:1]
    assert resumed[0]["cwd"] == started["cwd"]

    def annotation_gone() -> bool | None:
        annotations = kube.get("claim", name)["metadata"].get("annotations") or {}
        return "lorenz.dev/answer" not in annotations or None

    wait_until(annotation_gone, timeout=30, message="the answer annotation removed")


def test_the_answer_route_needs_patch_on_claims_with_kubernetes_auth(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators(
        "guarded", namespaces=(kube.namespace,), extra_args=("--api-auth", "kubernetes"),
    )
    kube.apply(rig.workflow("secured"))
    wait_until(lambda: kube.holder("secured") == "guarded" or None, timeout=60,
               message="the operator leads")
    reader = service_account(kube, "reader", verbs=["get", "list", "patch"])
    answerer = service_account(kube, "answerer")
    manifests = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "answerer"},
         "rules": [{"apiGroups": ["lorenz.dev"], "resources": ["claims"], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "answerer"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "answerer"},
         "subjects": [{"kind": "ServiceAccount", "name": "answerer",
                       "namespace": kube.namespace}]},
    ]
    kube.cluster.kubectl(
        "apply", "-n", kube.namespace, "-f", "-", input=yaml.safe_dump_all(manifests)
    )
    route = f"/api/v1/workflows/{kube.namespace}/secured/issues/TASK-1/answer"
    status, body = post(operator, route, {"text": "x"}, token=reader)
    assert (status, body["error"]["code"]) == (403, "forbidden")  # patch on the Workflow: no
    assert "claims.lorenz.dev" in body["error"]["message"]
    status, body = wait_until(
        lambda: ((r := post(operator, route, {"text": "x"}, token=answerer))[0] != 403 and r)
        or None,
        timeout=60, message="the answerer's Role is in force",
    )
    assert (status, body["error"]["code"]) == (404, "issue_not_waiting")
