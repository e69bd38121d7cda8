"""Whether anything enforces the run Pods' NetworkPolicy: a probe Pod that should be refused.

The operator writes ``lorenz-runs-<workflow>`` before any run Pod (no ingress, egress to DNS
and ``worker.egress`` only), but a NetworkPolicy is only a wish: a CNI that does not enforce it
(the bridge plugin, flannel alone, kindnet before 0.24) lets every run Pod reach the operator,
the API server and every other namespace's Pods, and nothing says so (#37). The platform team
must provide an enforcing CNI; this module tells the Workflow's owner when it did not.

Where a Workflow's runs go to Pods, its leader asks :class:`NetworkPolicyProbes` (one per
process, shared by every Workflow of a namespace) for the namespace's answer. A probe is a tiny
Pod carrying the run Pods' labels — so the Workflow's policy selects it — made with the
Workflow's own run image and scheduling (``FROM`` the Lorenz image, so ``python3`` is there;
it pulls and schedules wherever a run would: the operator's image might not). It tries one TCP
connect to this operator's API (the host and port of ``advertise_url``: the chart sets the
Pod's IP), which that policy refuses, and says what happened by its exit code; the Pod is
deleted afterwards. One probe at a time per process, each bounded by :data:`PROBE_TIMEOUT_S`;
a namespace's answer holds for ``network_policy_probe_interval_seconds`` (hourly).

The answer is the Workflow's ``NetworkPolicyEnforced`` condition: ``True`` (refused), ``False``
with reason ``network_policy_not_enforced`` and a Warning Event ``NetworkPolicyNotEnforced``
(connected: runs go on, the owner and the platform team know), or ``Unknown`` with reason
``network_policy_probe_failed`` when the probe could not answer (no image, no node, no address
of its own) — never ``Degraded`` on its own: the Workflow works either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from lorenz.codes import ErrorCode
from lorenz.config import WorkerSettings
from lorenz.kube.api.resources import WorkflowRef, digest
from lorenz.kube.api.statuses import ConditionStatus
from lorenz.kube.clients import KubeApi
from lorenz.kube.controller.posting import EventKind
from lorenz.kube.errors import KubeApiError
from lorenz.kube.pods.manifests import (
    AGENT_SERVICE_ACCOUNT,
    LABEL_MANAGED,
    LABEL_WORKFLOW,
    RUN_UID,
    label_value,
    pod_ended,
    pods_path,
    why_not_running,
)
from lorenz.kube.pods.transport import RUN_POLICIES, AgentAccounts, RunNetworkPolicies
from lorenz.kube.settings import OperatorSettings
from lorenz.policies.placement import runs_in_pods
from lorenz.runtime import LorenzRuntime

logger = logging.getLogger(__name__)

NOT_ENFORCED_EVENT: Final = "NetworkPolicyNotEnforced"
"""The Warning Event's reason."""
ENFORCED_REASON: Final = "ConnectionRefused"
"""The condition's reason when the probe was refused."""
LABEL_PROBE: Final = "lorenz.dev/probe"
"""Marks the probe Pod (it carries no handle: no run, no orphan sweep, no Claim names it)."""
PROBE_CONTAINER: Final = "probe"
PROBE_TIMEOUT_S: Final = 90.0
"""The longest a probe Pod may take, create to answer (an image pull included)."""
CONNECT_TIMEOUT_S: Final = 5.0
"""The probe's connect timeout: a policy that drops packets answers with silence."""
UNKNOWN_RETRY_S: Final = 300.0
"""How soon a probe that could not answer is tried again (at most)."""
EXIT_CONNECTED: Final = 10
EXIT_REFUSED: Final = 11

