"""The generated CRDs: fresh on disk, accepted by the API server, and enforcing the schema.

A bad Workflow must be refused at ``kubectl apply`` time with a message that names the field,
by the structural schema (wrong type, enum, bounds, unknown fields under strict validation) or
by a CEL rule (cross-field checks). These run against the real kube-apiserver.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorenz.kube.api import crds
from tests.cluster.cluster import Cluster
from tests.kube.conftest import CRDS

GOOD: dict[str, Any] = {
    "apiVersion": "lorenz.dev/v1alpha1",
    "kind": "Workflow",
    "metadata": {"name": "good"},
    "spec": {
        "tracker": {"kind": "files", "path": "/tmp/issues"},
        "polling": {"intervalMs": 1000},
        "agent": {"kind": "script", "maxConcurrentAgents": 2},
        "agents": {"script": {"command": "true", "protocol": "command"}},
        "prompt": "Work on {{ issue.identifier }}",
    },
}


def with_spec(name: str, **changes: Any) -> dict[str, Any]:
    """GOOD with ``changes`` merged into its spec (a section value replaces, keys merge)."""
    body = copy.deepcopy(GOOD)
    body["metadata"]["name"] = name
    for section, value in changes.items():
        current = body["spec"].get(section)
        if isinstance(current, dict) and isinstance(value, dict):
            current.update(value)
        elif value is None:
            body["spec"].pop(section, None)
        else:
            body["spec"][section] = value
    return body


def apply(
    cluster: Cluster, namespace: str, body: dict[str, Any], *, validate: str = "strict"
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "apply",
        f"--validate={validate}",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(body),
        check=False,
    )


def rejected(cluster: Cluster, namespace: str, body: dict[str, Any], **kwargs: Any) -> str:
    proc = apply(cluster, namespace, body, **kwargs)
    assert proc.returncode != 0, f"accepted: {body['spec']}\n{proc.stdout}"
    return proc.stderr


def test_committed_crds_are_generated_from_the_models() -> None:
    assert crds.stale_files(CRDS) == [], "run `lorenz crds --write crds/`"


def test_lorenz_crds_check_reports_a_stale_file(tmp_path: Any) -> None:
    from lorenz.cli import main

    crds.write(tmp_path)
    assert main(["crds", "--check", str(tmp_path)]) == 0
    (tmp_path / "claims.lorenz.dev.yaml").write_text("stale\n")
    assert main(["crds", "--check", str(tmp_path)]) == 1



@pytest.mark.cluster
def test_a_valid_workflow_is_accepted_and_keeps_only_what_was_written(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    proc = apply(kube_control_plane, kube_namespace, GOOD)
    assert proc.returncode == 0, proc.stderr
    stored = kube_control_plane.kubectl_json("get", "wf", "good", "-n", kube_namespace)
    # No server-side defaults: the model applies them, so the object holds what was written.
    assert stored["spec"] == GOOD["spec"]


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"polling": {"intervalMs": "soon"}}, "spec.polling.intervalMs", "must be of type integer"),
        ({"tracker": {"kind": "asana"}}, "spec.tracker.kind", "Unsupported value"),
        (
            {"agent": {"maxConcurrentAgents": 0}},
            "spec.agent.maxConcurrentAgents",
            "greater than or equal to 1",
        ),
        ({"agent": {"ensembleSize": 17}}, "spec.agent.ensembleSize", "less than or equal to 16"),
        ({"agents": {"script": {"protocol": "command"}}}, "spec.agents.script.command", "Required"),
        ({"tracker": {"activeStates": "Todo"}}, "spec.tracker.activeStates", "type array"),
    ],
)
def test_structural_schema_rejects_bad_values_naming_the_field(
    kube_control_plane: Cluster,
    kube_namespace: str,
    lorenz_crds: list[str],
    changes: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    body = with_spec("bad", **changes)
    if "agents" in changes:
        body["spec"]["agents"] = changes["agents"]
    stderr = rejected(kube_control_plane, kube_namespace, body)
    assert field in stderr
    assert fragment in stderr


@pytest.mark.cluster
def test_unknown_fields_fail_strict_validation_and_are_pruned_otherwise(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    typo = with_spec("typo", polling={"intervalMS": 5})
    stderr = rejected(kube_control_plane, kube_namespace, typo)
    assert 'unknown field "spec.polling.intervalMS"' in stderr

    proc = apply(kube_control_plane, kube_namespace, typo, validate="false")
    assert proc.returncode == 0, proc.stderr
    stored = kube_control_plane.kubectl_json("get", "wf", "typo", "-n", kube_namespace)
    assert stored["spec"]["polling"] == {"intervalMs": 1000}


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        (
            {"tracker": {"kind": "linear", "apiKeySecretRef": {"name": "s", "key": "k"}}},
            "spec.tracker.projectSlug",
            "tracker.projectSlug is required when tracker.kind is linear",
        ),
        (
            {"tracker": {"kind": "github", "apiKeySecretRef": {"name": "s", "key": "k"}}},
            "spec.tracker.repository",
            "tracker.repository is required when tracker.kind is github",
        ),
        (
            {"tracker": {"kind": "github", "repository": "o/r"}},
            "spec.tracker.apiKeySecretRef",
            "tracker.apiKeySecretRef is required",
        ),
        (
            {"tracker": {"apiKey": "lin_api_123"}},
            "spec.tracker.apiKey",
            "tracker.apiKey cannot be written inline",
        ),
        (
            {"tracker": {"kind": "memory"}},
            "spec.tracker.kind",
            "tracker.kind memory holds issues inside one process",
        ),
        (
            {"workspace": {"kind": "worktree"}},
            "spec.workspace.repo",
            "workspace.repo is required when workspace.kind is worktree",
        ),
        (
            {"agent": {"kind": "claude"}},
            "spec.agent.kind",
            "agent.kind must name an entry of agents",
        ),
        (
            {"worker": {"kind": "local", "podTemplate": {"image": "agents:1"}}},
            "spec.worker.kind",
            "only apply when worker.kind is pod",
        ),
        (
            {"worker": {"kind": "pod", "sshHosts": ["build1"]}},
            "spec.worker.sshHosts",
            "does not apply with worker.kind pod",
        ),
        # An unset worker.kind is the operator's default, pod.
        (
            {"worker": {"sshHosts": ["build1"]}},
            "spec.worker.sshHosts",
            "worker.kind pod, the default",
        ),
        (
            {"worker": {"detached": True}},
            "spec.worker.detached",
            "worker.kind pod, the default",
        ),
        (
            {"workspace": {"kind": "worktree", "repo": "/src/repo"}},
            "spec.workspace.kind",
            "or set worker.kind: local",
        ),
        (
            {
                "tracker": {"kind": "github", "repository": "o/r",
                            "apiKeySecretRef": {"name": "github", "key": "token"}},
                "worker": {"kind": "pod", "podTemplate": {"envFromSecrets": ["model", "github"]}},
            },
            "spec.worker.podTemplate.envFromSecrets",
            "must not name the tracker's Secret",
        ),
        # #37 point 2: the tracker's Secret mounted as a volume (the file holds the token).
        (
            {
                "tracker": {"kind": "linear", "projectSlug": "b",
                            "apiKeySecretRef": {"name": "linear-b", "key": "token"}},
                "worker": {"podTemplate": {"volumes": [
                    {"name": "cache", "mountPath": "/cache", "emptyDir": {}},
                    {"name": "trk", "mountPath": "/home/lorenz/trk", "secret": "linear-b"},
                ]}},
            },
            "spec.worker.podTemplate.volumes",
            "must not mount the tracker's Secret (tracker.apiKeySecretRef): the tracker token "
            "never enters a run's Pod",
        ),
        # Any other volume kind (a projected Secret, the node's disk) is pruned by the schema
        # and then has no source: refused, never stored as a volume without one.
        (
            {"worker": {"podTemplate": {"volumes": [
                {"name": "trk", "mountPath": "/trk",
                 "projected": {"sources": [{"secret": {"name": "linear-b"}}]}},
            ]}}},
            "spec.worker.podTemplate.volumes[0]",
            "names exactly one of secret, configMap, persistentVolumeClaim, emptyDir",
        ),
        (
            {"worker": {"podTemplate": {"volumes": [
                {"name": "two", "mountPath": "/two", "secret": "model", "emptyDir": {}},
            ]}}},
            "spec.worker.podTemplate.volumes[0]",
            "names exactly one of",
        ),
        # #37 point 6: a Secret of another namespace cannot be named.
        (
            {"tracker": {"kind": "linear", "projectSlug": "a",
                         "apiKeySecretRef": {"name": "team-a/linear-a", "key": "token"}}},
            "spec.tracker.apiKeySecretRef",
            "must be the name of a Secret in the Workflow's own namespace",
        ),
        (
            {"worker": {"podTemplate": {"envFromSecrets": ["team-a/model"]}}},
            "spec.worker.podTemplate.envFromSecrets[0]",
            "no 'namespace/' prefix",
        ),
        (
            {"worker": {"podTemplate": {"volumes": [
                {"name": "m", "mountPath": "/m", "secret": "team-a/model"},
            ]}}},
            "spec.worker.podTemplate.volumes[0].secret",
            "Secret in the Workflow's own namespace",
        ),
    ],
)
def test_cel_rules_reject_cross_field_violations_naming_the_field(
    kube_control_plane: Cluster,
    kube_namespace: str,
    lorenz_crds: list[str],
    changes: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    body = with_spec("cel", **changes)
    if changes.get("tracker", {}).get("kind") in ("linear", "github"):
        body["spec"]["tracker"].pop("path")
    # Non-strict too: CEL is enforced by the API server whatever the client asks for.
    stderr = rejected(kube_control_plane, kube_namespace, body, validate="false")
    assert field in stderr
    assert fragment in stderr


@pytest.mark.cluster
def test_cel_rules_accept_the_complete_forms(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    linear = with_spec(
        "linear",
        tracker={
            "kind": "linear",
            "projectSlug": "abc123",
            "apiKeySecretRef": {"name": "linear", "key": "token"},
        },
        workspace={"kind": "worktree", "repo": "/src/repo"},
        worker={"kind": "local"},
    )
    linear["spec"]["tracker"].pop("path")
    proc = apply(kube_control_plane, kube_namespace, linear)
    assert proc.returncode == 0, proc.stderr
    codex = with_spec("codex", agent={"kind": "codex"}, agents=None)
    proc = apply(kube_control_plane, kube_namespace, codex)
    assert proc.returncode == 0, proc.stderr
    # Pod settings need no kind (pod is the default); SSH hosts and workers that say so
    # need local, written out.
    for name, worker in (
        ("pod-default", {"startTimeoutMs": 5000, "podTemplate": {"image": "agents:1"}}),
        ("ssh", {"kind": "local", "sshHosts": ["build1"], "detached": True}),
    ):
        proc = apply(kube_control_plane, kube_namespace, with_spec(name, worker=worker))
        assert proc.returncode == 0, proc.stderr


POD_WORKER: dict[str, Any] = {
    "kind": "pod",
    "podTemplate": {
        "image": "registry.example/agents/codex:1.2",
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}},
        "nodeSelector": {"pool": "agents"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                        ]}
                    ]
                }
            }
        },
        "envFromSecrets": ["model"],
        "runtimeClassName": "gvisor",
        "volumes": [
            {"name": "agent-config", "mountPath": "/etc/agent", "configMap": "agent-config"},
            {"name": "model-key", "mountPath": "/etc/model", "secret": "model", "readOnly": True},
        ],
    },
    "serviceAccountName": "lorenz-agent",
    "workspace": {"emptyDir": {"sizeLimit": "10Gi"}},
    "startTimeoutMs": 30000,
}


@pytest.mark.cluster
def test_a_pod_worker_is_accepted_whole_and_kubectl_explain_shows_it(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    body = with_spec("pods", worker=POD_WORKER)
    proc = apply(kube_control_plane, kube_namespace, body)
    assert proc.returncode == 0, proc.stderr
    stored = kube_control_plane.kubectl_json("get", "wf", "pods", "-n", kube_namespace)
    # The affinity is Kubernetes' own object: kept whole (preserve-unknown-fields).
    assert stored["spec"]["worker"] == POD_WORKER
    # The spec maps back to the one settings model (camelCase -> snake_case).
    from lorenz.kube.api.casing import front_matter_from_spec
    from lorenz.workflow import settings_from_mapping

    settings = settings_from_mapping(
        front_matter_from_spec({"tracker": {"kind": "files", "path": "i"},
                                "worker": stored["spec"]["worker"]}),
        base_dir=Path("/"),
        environ={},
    ).settings
    assert settings.worker.pod_template.env_from_secrets == ("model",)
    assert settings.worker.pod_template.runtime_class_name == "gvisor"
    assert [v.name for v in settings.worker.pod_template.volumes] == ["agent-config", "model-key"]
    assert settings.worker.workspace.empty_dir.size_limit == "10Gi"

    explained = kube_control_plane.kubectl(
        "explain", "workflows.spec.worker.podTemplate", "--api-version=lorenz.dev/v1alpha1"
    ).stdout
    for field in ("image", "resources", "nodeSelector", "tolerations", "affinity",
                  "envFromSecrets", "runtimeClassName"):
        assert field in explained, explained
    kind = kube_control_plane.kubectl(
        "explain", "workflows.spec.worker.kind", "--api-version=lorenz.dev/v1alpha1"
    ).stdout
    assert "unisolated" in kind, kind
    # The operator's default (the schema sets none: the stored object keeps what was written).
    assert 'Default: "pod"' in kind, kind
    assert "default" not in crds.workflow_spec_schema()["properties"]["worker"]["properties"][
        "kind"
    ]


@pytest.mark.cluster
def test_an_agent_env_takes_strings_only_so_no_secret_key_ref_reaches_a_run(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    """#37 point 2: a Pod's ``env[].valueFrom.secretKeyRef`` has no counterpart in a Workflow:
    an agent's ``env`` holds plain strings, so a reference to the tracker's Secret is refused
    with or without strict validation."""
    body = with_spec("env-ref")
    body["spec"]["agents"]["script"]["env"] = {
        "TOKEN": {"valueFrom": {"secretKeyRef": {"name": "linear-b", "key": "token"}}}
    }
    stderr = rejected(kube_control_plane, kube_namespace, body)
    assert "spec.agents.script.env.TOKEN" in stderr, stderr
    # Unchecked by the client, the API server still refuses it: no string, no Workflow.
    stderr = rejected(kube_control_plane, kube_namespace, body, validate="false")
    assert "spec.agents.script.env.TOKEN" in stderr, stderr


@pytest.mark.cluster
def test_a_claims_spec_is_immutable(
    kube_control_plane: Cluster, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    claim: dict[str, Any] = {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Claim",
        "metadata": {"name": "c1"},
        "spec": {
            "workflow": "wf",
            "slotKey": "I-1#0",
            "issueId": "I-1",
            "identifier": "I-1",
            "slotIndex": 0,
        },
    }
    assert apply(kube_control_plane, kube_namespace, claim).returncode == 0
    claim["spec"]["slotIndex"] = 1
    stderr = rejected(kube_control_plane, kube_namespace, claim)
    assert "a Claim's spec is immutable" in stderr
