"""``worker.kind: pod`` and its Pod settings: what the loader accepts, and the coded errors
that refuse what Kubernetes would refuse or what would be ignored.

The same model is the Workflow CRD's spec (tests/kube/test_crds.py applies these to the real
API server); here the loader reports each problem under its code and key path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lorenz.config import WorkerKind
from lorenz.workflow import ConfigProblem, InvalidWorkflowConfig, settings_from_mapping


def _load(worker: dict[str, Any]) -> Any:
    return settings_from_mapping(
        {"tracker": {"kind": "files", "path": "issues"}, "worker": worker},
        base_dir=Path("/"),
        environ={},
    ).settings


def _problem(worker: dict[str, Any]) -> ConfigProblem:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        _load(worker)
    problems = caught.value.problems()
    assert len(problems) == 1, problems
    return problems[0]


def test_local_is_the_default_and_pod_settings_have_safe_defaults() -> None:
    worker = _load({}).worker
    assert worker.kind is WorkerKind.LOCAL
    pod = _load({"kind": "pod"}).worker
    assert pod.kind is WorkerKind.POD
    assert pod.start_timeout_ms == 120_000
    assert pod.service_account_name is None
    assert pod.pod_template.image is None
    assert pod.workspace.empty_dir.size_limit is None


def test_a_workflow_file_runs_local_workers_unless_it_says_otherwise(tmp_path: Path) -> None:
    """Single host (``lorenz WORKFLOW.md``): ``local`` is the default, and the only kind there;
    only the operator defaults a Workflow to ``pod`` (tests/kube/test_models.py)."""
    from lorenz.workflow import load_workflow

    path = tmp_path / "WORKFLOW.md"
    path.write_text("---\ntracker: {kind: files, path: issues}\n---\nWork.\n")
    assert load_workflow(path, environ={}).settings.worker.kind is WorkerKind.LOCAL


def test_a_complete_pod_worker_is_accepted() -> None:
    worker = _load(
        {
            "kind": "pod",
            "pod_template": {
                "image": "registry.example/agents/codex:1.2",
                "image_pull_policy": "IfNotPresent",
                "resources": {
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                    "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"},
                },
                "node_selector": {"kubernetes.io/arch": "amd64", "pool": "agents"},
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "agents",
                     "effect": "NoSchedule"},
                    {"operator": "Exists"},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                     "effect": "NoExecute", "toleration_seconds": 30},
                ],
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
                },
                "env_from_secrets": ["openai", "anthropic.keys"],
            },
            "service_account_name": "lorenz-agent",
            "workspace": {"empty_dir": {"size_limit": "10Gi"}},
            "start_timeout_ms": 30000,
        }
    ).worker
    template = worker.pod_template
    assert template.resources.limits["nvidia.com/gpu"] == "1"
    assert [t.manifest() for t in template.tolerations] == [
        {"operator": "Equal", "key": "dedicated", "value": "agents", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"operator": "Exists", "key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
         "tolerationSeconds": 30},
    ]
    # NB: the affinity is Kubernetes' own object, passed on with its keys as written.
    assert template.affinity == {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
    }


@pytest.mark.parametrize(
    ("worker", "code", "key_path", "fragment"),
    [
        (
            {"pod_template": {"image": "x"}},
            "worker_pod_settings_unused",
            "worker.pod_template",
            "set worker.kind: pod",
        ),
        (
            {"kind": "local", "start_timeout_ms": 5000},
            "worker_pod_settings_unused",
            "worker.start_timeout_ms",
            "only applies to runs in Pods",
        ),
        (
            {"kind": "pod", "ssh_hosts": ["build1"]},
            "worker_kind_conflict",
            "worker.ssh_hosts",
            "does not apply with worker.kind: pod",
        ),
        (
            {"detached": False},
            "worker_detached_false",
            "worker.detached",
            "delete worker.detached or set it to true",
        ),
        (
            {"kind": "pod", "detached": True},
            "worker_kind_conflict",
            "worker.detached",
            "does not apply with worker.kind: pod",
        ),
        (
            {"kind": "pod", "pod_template": {"resources": {"limits": {"memory": "2 GB"}}}},
            "worker_pod_value_invalid",
            "worker.pod_template.resources.limits.memory",
            "'2 GB' is not a Kubernetes quantity",
        ),
        (
            {"kind": "pod", "service_account_name": "Agents_SA"},
            "worker_pod_value_invalid",
            "worker.service_account_name",
            "'Agents_SA' is not a Kubernetes object name",
        ),
        (
            {"kind": "pod", "pod_template": {"env_from_secrets": ["my secret"]}},
            "worker_pod_value_invalid",
            "worker.pod_template.env_from_secrets",
            "'my secret' is not a Kubernetes object name",
        ),
        (
            {"kind": "pod", "pod_template": {"node_selector": {"pool": "a b"}}},
            "worker_pod_value_invalid",
            "worker.pod_template.node_selector.pool",
            "'a b' is not a Kubernetes label value",
        ),
        (
            {"kind": "pod", "pod_template": {"node_selector": {"-bad": "x"}}},
            "worker_pod_value_invalid",
            "worker.pod_template.node_selector",
            "'-bad' is not a Kubernetes label key",
        ),
        (
            {"kind": "pod",
             "pod_template": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
            "worker_pod_value_invalid",
            "worker.pod_template.tolerations",
            "operator Exists takes no value",
        ),
        (
            {"kind": "pod", "pod_template": {"tolerations": [{"value": "v"}]}},
            "worker_pod_value_invalid",
            "worker.pod_template.tolerations",
            "without a key needs operator Exists",
        ),
        (
            {"kind": "pod",
             "pod_template": {"tolerations": [{"key": "k", "toleration_seconds": 5}]}},
            "worker_pod_value_invalid",
            "worker.pod_template.tolerations",
            "toleration_seconds needs effect NoExecute",
        ),
        (
            {"kind": "pod", "workspace": {"empty_dir": {"size_limit": "lots"}}},
            "worker_pod_value_invalid",
            "worker.workspace.empty_dir.size_limit",
            "'lots' is not a Kubernetes quantity",
        ),
        (
            {"kind": "pod", "pod_template": {"image": "  "}},
            "worker_pod_value_invalid",
            "worker.pod_template.image",
            "must not be blank",
        ),
    ],
)
def test_nonsense_is_refused_with_a_code_and_the_key(
    worker: dict[str, Any], code: str, key_path: str, fragment: str
) -> None:
    problem = _problem(worker)
    assert (problem.code, problem.key_path) == (code, key_path)
    assert fragment in problem.reason


def test_a_worktree_workspace_cannot_be_made_in_a_pod() -> None:
    with pytest.raises(InvalidWorkflowConfig) as caught:
        settings_from_mapping(
            {
                "tracker": {"kind": "files", "path": "issues"},
                "workspace": {"kind": "worktree", "repo": "/src/repo"},
                "worker": {"kind": "pod"},
            },
            base_dir=Path("/"),
            environ={},
        )
    (problem,) = caught.value.problems()
    assert (problem.code, problem.key_path) == ("worker_kind_conflict", "workspace.kind")
    assert "clone in hooks.after_create" in problem.reason


@pytest.mark.parametrize(
    ("worker", "key_path"),
    [
        ({"kind": "container"}, "worker.kind"),
        ({"kind": "pod", "start_timeout_ms": 0}, "worker.start_timeout_ms"),
        ({"kind": "pod", "pod_template": {"imagePullPolicy": "Never"}},
         "worker.pod_template.imagePullPolicy"),
        ({"kind": "pod", "workspace": {"empty_dir": {"medium": "HugePages"}}},
         "worker.workspace.empty_dir.medium"),
    ],
)
def test_wrong_types_and_unknown_keys_are_invalid_config(
    worker: dict[str, Any], key_path: str
) -> None:
    problem = _problem(worker)
    assert problem.code == "invalid_workflow_config"
    assert problem.key_path == key_path
