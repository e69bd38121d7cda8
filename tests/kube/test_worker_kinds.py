"""The operator's default ``worker.kind`` is ``pod``; ``local`` is there when a Workflow asks.

A Workflow that says nothing about workers has its runs placed in Pods of their own: here a
Pod is created for its run (there is no node, so the run never starts; the Workflow is deleted
before its start timeout). A Workflow that writes ``worker: {kind: local}`` keeps its runs in
the operator (an unisolated worker in the operator's own Pod in a cluster): the run completes
with no Pod. Both run under one operator with a worker image that exists nowhere, as the
chart's would be set. What the loader and admission say about settings that need ``local``
(``sshHosts``, ``detached``, a ``worktree`` workspace) with the kind unset is in
tests/kube/test_models.py and tests/kube/test_crds.py; a single host's default staying
``local`` is in tests/workflow/test_worker_pods.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.cluster import Cluster, wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, issue_state, write_issue

pytestmark = pytest.mark.cluster


def run_pods(kube: Kube, workflow: str) -> list[dict[str, Any]]:
    return kube.items("pods", "-l", f"lorenz.dev/workflow={workflow}")


def test_a_workflow_without_worker_kind_runs_in_a_pod_and_local_stays_in_the_operator(
    kube_control_plane: Cluster,
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
) -> None:
    operators(
        "kinds",
        namespaces=(kube.namespace,),
        extra_args=("--worker-image", "localhost/lorenz:absent"),
    )
    write_issue(rig.issues_of("bare"), "TASK-1")
    bare = rig.workflow("bare", seconds=1.0)
    del bare["spec"]["worker"]  # nothing about workers: the operator's default
    kube.apply(bare)
    write_issue(rig.issues_of("inside"), "TASK-2")
    kube.apply(rig.workflow("inside", seconds=1.0))  # worker: {kind: local}

    (pod,) = wait_until(lambda: run_pods(kube, "bare") or None, timeout=60,
                        message="the run's Pod")
    assert pod["metadata"]["labels"]["lorenz.dev/issue"] == "TASK-1"
    assert pod["spec"]["containers"][0]["image"] == "localhost/lorenz:absent"
    assert pod["spec"]["automountServiceAccountToken"] is False

    wait_until(lambda: issue_state(rig.issues_of("inside"), "TASK-2") == "Done" or None,
               timeout=60, message="the local run completes")
    runs = rig.runs()
    assert runs, "the local run's agent logged nothing"
    assert not [run for run in runs if "TASK-1" in run.slot]  # the Pod's run never started
    assert run_pods(kube, "inside") == []
    assert issue_state(rig.issues_of("bare"), "TASK-1") == "Todo"

    kube_control_plane.kubectl(
        "delete", "workflow", "bare", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )
    wait_until(lambda: run_pods(kube, "bare") == [] or None, timeout=30,
               message="the run's Pod deleted with its Workflow")


def test_local_runs_are_refused_unless_the_platform_team_allows_them(
    kube_control_plane: Cluster,
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
) -> None:
    """#37 point 1: ``worker.kind: local`` would hand the tenant the operator's token. With the
    operator's default (``--local-runs`` off) the Workflow is ``Degraded`` with
    ``local_runs_forbidden`` and no agent runs; allowed only for other namespaces, the same.
    A spec change back to the default kind runs at once."""
    from tests.kube.test_operator import condition, wait_condition

    off = operators("no-local", namespaces=(kube.namespace,), local_runs=False,
                    extra_args=("--worker-image", "localhost/lorenz:absent"))
    write_issue(rig.issues_of("inside"), "TASK-1")
    kube.apply(rig.workflow("inside", seconds=0.2))
    workflow = wait_condition(kube, "inside", "Degraded", "True", reason="local_runs_forbidden",
                              timeout=60)
    message = condition(workflow, "Degraded")["message"]  # type: ignore[index]
    assert "worker.kind local" in message
    assert "--local-runs" in message
    assert rig.runs() == []
    assert issue_state(rig.issues_of("inside"), "TASK-1") == "Todo"
    assert run_pods(kube, "inside") == []
    off.stop()

    elsewhere = operators(
        "local-elsewhere", namespaces=(kube.namespace,),
        extra_args=("--local-runs-namespaces", "some-other-team",
                    "--worker-image", "localhost/lorenz:absent"),
    )
    kube_control_plane.kubectl(
        "annotate", "workflow", "inside", "-n", kube.namespace, "lorenz.dev/refresh=1",
        "--overwrite",
    )

    def refused_by_elsewhere() -> bool | None:
        workflow = kube.get("workflow", "inside")
        leader = ((workflow.get("status") or {}).get("leader") or {}).get("identity") or ""
        found = condition(workflow, "Degraded") or {}
        return (leader.startswith("local-elsewhere") and found.get("status") == "True"
                and found.get("reason") == "local_runs_forbidden") or None

    wait_until(refused_by_elsewhere, timeout=60,
               message="the Workflow refused by the operator that allows local elsewhere")
    assert rig.runs() == []

    # The default kind (a Pod of its own) is what the Workflow gets once it stops asking.
    kube_control_plane.kubectl(
        "patch", "workflow", "inside", "-n", kube.namespace, "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/worker"}]',
    )
    wait_until(lambda: run_pods(kube, "inside") or None, timeout=60, message="the run's Pod")
    wait_condition(kube, "inside", "Degraded", "False", timeout=60)
    assert rig.runs() == []
    assert elsewhere.alive
    kube_control_plane.kubectl(
        "delete", "workflow", "inside", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )


def test_runs_that_keep_failing_to_be_placed_make_the_workflow_degraded(
    kube_control_plane: Cluster,
    kube: Kube,
    rig: Rig,
    operators: Callable[..., OperatorProcess],
) -> None:
    """#37 point 6: a Workflow whose runs are never placed (here: no node at all; on a cluster,
    an image that does not pull) says so as ``Degraded``, with the placement failure's code as
    the reason, after three in a row; not only in ``PlacementFailed`` Events."""
    from tests.kube.test_operator import condition, wait_condition

    operators("unplaced", namespaces=(kube.namespace,),
              extra_args=("--worker-image", "localhost/lorenz:absent"))
    write_issue(rig.issues_of("unplaced"), "TASK-1")
    workflow = rig.workflow("unplaced", seconds=0.2)
    workflow["spec"]["worker"] = {"startTimeoutMs": 2000}  # pod, the default kind
    kube.apply(workflow)
    wait_condition(kube, "unplaced", "Ready", "True", timeout=60)
    # NB: the first failure already pauses dispatch (a host fault, #32: Degraded with the same
    # reason, "dispatch paused"); its probe runs keep failing, and the third in a row says the
    # runs cannot be placed, which takes precedence.
    def placement_degraded() -> dict[str, Any] | None:
        found = condition(kube.get("workflow", "unplaced"), "Degraded")
        if found is None or found["status"] != "True" or found["reason"] != "pod_start_timeout":
            return None
        return found if "cannot place its runs" in found["message"] else None

    message = wait_until(placement_degraded, timeout=300,
                         message="Degraded: the runs cannot be placed")["message"]
    assert "3 runs in a row were not placed" in message
    assert "start_timeout" in message
    assert "PlacementFailed" in kube.reasons("unplaced")
    assert rig.runs() == []
    kube_control_plane.kubectl(
        "delete", "workflow", "unplaced", "-n", kube.namespace, "--wait=true", "--timeout=60s"
    )
