"""Workspace claims of issues that turned terminal while no replica tracked them are deleted
when a leader's term starts (the Pod runs' counterpart of the start-up workspace cleanup).

An issue given up and then closed, or closed while the operator was away, has no Claim and no
run, so reconciliation never sees it terminal; before this sweep its PersistentVolumeClaim
stayed until the Workflow was deleted. Claims of issues still active, of issues the tracker
does not know, and of another Workflow stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lorenz.kube.pods.manifests import ANNOTATION_ISSUE_ID
from tests.cluster.cluster import wait_until
from tests.kube.operators import Kube, OperatorProcess, Rig, write_issue

pytestmark = pytest.mark.cluster


def workspace_claim(namespace: str, *, workflow: str, issue: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": f"ws-{workflow}-{issue.lower()}",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "lorenz",
                "lorenz.dev/workflow": workflow,
                "lorenz.dev/issue": issue,
                "lorenz.dev/issue-id": issue,
            },
            "annotations": {ANNOTATION_ISSUE_ID: issue},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "",
        },
    }


def claim_names(kube: Kube) -> set[str]:
    return {
        item["metadata"]["name"]
        for item in kube.items("persistentvolumeclaims")
        if not item["metadata"].get("deletionTimestamp")
    }


def test_a_new_term_deletes_the_workspace_claims_of_untracked_terminal_issues(
    kube: Kube, rig: Rig, operators: Callable[..., OperatorProcess]
) -> None:
    issues = rig.issues_of("sweep")
    write_issue(issues, "TASK-1", state="Done")  # closed while nobody tracked it
    write_issue(issues, "TASK-2", state="Cancelled")
    for claim in (
        workspace_claim(kube.namespace, workflow="sweep", issue="TASK-1"),
        workspace_claim(kube.namespace, workflow="sweep", issue="TASK-2"),
        # The tracker does not know this issue: never deleted on a guess.
        workspace_claim(kube.namespace, workflow="sweep", issue="TASK-404"),
        # Another Workflow's claim of a terminal issue of the same id: not this one's to judge.
        workspace_claim(kube.namespace, workflow="other", issue="TASK-1"),
    ):
        kube.apply(claim)
    assert claim_names(kube) >= {
        "ws-sweep-task-1", "ws-sweep-task-2", "ws-sweep-task-404", "ws-other-task-1"
    }
    operators("sweeper", namespaces=(kube.namespace,))
    # NB: nothing active to run: the Workflow's kind does not matter to the sweep.
    kube.apply(rig.workflow("sweep", seconds=1.0))
    wait_until(
        lambda: not ({"ws-sweep-task-1", "ws-sweep-task-2"} & claim_names(kube)) or None,
        timeout=90, message="the terminal issues' workspace claims deleted",
    )
    assert {"ws-sweep-task-404", "ws-other-task-1"} <= claim_names(kube)
