"""The operator end to end: a separate ``lorenz operator`` process against the real apiserver.

``kubectl apply`` a Workflow (files tracker on a temp dir, the logging agent script); watch the
Claims, the Workflow status, the printer columns and the Events through kubectl, as a person
would.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.cluster import wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, issue_state, write_issue

pytestmark = pytest.mark.cluster


def ts(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def phase(claim: dict[str, Any]) -> str | None:
    return (claim.get("status") or {}).get("phase")


def condition(workflow: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in (workflow.get("status") or {}).get("conditions") or ():
        if entry["type"] == kind:
            return dict(entry)
    return None


def test_a_workflow_runs_to_completion(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues, "TASK-1")
    kube.apply(rig.workflow("demo", seconds=2.0))

    running = wait_until(
        lambda: [c for c in kube.items("claims") if phase(c) == "Running"] or None,
        timeout=30, message="a Running Claim",
    )
    (claim,) = running
    assert claim["spec"]["identifier"] == "TASK-1"
    assert claim["status"]["owner"] == "solo"
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "Workflow"
    (row,) = kube.table("claims")
    assert row["ISSUE"] == "TASK-1"
    assert row["PHASE"] == "Running"
    assert row["OWNER"] == "solo"

    def workflow_row() -> dict[str, str] | None:
        rows = kube.table("workflows")
        return rows[0] if rows and rows[0]["RUNNING"] == "1" else None

    row = wait_until(workflow_row, timeout=15, message="kubectl get wf shows the run")
    assert row["TRACKER"] == "files"
    assert row["LEADER"] == "solo"
    assert row["READY"] == "True"
    assert row["LAST POLL"] not in ("", "<none>")

    wait_until(lambda: kube.items("claims") == [], timeout=30, message="the Claim is released")
    assert issue_state(rig.issues, "TASK-1") == "Done"
    (run,) = rig.runs()
    assert run.ended

    workflow = kube.get("workflow", "demo")
    status = workflow["status"]
    assert status["observedGeneration"] == workflow["metadata"]["generation"]
    assert condition(workflow, "Ready")["status"] == "True"  # type: ignore[index]
    assert condition(workflow, "Leading")["status"] == "True"  # type: ignore[index]
    assert condition(workflow, "Degraded")["status"] == "False"  # type: ignore[index]
    assert status["leader"]["identity"] == "solo"
    assert status["lanes"] == {"running": 0, "reserving": 0, "retrying": 0, "blocked": 0}
    assert status["usage"]["secondsRunning"] >= 2.0
    assert status["checkpoint"]["usage_totals"]["seconds_running"] >= 2.0
    assert "lorenz.dev/cleanup" in workflow["metadata"]["finalizers"]
    # kopf keeps no state on the object: only event handlers, nothing persisted.
    annotations = workflow["metadata"].get("annotations") or {}
    assert not [key for key in annotations if "kopf" in key]

    # The agent moves its issue to Done just before it exits: depending on which comes first
    # the run finishes (and a continuation retry finds the issue terminal), or reconciliation
    # sees the terminal state and stops it. Either way the run was dispatched and ended.
    reasons = wait_until(
        lambda: (r := kube.reasons("demo")) >= {"LeadershipAcquired", "RunStarted"}
        and r & {"RunFinished", "ReconcileStopped"} and r,
        timeout=15, message="Events on the Workflow",
    )
    assert "RunFailed" not in reasons
    assert operator.leads(kube.namespace, "demo")
    state = operator.get(f"/api/v1/workflows/{kube.namespace}/demo/state")
    assert state["run_history"][0]["outcome"] in ("success", "canceled")
    metrics = operator.get("/metrics")
    assert f'lorenz_dispatches_total{{workflow="{kube.namespace}/demo"}} 1.0' in metrics
    assert f'lorenz_operator_leading{{workflow="{kube.namespace}/demo"}} 1.0' in metrics


def test_a_failing_agent_leaves_a_retry_pending_claim_with_the_exact_backoff(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues, "TASK-1")
    kube.apply(rig.workflow("failing", seconds=0.5, fail=True))

    claim = wait_until(
        lambda: next((c for c in kube.items("claims") if phase(c) == "RetryPending"), None),
        timeout=30, message="a RetryPending Claim",
    )
    status = claim["status"]
    assert status["retryKind"] == "failure"
    assert status["attempt"] == 1
    assert "agent_exited" in status["lastError"]
    due, written = ts(status["dueAt"]), ts(status["updatedAt"])
    assert due - written == datetime.timedelta(seconds=10)
    (run,) = rig.runs()
    finished = datetime.datetime.fromtimestamp(run.last_seen, datetime.UTC)
    assert abs((due - finished).total_seconds() - 10.0) < 1.5
    row = kube.table("claims", "-o", "wide")[0]
    assert row["PHASE"] == "RetryPending"
    assert row["ATTEMPT"] == "1"
    assert row["DUE"] not in ("", "<none>")
    wait_until(lambda: "RunFailed" in kube.reasons("failing"), timeout=15, message="RunFailed")
