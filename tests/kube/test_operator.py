"""The operator end to end: a separate ``lorenz operator`` process against the real apiserver.

``kubectl apply`` a Workflow (files tracker on a temp dir, the logging agent script); watch the
Claims, the Workflow status, the printer columns and the Events through kubectl, as a person
would.
"""

from __future__ import annotations

import datetime
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorenz.kube.api import resources
from tests.cluster.cluster import wait_until
from tests.kube.operators import (
    Kube,
    OperatorProcess,
    Rig,
    completed_by,
    issue_state,
    now,
    write_issue,
)

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
    write_issue(rig.issues_of("demo"), "TASK-1")
    kube.apply(rig.workflow("demo", seconds=2.0))

    running = wait_until(
        lambda: [c for c in kube.items("claims") if phase(c) == "Running"] or None,
        timeout=30, message="a Running Claim",
    )
    (claim,) = running
    assert claim["spec"]["identifier"] == "TASK-1"
    assert claim["status"]["owner"] == "solo"
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "Workflow"
    (row,) = kube.table("claims", "-o", "wide")
    assert row["ISSUE"] == "TASK-1"
    assert row["PHASE"] == "Running"
    assert row["OWNER"] == "solo"
    assert row["ATTEMPT"] == "0"  # a first run shows as attempt 0, not blank
    assert row["DUE"] in ("", "<none>")  # no retry pending: blank, never <invalid>

    def workflow_row() -> dict[str, str] | None:
        rows = kube.table("workflows")
        return rows[0] if rows and rows[0]["RUNNING"] == "1" else None

    row = wait_until(workflow_row, timeout=60, message="kubectl get wf shows the run")
    wide = kube.table("workflows", "-o", "wide")[0]
    assert wide["DEGRADED"] == "False"
    assert row["TRACKER"] == "files"
    assert row["LEADER"] == "solo"
    assert row["READY"] == "True"
    assert row["LAST POLL"] not in ("", "<none>")

    wait_until(lambda: kube.items("claims") == [], timeout=30, message="the Claim is released")
    assert issue_state(rig.issues_of("demo"), "TASK-1") == "Done"
    (run,) = rig.runs()
    assert completed_by(rig.issues_of("demo"), "TASK-1") == run.pid

    # The status follows within a status interval.
    workflow = wait_until(
        lambda: (w := kube.get("workflow", "demo"))["status"]["lanes"]["running"] == 0 and w,
        timeout=60, message="the status shows the run ended",
    )
    status = workflow["status"]
    assert status["lanes"] == {"running": 0, "reserving": 0, "retrying": 0, "blocked": 0}
    assert status["observedGeneration"] == workflow["metadata"]["generation"]
    assert condition(workflow, "Ready")["status"] == "True"  # type: ignore[index]
    assert condition(workflow, "Leading")["status"] == "True"  # type: ignore[index]
    assert condition(workflow, "Degraded")["status"] == "False"  # type: ignore[index]
    assert status["leader"]["identity"] == "solo"
    assert status["usage"]["secondsRunning"] >= 2.0
    assert status["checkpoint"]["usageTotals"]["secondsRunning"] >= 2.0  # camelCase too
    assert "lorenz.dev/cleanup" in workflow["metadata"]["finalizers"]
    # kopf keeps no state on the object: only event handlers, nothing persisted.
    annotations = workflow["metadata"].get("annotations") or {}
    assert not [key for key in annotations if "kopf" in key]

    # The agent moves its issue to Done just before it exits: depending on which comes first
    # the run finishes (and a continuation retry finds the issue terminal), or reconciliation
    # sees the terminal state and stops it. Either way the run was dispatched and ended.
    def reasons_seen() -> set[str] | None:
        r = kube.reasons("demo")
        if not r >= {"LeadershipAcquired", "RunStarted"}:
            return None
        return r & {"RunFinished", "ReconcileStopped"} and r

    reasons = wait_until(reasons_seen, timeout=60, message="Events on the Workflow")
    assert "RunFailed" not in reasons
    assert operator.leads(kube.namespace, "demo")
    state = operator.get(f"/api/v1/workflows/{kube.namespace}/demo/state")
    assert state["run_history"][0]["outcome"] in ("success", "canceled")
    metrics = operator.get("/metrics")
    assert f'lorenz_dispatches_total{{workflow="{kube.namespace}/demo"}} 1.0' in metrics
    assert f'lorenz_operator_leading{{workflow="{kube.namespace}/demo"}} 1.0' in metrics


