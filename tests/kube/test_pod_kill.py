"""Issue #32 point 3 in Pods: a stopped run whose worker cannot be reached keeps its slot until
the API server shows its Pod gone.

The run's Pod is real (the control plane's kube-apiserver, no node: it stays Pending, so its
worker never answers — a worker as unknown as a frozen one) and carries a finalizer the test
holds. The runner adopts it, finds it unknown and quarantines it; the run is then stopped (what
a stall or a stopped issue does: its task is cancelled). The Pod is deleted with
``gracePeriodSeconds: 0``, but the finalizer keeps it: the run's task — and so the slot, which
the runtime settles only once that task ended — must not end until the test removes the
finalizer and the Pod is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorenz.agents import AgentRunRequest, RunPlacement
from lorenz.config import AgentLaunch, AgentProtocol, HooksSettings
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.execs import PodExec
from lorenz.kube.pods.manifests import pod_manifest, pod_name
from lorenz.kube.pods.runner import PodWorkerRunner
from lorenz.kube.pods.transport import PodTransport
from lorenz.model import AgentUpdate, Issue, SpawnIntent, SpawnPhase
from tests.cluster.cluster import Cluster
from tests.kube.test_pods import pod_worker, run_spec
from tests.waiting import wait_until_async

WAIT_S = 120.0
"""Hang protection only (probes through a loaded API server, the kill's retries)."""

HOLD = "lorenz.test/hold"


@pytest.fixture
def namespace(kube_control_plane: Cluster) -> Iterator[str]:
    name = kube_control_plane.create_namespace()
    yield name
    kube_control_plane.delete_namespace(name, wait=False)


async def _pod(api: KubeApi, path: str) -> dict[str, object] | None:
    try:
        return await api.get(path)
    except KubeApiError as exc:
        if exc.not_found:
            return None
        raise


@pytest.mark.cluster
async def test_a_stopped_runs_slot_is_held_until_its_pod_is_gone_from_the_api_server(
    kube_api: KubeApi, namespace: str, tmp_path: Path
) -> None:
    workflow = WorkflowRef(namespace=namespace, name="pods", uid=None)
    spec = run_spec()
    name = pod_name(spec.handle)
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    manifest = pod_manifest(
        spec=spec, workflow=workflow, worker=pod_worker(), image="localhost/lorenz:absent"
    )
    manifest["spec"]["serviceAccountName"] = "default"
    manifest["metadata"]["finalizers"] = [HOLD]
    await kube_api.create(f"/api/v1/namespaces/{namespace}/pods", manifest)

    transport = PodTransport(
        api=kube_api,
        execs=PodExec(kube_api.configuration),
        workflow=workflow,
        worker=pod_worker(),
        image="localhost/lorenz:absent",
        poll_s=0.2,
    )
    runner = PodWorkerRunner(
        workflow=spec.workflow,
        transport=transport,
        placement=RunPlacement(host="pod", hooks=HooksSettings(), worker=pod_worker()),
    )
    runner.unknown_patience_s = 1.0
    runner.quarantine_probe_s = 0.3
    updates: list[AgentUpdate] = []

    async def active() -> bool:
        return True

    request = AgentRunRequest(
        issue=Issue(id=spec.issue.id, identifier=spec.issue.identifier, title="Fix it",
                    state="Todo"),
        attempt=None,
        slot_index=0,
        prompt="Fix the bug.",
        workspace=tmp_path,
        settings=AgentLaunch(command="true", protocol=AgentProtocol.COMMAND),
        max_turns=1,
        env={},
        on_update=updates.append,
        issue_is_active=active,
        continuation_prompt=lambda turn, most: f"continue {turn}/{most}",
        resume=SpawnIntent(handle=spec.handle, phase=SpawnPhase.RUNNING),
    )
    run = asyncio.create_task(runner.run(request))
    try:
        await wait_until_async(
            lambda: [u for u in updates if u.event == "worker_quarantined"],
            timeout=WAIT_S,
            what="the unknown worker's quarantine",
        )
        run.cancel()  # a stall, a stopped issue

        def unconfirmed() -> list[AgentUpdate]:
            return [
                u for u in updates
                if u.event == "worker_quarantined"
                and (u.message or "").startswith("worker_kill_unconfirmed: ")
            ]

        [held] = await wait_until_async(
            unconfirmed, timeout=WAIT_S, what="the held slot's coded reason"
        )
        assert name in (held.message or "")
        assert HOLD in (held.message or "")
        pod = await _pod(kube_api, path)
        assert pod is not None
        metadata = pod["metadata"]
        assert isinstance(metadata, dict)
        assert metadata.get("deletionTimestamp"), "the kill deletes the Pod"
        assert metadata.get("deletionGracePeriodSeconds") == 0
        # The Pod is still there: the run has not ended, so its slot stays held.
        assert not run.done()

        await kube_api.merge_patch(path, {"metadata": {"finalizers": None}})
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(run), timeout=WAIT_S)
        assert await _pod(kube_api, path) is None, "the run ended before its Pod was gone"
    finally:
        if not run.done():
            run.cancel()
        with contextlib.suppress(KubeApiError):
            await kube_api.merge_patch(path, {"metadata": {"finalizers": None}})
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(run, timeout=30)