PROBE_SCRIPT: Final = f"""\
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout={CONNECT_TIMEOUT_S}).close()
except OSError as exc:
    print(f"refused: {{type(exc).__name__}}: {{exc}}", flush=True)
    sys.exit({EXIT_REFUSED})
print(f"connected to {{host}}:{{port}}", flush=True)
sys.exit({EXIT_CONNECTED})
"""
"""The probe: one TCP connect; exit :data:`EXIT_CONNECTED` or :data:`EXIT_REFUSED` (silence,
a reset, no route — anything but a connection — counts as refused)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnforcementVerdict:
    """One namespace's answer, as the ``NetworkPolicyEnforced`` condition says it."""

    status: ConditionStatus
    reason: str
    message: str
    checked_at: float = dataclasses.field(default_factory=time.monotonic)
    """When the answer came (monotonic): it holds for the probe interval."""

    def condition(self) -> tuple[ConditionStatus, str, str]:
        """Status, reason and message of the ``NetworkPolicyEnforced`` condition."""
        return (self.status, self.reason, self.message)


def probe_target(advertise_url: str | None) -> tuple[str, int] | None:
    """The host and port the probe connects to: this process's API as ``advertise_url``
    names it (``None``: unset, or no host in it)."""
    if not advertise_url:
        return None
    try:
        parts = urllib.parse.urlsplit(advertise_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def probe_pod_name(workflow: WorkflowRef) -> str:
    """``lorenz-netprobe-<digest>``: one per Workflow at a time (the digest keeps it short)."""
    return f"lorenz-netprobe-{digest(workflow.namespace, workflow.name)}"


def probe_pod_manifest(
    *, workflow: WorkflowRef, worker: WorkerSettings, image: str, target: tuple[str, int]
) -> dict[str, Any]:
    """The probe Pod: the run Pods' labels (``lorenz-runs-<workflow>`` selects it), the run's
    image and scheduling, restricted, no token, tiny; pure."""
    template = worker.pod_template
    container: dict[str, Any] = {
        "name": PROBE_CONTAINER,
        "image": image,
        "command": ["python3", "-c", PROBE_SCRIPT, target[0], str(target[1])],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
    }
    if template.image_pull_policy is not None:
        container["imagePullPolicy"] = template.image_pull_policy.value
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": int(PROBE_TIMEOUT_S),
        "serviceAccountName": worker.service_account_name or AGENT_SERVICE_ACCOUNT,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_UID,
            "runAsGroup": RUN_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = [t.manifest() for t in template.tolerations]
    if template.affinity:
        spec["affinity"] = template.affinity
    if template.runtime_class_name:
        spec["runtimeClassName"] = template.runtime_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": probe_pod_name(workflow),
            "namespace": workflow.namespace,
            "labels": {
                LABEL_MANAGED: "lorenz",
                LABEL_WORKFLOW: label_value(workflow.name),
                LABEL_PROBE: "network-policy",
            },
        },
        "spec": spec,
    }


def read_probe(pod: Mapping[str, Any], *, target: tuple[str, int]) -> EnforcementVerdict | None:
    """The answer of an ended probe Pod (``None``: it has not ended)."""
    if not pod_ended(pod):
        return None
    where = f"{target[0]}:{target[1]}"
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        said = str(terminated.get("message") or "").strip()[-300:]
        if terminated.get("exitCode") == EXIT_CONNECTED:
            return not_enforced(
                f"a probe Pod that lorenz-runs-* selects connected to the operator at {where}, "
                "which that policy refuses: nothing enforces NetworkPolicy in this namespace; "
                "the platform team needs an enforcing CNI (docs/operator.md)"
            )
        if terminated.get("exitCode") == EXIT_REFUSED:
            return EnforcementVerdict(
                status="True",
                reason=ENFORCED_REASON,
                message=f"a probe Pod that lorenz-runs-* selects could not reach the operator "
                f"at {where} ({said or 'refused'})",
            )
    return unknown(f"the probe Pod ended without an answer: {why_not_running(pod)}")


def not_enforced(message: str) -> EnforcementVerdict:
    return EnforcementVerdict(
        status="False", reason=ErrorCode.NETWORK_POLICY_NOT_ENFORCED.value, message=message
    )


def unknown(message: str) -> EnforcementVerdict:
    return EnforcementVerdict(
        status="Unknown", reason=ErrorCode.NETWORK_POLICY_PROBE_FAILED.value, message=message
    )


