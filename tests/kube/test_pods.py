"""Runs in Pods: the Pod a run gets, and what the API server makes of it.

The manifest is checked as written (pure), then created by :class:`PodTransport` against the
real kube-apiserver in a namespace that enforces the ``restricted`` Pod Security Standard: the
admission accepts it, the spec Secret is owned by the Pod, and with no node to run on the
launch gives up after ``start_timeout_ms`` with the reason and removes both; a create refused by
admission (a ResourceQuota) fails at once. The worker inside a real Pod is tested on the node
(tests/node/test_pod_runs.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import PlacementFailed
from lorenz.config import AgentLaunch, AgentProtocol, WorkerSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.cleanup import delete_issue_workspaces, delete_workflow_runs, sweep_run_pods
from lorenz.kube.pods.execs import PodExec
from lorenz.kube.pods.manifests import (
    AGENT_SERVICE_ACCOUNT,
    ANNOTATION_HANDLE,
    LABEL_HANDLE,
    LABEL_ISSUE,
    LABEL_WORKFLOW,
    operator_service_account,
    placement_reason,
    pod_manifest,
    pod_name,
    refusal_reason,
    spec_claim_name,
    why_not_running,
    workspace_claim_manifest,
    workspace_claim_name,
)
from lorenz.kube.pods.transport import AgentAccounts, PodTransport
from lorenz.kube.pods.watch import RunPodWatches
from lorenz.workers.launch import WorkerLaunchError
from lorenz.workers.spec import IssueSpec, RunSpec
from lorenz.workers.states import ProbeState
from tests.cluster.cluster import Cluster

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def run_spec(identifier: str = "ABC-12", *, attempt: int | None = None) -> RunSpec:
    return RunSpec(
        workflow="/var/lib/lorenz/workflows/team/pods/WORKFLOW.md",
        issue=IssueSpec(id="id-12", identifier=identifier, title="Fix it", state="Todo"),
        attempt=attempt,
        prompt="Fix the bug.",
        agent=AgentLaunch(command="true", protocol=AgentProtocol.COMMAND),
        max_turns=1,
        workspace="/var/lib/lorenz/workspaces/ABC-12",
        create_workspace=True,
    )


def pod_worker(**changes: Any) -> WorkerSettings:
    return WorkerSettings.model_validate({"kind": "pod", **changes})


WORKFLOW = WorkflowRef(namespace="team", name="pods", uid="0d6c7c1e-3c0a-4d5e-9f6e-1a2b3c4d5e6f")


def test_the_pod_is_restricted_tokenless_and_named_after_the_handle() -> None:
    spec = run_spec()
    worker = pod_worker(
        pod_template={
            "image": "agents:1",
            "resources": {"limits": {"memory": "1Gi"}},
            "node_selector": {"pool": "agents"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "env_from_secrets": ["model"],
        },
        service_account_name="lorenz-agent",
        workspace={"empty_dir": {"size_limit": "5Gi"}},
    )
    pod = pod_manifest(spec=spec, workflow=WORKFLOW, worker=worker, image="agents:1")
    meta, body = pod["metadata"], pod["spec"]
    assert meta["name"] == pod_name(spec.handle)
    assert meta["annotations"][ANNOTATION_HANDLE] == spec.handle
    assert meta["labels"][LABEL_WORKFLOW] == "pods"
    assert meta["labels"][LABEL_ISSUE] == "ABC-12"
    assert meta["labels"][LABEL_HANDLE] == spec.handle
    assert meta["ownerReferences"][0]["uid"] == WORKFLOW.uid
    assert body["automountServiceAccountToken"] is False
    assert body["enableServiceLinks"] is False
    assert body["serviceAccountName"] == "lorenz-agent"
    assert body["restartPolicy"] == "Never"
    assert body["securityContext"]["runAsNonRoot"] is True
    assert body["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = body["containers"]
    assert container["command"][:2] == ["lorenz", "worker"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "model"}}]
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert body["nodeSelector"] == {"pool": "agents"}
    assert body["tolerations"] == [
        {"operator": "Exists", "key": "dedicated", "effect": "NoSchedule"}
    ]
    volumes = {v["name"]: v for v in body["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "5Gi"}}
    assert volumes["spec"]["secret"]["secretName"] == f"{meta['name']}-spec"
    # Nothing but the spec Secret and emptyDirs: no host path, no token projection.
    assert {next(k for k in v if k != "name") for v in body["volumes"]} == {"secret", "emptyDir"}
    # The only variable the Pod sets itself; the tracker token is nowhere in it.
    assert container["env"] == [{"name": "HOME", "value": "/home/lorenz"}]


def test_the_default_identity_is_lorenz_agent_and_the_workspace_an_empty_dir() -> None:
    pod = pod_manifest(spec=run_spec(), workflow=WORKFLOW, worker=pod_worker(), image="a:1")
    assert pod["spec"]["serviceAccountName"] == AGENT_SERVICE_ACCOUNT
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {}}
    assert workspace_claim_manifest(spec=run_spec(), workflow=WORKFLOW, worker=pod_worker()) is None


def test_a_claim_template_gives_each_issue_slot_a_claim_of_its_own() -> None:
    worker = pod_worker(
        workspace={"volume_claim_template": {"storage": "2Gi", "storage_class_name": "fast"}}
    )
    spec = run_spec()
    claim = workspace_claim_manifest(spec=spec, workflow=WORKFLOW, worker=worker)
    assert claim is not None
    name = claim["metadata"]["name"]
    assert name == spec_claim_name(spec, workflow=WORKFLOW)
    assert DNS_LABEL.match(name), name
    assert name.startswith("ws-pods-abc-12-"), name
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "fast",
        "volumeMode": "Filesystem",
    }
    assert claim["metadata"]["annotations"]["lorenz.dev/issue-id"] == "id-12"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == WORKFLOW.uid
    # Every attempt of the issue mounts that claim; its Pod is still the attempt's own.
    later = run_spec(attempt=3)
    pod = pod_manifest(spec=later, workflow=WORKFLOW, worker=worker, image="a:1")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"] == {"claimName": name}
    assert spec_claim_name(later, workflow=WORKFLOW) == name
    # The agent's sessions are kept on the claim too, beside the issue's workspace folder, so
    # an answered question's run in a new Pod resumes the same session (docs/questions.md).
    (container,) = pod["spec"]["containers"]
    assert container["env"] == [
        {"name": "HOME", "value": "/home/lorenz"},
        {"name": "CODEX_HOME", "value": "/var/lib/lorenz/workspaces/.lorenz-sessions/codex"},
        {"name": "CLAUDE_CONFIG_DIR",
         "value": "/var/lib/lorenz/workspaces/.lorenz-sessions/claude"},
    ]
    # Another issue, slot, Workflow or a case-twin of the identifier: another claim.
    names = {
        workspace_claim_name(workflow=w, issue_id=i, identifier=k, slot_index=n)
        for w, i, k, n in [
            ("pods", "id-12", "ABC-12", 0), ("pods", "id-12", "ABC-12", 1),
            ("pods", "id-13", "ABC-13", 0), ("other", "id-12", "ABC-12", 0),
            ("pods", "id-12b", "abc-12", 0),
        ]
    }
    assert len(names) == 5
    long = workspace_claim_name(
        workflow="w" * 200, issue_id="x", identifier="I" * 200, slot_index=2
    )
    assert len(long) <= 63
    assert DNS_LABEL.match(long)


def test_extra_volumes_are_mounted_and_only_safe_kinds_exist() -> None:
    worker = pod_worker(
        pod_template={
            "volumes": [
                {"name": "agent-config", "mount_path": "/home/lorenz/.config/agent",
                 "config_map": "agent", "read_only": True},
                {"name": "cache", "mount_path": "/var/cache/tools",
                 "persistent_volume_claim": "tool-cache"},
                {"name": "scratch", "mount_path": "/scratch", "empty_dir": {"medium": "Memory"}},
            ]
        }
    )
    pod = pod_manifest(spec=run_spec(), workflow=WORKFLOW, worker=worker, image="a:1")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["agent-config"] == {"name": "agent-config", "configMap": {"name": "agent"}}
    assert volumes["cache"]["persistentVolumeClaim"] == {
        "claimName": "tool-cache", "readOnly": False,
    }
    assert volumes["scratch"]["emptyDir"] == {"medium": "Memory"}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["agent-config"] == {
        "name": "agent-config", "mountPath": "/home/lorenz/.config/agent", "readOnly": True,
    }
    assert mounts["workspace"]["mountPath"] == "/var/lib/lorenz/workspaces"


@pytest.mark.parametrize(
    ("volume", "needle"),
    [
        ({"name": "x", "mount_path": "/home", "secret": "s"}, "overlaps '/home/lorenz'"),
        ({"name": "x", "mount_path": "/var/lib/lorenz/workspaces/ABC-1", "secret": "s"},
         "overlaps"),
        ({"name": "x", "mount_path": "/var/run/lorenz/spec/more", "secret": "s"}, "overlaps"),
        ({"name": "x", "mount_path": "/", "secret": "s"}, "overlaps"),
        ({"name": "workspace", "mount_path": "/w", "secret": "s"}, "volume name of its own"),
        ({"name": "x", "mount_path": "relative", "secret": "s"}, "absolute"),
        ({"name": "x", "mount_path": "/w"}, "exactly one"),
        ({"name": "x", "mount_path": "/w", "secret": "s", "config_map": "c"}, "exactly one"),
        ({"name": "x", "mount_path": "/w", "host_path": "/etc"}, "host_path"),
    ],
)
def test_extra_volumes_that_would_reach_lorenz_paths_or_the_node_are_refused(
    volume: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ValueError, match="validation error") as caught:
        pod_worker(pod_template={"volumes": [volume]})
    assert needle in str(caught.value)


def test_a_workspace_is_an_empty_dir_or_a_claim_not_both() -> None:
    with pytest.raises(ValueError, match="not both"):
        pod_worker(workspace={"empty_dir": {}, "volume_claim_template": {"storage": "1Gi"}})
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        pod_worker(workspace={"volume_claim_template": {"storage": "lots"}})


def test_the_operators_own_account_is_read_from_its_token(tmp_path: Path) -> None:
    import base64
    import json

    claims = {"sub": "system:serviceaccount:lorenz-system:lorenz"}
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    token = tmp_path / "token"
    token.write_text(f"e30.{payload}.sig")
    assert operator_service_account(token) == ("lorenz-system", "lorenz")
    assert operator_service_account(tmp_path / "absent") is None
    token.write_text("not a token")
    assert operator_service_account(token) is None


@pytest.mark.cluster
async def test_run_pods_never_use_the_operators_service_account(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    transport = PodTransport(
        api=kube_api,
        execs=PodExec(kube_api.configuration),
        workflow=WorkflowRef(namespace=restricted_namespace, name="pods", uid=None),
        worker=pod_worker(service_account_name="lorenz"),
        image="localhost/lorenz:absent",
        operator_account=(restricted_namespace, "lorenz"),
    )
    with pytest.raises(WorkerLaunchError) as caught:
        await transport.launch(run_spec())
    assert caught.value.code == "pod_service_account_refused"
    assert transport.created == []


@pytest.mark.cluster
async def test_claims_and_the_agent_account_are_made_and_cleaned_up(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    ns = restricted_namespace
    ref = WorkflowRef(namespace=ns, name="pods", uid=None)
    accounts = AgentAccounts()
    worker = pod_worker(
        start_timeout_ms=1500,
        pod_template={"node_selector": {"no-such": "node"}},
        workspace={"volume_claim_template": {"storage": "1Gi", "storage_class_name": ""}},
    )
    transport = PodTransport(
        api=kube_api, execs=PodExec(kube_api.configuration), workflow=ref, worker=worker,
        image="localhost/lorenz:absent", poll_s=0.2, accounts=accounts,
    )
    spec = run_spec()
    claim = spec_claim_name(spec, workflow=ref)
    claim_path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}"
    with pytest.raises(PlacementFailed) as caught:
        await transport.launch(spec)
    assert caught.value.code == "pod_start_timeout"
    account = await kube_api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/{AGENT_SERVICE_ACCOUNT}")
    assert account["automountServiceAccountToken"] is False
    # The claim outlives the attempt's Pod; the next attempt finds it.
    assert await _exists(kube_api, claim_path)
    with pytest.raises(PlacementFailed) as again:
        await transport.launch(run_spec(attempt=1))
    assert again.value.code == "pod_start_timeout"
    # Another issue's claim is not touched by this one's terminal cleanup.
    other = dataclasses.replace(
        run_spec("ABC-13"), issue=IssueSpec(id="id-13", identifier="ABC-13")
    )
    with pytest.raises(PlacementFailed):
        await transport.launch(other)
    other_claim = spec_claim_name(other, workflow=ref)
    other_path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{other_claim}"
    assert await delete_issue_workspaces(kube_api, workflow=ref, issue_id="id-12") == [claim]
    assert await _gone(kube_api, claim_path)
    assert await _exists(kube_api, other_path)
    # A Workflow's deletion takes the rest along.
    deleted = await delete_workflow_runs(kube_api, workflow=ref)
    assert spec_claim_name(other, workflow=ref) in deleted["claims"]
    assert await _gone(kube_api, other_path)


def test_toleration_keys_in_a_spec_map_back_to_the_settings() -> None:
    from lorenz.kube.api.casing import front_matter_from_spec, spec_from_front_matter

    spec = {"worker": {"kind": "pod", "podTemplate": {"tolerations": [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 30}]}}}
    front = front_matter_from_spec(spec)
    worker = WorkerSettings.model_validate(front["worker"])
    assert worker.pod_template.tolerations[0].toleration_seconds == 30
    assert spec_from_front_matter(front) == spec


@pytest.mark.parametrize(
    "identifier", ["ABC-12", "team_x.y/Z 9", "A" * 200, "___", "Ünïcode-7"]
)
def test_pod_names_are_dns_labels_unique_per_handle(identifier: str) -> None:
    first, retry = run_spec(identifier), run_spec(identifier, attempt=1)
    for spec in (first, retry):
        name = pod_name(spec.handle)
        assert DNS_LABEL.match(name), name
        assert len(name) <= 63
        assert pod_name(spec.handle) == name  # deterministic
    assert pod_name(first.handle) != pod_name(retry.handle)


def test_what_kept_a_pod_from_being_placed_is_labelled_and_a_running_worker_is_not() -> None:
    unschedulable = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    assert placement_reason(unschedulable) == "unschedulable"
    for waiting, label in (("ImagePullBackOff", "image_pull"), ("ErrImagePull", "image_pull"),
                           ("CreateContainerConfigError", "container_config"),
                           ("ContainerCreating", "start_timeout")):
        pod = {"status": {"phase": "Pending", "containerStatuses": [
            {"name": "worker", "state": {"waiting": {"reason": waiting}}}]}}
        assert placement_reason(pod) == label, waiting
    assert placement_reason({}) == "start_timeout"
    # The worker's container runs but its worker did not serve: a failure of the run.
    running = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "worker", "state": {"running": {"startedAt": "2026-12-04T00:00:00Z"}}}]}}
    assert placement_reason(running) is None


def test_only_a_quota_refusal_is_a_placement_failure() -> None:
    def refused(status: int, reason: str, detail: str) -> KubeApiError:
        return KubeApiError(method="POST", path="/api/v1/namespaces/a/pods", status=status,
                            reason=reason, detail=detail)

    quota = refused(403, "Forbidden", 'pods "lzw-x" is forbidden: exceeded quota: one, '
                    "requested: pods=1, used: pods=1, limited: pods=1")
    assert refusal_reason(quota) == "quota"
    uncounted = refused(403, "Forbidden", 'pods "lzw-x" is forbidden: status unknown for quota: '
                        "one, resources: pods")
    assert refusal_reason(uncounted) == "quota"
    assert refusal_reason(refused(403, "Forbidden", "User cannot create pods")) is None
    assert refusal_reason(refused(422, "Invalid", "spec.affinity: Invalid value")) is None


def test_why_a_pod_does_not_run_is_said_in_kubernetes_words() -> None:
    unschedulable = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity"}]}}
    assert why_not_running(unschedulable).startswith("Unschedulable: 0/1 nodes")
    pulling = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "worker", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                 "message": "Back-off pulling image"}}}]}}
    assert why_not_running(pulling) == "ImagePullBackOff: Back-off pulling image"
    killed = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "worker", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    assert why_not_running(killed) == "OOMKilled (exit code 137)"
    evicted = {"status": {"phase": "Failed", "reason": "Evicted",
                          "message": "The node was low on resource: ephemeral-storage."}}
    assert why_not_running(evicted).startswith("Evicted: The node was low")


# -- against the API server ---------------------------------------------------------------


@pytest.fixture
def restricted_namespace(kube_control_plane: Cluster) -> Iterator[str]:
    name = kube_control_plane.create_namespace(labels=RESTRICTED)
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


async def _exists(api: KubeApi, path: str) -> bool:
    try:
        await api.get(path)
    except KubeApiError as exc:
        if exc.not_found:
            return False
        raise
    return True


async def _gone(api: KubeApi, path: str) -> bool:
    """Gone, or on its way (a claim waits for the pvc-protection finalizer)."""
    try:
        body = await api.get(path)
    except KubeApiError as exc:
        if exc.not_found:
            return True
        raise
    return bool(body["metadata"].get("deletionTimestamp"))


@pytest.mark.cluster
async def test_a_pod_that_never_serves_is_removed_with_the_reason_after_the_start_timeout(
    kube_control_plane: Cluster,
    kube_scheduler: None,
    kube_api: KubeApi,
    restricted_namespace: str,
) -> None:
    ns = restricted_namespace
    ref = WorkflowRef(namespace=ns, name="pods", uid=None)
    transport = PodTransport(
        api=kube_api,
        execs=PodExec(kube_api.configuration),
        workflow=ref,
        worker=pod_worker(
            # NB: long enough for the scheduler to have tried the Pod on a loaded machine (it
            # sets PodScheduled False); the launch cannot end before its deadline anyway.
            start_timeout_ms=15000, pod_template={"node_selector": {"no-such": "node"}}
        ),
        image="localhost/lorenz:absent",
        poll_s=0.2,
    )
    spec = run_spec()
    name = pod_name(spec.handle)
    with pytest.raises(PlacementFailed) as caught:
        await transport.launch(spec)
    assert caught.value.code == "pod_start_timeout"
    assert "worker.start_timeout_ms" in caught.value.message
    # Never placed: the control plane's kube-scheduler finds no node for the selector
    # (PodScheduled False), so the runtime gives the reservation back instead of failing the run.
    assert caught.value.reason == "unschedulable"
    # The restricted admission accepted the Pod (else: pod_refused), and it is gone now, with
    # its spec Secret.
    assert transport.created == [spec.handle]
    assert not await _exists(kube_api, f"/api/v1/namespaces/{ns}/pods/{name}")
    assert not await _exists(kube_api, f"/api/v1/namespaces/{ns}/secrets/{name}-spec")
    assert (await transport.probe(spec.handle)).state is ProbeState.GONE


@pytest.mark.cluster
async def test_a_pod_the_api_refuses_fails_the_launch_at_once(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str, tmp_path: Path
) -> None:
    ns = restricted_namespace
    kube_control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}},
        },
        namespace=ns,
    )
    transport = PodTransport(
        api=kube_api,
        execs=PodExec(kube_api.configuration),
        workflow=WorkflowRef(namespace=ns, name="pods", uid=None),
        worker=pod_worker(start_timeout_ms=60000),
        image="localhost/lorenz:absent",
    )
    with pytest.raises(PlacementFailed) as caught:
        await transport.launch(run_spec())
    assert caught.value.code == "pod_refused"
    assert caught.value.reason == "quota"
    assert "403" in caught.value.message
    assert "exceeded quota" in caught.value.message
    assert transport.created == []
    # The spec Secret made before the Pod is removed again.
    name = pod_name(run_spec().handle)
    assert not await _exists(kube_api, f"/api/v1/namespaces/{ns}/secrets/{name}-spec")


async def _place(api: KubeApi, *, spec: RunSpec, workflow: WorkflowRef) -> str:
    """A run's Pod and spec Secret as the transport creates them (no node: they stay
    Pending, which is all the sweep looks at)."""
    name = pod_name(spec.handle)
    manifest = pod_manifest(
        spec=spec, workflow=workflow, worker=pod_worker(), image="localhost/lorenz:absent"
    )
    await api.create(
        f"/api/v1/namespaces/{workflow.namespace}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-spec", "labels": manifest["metadata"]["labels"]},
            "stringData": {"spec.json": "{}"},
        },
    )
    # NB: the namespace's default ServiceAccount (the operator makes lorenz-agent; none here).
    manifest["spec"]["serviceAccountName"] = "default"
    await api.create(f"/api/v1/namespaces/{workflow.namespace}/pods", manifest)
    return name


@pytest.mark.cluster
async def test_the_orphan_sweep_deletes_only_the_pods_no_claim_names(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    """A new leader keeps the Pods its Claims' intents name (it adopts them) and deletes the
    rest with their spec Secrets; a Pod of another Workflow is never touched; a leader on its
    way out deletes nothing."""
    ns = restricted_namespace
    ours = WorkflowRef(namespace=ns, name="pods", uid=None)
    other = WorkflowRef(namespace=ns, name="others", uid=None)
    adopted = run_spec("ABC-1")
    orphan = run_spec("ABC-2")
    stale = run_spec("ABC-1", attempt=1)  # an older attempt of a slot the Claim moved past
    theirs = run_spec("ABC-3")
    names = {
        spec.handle: await _place(kube_api, spec=spec, workflow=workflow)
        for spec, workflow in ((adopted, ours), (orphan, ours), (stale, ours), (theirs, other))
    }
    pods = f"/api/v1/namespaces/{ns}/pods"
    secrets = f"/api/v1/namespaces/{ns}/secrets"

    # Leadership already gone: nothing is deleted, whatever the Claims say.
    assert await sweep_run_pods(
        api=kube_api, workflow=ours, keep=frozenset, may_delete=lambda: False
    ) == []
    assert all([await _exists(kube_api, f"{pods}/{n}") for n in names.values()])

    deleted = await sweep_run_pods(api=kube_api, workflow=ours, keep=lambda: {adopted.handle})
    assert sorted(deleted) == sorted([orphan.handle, stale.handle])
    for spec in (orphan, stale):
        name = names[spec.handle]
        # NB: without a node, a Pod being deleted may linger with a deletionTimestamp.
        if await _exists(kube_api, f"{pods}/{name}"):
            body = await kube_api.get(f"{pods}/{name}")
            assert body["metadata"].get("deletionTimestamp")
        assert not await _exists(kube_api, f"{secrets}/{name}-spec")
    for spec in (adopted, theirs):
        name = names[spec.handle]
        body = await kube_api.get(f"{pods}/{name}")
        assert not body["metadata"].get("deletionTimestamp")
        assert await _exists(kube_api, f"{secrets}/{name}-spec")


@pytest.mark.cluster
async def test_a_new_terms_orphan_sweep_waits_for_its_claims_before_judging_a_pod(
    kube_control_plane: Cluster,
    kube_api: KubeApi,
    restricted_namespace: str,
    lorenz_crds: list[str],
) -> None:
    """The sweep starts beside the runtime whose start-up loads the Claims: it judges no Pod
    before they are loaded, so the Pod of the previous leader's run (named by a Claim's
    intent) is kept for adoption. It was deleted when the sweep won that race (a ``helm
    upgrade`` mid-run on a loaded machine: the run stopped and started again)."""
    from lorenz.kube.claims.store import ClaimResourceStore
    from lorenz.kube.controller.cleanup import sweep_orphans_of_term
    from lorenz.model import SlotKey, SpawnIntent, SpawnPhase
    from tests.kube.test_claims import Leadership, record

    ns = restricted_namespace
    ours = WorkflowRef(namespace=ns, name="pods", uid=None)
    adopted, orphan = run_spec("ABC-1"), run_spec("ABC-2")
    names = {spec.handle: await _place(kube_api, spec=spec, workflow=ours)
             for spec in (adopted, orphan)}
    pods = f"/api/v1/namespaces/{ns}/pods"

    def store(owner: str) -> ClaimResourceStore:
        leadership = Leadership(owner)
        return ClaimResourceStore(
            api=kube_api, workflow=ours, owner=owner, holder=leadership.current_holder,
            may_write=leadership.may_write,
        )

    previous = store("a")  # the leader that started the run, then went
    assert await previous.acquire(record("ABC-1", owner="a"))
    assert await previous.record_intent(
        SlotKey("ABC-1#0"), SpawnIntent(handle=adopted.handle, phase=SpawnPhase.RUNNING)
    )

    successor = store("b")
    sweep = asyncio.create_task(sweep_orphans_of_term(
        api=kube_api, workflow=ours, store=successor, may_delete=lambda: True
    ))
    # Unloaded, the successor's store names no Pod: the sweep must not judge any yet. (A
    # sweep that did not wait lists and deletes both Pods well within this.)
    done, _ = await asyncio.wait({sweep}, timeout=5.0)
    assert not done, f"the sweep ran before the Claims were loaded: {sweep.result()}"
    for name in names.values():
        assert not (await kube_api.get(f"{pods}/{name}"))["metadata"].get("deletionTimestamp")

    await successor.load()  # what the runtime's start-up does
    deleted = await asyncio.wait_for(sweep, timeout=60)
    assert deleted == [orphan.handle]
    kept = await kube_api.get(f"{pods}/{names[adopted.handle]}")
    assert not kept["metadata"].get("deletionTimestamp")


@pytest.mark.cluster
async def test_launches_waiting_share_one_watch_and_read_no_pod(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    """Twenty launches waiting for Pods that never start cost one list and one watch of the
    namespace's run Pods, not a GET per launch per second (counted by the API client's request
    counter, the figures' source)."""
    import asyncio

    ref = WorkflowRef(namespace=restricted_namespace, name="pods", uid=None)
    watches = RunPodWatches(linger_s=0.1)
    execs = PodExec(kube_api.configuration)
    worker = pod_worker(
        start_timeout_ms=4000, pod_template={"node_selector": {"no-such": "node"}}
    )
    transports = [
        PodTransport(
            api=kube_api, execs=execs, workflow=ref, worker=worker,
            image="localhost/lorenz:absent", poll_s=0.1, watches=watches,
        )
        for _ in range(20)
    ]
    heard: list[str] = []
    first = pod_name(run_spec("ABC-0").handle)
    transports[0].watch().listen(lambda name, pod: heard.append(name), name=first)
    before = dict(kube_api.requests)
    launches = [
        transport.launch(run_spec(f"ABC-{index}"))
        for index, transport in enumerate(transports)
    ]
    results = await asyncio.gather(*launches, return_exceptions=True)
    assert all(isinstance(result, PlacementFailed) for result in results), results
    made = {key: count - before.get(key, 0) for key, count in kube_api.requests.items()}
    assert made.get(("get", "pods"), 0) == 0, made
    assert made.get(("list", "pods"), 0) == 1, made
    assert made.get(("watch", "pods"), 0) == 1, made
    assert made.get(("create", "pods"), 0) == 20, made
    assert execs.opened == 0  # never running: never probed
    assert heard  # a listener of one Pod hears that Pod only
    assert set(heard) == {first}
    # Each launch saw its own Pod through the watch: its reason is the Pod's, not "never seen".
    assert all("phase Pending" in str(result) or "Unschedulable" in str(result)
               for result in results), results
    watch = transports[0].watch()
    for transport in transports:
        await transport.close()
    await asyncio.wait_for(_until(lambda: not watch.running), timeout=30)
    await watches.close()


