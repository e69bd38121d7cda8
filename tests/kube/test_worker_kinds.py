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
