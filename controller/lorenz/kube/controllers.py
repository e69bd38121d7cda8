"""One controller per Workflow: campaign for its Lease, run its runtime while holding it.

Every replica has a :class:`WorkflowController` for every Workflow it watches; all of them
campaign for the Workflow's Lease and exactly one holds it. The holder:

1. adds the ``lorenz.dev/cleanup`` finalizer (so a deletion waits for its cleanup);
2. builds the runtime from the latest spec (a spec that does not load sets ``Degraded`` and
   waits for the next change), hydrates the orchestrator from the Workflow's Claims — the runs
   of a previous leader become failure retries, its pending retries come back — and starts it;
3. keeps the Workflow's status in step with the runtime's snapshots (at most one patch per
   ``status_interval_seconds``, and only when something changed);
4. turns spec updates into the runtime's transactional reload (a spec that fails keeps the
   last known good workflow and sets ``Degraded`` with the error's code), the
   ``lorenz.dev/refresh`` annotation into an immediate poll, a deleted Claim into a cancelled
   run, and the interesting runtime events into Kubernetes Events.

It stops in one of three ways, each in its own order:

* **Lease lost** (a renewal saw another holder, or none succeeded within the renew
  deadline): the claim store is already fenced, so nothing is written; local runs are aborted
  without recording anything (their Claims are the new leader's to recover); the runtime stops.
* **Workflow deleted**: the runtime stops and drains, its Claims are deleted, the Lease is
  released, the finalizer is removed.
* **Operator shutdown**: the runtime stops and drains (runs end as clean shutdowns, kept as
  continuation retries in their Claims), a last status says nobody leads, the Lease is released
  so a follower takes over at once.

Handlers are level-based: :meth:`observe` only records the newest object and wakes the loop;
what to do is always decided from the current state, never from which event arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from lorenz.agents import build_runner
from lorenz.agents.environment import TRACKER_SECRET_ENV
from lorenz.kube import resources
from lorenz.kube.claims import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.errors import KubeApiError, LeaseLost
from lorenz.kube.leases import KubernetesLeaseProvider
from lorenz.kube.posting import EventKind, EventPoster, Post, kopf_post
from lorenz.kube.settings import OperatorSettings
from lorenz.kube.specs import (
    failed_stamp,
    generation_of,
    load_workflow_object,
    workflow_ref,
)
from lorenz.kube.statuses import (
    DEGRADED,
    LEADING,
    READY,
    Condition,
    ConditionStatus,
    LeaderStatus,
    condition,
    reason_from_code,
    status_from_snapshot,
)
from lorenz.model import EventType, LorenzError, SlotKey, SystemClock
from lorenz.orchestrator import Orchestrator
from lorenz.runtime import LorenzRuntime
from lorenz.trackers import build_tracker
from lorenz.workflow import LoadedWorkflow, WorkflowStamp, validate_dispatch
from lorenz.workspaces import WorkspaceManager

logger = logging.getLogger("lorenz.kube.controllers")

MAX_PATCH_RETRIES = 5
TRANSIENT_RETRIES = 3
"""Retries (one retry period apart) of a spec rebuild whose API read failed transiently."""
STATUS_SETTLE_S = 0.05
"""How long a burst of snapshots may settle before the status is computed and patched."""


class RuntimeAttacher(Protocol):
    """Where a runtime is announced while it runs (the shared metrics registry)."""

    def attach(self, runtime: LorenzRuntime, *, workflow: str | None = None) -> Callable[[], None]:
        ...


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class WorkflowController:
    """The lifecycle of one Workflow in one operator process."""

    def __init__(
        self,
        *,
        body: Mapping[str, Any],
        api: KubeApi,
        settings: OperatorSettings,
        base_env: Mapping[str, str],
        post: Post = kopf_post,
        metrics: RuntimeAttacher | None = None,
    ) -> None:
        self._body: Mapping[str, Any] = body
        self.ref = workflow_ref(body)
        self._api = api
        self._settings = settings
        self._base_env = dict(base_env)
        self._metrics = metrics
        self._detach_metrics: Callable[[], None] | None = None
        self.workflow_dir: Path = settings.workflow_dir(self.ref.namespace, self.ref.name)
        self.lease = KubernetesLeaseProvider(
            api=api,
            workflow=self.ref,
            identity=settings.identity,
            timing=settings.lease_timing(),
        )
        self.events = EventPoster(
            reference={
                "apiVersion": resources.API_VERSION,
                "kind": resources.WORKFLOW_KIND,
                "metadata": {
                    "name": self.ref.name,
                    "namespace": self.ref.namespace,
                    "uid": self.ref.uid,
                },
            },
            per_minute=settings.events_per_minute,
            post=post,
        )
        self._stop = asyncio.Event()
        """Operator shutdown, or the Workflow is gone: leave."""
        self._deleting = asyncio.Event()
        """The Workflow has a deletionTimestamp (or vanished): clean up when leading."""
        self._changed = asyncio.Event()
        """A spec or refresh change was observed (wakes a leader waiting for a valid spec)."""
        self._status_dirty = asyncio.Event()
        self._refresh_value = self._annotation(body)

        self.runtime: LorenzRuntime | None = None
        self.store: ClaimResourceStore | None = None
        self._runtime_task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._candidate: LoadedWorkflow | BaseException | None = None
        self._candidate_stamp: WorkflowStamp | None = None
        self._candidate_generation = 0
        self._applied_generation: int | None = None
        self._degraded: tuple[str, str, int] | None = None
        self._snapshot: dict[str, Any] | None = None
        self._last_status: dict[str, Any] | None = None
        self._conditions: list[Condition] = []
        self._releasing = False
        self._background: set[asyncio.Task[Any]] = set()
        self.task: asyncio.Task[None] | None = None
        self.finished = False
        """The Workflow was deleted and this replica finished its cleanup."""
        self.terms = 0
        """How many times this process has led the Workflow."""

    # -- the supervisor's side -------------------------------------------------------------

    @property
    def uid(self) -> str | None:
        return self.ref.uid

    @property
    def leading(self) -> bool:
        return self.lease.holds_lease()

    def snapshot(self) -> dict[str, Any] | None:
        """The runtime's current snapshot, while this process leads the Workflow."""
        runtime = self.runtime
        return runtime.snapshot() if runtime is not None else None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self.run(), name=f"lorenz-workflow:{self.ref.display}"
        )

    def observe(self, body: Mapping[str, Any]) -> None:
        """The newest version of the Workflow object (from the watch)."""
        previous = self._body
        self._body = body
        ref = workflow_ref(body)
        if ref.uid is not None and self.ref.uid is None:
            self.ref = ref
            self.lease.update_workflow(ref)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            self._deleting.set()
            self._changed.set()
            return
        refresh = self._annotation(body)
        spec_changed = generation_of(body) != generation_of(previous)
        refreshed = refresh != self._refresh_value
        self._refresh_value = refresh
        if spec_changed or refreshed:
            self._changed.set()
            if self.runtime is not None:
                self._spawn(self._rebuild_candidate(refresh=refreshed))

    def gone(self) -> None:
        """The Workflow object no longer exists: clean up if leading, then leave."""
        self._deleting.set()
        self._stop.set()

    def claim_deleted(self, *, uid: str, slot_key: SlotKey) -> None:
        """A Claim of this Workflow was deleted; cancel its run if it was not our doing."""
        store, runtime = self.store, self.runtime
        if store is None or runtime is None or not self.lease.holds_lease():
            return
        if not store.claim_deleted(uid=uid, slot_key=slot_key):
            return
        logger.info(
            "Claim deleted, cancelling its run workflow=%s slot=%s", self.ref.display, slot_key
        )
        self.post("Normal", "ClaimDeleted", f"the Claim of {slot_key} was deleted; run cancelled")
        self._spawn(runtime.cancel_slot(slot_key, reason="claim_deleted"))

    async def shutdown(self) -> None:
        """Stop this controller (operator shutdown): release what it leads, then return."""
        self._stop.set()
        if self.task is not None:
            timeout = self._settings.drain_timeout_seconds + self._settings.renew_deadline_seconds
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout)

    def post(self, kind: EventKind, reason: str, message: str) -> None:
        self.events.post(kind, reason, message)

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.lease.set_endpoint(self._settings.advertise_url)
            while not self._stop.is_set() and not self.finished:
                if not await self.lease.wait_for_leadership(stop=self._stop):
                    if self._deleting.is_set() and self.lease.holds_lease():
                        await self._cleanup_deleted()
                    break
                self.terms += 1
                try:
                    await self._lead()
                except Exception:
                    logger.exception("Workflow controller failed workflow=%s", self.ref.display)
                    await self._abandon(reason="controller failure")
                    with contextlib.suppress(Exception):
                        await self.lease.release()
        finally:
            for task in list(self._background):
                task.cancel()

    async def _lead(self) -> None:
        lost = asyncio.Event()
        stop_renewing = asyncio.Event()
        renewer = self._spawn(self._renew(lost, stop_renewing))
        publisher = self._spawn(self._publish_loop())
        self._releasing = False
        record = self.lease.observed
        self.post(
            "Normal",
            "LeadershipAcquired",
            f"{self.lease.identity} leads this Workflow (Lease {self.lease.name}, "
            f"transitions {record.transitions if record else 0})",
        )
        self._dirty()

        async def halt_renewer() -> None:
            # NB: the renewer must be stopped before any release: a renewal racing the release
            # re-acquires the just-released Lease, and then nobody ever releases it again.
            stop_renewing.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer

        try:
            if self._deleting.is_set():
                await halt_renewer()
                await self._cleanup_deleted()
                return
            await self._ensure_finalizer()
            while True:
                if not await self._start_runtime(lost):
                    break
                assert self._runtime_task is not None
                await _first(
                    lost.wait(), self._deleting.wait(), self._stop.wait(), self._runtime_task
                )
                if lost.is_set() or self._deleting.is_set() or self._stop.is_set():
                    break
                logger.error("Runtime ended by itself; restarting workflow=%s", self.ref.display)
                await self._stop_runtime()
            if lost.is_set():
                await self._abandon(reason="the Lease was lost")
                self.post(
                    "Warning",
                    "LeadershipLost",
                    f"{self.lease.identity} lost the Lease (now held by "
                    f"{self.lease.holder or 'nobody'}); its runs were aborted",
                )
            elif self._deleting.is_set():
                await self._stop_runtime()
                await halt_renewer()
                await self._cleanup_deleted()
            else:
                await self._stop_runtime()
                await halt_renewer()
                await self._release()
        finally:
            stop_renewing.set()
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer

    async def _renew(self, lost: asyncio.Event, stop_renewing: asyncio.Event) -> None:
        await self.lease.renew_until_lost(stop=stop_renewing)
        if not stop_renewing.is_set():
            lost.set()

    # -- runtime ---------------------------------------------------------------------------

    async def _start_runtime(self, lost: asyncio.Event) -> bool:
        """Build, hydrate and start the runtime from the newest spec; ``False`` if we must
        leave first (lost, deleting, stopping)."""
        while True:
            if lost.is_set() or self._deleting.is_set() or self._stop.is_set():
                return False
            self._changed.clear()
            body = self._body
            generation = generation_of(body)
            try:
                loaded = await load_workflow_object(
                    body, api=self._api, workflow_dir=self.workflow_dir
                )
                validate_dispatch(loaded.settings)
            except KubeApiError as exc:
                logger.warning(
                    "Workflow spec not readable workflow=%s error=%s", self.ref.display, exc
                )
                await self._wait(lost, seconds=self._settings.retry_period_seconds)
                continue
            except LorenzError as exc:
                self._reject(exc, generation=generation)
                await self._wait(lost, self._changed)
                continue
            try:
                await self._launch(loaded, generation=generation)
            except KubeApiError as exc:
                logger.warning("Claims not readable workflow=%s error=%s", self.ref.display, exc)
                await self._wait(lost, seconds=self._settings.retry_period_seconds)
                continue
            return True

    async def _launch(self, loaded: LoadedWorkflow, *, generation: int) -> None:
        settings = loaded.settings
        store = ClaimResourceStore(
            api=self._api,
            workflow=self.ref,
            owner=self.lease.identity,
            holder=lambda: self.lease.holder,
            may_write=self.lease.holds_lease,
        )
        orchestrator = Orchestrator(settings=settings, store=store, clock=SystemClock())
        report = await orchestrator.hydrate()
        if report.interrupted or report.restored_retries:
            owners = ", ".join(sorted(report.taken_over_from)) or "nobody"
            self.post(
                "Normal",
                "ClaimsRecovered",
                f"{len(report.interrupted)} interrupted run(s) will retry, "
                f"{len(report.restored_retries)} pending retr(ies) restored (from {owners})",
            )
        logger.info(
            "Runtime starting workflow=%s interrupted=%d restored=%d foreign=%d",
            self.ref.display,
            len(report.interrupted),
            len(report.restored_retries),
            len(report.foreign),
        )
        base_dir = self.workflow_dir
        base_dir.mkdir(parents=True, exist_ok=True)
        tracker = build_tracker(settings, base_dir=base_dir, env={})
        workspaces = WorkspaceManager(
            settings=settings, secrets=TRACKER_SECRET_ENV, base_env=self._base_env
        )
        self._candidate = loaded
        self._candidate_stamp = loaded.stamp
        self._candidate_generation = generation
        self._applied_generation = generation
        self._degraded = None
        runtime = LorenzRuntime(
            workflow=loaded,
            orchestrator=orchestrator,
            tracker=tracker,
            workspaces=workspaces,
            runner_factory=build_runner,
            tracker_factory=lambda s: build_tracker(s, base_dir=base_dir, env={}),
            reload_workflow=self._reload,
            source_stamp=self._source_stamp,
            prove_leadership=self._prove_leadership,
            base_env=self._base_env,
        )
        runtime.add_event_listener(self._on_runtime_event)
        self.store = store
        self.runtime = runtime
        self._unsubscribe = runtime.subscribe(self._on_snapshot)
        if self._metrics is not None:
            self._detach_metrics = self._metrics.attach(runtime, workflow=self.ref.display)
        self._runtime_task = asyncio.get_running_loop().create_task(
            runtime.start(), name=f"lorenz-runtime:{self.ref.display}"
        )

    async def _stop_runtime(self) -> None:
        """Graceful: runs end as clean shutdowns (kept as continuation retries)."""
        runtime, task = self.runtime, self._runtime_task
        if runtime is None:
            return
        runtime.stop()
        if task is not None:
            try:
                await asyncio.wait_for(
                    asyncio.shield(task), timeout=self._settings.drain_timeout_seconds
                )
            except TimeoutError:
                logger.warning("Runs did not settle in time workflow=%s", self.ref.display)
            except Exception:
                logger.exception("Runtime failed workflow=%s", self.ref.display)
        await self._forget_runtime()

    async def _abandon(self, *, reason: str) -> None:
        """Lost leadership: abort local runs without recording anything, then stop."""
        runtime, task = self.runtime, self._runtime_task
        if runtime is None:
            return
        with contextlib.suppress(Exception):
            await runtime.abandon_runs(reason=reason)
        runtime.stop()
        if task is not None:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(
                    asyncio.shield(task), timeout=self._settings.drain_timeout_seconds
                )
        await self._forget_runtime()

    async def _forget_runtime(self) -> None:
        runtime = self.runtime
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._detach_metrics is not None:
            self._detach_metrics()
            self._detach_metrics = None
        self.runtime = None
        self.store = None
        self._runtime_task = None
        self._snapshot = None
        if runtime is not None:
            with contextlib.suppress(Exception):
                await runtime.tracker.close()

    async def _prove_leadership(self) -> None:
        if not self.lease.holds_lease():
            raise LeaseLost(
                lease=f"{self.ref.namespace}/{self.lease.name}",
                holder=self.lease.holder if self.lease.holder != self.lease.identity else None,
                since_renew_s=self.lease.since_renewal(),
            )

    # -- spec changes ----------------------------------------------------------------------

    async def _rebuild_candidate(self, *, refresh: bool) -> None:
        body = self._body
        generation = generation_of(body)
        outcome: LoadedWorkflow | BaseException
        for attempt in range(TRANSIENT_RETRIES + 1):
            try:
                outcome = await load_workflow_object(
                    body, api=self._api, workflow_dir=self.workflow_dir
                )
                break
            except KubeApiError as exc:
                outcome = exc
                if not _transient(exc) or attempt == TRANSIENT_RETRIES:
                    break
                await asyncio.sleep(self._settings.retry_period_seconds)
            except Exception as exc:
                outcome = exc
                break
        if generation < self._candidate_generation:
            return  # NB: a newer spec was built meanwhile; never go back to an older one
        if isinstance(outcome, LoadedWorkflow):
            self._candidate = outcome
            self._candidate_stamp = outcome.stamp
        else:
            self._candidate = outcome
            self._candidate_stamp = failed_stamp(body, outcome)
        self._candidate_generation = generation
        runtime = self.runtime
        if runtime is not None:
            runtime.request_refresh()

    def _source_stamp(self) -> WorkflowStamp:
        if self._candidate_stamp is None:
            raise RuntimeError("no candidate workflow yet")
        return self._candidate_stamp

    def _reload(self) -> LoadedWorkflow:
        candidate = self._candidate
        if isinstance(candidate, BaseException):
            raise candidate
        if candidate is None:
            raise RuntimeError("no candidate workflow yet")
        return candidate

    def _reject(self, exc: LorenzError, *, generation: int) -> None:
        self._degraded = (exc.code, str(exc), generation)
        logger.warning("Workflow spec rejected workflow=%s error=%s", self.ref.display, exc)
        self.post("Warning", "SpecRejected", str(exc))
        self._dirty()

    # -- runtime output --------------------------------------------------------------------

    def _on_runtime_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == EventType.WORKFLOW_RELOADED.value:
            self._degraded = None
            self._applied_generation = self._candidate_generation
            self._dirty()
        elif kind == EventType.WORKFLOW_RELOAD_FAILED.value:
            code = str(event.get("code") or "workflow_reload_failed")
            self._degraded = (code, str(event.get("message") or ""), self._candidate_generation)
            self._dirty()
        if kind != EventType.LEADERSHIP_LOST.value:
            self.events.runtime_event(event)

    def _on_snapshot(self, snapshot: dict[str, Any]) -> None:
        self._snapshot = snapshot
        self._dirty()

    # -- status ----------------------------------------------------------------------------

    def _dirty(self) -> None:
        self._status_dirty.set()

    async def _publish_loop(self) -> None:
        while True:
            await self._status_dirty.wait()
            # NB: one tick emits a burst of snapshots (start, end, next poll scheduled); letting
            # it settle first makes an idle tick cost one status patch, not three.
            await asyncio.sleep(STATUS_SETTLE_S)
            self._status_dirty.clear()
            try:
                await self.publish_status()
            except KubeApiError as exc:
                logger.warning("Status patch failed workflow=%s error=%s", self.ref.display, exc)
            await asyncio.sleep(self._settings.status_interval_seconds)

    def status_body(self) -> dict[str, Any]:
        """The status this leader would write now (conditions keep their transition times)."""
        now = _utc_now()
        previous = self._conditions or _conditions_of(self._body)
        generation = generation_of(self._body)
        applied = self._applied_generation
        snapshot = self._snapshot
        ready: tuple[ConditionStatus, str, str]
        if self._releasing:
            ready = ("False", "NoLeader", "the leader released the Lease; a follower takes over")
        elif self.runtime is None and self._degraded is not None:
            code, message, _ = self._degraded
            ready = ("False", reason_from_code(code), message)
        elif self.runtime is None or snapshot is None:
            ready = ("Unknown", "Starting", "the runtime is starting")
        else:
            poll = snapshot.get("poll") or {}
            if poll.get("last_error"):
                ready = ("False", "PollFailed", str(poll["last_error"]))
            elif not poll.get("last_poll_at"):
                ready = ("Unknown", "Starting", "waiting for the first poll")
            else:
                ready = (
                    "True",
                    "Polling",
                    f"last poll: {poll.get('candidates', 0)} candidates, "
                    f"{poll.get('eligible', 0)} eligible",
                )
        record = self.lease.observed
        leading: tuple[ConditionStatus, str, str]
        if self._releasing:
            leading = ("False", "LeaseReleased", f"{self.lease.identity} released the Lease")
        else:
            leading = (
                "True",
                "LeaseHeld",
                f"{self.lease.identity} holds Lease {self.lease.name}",
            )
        if self._degraded is not None:
            code, message, rejected = self._degraded
            kept = f" (running generation {applied})" if applied is not None else ""
            degraded: tuple[ConditionStatus, str, str] = (
                "True",
                reason_from_code(code),
                f"generation {rejected} rejected{kept}: {message}",
            )
            degraded_generation = rejected
        else:
            degraded = ("False", "SpecApplied", f"generation {applied} applied")
            degraded_generation = applied if applied is not None else generation
        conditions = [
            condition(
                READY, ready[0], reason=ready[1], message=ready[2],
                generation=applied if applied is not None else generation,
                now=now, previous=previous,
            ),
            condition(
                LEADING, leading[0], reason=leading[1], message=leading[2],
                generation=generation, now=now, previous=previous,
            ),
            condition(
                DEGRADED, degraded[0], reason=degraded[1], message=degraded[2],
                generation=degraded_generation, now=now, previous=previous,
            ),
        ]
        observed = max(applied or 0, self._candidate_generation, self._degraded_generation())
        status: dict[str, Any] = {
            "observedGeneration": observed or None,
            "conditions": [c.wire() for c in conditions],
            "leader": LeaderStatus(
                identity=None if self._releasing else self.lease.identity,
                acquired_at=None if self._releasing or record is None else record.acquired_at,
                transitions=record.transitions if record is not None else 0,
                endpoint=None if self._releasing else self._settings.advertise_url,
            ).wire(),
        }
        if snapshot is not None:
            status.update(status_from_snapshot(snapshot))
        return status

    def _degraded_generation(self) -> int:
        return self._degraded[2] if self._degraded is not None else 0

    async def publish_status(self, *, force: bool = False) -> bool:
        """Patch the status if it changed (and we still hold the Lease); ``True`` if patched."""
        if not self.lease.holds_lease():
            return False
        status = self.status_body()
        if not force and status == self._last_status:
            return False
        path = workflows_path(self.ref.namespace, self.ref.name, status=True)
        try:
            await self._api.merge_patch(path, {"status": status})
        except KubeApiError as exc:
            if exc.not_found:
                return False
            raise
        self._last_status = status
        self._conditions = [Condition.model_validate(c) for c in status["conditions"]]
        return True

    # -- cluster objects -------------------------------------------------------------------

    async def _release(self) -> None:
        self._releasing = True
        with contextlib.suppress(KubeApiError):
            await self.publish_status(force=True)
        await self.lease.release()
        logger.info(
            "Workflow released workflow=%s identity=%s", self.ref.display, self.lease.identity
        )

    async def _cleanup_deleted(self) -> None:
        """The Workflow is being deleted: delete its Claims, release the Lease, unblock it."""
        items = await self._api.list_items(
            claims_path(self.ref.namespace),
            label_selector=resources.workflow_selector(self.ref.name),
        )
        deleted = 0
        for item in items:
            metadata = item.get("metadata") or {}
            owners = {o.get("uid") for o in metadata.get("ownerReferences") or ()}
            if (item.get("spec") or {}).get("workflow") != self.ref.name:
                continue
            if owners and self.ref.uid not in owners:
                continue  # a Claim of a re-created Workflow of the same name
            with contextlib.suppress(KubeApiError):
                await self._api.delete(
                    claims_path(self.ref.namespace, str(metadata["name"])), uid=metadata.get("uid")
                )
                deleted += 1
        await self.lease.release()
        await self._edit_finalizer(add=False)
        self.finished = True
        self._stop.set()
        logger.info(
            "Workflow cleaned up workflow=%s claims_deleted=%d", self.ref.display, deleted
        )

    async def _ensure_finalizer(self) -> None:
        await self._edit_finalizer(add=True)

    async def _edit_finalizer(self, *, add: bool) -> None:
        path = workflows_path(self.ref.namespace, self.ref.name)
        for _ in range(MAX_PATCH_RETRIES):
            try:
                current = await self._api.get(path)
            except KubeApiError as exc:
                if exc.not_found:
                    return
                raise
            metadata = current.get("metadata") or {}
            if self.ref.uid is not None and metadata.get("uid") != self.ref.uid:
                return
            finalizers = list(metadata.get("finalizers") or [])
            present = resources.CLEANUP_FINALIZER in finalizers
            if present == add:
                return
            ops: list[dict[str, Any]] = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": metadata["resourceVersion"],
                }
            ]
            finalizer = resources.CLEANUP_FINALIZER
            if add and not finalizers:
                ops.append({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
            elif add:
                ops.append({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
            else:
                index = finalizers.index(resources.CLEANUP_FINALIZER)
                ops.append({"op": "remove", "path": f"/metadata/finalizers/{index}"})
            try:
                await self._api.json_patch(path, ops)
                return
            except KubeApiError as exc:
                if exc.not_found:
                    return
                if not exc.conflict:
                    raise
        logger.warning("Finalizer edit kept conflicting workflow=%s", self.ref.display)

    # -- helpers ---------------------------------------------------------------------------

    def _annotation(self, body: Mapping[str, Any]) -> str | None:
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(resources.REFRESH_ANNOTATION)
        return str(value) if value is not None else None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _wait(
        self, lost: asyncio.Event, *events: asyncio.Event, seconds: float | None = None
    ) -> None:
        waits = [lost.wait(), self._deleting.wait(), self._stop.wait(), *(e.wait() for e in events)]
        await _first(*waits, seconds=seconds)


def _transient(exc: KubeApiError) -> bool:
    return exc.status == 0 or exc.status == 429 or exc.status >= 500


def _conditions_of(body: Mapping[str, Any]) -> list[Condition]:
    found = []
    for raw in (body.get("status") or {}).get("conditions") or ():
        with contextlib.suppress(ValueError):
            found.append(Condition.model_validate(raw))
    return found


async def _first(*awaitables: Awaitable[Any], seconds: float | None = None) -> None:
    """Wait until the first of ``awaitables`` completes (or ``seconds``); cancel the rest.

    NB: tasks passed in (the runtime's) are only watched, never cancelled.
    """
    tasks: list[asyncio.Future[Any]] = []
    owned: list[asyncio.Future[Any]] = []
    for item in awaitables:
        if isinstance(item, asyncio.Future):
            tasks.append(item)
        else:
            future = asyncio.ensure_future(item)
            tasks.append(future)
            owned.append(future)
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in owned:
            task.cancel()
        for task in owned:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