# NB: counts in the operator process every snapshot its runtimes build (any caller).
COUNT_SNAPSHOTS = """
import os, pathlib
from lorenz.runtime.runtime import LorenzRuntime
_built = [0]
_snapshot = LorenzRuntime.snapshot
def _counted(self):
    _built[0] += 1
    pathlib.Path(os.environ["SNAPSHOT_COUNT"]).write_text(str(_built[0]))
    return _snapshot(self)
LorenzRuntime.snapshot = _counted
"""


def test_the_status_builds_a_snapshot_per_publish_not_per_agent_update(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    count = tmp_path / "snapshots-built"
    # NB: a status interval of 2 s against an agent that prints every 0.2 s: published at
    # most once per interval, the status must not cost a snapshot per printed line.
    operators(
        "solo", namespaces=(kube.namespace,), prelude=COUNT_SNAPSHOTS,
        env={"SNAPSHOT_COUNT": str(count)}, extra_args=("--status-interval-seconds", "2"),
    )
    write_issue(rig.issues_of("chatty"), "TASK-1")
    kube.apply(rig.workflow("chatty", seconds=6.0))
    (run,) = wait_until(lambda: [r for r in rig.runs() if r.ended] or None, timeout=60,
                        message="the agent run ended")
    workflow = wait_until(
        lambda: (w := kube.get("workflow", "chatty"))["status"]["lanes"]["running"] == 0
        and w.get("status", {}).get("usage", {}).get("secondsRunning", 0) >= 6.0 and w,
        timeout=30, message="the status shows the run ended",
    )
    assert condition(workflow, "Ready")["status"] == "True"  # type: ignore[index]
    beats = sum(1 for line in rig.agent_log.read_text().splitlines()
                if line.startswith(f"beat {run.slot} "))
    assert beats >= 25, "the agent printed a line every 0.2 s for 6 s"
    built = int(count.read_text())
    assert built < beats // 2, f"{built} snapshots for {beats} agent updates"


def test_a_failing_agent_leaves_a_retry_pending_claim_with_the_exact_backoff(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("failing"), "TASK-1")
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
    row = kube.table("claims", "-o", "wide")[0]
    assert row["PHASE"] == "RetryPending"
    assert row["ATTEMPT"] == "1"
    assert row["DUE"] == "10s"  # the backoff as a duration, never <invalid>
    wait_until(lambda: "RunFailed" in kube.reasons("failing"), timeout=60, message="RunFailed")


def wait_condition(
    kube: Kube, name: str, kind: str, status: str, *, reason: str | None = None, timeout: float = 30
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        workflow = kube.get("workflow", name)
        found = condition(workflow, kind)
        if found is None or found["status"] != status:
            return None
        if reason is not None and found["reason"] != reason:
            return None
        return workflow

    return wait_until(check, timeout=timeout, message=f"{kind}={status} ({reason}) on {name}")


def ticks_of(operator: OperatorProcess, namespace: str, name: str) -> int:
    """Poll ticks of a Workflow so far, from the leader's API (always current)."""
    state = operator.get(f"/api/v1/workflows/{namespace}/{name}/state")
    return int(state["poll"]["count"])


def patch_spec(kube: Kube, name: str, patch: str) -> None:
    kube.cluster.kubectl(
        "patch", "workflow", name, "-n", kube.namespace, "--type=merge", "-p", patch
    )


def test_a_bad_spec_update_keeps_the_last_known_good_and_sets_degraded(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,))
    kube.apply(rig.workflow("reload", interval_ms=300))
    wait_condition(kube, "reload", "Ready", "True")

    patch_spec(kube, "reload", '{"spec": {"prompt": "{% if %}broken"}}')
    workflow = wait_condition(kube, "reload", "Degraded", "True", reason="template_parse_error")
    degraded = condition(workflow, "Degraded")
    assert degraded is not None
    assert degraded["observedGeneration"] == 2
    assert "generation 2 rejected (running generation 1)" in degraded["message"]
    assert workflow["status"]["observedGeneration"] == 2
    # The last known good workflow keeps polling (the operator's API has every tick; the
    # status only at most once a minute while idle).
    count = ticks_of(operator, kube.namespace, "reload")
    wait_until(
        lambda: ticks_of(operator, kube.namespace, "reload") > count + 2,
        timeout=30, message="polls go on",
    )
    ready = condition(kube.get("workflow", "reload"), "Ready")
    assert ready is not None
    assert ready["status"] == "True"
    wait_until(lambda: "SpecRejected" in kube.reasons("reload"), timeout=60, message="event")

    patch_spec(kube, "reload", '{"spec": {"prompt": "ok {{ issue.identifier }}", '
                               '"polling": {"intervalMs": 700}}}')
    workflow = wait_condition(kube, "reload", "Degraded", "False", reason="SpecApplied")
    wait_until(
        lambda: kube.get("workflow", "reload")["status"]["poll"]["intervalMs"] == 700,
        timeout=60, message="the new interval is in force",
    )
    assert kube.get("workflow", "reload")["status"]["observedGeneration"] == 3


def test_a_missing_secret_degrades_until_it_exists_and_a_refresh_is_requested(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    manifest = rig.workflow("secret")
    manifest["spec"]["tracker"]["apiKeySecretRef"] = {"name": "tracker-token", "key": "token"}
    kube.apply(manifest)
    workflow = wait_condition(kube, "secret", "Degraded", "True", reason="tracker_secret_missing")
    ready = condition(workflow, "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    assert ready["reason"] == "tracker_secret_missing"
    assert "tracker-token" in ready["message"]

    kube.cluster.kubectl(
        "create", "secret", "generic", "tracker-token", "-n", kube.namespace,
        "--from-literal=token=s3cr3t-value",
    )
    kube.cluster.kubectl(
        "annotate", "workflow", "secret", "-n", kube.namespace, "lorenz.dev/refresh=1"
    )
    workflow = wait_condition(kube, "secret", "Ready", "True")
    assert "s3cr3t-value" not in str(workflow)


def test_the_refresh_annotation_polls_at_once(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,))
    kube.apply(rig.workflow("refresh", interval_ms=600000))
    wait_condition(kube, "refresh", "Ready", "True")
    # NB: ticks from the leader's API: the status carries poll bookkeeping at most once a
    # minute while idle, so it may still say 1 after the refresh's poll.
    assert ticks_of(operator, kube.namespace, "refresh") == 1
    write_issue(rig.issues_of("refresh"), "TASK-1")
    kube.cluster.kubectl(
        "annotate", "workflow", "refresh", "-n", kube.namespace, "lorenz.dev/refresh=now"
    )
    wait_until(
        lambda: [c for c in kube.items("claims") if phase(c) == "Running"] or None,
        timeout=60, message="the refresh dispatched the new issue",
    )
    assert ticks_of(operator, kube.namespace, "refresh") >= 2


def test_deleting_a_claim_cancels_its_run_and_an_eligible_issue_runs_again(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("cancel"), "TASK-1")
    kube.apply(rig.workflow("cancel", seconds=60.0))
    first = wait_until(
        lambda: next((c for c in kube.items("claims") if phase(c) == "Running"), None),
        timeout=30, message="a Running Claim",
    )
    wait_until(lambda: rig.runs() or None, timeout=60, message="the agent started")
    kube.cluster.kubectl("delete", "claim", first["metadata"]["name"], "-n", kube.namespace)

    def replaced() -> dict[str, Any] | None:
        for claim in kube.items("claims"):
            if claim["metadata"]["uid"] != first["metadata"]["uid"] and phase(claim) == "Running":
                return claim
        return None

    second = wait_until(replaced, timeout=30, message="the issue is dispatched again")
    assert second["metadata"]["name"] == first["metadata"]["name"]  # the same slot
    runs = wait_until(lambda: r if len(r := rig.runs()) == 2 else None, timeout=60,
                      message="a second agent run")
    assert not runs[0].ended
    assert not _alive(runs[0].pid)
    assert runs[0].last_seen <= runs[1].started
    wait_until(lambda: "ClaimDeleted" in kube.reasons("cancel"), timeout=60, message="event")


def test_deleting_a_workflow_stops_its_runs_and_removes_claims_workspaces_and_finalizer(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("solo", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("doomed"), "TASK-1")
    write_issue(rig.issues_of("doomed"), "TASK-2")
    kube.apply(rig.workflow("doomed", seconds=60.0))
    folder = operator.volume / kube.namespace / "doomed"
    wait_until(
        lambda: len([c for c in kube.items("claims") if phase(c) == "Running"]) == 2 or None,
        timeout=30, message="two Running Claims",
    )
    wait_until(lambda: len(rig.runs()) == 2 or None, timeout=60, message="two agents")
    workspaces = sorted(p.name for p in (folder / "workspaces").iterdir() if p.name[0] != ".")
    assert len(workspaces) == 2, workspaces
    before = operator_requests(operator)
    kube.cluster.kubectl(
        "delete", "workflow", "doomed", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )
    assert kube.items("workflows") == []
    # The cleanup removes the finalizer from the watched object, without reading it again.
    after = operator_requests(operator)
    assert after.get(("get", "workflows"), 0.0) == before.get(("get", "workflows"), 0.0)
    assert kube.items("claims") == []
    # Its shard stays held (other Workflows share it); no Lease was ever made for the Workflow.
    assert kube.holder("doomed") == "solo"
    assert len(kube.leases()) == kube.shards + 1
    for run in rig.runs():
        assert not _alive(run.pid)
    # Its workspaces went with it: a new Workflow of the same name starts from scratch.
    assert not (folder / "workspaces").exists()


def test_deleting_a_namespace_with_workflows_and_claims_completes_with_no_lease_in_it(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    namespace = kube.cluster.create_namespace()
    doomed = Kube(kube.cluster, namespace)
    operator = operators("nsdel", namespaces=(namespace,))
    names = [f"wf-{i}" for i in range(10)]
    for name in names:
        write_issue(rig.issues_of(name, namespace=namespace), "TASK-1")
        doomed.apply(rig.workflow(name, seconds=600.0, namespace=namespace))
    wait_until(
        lambda: len([c for c in doomed.items("claims") if phase(c) == "Running"]) == len(names)
        or None,
        timeout=120, message="every Workflow runs its Claim",
    )
    # Leadership lives in the operator's namespace: nothing in the doomed one needs a Lease.
    assert doomed.items("leases") == []
    # The worst order: no replica runs while the namespace starts terminating, so every
    # Workflow's deletion is seen only after a restart.
    operator.stop()
    kube.cluster.delete_namespace(namespace, wait=False)
    wait_until(
        lambda: all(w["metadata"].get("deletionTimestamp") for w in doomed.items("workflows"))
        or None,
        timeout=120, message="the Workflows are being deleted",
    )
    assert len(doomed.items("workflows")) == len(names)  # held by the finalizer
    operator.start()
    wait_until(
        lambda: namespace not in kube.cluster.kubectl("get", "namespaces", "-o", "name").stdout
        or None,
        timeout=180, interval=1.0, message="the namespace is gone",
    )
    log = operator.log()
    assert "grant the operator" not in log
    assert log.count("Workflow cleaned up") >= len(names)
    for name in names:
        assert not (operator.volume / namespace / name / "workspaces").exists()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def operator_requests(operator: OperatorProcess) -> dict[tuple[str, str], float]:
    counts: dict[tuple[str, str], float] = {}
    for line in operator.get("/metrics").splitlines():
        if line.startswith("lorenz_operator_api_requests_total{"):
            labels, _, value = line.rpartition(" ")
            verb = labels.split('verb="', 1)[1].split('"', 1)[0]
            resource = labels.split('resource="', 1)[1].split('"', 1)[0]
            counts[(verb, resource)] = float(value)
    return counts


def test_idle_ticks_write_no_status_and_no_claims_only_the_lease_renewals(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    # The default idle heartbeat (--idle-status-interval-seconds 3600); the window below spans
    # more than the minute the old code waited before writing the bookkeeping of idle ticks.
    period = 3.0
    operator = operators("idle", namespaces=(kube.namespace,), lease=(15, 10.0, period))
    kube.apply(rig.workflow("idle", interval_ms=300))
    wait_condition(kube, "idle", "Ready", "True")
    wait_until(lambda: ticks_of(operator, kube.namespace, "idle") >= 3 or None, timeout=30,
               message="polling")
    # NB: the first poll's status write may still be settling; the window starts once the
    # object is quiet for a few ticks.
    wait_until(lambda: ticks_of(operator, kube.namespace, "idle") >= 10 or None, timeout=60,
               message="ten ticks")
    version = kube.get("workflow", "idle")["metadata"]["resourceVersion"]
    before_ticks = ticks_of(operator, kube.namespace, "idle")
    before = operator_requests(operator)
    started = now()
    # 240 ticks of 300 ms: at least 72 s, however slow the machine.
    wait_until(
        lambda: ticks_of(operator, kube.namespace, "idle") >= before_ticks + 240 or None,
        timeout=600, message="240 idle ticks",
    )
    after = operator_requests(operator)
    elapsed = now() - started
    spent = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    # Leadership costs the shard set's renewals and one listing per retry period, whatever the
    # Workflows do; an idle Workflow writes nothing at all.
    assert set(spent) <= {("update", "leases"), ("list", "leases")}, spent
    assert kube.get("workflow", "idle")["metadata"]["resourceVersion"] == version
    # One renewal per held shard and one of the membership per round, a round per period: a
    # generous bound (twice the rounds the window can hold, plus one), not a speed figure.
    rounds = elapsed / period + 1
    assert spent.get(("update", "leases"), 0) <= 2 * rounds * (kube.shards + 1), (spent, elapsed)
    # What a user acts on is written at once: a new issue changes the counts and the lanes.
    write_issue(rig.issues_of("idle"), "TASK-1")
    wait_until(
        lambda: (kube.get("workflow", "idle")["status"].get("lanes") or {}).get("running")
        or None,
        timeout=30, message="the running lane in the status",
    )


def test_a_new_workflows_first_status_is_ready_in_one_patch(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    # A bound no start on a loaded machine reaches: the first status waits for the first poll.
    operator = operators("first", namespaces=(kube.namespace,),
                         extra_args=("--first-status-wait-seconds", "600"))
    before = operator_requests(operator)
    kube.apply(rig.workflow("first", interval_ms=300))
    workflow = wait_condition(kube, "first", "Ready", "True", timeout=120)
    leading = condition(workflow, "Leading")
    assert leading is not None
    assert leading["status"] == "True"
    wait_until(lambda: ticks_of(operator, kube.namespace, "first") >= 5 or None, timeout=60,
               message="five ticks")
    after = operator_requests(operator)
    patches = after.get(("patch", "workflows/status"), 0.0) - before.get(
        ("patch", "workflows/status"), 0.0)
    # Ready at once, not Starting and then Ready; and the finalizer was added from the
    # watched object, without reading it first.
    assert patches == 1, (before, after)
    assert after.get(("get", "workflows"), 0.0) - before.get(("get", "workflows"), 0.0) <= 1
    assert resources.CLEANUP_FINALIZER in kube.get("workflow", "first")["metadata"]["finalizers"]
    # On its way out it writes no status at all (nobody reads it; in a terminating namespace
    # 1,000 such patches queued before the cleanups).
    kube.cluster.kubectl(
        "delete", "workflow", "first", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )
    gone = operator_requests(operator)
    assert gone.get(("patch", "workflows/status"), 0.0) == after.get(
        ("patch", "workflows/status"), 0.0), (after, gone)
    assert gone.get(("get", "workflows"), 0.0) == after.get(("get", "workflows"), 0.0)


def test_a_workflow_that_cannot_start_is_degraded_and_backs_off_holding_its_lease(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("backoff", namespaces=(kube.namespace,))
    manifest = rig.workflow("stuck")
    # The Workflow's folder on the volume is a file: every start fails the same way.
    folder = operator.volume / kube.namespace / "stuck"
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    kube.apply(manifest)
    workflow = wait_condition(kube, "stuck", "Degraded", "True", reason="workflow_dir_unusable")
    ready = condition(workflow, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", "workflow_dir_unusable")

    def start_failures() -> list[str]:
        return sorted(e["message"] for e in kube.events("stuck") if e["reason"] == "StartFailed")

    def failures_seen() -> list[str] | None:
        f = start_failures()
        return None if f and len(f) < 2 else f

    failures = wait_until(failures_seen, timeout=60, message="a second, later start attempt")
    # Each failure doubles the wait (5 s, 10 s, ...) instead of retrying at once.
    assert any("attempt 1; next in 5 s" in m for m in failures), failures
    assert any("attempt 2; next in 10 s" in m for m in failures), failures
    # The replica keeps the shard meanwhile: no release, no new term.
    generation = kube.lease("stuck")["spec"]["leaseTransitions"]
    assert "Lease released" not in operator.log()

    folder.unlink()
    rig.issues_of("stuck").mkdir(parents=True)
    # The next attempt (at most 40 s away if the machine is slow) starts the runtime.
    workflow = wait_condition(kube, "stuck", "Ready", "True", timeout=120)
    degraded = condition(workflow, "Degraded")
    assert degraded is not None
    assert degraded["status"] == "False"
    assert kube.lease("stuck")["spec"]["leaseTransitions"] == generation  # the same term


def test_agents_get_an_explicit_environment_never_the_operators(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operators(
        "envs", namespaces=(kube.namespace,),
        env={"OPERATOR_CLOUD_TOKEN": "s3cr3t", "TZ": "UTC"},
    )
    write_issue(rig.issues_of("envs"), "TASK-1")
    dump = rig.root / "agent-env.txt"
    kube.apply(rig.workflow("envs", agent_env={"AGENT_ENV_DUMP": str(dump)}))
    def env_names() -> list[str] | None:
        return dump.read_text().split() if dump.exists() else None

    names = wait_until(env_names, timeout=60, message="the agent wrote its environment")
    assert "OPERATOR_CLOUD_TOKEN" not in names
    assert "KUBECONFIG" not in names
    assert not [n for n in names if n.startswith("LORENZ_OPERATOR_")]
    assert "TZ" in names  # the documented allow-list
    assert "PATH" in names
    assert "AGENT_LOG" in names  # the agent kind's env from the spec
    assert "LORENZ_ISSUE_IDENTIFIER" in names  # the run's own variables
    # LORENZ_WORKFLOW names a file that exists: the applied spec rendered as a WORKFLOW.md.
    workflow_file = Path((rig.root / "agent-env.txt.workflow").read_text())
    assert workflow_file.is_file()
    assert workflow_file.read_text().startswith("---\n")


def test_a_held_claim_stops_its_run_and_keeps_the_issue_until_the_hold_is_removed(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators("holder", namespaces=(kube.namespace,))
    write_issue(rig.issues_of("hold"), "TASK-1")
    kube.apply(rig.workflow("hold", seconds=600.0, interval_ms=300))
    claim = wait_until(
        lambda: next((c for c in kube.items("claims") if phase(c) == "Running"), None),
        timeout=60, message="a Running Claim",
    )
    (first,) = wait_until(lambda: rig.runs() or None, timeout=60, message="the agent runs")
    name = claim["metadata"]["name"]
    kube.cluster.kubectl(
        "annotate", "claim", name, "-n", kube.namespace, "lorenz.dev/hold=looking into it"
    )
    wait_until(lambda: not _alive(first.pid) or None, timeout=60, message="the run stopped")
    wait_until(lambda: "IssueHeld" in kube.reasons("hold"), timeout=60, message="IssueHeld")
    # Unlike a deleted Claim, a held one stays, and polls go by without a new run.
    ticks = ticks_of(operator, kube.namespace, "hold")
    wait_until(lambda: ticks_of(operator, kube.namespace, "hold") >= ticks + 5 or None,
               timeout=60, message="five more polls")
    assert [c["metadata"]["name"] for c in kube.items("claims")] == [name]
    assert len(rig.runs()) == 1
    assert issue_state(rig.issues_of("hold"), "TASK-1") == "Todo"

    kube.cluster.kubectl("annotate", "claim", name, "-n", kube.namespace, "lorenz.dev/hold-")
    wait_until(lambda: len(rig.runs()) == 2 or None, timeout=120,
               message="released, the issue runs again")
    claim = wait_until(
        lambda: next((c for c in kube.items("claims") if phase(c) == "Running"), None),
        timeout=60, message="its Claim is Running again",
    )
    assert "lorenz.dev/hold" not in (claim["metadata"].get("annotations") or {})


def test_an_agent_that_ends_cleanly_without_moving_its_issue_is_held_after_a_bound(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    operator = operators(
        "bounded", namespaces=(kube.namespace,), extra_args=("--max-continuation-runs", "2")
    )
    write_issue(rig.issues_of("noop"), "TASK-1")
    kube.apply(rig.workflow("noop", seconds=0.2, interval_ms=300,
                            agent_env={"AGENT_NOOP": "1"}))
    event = wait_until(
        lambda: next((e for e in kube.events("noop") if e["reason"] == "ContinuationLimit"),
                     None),
        timeout=120, message="the ContinuationLimit Event",
    )
    assert "ended cleanly 3 times in a row" in event["message"]
    assert "held" in event["message"]
    claim = wait_until(
        lambda: next((c for c in kube.items("claims")
                      if "lorenz.dev/hold" in (c["metadata"].get("annotations") or {})), None),
        timeout=60, message="the Claim is held",
    )
    assert claim["spec"]["identifier"] == "TASK-1"
    runs = len(rig.runs())
    ticks = ticks_of(operator, kube.namespace, "noop")
    wait_until(lambda: ticks_of(operator, kube.namespace, "noop") >= ticks + 5 or None,
               timeout=60, message="five more polls")
    # The first run and two continuation re-runs (one more may have started before the hold
    # landed, and was stopped by it); then nothing.
    assert 3 <= runs <= 4, runs
    assert len(rig.runs()) == runs
    assert issue_state(rig.issues_of("noop"), "TASK-1") == "Todo"


def test_the_operator_log_scrubs_a_workflows_tracker_token(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    """The token comes from the Workflow's Secret, not the operator's environment; an agent
    that prints it to stderr (logged at debug) must not put it into the operator's log."""
    token = "tok-3f9a1c77-lorenz-log"
    operator = operators("solo", namespaces=(kube.namespace,))
    kube.cluster.kubectl(
        "create", "secret", "generic", "tracker-token", "-n", kube.namespace,
        f"--from-literal=token={token}",
    )
    write_issue(rig.issues_of("scrub"), "TASK-1")
    manifest = rig.workflow("scrub")
    manifest["spec"]["tracker"]["apiKeySecretRef"] = {"name": "tracker-token", "key": "token"}
    manifest["spec"]["agents"]["script"]["command"] = (
        f"{sys.executable} -c \"import sys; sys.stderr.write('echoed {token} here\\n')\""
    )
    kube.apply(manifest)
    wait_until(
        lambda: "agent stderr: echoed" in operator.log() or None,
        timeout=90, message="the agent's stderr line was logged",
    )
    assert token not in operator.log()
    assert "agent stderr: echoed *** here" in operator.log()