class NetworkPolicyProbes:
    """The namespaces' answers, and the one probe this process runs at a time."""

    def __init__(
        self,
        *,
        timeout_s: float = PROBE_TIMEOUT_S,
        poll_s: float = 1.0,
        policies: RunNetworkPolicies | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._policies = policies if policies is not None else RUN_POLICIES
        self._answers: dict[str, EnforcementVerdict] = {}
        self._gate = asyncio.Lock()
        """One probe at a time, whatever the number of namespaces and Workflows."""
        self.probes = 0
        """Probe Pods made (for tests and figures)."""

    def answer(self, namespace: str, *, max_age_s: float) -> EnforcementVerdict | None:
        """The namespace's answer if it is younger than ``max_age_s`` (an ``Unknown`` one
        holds at most :data:`UNKNOWN_RETRY_S`)."""
        found = self._answers.get(namespace)
        if found is None:
            return None
        if found.status == "Unknown":
            max_age_s = min(max_age_s, UNKNOWN_RETRY_S)
        return found if time.monotonic() - found.checked_at < max_age_s else None

    async def verdict(
        self,
        api: KubeApi,
        *,
        workflow: WorkflowRef,
        worker: WorkerSettings,
        image: str | None,
        target: tuple[str, int] | None,
        accounts: AgentAccounts,
        max_age_s: float,
    ) -> EnforcementVerdict:
        """The namespace's answer: a young enough one, else a new probe's."""
        found = self.answer(workflow.namespace, max_age_s=max_age_s)
        if found is not None:
            return found
        async with self._gate:
            found = self.answer(workflow.namespace, max_age_s=max_age_s)
            if found is not None:
                return found
            verdict = await self._probe(
                api, workflow=workflow, worker=worker, image=image, target=target,
                accounts=accounts,
            )
            self._answers[workflow.namespace] = verdict
            logger.info(
                "NetworkPolicy probe namespace=%s enforced=%s message=%s",
                workflow.namespace, verdict.status, verdict.message,
            )
            return verdict

    async def _probe(
        self,
        api: KubeApi,
        *,
        workflow: WorkflowRef,
        worker: WorkerSettings,
        image: str | None,
        target: tuple[str, int] | None,
        accounts: AgentAccounts,
    ) -> EnforcementVerdict:
        if target is None:
            return unknown(
                "the operator knows no address of its own to probe: set --advertise-url "
                "(the chart sets the Pod's IP)"
            )
        if image is None:
            return unknown("no run image to probe with (worker.podTemplate.image)")
        try:
            if worker.service_account_name is None:
                await accounts.ensure(api, namespace=workflow.namespace)
            # NB: before the probe, as before any run Pod: the probe is what it selects.
            await self._policies.ensure(api, workflow=workflow, worker=worker)
        except Exception as exc:  # noqa: BLE001 - a coded launch error, or the API's
            return unknown(f"the probe's NetworkPolicy or ServiceAccount: {exc}")
        manifest = probe_pod_manifest(workflow=workflow, worker=worker, image=image,
                                      target=target)
        path = pods_path(workflow.namespace, manifest["metadata"]["name"])
        # NB: a probe of an earlier process (it died mid-probe) would answer for then.
        await self._delete(api, path)
        try:
            created = await api.create(pods_path(workflow.namespace), manifest)
        except KubeApiError as exc:
            return unknown(f"the API refused the probe Pod: {exc.status} "
                           f"{exc.detail or exc.reason}")
        self.probes += 1
        uid = (created.get("metadata") or {}).get("uid")
        pod: Mapping[str, Any] = created
        try:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                try:
                    pod = await api.get(path)
                except KubeApiError as exc:
                    if exc.not_found:
                        return unknown("the probe Pod was deleted before it answered")
                    raise
                verdict = read_probe(pod, target=target)
                if verdict is not None:
                    return verdict
                await asyncio.sleep(self.poll_s)
            return unknown(
                f"the probe Pod did not answer within {self.timeout_s:.0f} s: "
                f"{why_not_running(pod)}"
            )
        except KubeApiError as exc:
            return unknown(f"reading the probe Pod failed: {exc.status} {exc.reason}")
        finally:
            await asyncio.shield(self._delete(api, path, uid=uid))

    @staticmethod
    async def _delete(api: KubeApi, path: str, *, uid: str | None = None) -> None:
        try:
            await api.delete(path, uid=uid)
        except KubeApiError as exc:
            if not exc.not_found and exc.status != 409:
                logger.warning("could not delete the probe Pod %s: %s", path, exc)


NETWORK_PROBES = NetworkPolicyProbes()
"""The process's probes (every Workflow controller shares it unless given another)."""


class EnforcementFollower:
    """One Workflow's ``NetworkPolicyEnforced`` condition, kept by its leader.

    :meth:`follow` runs while the term holds: it asks the namespace's answer at once and again
    whenever it is due, and says each new one (the status is marked dirty; a ``False`` one posts
    the Warning Event). The last answer stays until a newer one replaces it."""

    def __init__(
        self,
        *,
        api: KubeApi,
        settings: OperatorSettings,
        post: Callable[[EventKind, str, str], object],
        changed: Callable[[], None],
        accounts: AgentAccounts | None = None,
        probes: NetworkPolicyProbes | None = None,
    ) -> None:
        self._api = api
        self.enabled = settings.network_policy_probe
        self.interval_s = settings.network_policy_probe_interval_seconds
        self._target = probe_target(settings.advertise_url)
        self._worker_image = settings.worker_image
        self._post = post
        self._changed = changed
        self._accounts = accounts if accounts is not None else AgentAccounts()
        self.probes = probes if probes is not None else NETWORK_PROBES
        self.verdict: EnforcementVerdict | None = None
        """The newest answer for this Workflow's namespace (``None``: none yet, or off)."""
        self._task: asyncio.Task[None] | None = None
        self._active: Callable[[], bool] = lambda: False

    def condition(self) -> tuple[ConditionStatus, str, str] | None:
        """The condition as the status says it (``None``: no answer yet, or the probe is off)."""
        return self.verdict.condition() if self.verdict is not None else None

    def start(
        self,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        *,
        workflow: Callable[[], WorkflowRef],
        runtime: Callable[[], LorenzRuntime | None],
        active: Callable[[], bool],
    ) -> None:
        """Follow the namespace's answer (with ``spawn``) unless off, while ``active()``, with
        the worker settings of ``runtime()`` as they are then.

        NB: a loop that still runs (a runtime restarted within the term, or a new term while
        it sleeps) goes on with the new ``active`` instead of a second loop beside it."""
        if not self.enabled:
            return
        self._active = active
        if self._task is not None and not self._task.done():
            return

        def worker() -> WorkerSettings | None:
            now = runtime()
            return now.settings.worker if now is not None else None

        self._task = spawn(self.follow(workflow=workflow, worker=worker,
                                       active=lambda: self._active()))

    async def follow(
        self,
        *,
        workflow: Callable[[], WorkflowRef],
        worker: Callable[[], WorkerSettings | None],
        active: Callable[[], bool],
    ) -> None:
        while active():
            settings = worker()
            if settings is None or not runs_in_pods(settings):
                return
            ref = workflow()
            verdict = await self.probes.verdict(
                self._api,
                workflow=ref,
                worker=settings,
                image=settings.pod_template.image or self._worker_image,
                target=self._target,
                accounts=self._accounts,
                max_age_s=self.interval_s,
            )
            if not active():
                return
            self.report(verdict)
            due = self.interval_s if verdict.status != "Unknown" else UNKNOWN_RETRY_S
            await asyncio.sleep(max(1.0, min(due, self.interval_s)
                                    - (time.monotonic() - verdict.checked_at)))

    def report(self, verdict: EnforcementVerdict) -> None:
        """Take ``verdict`` as the condition; a new ``False`` one posts the Warning Event."""
        fresh = self.verdict is None or self.verdict.checked_at != verdict.checked_at
        self.verdict = verdict
        self._changed()
        if fresh and verdict.status == "False":
            self._post("Warning", NOT_ENFORCED_EVENT, verdict.message)