@pytest.mark.cluster
async def test_a_probe_cancelled_while_it_connects_closes_its_session(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    """The exec client's sessions are closed on every path: a probe cancelled mid-connect (a
    runtime abandoned), and a transport closed with channels still open."""
    import asyncio

    execs = PodExec(kube_api.configuration)
    scoped = execs.scoped()
    task = asyncio.ensure_future(
        scoped.run(namespace=restricted_namespace, pod="absent", container="worker",
                   command=["true"])
    )
    await asyncio.sleep(0)
    assert scoped.open_channels == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scoped.open_channels == 0
    transport = PodTransport(
        api=kube_api, execs=execs,
        workflow=WorkflowRef(namespace=restricted_namespace, name="pods", uid=None),
        worker=pod_worker(), image="localhost/lorenz:absent",
    )
    pending = asyncio.ensure_future(transport.probe(run_spec().handle))
    await asyncio.sleep(0)
    await transport.close()
    await pending
    assert transport.execs.open_channels == 0


async def _until(check: Any, *, every_s: float = 0.05) -> None:
    import asyncio

    while not check():
        await asyncio.sleep(every_s)


@pytest.mark.cluster
async def test_the_spec_secret_is_owned_by_its_pod_and_never_outlives_a_launch_that_dies(
    kube_control_plane: Cluster,
    kube_api: KubeApi,
    restricted_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Pod is created first, then its spec Secret owned by it (by uid): a launch that dies
    between the two steps leaves no Secret, and a Secret of an earlier Pod of the same name is
    replaced rather than taken (the garbage collector would delete it with that Pod)."""
    ns = restricted_namespace
    ref = WorkflowRef(namespace=ns, name="pods", uid=None)
    watches = RunPodWatches(linger_s=0.1)

    def transport() -> PodTransport:
        return PodTransport(
            api=kube_api, execs=PodExec(kube_api.configuration), workflow=ref,
            worker=pod_worker(start_timeout_ms=1000), image="localhost/lorenz:absent",
            poll_s=0.1, watches=watches,
        )

    # The launch dies right after the Pod's create (the process is killed, the task cancelled).
    dying = transport()
    spec = run_spec("ABC-1")
    name = pod_name(spec.handle)

    async def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # NB: a BaseException, as a cancellation or a kill is

    monkeypatch.setattr(dying, "_create_spec_secret", killed)
    with pytest.raises(KeyboardInterrupt):
        await dying.launch(spec)
    assert not await _exists(kube_api, f"/api/v1/namespaces/{ns}/secrets/{name}-spec")
    assert await _gone(kube_api, f"/api/v1/namespaces/{ns}/pods/{name}")
    monkeypatch.undo()

    # A launch that ends any way after both steps: the Secret is the Pod's, by uid.
    other = run_spec("ABC-2")
    name = pod_name(other.handle)
    stale = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-spec"},
             "stringData": {"spec.json": "{}"}}
    await kube_api.create(f"/api/v1/namespaces/{ns}/secrets", stale)
    with pytest.raises(PlacementFailed):
        await transport().launch(other)
    # (the launch deleted its Pod at the start timeout; the Secret went with it, explicitly
    # here — the envtest control plane may run no garbage collector)
    assert not await _exists(kube_api, f"/api/v1/namespaces/{ns}/secrets/{name}-spec")
    seen: dict[str, Any] = {}
    original = PodTransport._create_spec_secret

    async def recorded(self: PodTransport, spec: RunSpec, **kwargs: Any) -> None:
        await original(self, spec, **kwargs)
        seen.update(await kube_api.get(f"/api/v1/namespaces/{ns}/secrets/{name}-spec"))
        seen["pod"] = kwargs["pod"]

    monkeypatch.setattr(PodTransport, "_create_spec_secret", recorded)
    await kube_api.create(f"/api/v1/namespaces/{ns}/secrets", stale)
    with pytest.raises(PlacementFailed):
        await transport().launch(dataclasses.replace(other, run=0))
    owners = seen["metadata"]["ownerReferences"]
    assert owners == [{"apiVersion": "v1", "kind": "Pod", "name": name,
                       "uid": seen["pod"]["metadata"]["uid"]}]
    await watches.close()


@pytest.mark.cluster
async def test_kubectl_get_claims_shows_the_pod_its_phase_and_node(
    kube_control_plane: Cluster, kube_api: KubeApi, kube_namespace: str, lorenz_crds: list[str]
) -> None:
    """The Pod watch's phase and node go on the run's Claim: a phase change is one status
    write of its own (Pending, Failed), a node alone and a Running Pod ride along with the
    next write (the binding's), and ``kubectl get claims`` prints them."""
    import datetime

    from lorenz.kube.claims.store import ClaimResourceStore
    from lorenz.model import ClaimPhase, ClaimRecord, SlotKey

    ns = kube_namespace
    store = ClaimResourceStore(
        api=kube_api, workflow=WorkflowRef(namespace=ns, name="pods", uid=None),
        owner="me", holder=lambda: "me", may_write=lambda: True,
    )
    key = SlotKey("id-12#0")
    reserved = ClaimRecord(
        slot_key=key, issue_id="id-12", identifier="ABC-12", slot_index=0,
        phase=ClaimPhase.RESERVED, owner="me",
        started_at=datetime.datetime.now(datetime.UTC),
    )
    assert await store.acquire(reserved)

    def patches() -> int:
        return kube_api.requests[("patch", "claims/status")]

    before = patches()
    assert await store.note_pod(key, phase="Pending", node=None)
    assert not await store.note_pod(key, phase="Pending", node="fake-7")  # a node alone
    assert not await store.note_pod(key, phase="Pending", node="fake-7")
    assert patches() == before + 1
    store.remember_pod(key, phase="Running", node="fake-7")  # the binding carries it
    pod = pod_name(run_spec().handle)
    await store.save(
        ClaimRecord(
            slot_key=key, issue_id="id-12", identifier="ABC-12", slot_index=0,
            phase=ClaimPhase.RUNNING, owner="me", host=pod,
            started_at=reserved.started_at,
        )
    )
    assert patches() == before + 2
    listed = kube_control_plane.kubectl("get", "claims", "-n", ns).stdout
    header, row = listed.splitlines()[:2]
    names = re.findall(r"\S+(?: \S+)*", header)  # NB: "POD PHASE" is one column
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], None]
    columns = {
        name: row[start:end].strip() for name, start, end in zip(names, starts, ends, strict=True)
    }
    assert columns["HOST"] == pod
    assert columns["POD PHASE"] == "Running"
    assert columns["NODE"] == "fake-7"
    claim = (await kube_api.get(
        f"/apis/lorenz.dev/v1alpha1/namespaces/{ns}/claims"
    ))["items"][0]
    assert claim["status"]["podPhase"] == "Running"
    assert claim["status"]["node"] == "fake-7"
    assert await store.note_pod(key, phase="Failed", node="fake-7")
    assert patches() == before + 3


@pytest.mark.cluster
async def test_a_runtime_class_reaches_the_pod_and_one_that_does_not_exist_is_refused(
    kube_control_plane: Cluster, kube_api: KubeApi, restricted_namespace: str
) -> None:
    """``worker.podTemplate.runtimeClassName`` (#37 point 6) is the Pod's ``runtimeClassName``;
    the API server admits the Pod when the RuntimeClass exists and refuses it otherwise. NB: no
    sandbox runs here: the test node's containerd has the ``runc`` handler only, so this checks
    the pass-through and the API's admission, not gVisor or Kata themselves."""
    ns = restricted_namespace
    runtime_class = f"sandbox-{ns}"[:63]
    await kube_api.create(
        "/apis/node.k8s.io/v1/runtimeclasses",
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": runtime_class},
            "handler": "runsc",
        },
    )
    try:
        workflow = WorkflowRef(namespace=ns, name="pods", uid=None)
        for name, wanted in (("sandboxed", runtime_class), ("missing", "no-such-runtime")):
            spec = run_spec(name.upper() + "-1")
            worker = pod_worker(pod_template={"runtime_class_name": wanted})
            manifest = pod_manifest(
                spec=spec, workflow=workflow, worker=worker, image="localhost/lorenz:absent"
            )
            assert manifest["spec"]["runtimeClassName"] == wanted
            manifest["spec"]["serviceAccountName"] = "default"
            if name == "sandboxed":
                created = await kube_api.create(f"/api/v1/namespaces/{ns}/pods", manifest)
                assert created["spec"]["runtimeClassName"] == runtime_class
            else:
                with pytest.raises(KubeApiError) as refused:
                    await kube_api.create(f"/api/v1/namespaces/{ns}/pods", manifest)
                assert "no-such-runtime" in str(refused.value)
        assert "runtimeClassName" not in pod_manifest(
            spec=run_spec(), workflow=workflow, worker=pod_worker(), image="x"
        )["spec"]
    finally:
        await kube_api.delete(f"/apis/node.k8s.io/v1/runtimeclasses/{runtime_class}")
