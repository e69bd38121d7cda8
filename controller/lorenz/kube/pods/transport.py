"""The Pod transport: a run's worker launched, probed, reached and deleted in a Pod of its own.

:class:`PodTransport` is the worker runner's transport for ``worker.kind: pod`` (the local one
starts a process instead): it makes sure of the run's ServiceAccount (:class:`AgentAccounts`)
and workspace claim, creates the Pod and its spec Secret, waits on the namespace's shared Pod
watch until the worker serves, and speaks to it through the exec channel. See
:mod:`lorenz.kube.pods` for the rules it keeps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lorenz.agents import (
    PlacementFailed,
)
from lorenz.codes import ErrorCode
from lorenz.config import WorkerSettings
from lorenz.kube.api.resources import WorkflowRef, digest
from lorenz.kube.clients import KubeApi
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.execs import PodExec, PodExecError
from lorenz.kube.pods.manifests import (
    AGENT_SERVICE_ACCOUNT,
    ANNOTATION_HANDLE,
    ANNOTATION_ISSUE_ID,
    CONTAINER,
    PROBE_BACKOFF_MAX_S,
    SPEC_KEY,
    SPEC_SECRET_LIMIT,
    STATE_ROOT,
    agent_service_account_manifest,
    network_policies_path,
    placement_reason,
    pod_ended,
    pod_manifest,
    pod_name,
    pod_owner,
    pods_path,
    refused,
    run_labels,
    run_network_policy_manifest,
    secrets_path,
    service_accounts_path,
    volume_claims_path,
    why_not_running,
    worker_running,
    workspace_claim_manifest,
)
from lorenz.kube.pods.watch import WATCHES, RunPodWatch, RunPodWatches
from lorenz.workers.handles import WorkerKillUnconfirmed
from lorenz.workers.journal import Record
from lorenz.workers.launch import LaunchResult, WorkerLaunchError
from lorenz.workers.protocol import SOCKET_NAME
from lorenz.workers.spec import RunSpec, encode_spec
from lorenz.workers.states import Probe, ProbeState

logger = logging.getLogger(__name__)


class AgentAccounts:
    """The ``lorenz-agent`` ServiceAccounts this operator has made sure of, per namespace.

    A namespace is checked once per process (a ``get``, and a ``create`` when it is missing);
    :meth:`forget` makes the next launch check again (the Pod's create said it is gone)."""

    def __init__(self) -> None:
        self._ensured: set[str] = set()
        self._lock = asyncio.Lock()

    async def ensure(self, api: KubeApi, *, namespace: str) -> None:
        if namespace in self._ensured:
            return
        async with self._lock:
            if namespace in self._ensured:
                return
            path = service_accounts_path(namespace, AGENT_SERVICE_ACCOUNT)
            try:
                await api.get(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    raise _account_error(namespace, exc) from exc
                try:
                    await api.create(
                        service_accounts_path(namespace),
                        agent_service_account_manifest(namespace),
                    )
                except KubeApiError as created:
                    if created.status != 409:
                        raise _account_error(namespace, created) from created
            self._ensured.add(namespace)

    def forget(self, namespace: str) -> None:
        self._ensured.discard(namespace)


def _account_error(namespace: str, exc: KubeApiError) -> WorkerLaunchError:
    return WorkerLaunchError(
        f"the ServiceAccount {namespace}/{AGENT_SERVICE_ACCOUNT} for run Pods could not be "
        f"made: {exc.status} {exc.detail or exc.reason}; create it (no RBAC, "
        "automountServiceAccountToken: false) or set worker.service_account_name",
        code=ErrorCode.POD_SERVICE_ACCOUNT_FAILED,
    )


POLICY_DIGEST_ANNOTATION = "lorenz.dev/policy-digest"
"""On the run Pods' NetworkPolicy: the digest of the spec (and owner) the operator wrote, so a
changed ``worker.egress`` is noticed without comparing against the API server's defaults."""


class RunNetworkPolicies:
    """The ``lorenz-runs-<workflow>`` NetworkPolicies this operator has made sure of.

    A Workflow's policy is created (or brought up to date) before the first run Pod of each
    ``worker.egress`` it sees, once per process; a launch never creates a run Pod that no
    policy selects."""

    def __init__(self) -> None:
        self._ensured: dict[tuple[str, str], str] = {}
        self._lock = asyncio.Lock()

    async def ensure(self, api: KubeApi, *, workflow: WorkflowRef, worker: WorkerSettings) -> None:
        manifest = run_network_policy_manifest(workflow=workflow, worker=worker)
        metadata = manifest["metadata"]
        name = metadata["name"]
        key = (workflow.namespace, name)
        want = digest(
            json.dumps([manifest["spec"], metadata.get("ownerReferences")], sort_keys=True)
        )
        if self._ensured.get(key) == want:
            return
        metadata["annotations"] = {POLICY_DIGEST_ANNOTATION: want}
        async with self._lock:
            if self._ensured.get(key) == want:
                return
            try:
                await api.create(network_policies_path(workflow.namespace), manifest)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise _policy_error(workflow.namespace, name, exc) from exc
                try:
                    found = await api.get(network_policies_path(workflow.namespace, name))
                    annotations = (found.get("metadata") or {}).get("annotations") or {}
                    if annotations.get(POLICY_DIGEST_ANNOTATION) != want:
                        version = (found.get("metadata") or {}).get("resourceVersion")
                        metadata["resourceVersion"] = version
                        await api.replace(network_policies_path(workflow.namespace, name), manifest)
                except KubeApiError as again:
                    raise _policy_error(workflow.namespace, name, again) from again
            self._ensured[key] = want


def _policy_error(namespace: str, name: str, exc: KubeApiError) -> WorkerLaunchError:
    return WorkerLaunchError(
        f"the NetworkPolicy {namespace}/{name} of the run Pods could not be made: "
        f"{exc.status} {exc.detail or exc.reason}; grant the operator networkpolicies "
        "get/create/update in this namespace",
        code=ErrorCode.POD_NETWORK_POLICY_FAILED,
    )


RUN_POLICIES = RunNetworkPolicies()
"""The process's run Pod NetworkPolicies (every transport shares it unless given another)."""


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
        accounts: AgentAccounts | None = None,
        operator_account: tuple[str, str] | None = None,
        watches: RunPodWatches | None = None,
        policies: RunNetworkPolicies | None = None,
    ) -> None:
        self.api = api
        self.policies = policies if policies is not None else RUN_POLICIES
        """The run Pods' NetworkPolicies made sure of (the process's, by default)."""
        self.watches = watches if watches is not None else WATCHES
        """Where this transport's namespace watch is shared (the process's, by default)."""
        self._watch: RunPodWatch | None = None
        """The namespace's run Pod watch, held from the first launch until :meth:`close`."""
        self.accounts = accounts if accounts is not None else AgentAccounts()
        """The ``lorenz-agent`` ServiceAccounts made sure of (the operator shares one)."""
        self.operator_account = operator_account
        """The operator's own ServiceAccount (namespace, name), which no run Pod may use."""
        self.execs = execs.scoped()
        """This run's exec channels (closed with the transport; counted in ``execs`` too)."""
        self._credentials = execs
        self.workflow = workflow
        self.worker = worker
        self.image = image
        self.poll_s = poll_s
        self.namespace = workflow.namespace
        self.started_in_s: float | None = None
        """How long the newest launch took, create to serving (for metrics and figures)."""
        self.created: list[str] = []
        """Handles whose Pod this transport created (the runner deletes them at the end)."""
        self.on_pod: Callable[[str], None] | None = None
        """Told the name of each Pod a launch created or found (the runner shows its phase)."""

    def _state_dir(self, handle: str) -> str:
        return f"{STATE_ROOT}/{handle}"

    def watch(self) -> RunPodWatch:
        """The namespace's shared run Pod watch, held by this transport until it is closed."""
        if self._watch is None:
            self._watch = self.watches.of(
                api=self.api, execs=self._credentials, namespace=self.namespace
            )
            self._watch.hold()
        return self._watch

    async def launch(self, spec: RunSpec) -> LaunchResult:
        name = pod_name(spec.handle)
        payload = encode_spec(spec).decode()
        if len(payload) > SPEC_SECRET_LIMIT:
            raise WorkerLaunchError(
                f"the run spec of {spec.handle} is {len(payload)} bytes, more than a Secret "
                f"holds ({SPEC_SECRET_LIMIT}); shorten the prompt",
                code=ErrorCode.POD_SPEC_TOO_LARGE,
            )
        began = time.monotonic()
        manifest = pod_manifest(
            spec=spec, workflow=self.workflow, worker=self.worker, image=self.image
        )
        await self._ensure_identity()
        # NB: before the Pod: a run Pod is never, even briefly, selected by no policy.
        await self.policies.ensure(self.api, workflow=self.workflow, worker=self.worker)
        await self._ensure_workspace_claim(spec)
        # NB: the Pod first, then its spec Secret owned by it (uid and all): a launch that
        # dies between the two leaves a Pod (which its Claim's intent names: adopted or swept),
        # never a Secret nothing deletes, and the Secret goes with its Pod however the Pod goes.
        # The kubelet waits for a Secret volume that is not there yet; the Secret is made
        # within milliseconds of the Pod, before the Pod is even scheduled.
        fresh = False
        try:
            created = await self.api.create(pods_path(self.namespace), manifest)
            self.created.append(spec.handle)
            fresh = True
        except KubeApiError as exc:
            if exc.status != 409:
                if "service account" in (exc.detail or "").lower():
                    self.accounts.forget(self.namespace)
                raise refused(
                    exc, what=f"the API refused the run's Pod {self.namespace}/{name}"
                ) from exc
            created = await self.api.get(pods_path(self.namespace, name))
            annotations = (created.get("metadata") or {}).get("annotations") or {}
            if annotations.get(ANNOTATION_HANDLE) != spec.handle:
                raise WorkerLaunchError(
                    f"a Pod {self.namespace}/{name} exists that is not this run's; delete it",
                    code=ErrorCode.POD_NAME_TAKEN,
                ) from exc
            if pod_ended(created) or (created.get("metadata") or {}).get("deletionTimestamp"):
                # NB: an earlier run of this handle ended (or was stopped: a deleted Claim,
                # then the same attempt dispatched again); the runner moves to the next one.
                raise WorkerLaunchError(
                    f"the Pod of {spec.handle} already ran", code=ErrorCode.WORKER_HANDLE_USED
                ) from exc
        if self.on_pod is not None:
            self.on_pod(name)
        try:
            await self._create_spec_secret(spec, pod=created, payload=payload)
        except BaseException:
            if fresh:
                # NB: shielded: a launch cancelled here still removes the Pod that would
                # wait for its Secret forever.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.delete(spec.handle))
            raise
        deadline = began + self.worker.start_timeout_ms / 1000
        last = "the Pod was created"
        last_pod: Mapping[str, Any] = {}
        watch = self.watch()
        seen = False
        probe_wait = self.poll_s
        # NB: no GET per launch: every launch of the namespace waits on the one watch's copy
        # of its Pod, and the exec probe runs only once that copy says the worker's container
        # runs (a thousand launches waiting for image pulls cost one stream, not a thousand
        # polls a second; bench/README.md, kwok_bench.py).
        while True:
            found = watch.get(name)
            if found is not None:
                seen = True
                last_pod = found
            elif seen and watch.synced.is_set():
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} was deleted while starting",
                    code=ErrorCode.WORKER_START_FAILED,
                )
            wait = deadline - time.monotonic()
            if found is not None and pod_ended(found):
                reason = why_not_running(found)
                await self.delete(spec.handle)
                raise WorkerLaunchError(
                    f"the run's Pod {self.namespace}/{name} ended before its worker served: "
                    f"{reason}",
                    code=ErrorCode.WORKER_START_FAILED,
                )
            if found is not None and worker_running(found):
                probe = await self._probe_running(spec.handle, found)
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
                # NB: a container that runs serves within a second or two; one that does not
                # (kwok runs none) is asked less and less often.
                wait = min(wait, probe_wait)
                probe_wait = min(probe_wait * 2, PROBE_BACKOFF_MAX_S)
            elif found is not None:
                last = why_not_running(found)
            if time.monotonic() >= deadline:
                await self.delete(spec.handle)
                message = (
                    f"the run's Pod {self.namespace}/{name} did not serve its worker within "
                    f"{self.worker.start_timeout_ms} ms (worker.start_timeout_ms): {last}"
                )
                unplaced = placement_reason(last_pod)
                if unplaced is not None:
                    # NB: never placed (not scheduled, no image, not created): nothing ran,
                    # so the reservation goes back; a worker that ran and did not serve is a
                    # failure of the run.
                    raise PlacementFailed(
                        message,
                        code=ErrorCode.POD_START_TIMEOUT,
                        reason=unplaced,
                    )
                raise WorkerLaunchError(message, code=ErrorCode.POD_START_TIMEOUT)
            await watch.changed(name, timeout_s=max(0.0, wait))

    async def _ensure_identity(self) -> None:
        """The run Pod's ServiceAccount exists and is not the operator's own."""
        named = self.worker.service_account_name
        if named is None:
            await self.accounts.ensure(self.api, namespace=self.namespace)
            return
        if self.operator_account == (self.namespace, named):
            raise WorkerLaunchError(
                f"worker.service_account_name {named!r} is the operator's own ServiceAccount; "
                "run Pods never use it: name another or unset it (lorenz-agent)",
                code=ErrorCode.POD_SERVICE_ACCOUNT_REFUSED,
            )

    async def _ensure_workspace_claim(self, spec: RunSpec) -> None:
        """Create the issue slot's workspace claim, or find the one an earlier attempt made."""
        claim = workspace_claim_manifest(spec=spec, workflow=self.workflow, worker=self.worker)
        if claim is None:
            return
        name = claim["metadata"]["name"]
        try:
            await self.api.create(volume_claims_path(self.namespace), claim)
            return
        except KubeApiError as exc:
            if exc.status != 409:
                raise WorkerLaunchError(
                    f"the API refused the workspace claim {self.namespace}/{name}: {exc.status} "
                    f"{exc.detail or exc.reason}",
                    code=ErrorCode.POD_REFUSED,
                ) from exc
        found = await self.api.get(volume_claims_path(self.namespace, name))
        metadata = found.get("metadata") or {}
        if (metadata.get("annotations") or {}).get(ANNOTATION_ISSUE_ID) != spec.issue.id:
            raise WorkerLaunchError(
                f"a PersistentVolumeClaim {self.namespace}/{name} exists that is not the "
                f"workspace of {spec.issue.identifier}; delete it",
                code=ErrorCode.POD_NAME_TAKEN,
            )
        if metadata.get("deletionTimestamp"):
            # NB: the issue was terminal a moment ago; its claim goes once its last Pod has.
            raise WorkerLaunchError(
                f"the workspace claim {self.namespace}/{name} of {spec.issue.identifier} is "
                "still being deleted; the retry makes a new one",
                code=ErrorCode.POD_WORKSPACE_TERMINATING,
            )

    async def _create_spec_secret(
        self, spec: RunSpec, *, pod: Mapping[str, Any], payload: str
    ) -> None:
        """The run's spec as a Secret that only its Pod mounts, owned by that Pod (by uid: the
        garbage collector deletes it with the Pod, and a namesake Pod's Secret is not it)."""
        pod_metadata = pod.get("metadata") or {}
        name = str(pod_metadata.get("name"))
        uid = str(pod_metadata.get("uid"))
        secret_name = f"{name}-spec"
        metadata: dict[str, Any] = {
            "name": secret_name,
            "namespace": self.namespace,
            "labels": run_labels(spec=spec, workflow=self.workflow),
            "annotations": {ANNOTATION_HANDLE: spec.handle},
            "ownerReferences": [pod_owner(name=name, uid=uid)],
        }
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": metadata,
            "data": {SPEC_KEY: base64.b64encode(payload.encode()).decode()},
        }
        for _ in range(3):
            try:
                await self.api.create(secrets_path(self.namespace), secret)
                return
            except KubeApiError as exc:
                if exc.status != 409:
                    raise refused(
                        exc,
                        what=(
                            "the API refused the run's spec Secret "
                            f"{self.namespace}/{secret_name}"
                        ),
                    ) from exc
            path = secrets_path(self.namespace, secret_name)
            try:
                found = await self.api.get(path)
            except KubeApiError as exc:
                if exc.not_found:
                    continue
                raise
            found_metadata = found.get("metadata") or {}
            owners = {ref.get("uid") for ref in found_metadata.get("ownerReferences") or ()}
            if uid in owners:
                return  # NB: this Pod's (a launch of an adopted Pod, or one that crashed)
            # NB: an earlier Pod's of the same name (the garbage collector has not got to it):
            # it would take this Pod's Secret along; replaced, uid-checked.
            with contextlib.suppress(KubeApiError):
                await self.api.delete(path, uid=str(found_metadata.get("uid")))
        raise WorkerLaunchError(
            f"the spec Secret {self.namespace}/{secret_name} of an earlier Pod kept coming "
            "back; delete it",
            code=ErrorCode.POD_NAME_TAKEN,
        )

    async def probe(self, handle: str) -> Probe:
        name = pod_name(handle)
        # NB: the watch's copy when it has one (a launch of this namespace holds it); a Pod
        # it has not seen is read, never taken for gone.
        pod = self._watch.get(name) if self._watch is not None else None
        if pod is None:
            try:
                pod = await self.api.get(pods_path(self.namespace, name))
            except KubeApiError as exc:
                if exc.not_found:
                    return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is gone")
                return Probe(state=ProbeState.UNKNOWN, detail=f"{exc.status} {exc.reason}")
        return await self._probe_running(handle, pod)

    async def _probe_running(self, handle: str, pod: Mapping[str, Any]) -> Probe:
        """Probe the worker of ``pod`` (as last seen): through an exec when it runs."""
        name = pod_name(handle)
        if pod_ended(pod):
            # NB: the journal was in the Pod's emptyDir; a Pod that ended has taken it along.
            return Probe(state=ProbeState.GONE, detail=why_not_running(pod))
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return Probe(state=ProbeState.GONE, detail=f"the Pod {name} is being deleted")
        if not worker_running(pod):
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
        """The journal's records after ``after_seq``; none when the Pod is gone or ended
        (its journal went with its ``emptyDir``: the run is followed to ``worker_gone``)."""
        try:
            result = await self.execs.run(
                namespace=self.namespace,
                pod=pod_name(handle),
                container=CONTAINER,
                command=["lorenz", "worker", "--journal-after", str(after_seq),
                         "--state-dir", self._state_dir(handle)],
            )
        except PodExecError as exc:
            if (await self.probe(handle)).state is ProbeState.GONE:
                return []
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

    async def kill(self, handle: str) -> None:
        """Delete the run's Pod with ``gracePeriodSeconds: 0`` and return once the API server
        shows it gone (or ended: every container terminated); :class:`WorkerKillUnconfirmed`
        while it still exists (a finalizer holds it, the kubelet has not killed it yet) or the
        API server cannot be asked — the runner keeps the slot held and calls this again.

        NB: the deletion is sent again on every call (idempotent: a Pod being deleted is
        only not found once gone), so a delete that failed is retried with the read.
        """
        name = pod_name(handle)
        path = pods_path(self.namespace, name)
        try:
            await self.api.delete(path, grace_period_s=0)
        except KubeApiError as exc:
            if not exc.not_found:
                raise WorkerKillUnconfirmed(
                    f"the Pod {self.namespace}/{name} could not be deleted ({exc.status} "
                    f"{exc.reason}); the slot stays held and the deletion is tried again"
                ) from exc
        try:
            pod = await self.api.get(path)
        except KubeApiError as exc:
            if exc.not_found:
                await self.delete(handle)  # NB: its spec Secret (the GC would, later)
                return
            raise WorkerKillUnconfirmed(
                f"the Pod {self.namespace}/{name} could not be read after its deletion "
                f"({exc.status} {exc.reason}); the slot stays held until it is seen gone"
            ) from exc
        if pod_ended(pod):
            return
        finalizers = (pod.get("metadata") or {}).get("finalizers") or []
        held = f" (finalizers {', '.join(map(str, finalizers))})" if finalizers else ""
        raise WorkerKillUnconfirmed(
            f"the Pod {self.namespace}/{name} is being deleted but not gone yet{held}; the "
            "slot stays held until the API server shows it gone"
        )

    async def delete(self, handle: str) -> None:
        """Delete the run's Pod and its spec Secret (gone already is fine)."""
        name = pod_name(handle)
        spec_secret = secrets_path(self.namespace, f"{name}-spec")
        for path in (pods_path(self.namespace, name), spec_secret):
            try:
                await self.api.delete(path)
            except KubeApiError as exc:
                if not exc.not_found:
                    logger.warning("could not delete %s: %s", path, exc)

    async def close(self) -> None:
        """Close this transport's exec channels and let go of the namespace's watch (it
        lingers for the next run); idempotent."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.release()
        await self.execs.close()
