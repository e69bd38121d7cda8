"""Runs in Pods of their own (``worker.kind: pod``): the Pod transport and its runner.

Each run is one Pod in the Workflow's namespace whose main container runs ``lorenz worker``
for the run's spec, the same worker as everywhere else (journal, control protocol, hooks, the
agent). What the operator adds is where it runs and how it is reached:

* **Placement.** The Pod is named after the run's deterministic handle (lowercased,
  DNS-safe), labelled with the Workflow, the issue and the handle, owned by the Workflow (its
  deletion takes the Pods along), and built from ``worker.pod_template``: the image, resources,
  node selector, tolerations, affinity, ``envFrom`` the Secrets the user names. It runs as a
  non-root user with a read-only root filesystem, no capabilities and the runtime's seccomp
  profile (the ``restricted`` Pod Security Standard), ``automountServiceAccountToken: false``
  and no service links. The workspace, the worker's state, ``HOME`` and ``/tmp`` are
  ``emptyDir`` volumes of that Pod only.
* **The spec** travels in a per-run Secret (``<pod>-spec``) mounted only in that Pod (0440,
  group-readable by the Pod's ``fsGroup``), created before the Pod, owned by the Workflow and
  deleted with the Pod. It holds no tracker credential: host-side tools run in the operator.
* **Start.** The transport waits — up to ``worker.start_timeout_ms`` — until the Pod runs and
  its worker answers a probe. A Pod that cannot be scheduled, whose image cannot be pulled or
  whose container cannot be created is deleted when the time is up and the launch fails with
  the last reason Kubernetes gave (``pod_start_timeout``); a create the API refuses (a
  ResourceQuota, an invalid affinity) fails at once (``pod_refused``).
* **The channel** is the API's exec subresource (:mod:`lorenz.kube.execs`): ``lorenz worker
  --bridge`` inside the Pod splices the exec stream onto the worker's unix socket, so the socket
  keeps its 0600 mode and ``SO_PEERCRED`` check, the Pod opens no port and holds no token, and
  the operator needs only ``pods/exec``. Probes and journal catch-ups are short execs.
* **The end.** When the run is settled the Pod and its Secret are deleted; a controller that
  is leaving its workers for the next one (leadership lost) leaves the Pod too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from lorenz.agents import AgentRunRequest, AgentRunResult, RunPlacement
from lorenz.config import WorkerSettings
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.execs import PodExec, PodExecError
from lorenz.kube.resources import WorkflowRef
from lorenz.workers.journal import Record
from lorenz.workers.launch import LaunchResult, WorkerLaunchError
from lorenz.workers.placement import HOOK_VARIABLE_PREFIX, POD_WORKSPACE_ROOT
from lorenz.workers.protocol import SOCKET_NAME
from lorenz.workers.runner import WorkerRunner, leaving_workers
from lorenz.workers.spec import HookSpec, RunSpec
from lorenz.workers.states import Probe, ProbeState

logger = logging.getLogger(__name__)

CONTAINER: Final = "worker"
STATE_ROOT: Final = "/var/lib/lorenz/run"
SPEC_DIR: Final = "/var/run/lorenz/spec"
SPEC_KEY: Final = "spec.json"
RUN_UID: Final = 10001
"""The Lorenz image's user; a run's image is built ``FROM`` it (docs/install.md)."""
SPEC_SECRET_LIMIT: Final = 900 * 1024
"""A Secret holds at most 1 MiB; the spec must fit with room to spare."""

LABEL_MANAGED: Final = "app.kubernetes.io/managed-by"
LABEL_WORKFLOW: Final = "lorenz.dev/workflow"
LABEL_ISSUE: Final = "lorenz.dev/issue"
LABEL_HANDLE: Final = "lorenz.dev/handle"
ANNOTATION_HANDLE: Final = "lorenz.dev/handle"

_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")

WAITING_FAILURES: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
     "CreateContainerError", "ErrImageNeverPull"}
)
"""Container waiting reasons worth reporting when a Pod does not start in time."""


def pod_name(handle: str) -> str:
    """The Pod of a run: its handle in DNS-1123 form (deterministic; the hash keeps it unique)."""
    name = _NOT_DNS.sub("-", handle.lower()).strip("-")
    if len(name) > 63:
        name = f"{name[:38].rstrip('-')}-{name[-24:].lstrip('-')}"
    return name


def label_value(text: str) -> str:
    value = _NOT_LABEL.sub("_", text)[:63]
    return value.strip("._-") or "x"


def pod_manifest(
    *,
    spec: RunSpec,
    workflow: WorkflowRef,
    worker: WorkerSettings,
    image: str,
) -> dict[str, Any]:
    """The run's Pod (see the module docstring); pure, so tests read it as written."""
    template = worker.pod_template
    name = pod_name(spec.handle)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": ["lorenz", "worker", "--spec", f"{SPEC_DIR}/{SPEC_KEY}",
                    "--state-root", STATE_ROOT],
        "env": [{"name": "HOME", "value": "/home/lorenz"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_ROOT},
            {"name": "workspace", "mountPath": POD_WORKSPACE_ROOT},
            {"name": "home", "mountPath": "/home/lorenz"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if template.image_pull_policy is not None:
        container["imagePullPolicy"] = template.image_pull_policy.value
    resources = {
        key: dict(values)
        for key, values in (
            ("requests", template.resources.requests),
            ("limits", template.resources.limits),
        )
        if values
    }
    if resources:
        container["resources"] = resources
    if template.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": s}} for s in template.env_from_secrets]
    empty_dir: dict[str, Any] = {}
    if worker.workspace.empty_dir.size_limit:
        empty_dir["sizeLimit"] = worker.workspace.empty_dir.size_limit
    if worker.workspace.empty_dir.medium:
        empty_dir["medium"] = worker.workspace.empty_dir.medium
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_UID,
            "runAsGroup": RUN_UID,
            "fsGroup": RUN_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {
                "name": "spec",
                "secret": {"secretName": f"{name}-spec", "defaultMode": 0o440},
            },
            {"name": "state", "emptyDir": {}},
            {"name": "workspace", "emptyDir": empty_dir},
            {"name": "home", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    if worker.service_account_name:
        pod_spec["serviceAccountName"] = worker.service_account_name
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = [t.manifest() for t in template.tolerations]
    if template.affinity:
        pod_spec["affinity"] = json.loads(json.dumps(template.affinity))
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": workflow.namespace,
        "labels": run_labels(spec=spec, workflow=workflow),
        "annotations": {ANNOTATION_HANDLE: spec.handle},
    }
    if workflow.uid:
        metadata["ownerReferences"] = [workflow_owner(workflow)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def workflow_owner(workflow: WorkflowRef) -> dict[str, Any]:
    """An owner reference to the Workflow: its deletion garbage-collects what carries it."""
    return {
        "apiVersion": "lorenz.dev/v1alpha1",
        "kind": "Workflow",
        "name": workflow.name,
        "uid": workflow.uid,
    }


def run_labels(*, spec: RunSpec, workflow: WorkflowRef) -> dict[str, str]:
    return {
        LABEL_MANAGED: "lorenz",
        LABEL_WORKFLOW: label_value(workflow.name),
        LABEL_ISSUE: label_value(spec.issue.identifier),
        LABEL_HANDLE: label_value(spec.handle),
    }


def _pods_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return base if name is None else f"{base}/{name}"


def _secrets_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return base if name is None else f"{base}/{name}"


def why_not_running(pod: Mapping[str, Any]) -> str:
    """What keeps a Pod from running its worker, in Kubernetes' words."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason') or 'Unschedulable'}: {condition.get('message') or ''}"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting = state.get("waiting")
        if waiting and waiting.get("reason"):
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
        terminated = state.get("terminated")
        if terminated:
            return (
                f"{terminated.get('reason') or 'Terminated'} (exit code "
                f"{terminated.get('exitCode')}): {terminated.get('message') or ''}"
            ).rstrip(": ")
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message') or ''}".rstrip(": ")
    return f"phase {status.get('phase') or 'Pending'}"


def _worker_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        (c.get("state") or {}).get("running") is not None
        for c in status.get("containerStatuses") or []
        if c.get("name") == CONTAINER
    )


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class PodTransport:
    """Workers in Pods of one Workflow's namespace (one transport per run's settings)."""

    name = "pod"

    def __init__(
        self,
        *,
        api: KubeApi,
        execs: PodExec,
        workflow: WorkflowRef,
        worker: WorkerSettings,
        image: str,
        poll_s: float = 1.0,
    ) -> None:
        self.api = api
        self.execs = execs
        self.workflow = workflow
        self.worker = worker
        self.image = image
        self.poll_s = poll_s
        self.namespace = workflow.namespace
        self.started_in_s: float | None = None
        """How long the newest launch took, create to serving (for metrics and figures)."""
        self.created: list[str] = []
        """Handles whose Pod this transport created (the runner deletes them at the end)."""

    def _state_dir(self, handle: str) -> str:
        return f"{STATE_ROOT}/{handle}"

    async def launch(self, spec: RunSpec) -> LaunchResult:
        name = pod_name(spec.handle)
        payload = spec.model_dump_json()
        if len(payload) > SPEC_SECRET_LIMIT:
            raise WorkerLaunchError(
                f"the run spec of {spec.handle} is {len(payload)} bytes, more than a Secret "
                f"holds ({SPEC_SECRET_LIMIT}); shorten the prompt",
                code="pod_spec_too_large",
            )
        began = time.monotonic()
        manifest = pod_manifest(
            spec=spec, workflow=self.workflow, worker=self.worker, image=self.image
        )
        # NB: the Secret first: a Pod whose Secret volume is missing waits in the kubelet's
        # mount backoff, which would add seconds to every start.
        await self._create_spec_secret(spec, name=name, payload=payload)
        fresh = False
        try:
            await self.api.create(_pods_path(self.namespace), manifest)
            self.created.append(spec.handle)
            fresh = True
        except KubeApiError as exc:
            if exc.status != 409:
                await self.delete(spec.handle)
                raise WorkerLaunchError(
                    f"the API refused the run's Pod {self.namespace}/{name}: {exc.status} "
                    f"{exc.detail or exc.reason}",
                    code="pod_refused",
                ) from exc
            pod = await self.api.get(_pods_path(self.namespace, name))
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANNOTATION_HANDLE) != spec.handle:
                raise WorkerLaunchError(
                    f"a Pod {self.namespace}/{name} exists that is not this run's; delete it",
                    code="pod_name_taken",
                ) from exc
            if _ended(pod):
                # NB: an earlier run of this handle ended; the runner moves to the next one.
                raise WorkerLaunchError(
                    f"the Pod of {spec.handle} already ran", code="worker_handle_used"
                ) from exc
        deadline = began + self.worker.start_timeout_ms / 1000
        last = "the Pod was created"
        while True:
            try:
                pod = await self.api.get(_pods_path(self.namespace, name))
            except KubeApiError as exc:
                if exc.not_found:
                    raise WorkerLaunchError(
                        f"the run's Pod {self.namespace}/{name} was deleted while starting",
                        code="worker_start_failed",
                    ) from exc
                last = f"{exc.status} {exc.reason}"
                pod = {}
            if pod and _ended(pod):
                reason = why_not_running(pod)
                await self.delete(spec.handle)
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} ended before its worker served: "
                    f"{reason}",
                    code="worker_start_failed",
                )
            if pod and _worker_running(pod):
                probe = await self.probe(spec.handle)
                if probe.state is ProbeState.ALIVE or probe.state is ProbeState.FINAL:
                    self.started_in_s = time.monotonic() - began
                    return LaunchResult(
                        handle=spec.handle,
                        state_dir=self._state_dir(spec.handle),
                        socket=f"{self._state_dir(spec.handle)}/{SOCKET_NAME}",
                        pid=probe.pid,
                        # NB: a worker this launch started is this run, even if it is done
                        # already; only a Pod found in place may be an earlier run's.
                        existing=None if fresh or probe.state is ProbeState.ALIVE else "final",
                    )
                last = f"the worker does not serve yet ({probe.detail or probe.state.value})"
            elif pod:
                last = why_not_running(pod)
            if time.monotonic() >= deadline:
                await self.delete(spec.handle)
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} did not serve its worker within "
                    f"{self.worker.start_timeout_ms} ms (worker.start_timeout_ms): {last}",
                    code="pod_start_timeout",
                )
            await asyncio.sleep(self.poll_s)

    async def _create_spec_secret(self, spec: RunSpec, *, name: str, payload: str) -> None:
        """The run's spec as a Secret that only its Pod mounts; owned by the Workflow (so its
        deletion takes it along) and deleted with the Pod."""
        metadata: dict[str, Any] = {
            "name": f"{name}-spec",
            "namespace": self.namespace,
            "labels": run_labels(spec=spec, workflow=self.workflow),
            "annotations": {ANNOTATION_HANDLE: spec.handle},
        }
        if self.workflow.uid:
            metadata["ownerReferences"] = [workflow_owner(self.workflow)]
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": metadata,
            "data": {SPEC_KEY: base64.b64encode(payload.encode()).decode()},
        }
        try:
            await self.api.create(_secrets_path(self.namespace), secret)
        except KubeApiError as exc:
            if exc.status != 409:
                raise WorkerLaunchError(
                    f"the API refused the run's spec Secret {self.namespace}/{name}-spec: "
                    f"{exc.status} {exc.detail or exc.reason}",
                    code="pod_refused",
                ) from exc

    async def probe(self, handle: str) -> Probe:
        name = pod_name(handle)
        try:
            pod = await self.api.get(_pods_path(self.namespace, name))
        except KubeApiError as exc:
            if exc.not_found:
                return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is gone")
            return Probe(state=ProbeState.UNKNOWN, detail=f"{exc.status} {exc.reason}")
        if _ended(pod):
            # NB: the journal was in the Pod's emptyDir; a Pod that ended has taken it along.
            return Probe(state=ProbeState.GONE, detail=why_not_running(pod))
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is being deleted")
        if not _worker_running(pod):
            return Probe(state=ProbeState.UNKNOWN, detail=why_not_running(pod))
        try:
            result = await self.execs.run(
                namespace=self.namespace,
                pod=name,
                container=CONTAINER,
                command=["lorenz", "worker", "--probe", "--state-dir", self._state_dir(handle)],
            )
        except PodExecError as exc:
            return Probe(state=ProbeState.UNKNOWN, detail=str(exc))
        if result.exit_code != 0:
            return Probe(
                state=ProbeState.UNKNOWN,
                detail=f"the probe exited {result.exit_code}: {result.stderr[-300:]!r}",
            )
        try:
            return Probe.from_json(json.loads(result.stdout))
        except ValueError as exc:
            return Probe(state=ProbeState.UNKNOWN, detail=f"unreadable probe answer ({exc})")

    async def read_journal(self, handle: str, *, after_seq: int) -> list[Record]:
        try:
            result = await self.execs.run(
                namespace=self.namespace,
                pod=pod_name(handle),
                container=CONTAINER,
                command=["lorenz", "worker", "--journal-after", str(after_seq),
                         "--state-dir", self._state_dir(handle)],
            )
        except PodExecError as exc:
            raise OSError(str(exc)) from exc
        if result.exit_code != 0:
            raise OSError(f"reading the journal of {handle} failed: {result.stderr[-300:]!r}")
        return [
            Record.from_json(json.loads(line))
            for line in result.stdout.decode().splitlines()
            if line.strip()
        ]

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await self.execs.open_stream(
                namespace=self.namespace,
                pod=pod_name(handle),
                container=CONTAINER,
                command=["lorenz", "worker", "--state-dir", self._state_dir(handle), "--bridge"],
            )
        except PodExecError as exc:
            raise OSError(str(exc)) from exc

    async def delete(self, handle: str) -> None:
        """Delete the run's Pod and its spec Secret (gone already is fine)."""
        name = pod_name(handle)
        spec_secret = _secrets_path(self.namespace, f"{name}-spec")
        for path in (_pods_path(self.namespace, name), spec_secret):
            try:
                await self.api.delete(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    logger.warning("could not delete %s: %s", path, exc)

    async def close(self) -> None:
        return None


class PodWorkerRunner(WorkerRunner):
    """A :class:`WorkerRunner` for one run in a Pod: the worker creates the workspace on the
    Pod's volume, runs every hook there, and starts its agent from the container's environment
    (the image's, plus the Secrets of ``env_from_secrets``); the Pod is deleted afterwards."""

    def __init__(
        self,
        *,
        workflow: str,
        transport: PodTransport,
        placement: RunPlacement,
        generation: int = 0,
    ) -> None:
        super().__init__(
            workflow=workflow, transport=transport, placement=placement.host, generation=generation
        )
        self.pods = transport
        self.run_placement = placement

    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        spec = super().spec_for(request, run=run)
        hooks = self.run_placement.hooks
        variables = {
            name: value
            for name, value in request.env.items()
            if name.startswith(HOOK_VARIABLE_PREFIX)
        }
        return spec.model_copy(
            update={
                "workspace": str(request.workspace),
                "create_workspace": True,
                "inherit_env": True,
                "host": self.run_placement.host,
                "hooks": HookSpec(
                    after_create=hooks.after_create,
                    before_run=hooks.before_run,
                    after_run=hooks.after_run,
                    timeout_ms=hooks.timeout_ms,
                    env=variables,
                ),
            }
        )

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        try:
            return await super().run(request)
        finally:
            handles = set(self.pods.created)
            if self.last_handle is not None:
                handles.add(self.last_handle.handle)
            if leaving_workers() is None:
                for handle in sorted(handles):
                    # NB: shielded: a cancelled run still removes its Pod (the worker has
                    # written its final record or is gone by now); a failed delete is logged.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self.pods.delete(handle))
