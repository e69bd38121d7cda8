"""The Kubernetes API verbs the operator uses, written down once, as data.

The Helm chart, the plain manifests in ``deploy/`` and the RBAC tests all derive the operator's
ClusterRole (or per-namespace Role) from :data:`OPERATOR_RULES`, and its Lease Role in its own
namespace from :data:`LEASE_RULES`, so "least privilege" has one
definition: when the operator starts calling a new verb, the rule is added here, in the same
change, and every consumer follows. Each rule says *why* the operator needs it; a verb without a
reason does not belong here.

NB: the operator deliberately needs no access to CustomResourceDefinitions or Namespaces: kopf's
resource scanning is disabled (the two kinds are known up front), and it watches either all
namespaces or the listed ones without observing Namespace objects.
"""

from __future__ import annotations

import copy
from typing import Any, Final, TypedDict


class PolicyRule(TypedDict):
    """One ``rbac.authorization.k8s.io/v1`` PolicyRule (the fields the operator needs)."""

    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]


API_GROUP: Final = "lorenz.dev"

RULE_REASONS: Final[dict[tuple[str, str], str]] = {
    (API_GROUP, "workflows"): (
        "watch Workflows (kopf), read the spec on takeover, add and remove the "
        "lorenz.dev/cleanup finalizer (patch)"
    ),
    (API_GROUP, "workflows/status"): "publish conditions, poll block, lanes, usage, leader",
    (API_GROUP, "claims"): (
        "one Claim per claimed slot: create on claim, list on takeover, watch for deletions "
        "(a deleted Claim cancels its run), delete on release and on Workflow deletion"
    ),
    (API_GROUP, "claims/status"): "claim state (phase, attempt, owner, due time) with CAS",
    ("", "secrets"): (
        "read the tracker API key and webhook secret named by spec.tracker.apiKeySecretRef "
        "and webhookSecretRef; create and delete the per-run spec Secret of a run's Pod "
        "(worker.kind: pod)"
    ),
    ("", "pods"): (
        "runs in Pods (worker.kind: pod): create the run's Pod, watch the namespace's run "
        "Pods (one list+watch shared by every launch waiting for its worker, and the Claims' "
        "Pod phase), read one when probed, delete it when the run is settled; list a "
        "Workflow's run Pods "
        "(by label) to delete those no Claim names (a new leader's orphan sweep) and all of "
        "them when the Workflow is deleted"
    ),
    ("", "persistentvolumeclaims"): (
        "workspaces on claims (worker.workspace.volumeClaimTemplate): create an issue's claim, "
        "read it on the next attempt, list an issue's or a deleted Workflow's claims (by "
        "label) and delete them"
    ),
    ("", "serviceaccounts"): (
        "run Pods' identity: read the namespace's lorenz-agent ServiceAccount and create it "
        "when missing (no token mounted, bound to no role)"
    ),
    ("", "pods/exec"): (
        "reach the worker in a run's Pod: `lorenz worker --bridge/--probe` through the exec "
        "channel (a WebSocket GET, authorized as get and create)"
    ),
    ("", "events"): "post Kubernetes Events on the Workflow (kubectl describe)",
    ("networking.k8s.io", "networkpolicies"): (
        "run Pods' network: create the Workflow's lorenz-runs-<workflow> NetworkPolicy (no "
        "ingress; egress to DNS and worker.egress) before its first run Pod, read it and "
        "update it when worker.egress changes"
    ),
}
"""Why each resource is in :data:`OPERATOR_RULES` (docs and tests read this)."""

OPERATOR_RULES: Final[list[PolicyRule]] = [
    {
        "apiGroups": [API_GROUP],
        "resources": ["workflows"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {
        "apiGroups": [API_GROUP],
        "resources": ["workflows/status"],
        "verbs": ["get", "patch"],
    },
    {
        "apiGroups": [API_GROUP],
        "resources": ["claims"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {
        "apiGroups": [API_GROUP],
        "resources": ["claims/status"],
        "verbs": ["get", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get", "create", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["persistentvolumeclaims"],
        "verbs": ["get", "list", "create", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["serviceaccounts"],
        "verbs": ["get", "create"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods/exec"],
        "verbs": ["get", "create"],
    },
    {
        "apiGroups": [""],
        "resources": ["events"],
        "verbs": ["create"],
    },
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "update"],
    },
]
"""Every verb the operator calls on the Workflows' side, per resource: the rules of its
ClusterRole (cluster-wide install) or of a Role in each watched namespace (namespaced install).
Leases are not among them: see :data:`LEASE_RULES`."""


LEASE_REASONS: Final[dict[tuple[str, str], str]] = {
    ("coordination.k8s.io", "leases"): (
        "sharded leadership: list the operator's shard and membership Leases, read, create and "
        "compare-and-swap update them (only in the operator's own namespace)"
    ),
}
"""Why each resource is in :data:`LEASE_RULES`."""

LEASE_RULES: Final[list[PolicyRule]] = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "create", "update"],
    },
]
"""What leadership needs, granted by a Role in the operator's own namespace only (where every
Lease it writes lives), never cluster-wide: the operator cannot touch any other Lease, such as
kube-system's control-plane ones."""


API_AUTH_REASONS: Final[dict[tuple[str, str], str]] = {
    ("authentication.k8s.io", "tokenreviews"): (
        "HTTP API authentication: ask the API server who a caller's bearer token belongs to"
    ),
    ("authorization.k8s.io", "subjectaccessreviews"): (
        "HTTP API authorization: ask whether that caller may read (or patch) the Workflow"
    ),
}
"""Why each resource is in :data:`API_AUTH_RULES`."""

API_AUTH_RULES: Final[list[PolicyRule]] = [
    {
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["tokenreviews"],
        "verbs": ["create"],
    },
    {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["subjectaccessreviews"],
        "verbs": ["create"],
    },
]
"""What ``api_auth: kubernetes`` needs: cluster-scoped, so always a ClusterRole of its own, also
in a namespaced install (these reviews read nothing; they only ask the API server)."""


def cluster_role(
    *, name: str, labels: dict[str, str] | None = None, rules: list[PolicyRule] | None = None
) -> dict[str, Any]:
    """A ClusterRole manifest granting exactly ``rules`` (default :data:`OPERATOR_RULES`)."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    chosen = OPERATOR_RULES if rules is None else rules
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata,
        "rules": [dict(copy.deepcopy(rule)) for rule in chosen],
    }


def role(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str] | None = None,
    rules: list[PolicyRule] | None = None,
) -> dict[str, Any]:
    """A namespaced Role manifest granting exactly ``rules`` (default :data:`OPERATOR_RULES`)
    in ``namespace``."""
    manifest = cluster_role(name=name, labels=labels, rules=rules)
    manifest["kind"] = "Role"
    manifest["metadata"]["namespace"] = namespace
    return manifest


def lease_role(
    *, name: str, namespace: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The Role in the operator's own namespace granting exactly :data:`LEASE_RULES`."""
    return role(name=name, namespace=namespace, labels=labels, rules=LEASE_RULES)
