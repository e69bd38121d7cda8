"""The runner of a run in a Pod, and the runners of one Workflow's runs in Pods.

:class:`PodWorkerRunner` is the worker runner (journal, spawn intent, adoption) over the Pod
transport, showing the run's Pod and node on its Claim; :class:`PodRunners` makes one per run
for a Workflow's controller, with the exec channels and ServiceAccounts its runs share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lorenz.agents import (
    AgentRunError,
    AgentRunRequest,
    AgentRunResult,
    DroppedAdoption,
    RunPlacement,
)
from lorenz.codes import ErrorCode
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi
from lorenz.kube.pods.execs import PodExec
from lorenz.kube.pods.manifests import (
    POD_LINGER_MS,
    operator_service_account,
    pod_name,
)
from lorenz.kube.pods.transport import AgentAccounts, PodTransport
from lorenz.model import SlotKey, SpawnIntents, slot_key
from lorenz.workers.placement import placed_spec
from lorenz.workers.runner import WorkerRunner
from lorenz.workers.spec import RunSpec

logger = logging.getLogger(__name__)


class PodWorkerRunner(WorkerRunner):
    """A :class:`WorkerRunner` for one run in a Pod: the worker creates the workspace on the
    Pod's volume, runs every hook there, and starts its agent from the container's environment
    (the image's, plus the Secrets of ``env_from_secrets``); the Pod is deleted afterwards.

    A run stopped (a stall, a stopped issue) whose worker does not end it, or whose worker is
    gone, ends only once its Pod is: deleted with ``gracePeriodSeconds: 0`` and seen gone (or
    ended) on the API server, tried again while a finalizer or a failing API server keeps it
    (``worker_kill_unconfirmed``; :meth:`WorkerRunner._kill_run`). Until then the slot stays
    held, and no retry is placed beside a Pod whose agent may still run."""

    def __init__(
        self,
        *,
        workflow: str,
        transport: PodTransport,
        placement: RunPlacement,
        generation: int = 0,
        intents: SpawnIntents | None = None,
        leaving: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(
            workflow=workflow,
            transport=transport,
            placement=placement.host,
            generation=generation,
            intents=intents,
            leaving=leaving,
        )
        self.pods = transport
        self.run_placement = placement
        self._placed_key: SlotKey | None = None
        """The slot of the run (whose Claim shows its Pod's phase and node)."""
        self._follow_pod: Callable[[str], None] | None = None


    def spec_for(self, request: AgentRunRequest, *, run: int = 0) -> RunSpec:
        spec = placed_spec(super().spec_for(request, run=run), request, self.run_placement)
        return dataclasses.replace(spec, linger_ms=max(spec.linger_ms, POD_LINGER_MS))

    async def run(self, request: AgentRunRequest) -> AgentRunResult:
        stop = self._show_pods(slot_key(request.issue.id, request.slot_index))
        try:
            return await super().run(request)
        finally:
            stop()
            try:
                await self._delete_pods()
            finally:
                await self._close()

    def _show_pods(self, key: SlotKey) -> Callable[[], None]:
        """Show the phase and node of this run's Pods on its Claim (``kubectl get claims``),
        from the namespace's Pod watch; the function that stops it."""
        store = self.intents
        if not isinstance(store, ClaimResourceStore):
            return lambda: None
        writes: set[asyncio.Task[bool]] = set()
        stops: dict[str, Callable[[], None]] = {}
        watch = self.pods.watch()

        def changed(name: str, pod: Mapping[str, Any] | None) -> None:
            if pod is None:
                return
            phase = (pod.get("status") or {}).get("phase")
            node = (pod.get("spec") or {}).get("nodeName")
            if phase not in ("Pending", "Failed"):
                # NB: a Running or Succeeded Pod's run is bound or settled in a moment (a
                # status write anyway): the phase rides along with it.
                store.remember_pod(key, phase=phase, node=node)
                return
            task = asyncio.ensure_future(store.note_pod(key, phase=phase, node=node))
            writes.add(task)
            task.add_done_callback(_settled(writes))

        def follow(name: str) -> None:
            if name not in stops:
                stops[name] = watch.listen(changed, name=name)
                changed(name, watch.get(name))

        self.pods.on_pod = follow
        self._placed_key = key
        self._follow_pod = follow

        def stop() -> None:
            self.pods.on_pod = None
            self._follow_pod = None
            for unlisten in stops.values():
                unlisten()
            for task in writes:
                task.cancel()

        return stop

    def placed_at(self, handle: str) -> str | None:
        """The run's Pod: where the slot's binding (and ``kubectl get claims``) says it runs.

        NB: the Pod's phase and node as the watch sees them now ride along with the binding's
        status write (no write of their own)."""
        name = pod_name(handle)
        store, key = self.intents, self._placed_key
        if self._follow_pod is not None:
            self._follow_pod(name)  # NB: an adopted run's Pod, which no launch of ours found
        pod = self.pods.watch().get(name)
        if isinstance(store, ClaimResourceStore) and key is not None and pod is not None:
            store.remember_pod(
                key,
                phase=(pod.get("status") or {}).get("phase"),
                node=(pod.get("spec") or {}).get("nodeName"),
            )
        return name

    async def cancel_adoption(self, dropped: DroppedAdoption) -> bool:
        """Cancel a lost controller's run that is not adopted, then delete its Pod."""
        try:
            return await super().cancel_adoption(dropped)
        finally:
            try:
                await self._delete_pods()
            finally:
                await self._close()

    async def _close(self) -> None:
        """The run is over for this controller (ended, cancelled or left to the next one):
        its exec channels close on every path (shielded: a cancelled run still closes them)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self.pods.close())

    async def _delete_pods(self) -> None:
        """Delete the Pods (and spec Secrets) of this runner's runs, unless this controller
        leaves its workers to the next one.

        NB: only ever after the run was followed to its end, cancelled, or found gone: a
        controller that may not write any more (leadership lost, fenced, handed over) leaves
        the Pod running for the leader that adopts it, whatever failed.
        """
        handles = set(self.pods.created)
        if self.last_handle is not None:
            handles.add(self.last_handle.handle)
        if self._leaves_workers():
            if handles:
                logger.info("run Pod left for the next controller handles=%s", sorted(handles))
            return
        for handle in sorted(handles):
            # NB: shielded: a cancelled run still removes its Pod. Its agent is over by now:
            # the worker wrote its final record, or the run was stopped (or found gone)
            # without one and the kill path already deleted the Pod with grace 0 and waited
            # until the API server showed it gone (PodTransport.kill) — so this tidy-up may
            # fail: it is logged, and the next term's orphan sweep removes what is left.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.pods.delete(handle))


def _settled(tasks: set[asyncio.Task[bool]]) -> Callable[[asyncio.Task[bool]], None]:
    """A done-callback: forget the task, and log a failed Claim write (never raised)."""

    def done(task: asyncio.Task[bool]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("Claim Pod status write failed: %s", task.exception())

    return done


class PodRunners:
    """The runners of one Workflow's runs in Pods of their own (``worker.kind: pod``).

    The exec channels and the ``lorenz-agent`` ServiceAccounts made sure of are made at the
    first such run (a Workflow whose runs stay local never makes them) and kept for every run
    after it, across terms.
    """

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        worker_image: str | None,
        accounts: AgentAccounts | None = None,
    ) -> None:
        self._api = api
        self._workflow = workflow
        """The Workflow (its uid, which the Pods' owner references name, may come later: see
        :meth:`update_workflow`)."""
        self._worker_image = worker_image
        """The operator's ``worker_image``: the image of a run whose template names none."""
        self._execs: PodExec | None = None
        """The exec channels of runs in Pods (made at the first such run)."""
        self._accounts = accounts
        """The ``lorenz-agent`` ServiceAccounts made sure of (the process's, shared; made at
        the first run in a Pod when none is given)."""

    def update_workflow(self, workflow: WorkflowRef) -> None:
        """The Workflow's reference with its uid (first seen without one)."""
        self._workflow = workflow

    def runner(
        self,
        placement: RunPlacement,
        *,
        workflow: str,
        store: ClaimResourceStore,
        leaving: Callable[[], str | None] | None,
    ) -> PodWorkerRunner:
        """The runner of one run in a Pod of its own: its spawn intent and phases go on its
        Claim in ``store`` under the term's generation (the handle, and so the Pod's name,
        carries it), and a replica that leaves (``leaving`` names why) leaves the Pod to the
        next leader."""
        worker = placement.worker
        image = worker.pod_template.image or self._worker_image
        if image is None:
            raise AgentRunError(
                "worker.kind: pod needs an image: set worker.podTemplate.image, or the "
                "operator's worker_image (the chart sets it to the operator's own image)",
                code=ErrorCode.WORKER_IMAGE_MISSING,
            )
        if self._execs is None:
            self._execs = PodExec(self._api.configuration)
        if self._accounts is None:
            self._accounts = AgentAccounts()
        transport = PodTransport(
            api=self._api,
            execs=self._execs,
            workflow=self._workflow,
            worker=worker,
            image=image,
            accounts=self._accounts,
            operator_account=_operator_account(),
        )
        return PodWorkerRunner(
            workflow=workflow,
            transport=transport,
            placement=placement,
            generation=store.generation or 0,
            intents=store,
            leaving=leaving,
        )


@functools.cache
def _operator_account() -> tuple[str, str] | None:
    """The operator's own ServiceAccount, read once per process.

    NB: it was read (a file) by every controller as it was made, on the event loop: 1,000
    reads per replica while 1,000 Workflows were created, for runs in Pods only.
    """
    return operator_service_account()
