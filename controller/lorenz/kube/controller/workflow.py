"""One controller per Workflow: run its runtime while this replica holds the Workflow's shard.

Every Workflow belongs to one shard (:mod:`lorenz.kube.leaderelection.sharding`) and exactly one
replica holds that shard's Lease. A replica watches every Workflow but makes a
:class:`WorkflowController` only for those whose shard it holds (the supervisor,
:mod:`lorenz.kube.operator.process`, keeps just the newest object of the others, and makes their
controllers the moment their shard comes); the controller lets go — its loop ends — once the
shard is no longer offered here. The controller of the holder:

1. adds the ``lorenz.dev/cleanup`` finalizer (so a deletion waits for its cleanup);
2. builds the runtime from the latest spec (a spec that does not load sets ``Degraded`` and
   waits for the next change), hydrates the orchestrator from the Workflow's Claims — the runs
   of a previous leader become failure retries, its pending retries come back — and starts it;
3. keeps the Workflow's status in step with the runtime: told of each change, it builds the
   runtime's snapshot only when it computes the status (at most one patch per
   ``status_interval_seconds``, and only when something changed);
4. turns spec updates into the runtime's transactional reload (a spec that fails keeps the
   last known good workflow and sets ``Degraded`` with the error's code), the
   ``lorenz.dev/refresh`` annotation into an immediate poll, a deleted Claim into a cancelled
   run, and the interesting runtime events into Kubernetes Events.

It stops in one of four ways, each in its own order:

* **Shard lost** (a renewal saw another holder, or none succeeded within the renew
  deadline), or **fenced** (a Claim showed a newer leader generation): the claim store is
  already fenced, so nothing is written; local runs are aborted without recording anything
  (their Claims are the new leader's to recover) — runs in detached workers (every run, but
  for the suite's in-process switch) and in Pods of their own are left running for the new
  leader to adopt; the runtime stops.
* **Shard handed over** (another replica is below its fair share): the runtime stops and
  drains (runs not started yet end as clean shutdowns, kept as continuation retries in their
  Claims; a run under way is left to its detached worker (or its Pod) instead, its Claim
  still running with its spawn intent, for the new leader to adopt), a last status says
  nobody leads, the Workflow lets go of the shard — which is released once all its
  Workflows have — and campaigns again.
* **Workflow deleted**: the runtime stops and drains (its runs cancelled, their Pods
  deleted); the run Pods nobody followed, its Claims and workspaces are deleted; the
  finalizer is removed.
* **Operator shutdown**: as a handover, then the process's shards are released so the other
  replicas take over at once.

Handlers are level-based: :meth:`observe` only records the newest object and wakes the loop;
what to do is always decided from the current state, never from which event arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from lorenz.agents import AgentRunError, AgentRunner, RunPlacement
from lorenz.assembly import assemble_runtime, runs_in_workers, tracker_factory
from lorenz.config import WorkerKind, WorkflowSettings
from lorenz.kube.api import resources
from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.api.statuses import Condition
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi, claims_path, workflows_path
from lorenz.kube.controller.candidates import SpecCandidates
from lorenz.kube.controller.cleanup import delete_claims, edit_finalizer, remove_workspaces
from lorenz.kube.controller.posting import EventKind, EventPoster, Post, kopf_post
from lorenz.kube.controller.specs import (
    generation_of,
    load_workflow_object,
    workflow_ref,
    write_workflow_file,
)
from lorenz.kube.controller.status import (
    STARTING_REASON,
    Degradation,
    StatusInputs,
    only_bookkeeping_changed,
    ready_condition,
    workflow_status,
)
from lorenz.kube.errors import KubeApiError, LeaseLost, OperatorError
from lorenz.kube.leaderelection.leading import Term, WorkflowLeadership
from lorenz.kube.leaderelection.sharding import ShardCoordinator
from lorenz.kube.pods.execs import PodExec
from lorenz.kube.pods.transport import (
    AgentAccounts,
    PodTransport,
    PodWorkerRunner,
    delete_issue_workspaces,
    delete_workflow_runs,
    operator_service_account,
    sweep_run_pods,
    workspace_claims_by_issue,
)
from lorenz.kube.settings import OperatorSettings
from lorenz.model import (
    ClaimRecord,
    EventType,
    LorenzError,
    RuntimeEvent,
    SlotKey,
    SystemClock,
)
from lorenz.model.slots import slot_key
from lorenz.orchestrator import Orchestrator
from lorenz.runtime import LorenzRuntime
from lorenz.secrets import tracker_secrets
from lorenz.tasks import BackgroundTasks, first_of
from lorenz.workers.states import STATE_ROOT_ENV
from lorenz.workflow import LoadedWorkflow, validate_dispatch

logger = logging.getLogger("lorenz.kube.controllers")

T = TypeVar("T")

STATUS_SETTLE_S = 0.05
"""How long a burst of snapshots may settle before the status is computed and patched."""

HOLD_ATTEMPTS = 5
"""Tries of the hold annotation's patch (a continuation limit) before the slot is let go."""


class HoldingClaimStore(ClaimResourceStore):
    """The term's claim store, which also refuses the slots this replica is holding itself.

    NB: the continuation limit holds a slot with an annotation on its Claim, and the watch
    that sees it stops the slot; under load that round trip took longer than the next
    continuation retry, so runs slipped through (and each reset the count). A slot in
    ``holding`` is refused at once, as a held Claim would be, until the watch has seen the
    annotation (then the Claim itself refuses it) or the patch gave up.
    """

    def __init__(self, *, holding: set[SlotKey], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._holding = holding

    async def acquire(self, record: ClaimRecord) -> bool:
        if record.slot_key in self._holding:
            return False
        return await super().acquire(record)



class Flag(asyncio.Event):
    """An :class:`asyncio.Event` without the waiter deque it allocates up front.

    NB: a replica has a controller for every Workflow it leads, each with five events that
    are nearly always waited on by nobody or one or two tasks; the deque (a 64-slot block) was
    ~0.6 KiB each, 3 KiB per Workflow. A list does the same job here.
    """

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[asyncio.Future[Any]] = []  # type: ignore[assignment]


class RuntimeAttacher(Protocol):
    """Where a runtime is announced while it runs (the shared metrics registry)."""

    def attach(self, runtime: LorenzRuntime, *, workflow: str | None = None) -> Callable[[], None]:
        ...


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(slots=True)
class Departure:
    """Whether one runtime's stopped runs leave their detached workers running.

    NB: per runtime, not per process (``leave_workers_running`` is the process-wide form the
    daemon uses): a replica leads many Workflows, and the one it hands over or loses must not
    make the others' cancelled runs leave their workers behind.
    """

    reason: str | None = None
    """Why the runs are left to their workers (``None``: cancelling a run cancels its worker)."""


def runs_in_pods(settings: WorkflowSettings) -> bool:
    """Whether the runs of ``settings`` go to Pods of their own (``worker.kind: pod``): they
    outlive the runtime wherever the replica runs."""
    return settings.worker.kind is WorkerKind.POD


class WorkflowController:
    """The lifecycle of one Workflow in one operator process, while its shard is offered here."""

    def __init__(
        self,
        *,
        body_text: str,
        api: KubeApi,
        settings: OperatorSettings,
        coordinator: ShardCoordinator,
        base_env: Mapping[str, str],
        post: Post = kopf_post,
        metrics: RuntimeAttacher | None = None,
        log_secrets: Callable[[Iterable[str]], None] | None = None,
        claim_lister: ClaimLister | None = None,
        agent_accounts: AgentAccounts | None = None,
    ) -> None:
        self._body_text = body_text
        """The newest watched object as compact JSON (see :attr:`_body`)."""
        body = self._body
        self._generation = generation_of(body)
        self._claim_lister = claim_lister
        """The replica's shared Claim lists (see :mod:`lorenz.kube.claims.lists`)."""
        self.ref = workflow_ref(body)
        self._api = api
        self._settings = settings
        self._base_env = dict(base_env)
        self._metrics = metrics
        self._log_secrets = log_secrets
        """Adds this Workflow's tracker token to the process log's redactor."""
        self._detach_metrics: Callable[[], None] | None = None
        self.workflow_dir: Path = settings.workflow_dir(self.ref.namespace, self.ref.name)
        self.lease = WorkflowLeadership(coordinator=coordinator, workflow=self.ref)
        self._term: Term | None = None
        """The current term while leading (its fence guards every write of the runtime)."""
        self.candidates = SpecCandidates(
            api=api, workflow_dir=self.workflow_dir, retry_period_s=settings.retry_period_seconds
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
        self._stop = Flag()
        """Operator shutdown, or the Workflow is gone: leave."""
        self._deleting = Flag()
        """The Workflow has a deletionTimestamp (or vanished): clean up when leading."""
        self._changed = Flag()
        """A spec or refresh change was observed (wakes a leader waiting for a valid spec)."""
        self._status_dirty = Flag()
        self._refresh_value = self._annotation(body)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            self._deleting.set()  # NB: first seen already being deleted (operator restart)
            self.events.silence()

        self.runtime: LorenzRuntime | None = None
        self.store: ClaimResourceStore | None = None
        self._departure: Departure | None = None
        """Set while the runtime runs its agents in detached workers (always, but for the
        suite's in-process switch)."""
        self._fenced = Flag()
        """The term's claim store saw a newer leader generation: stop as if the Lease was
        lost."""
        self._execs: PodExec | None = None
        """The exec channels of runs in Pods (made at the first such run)."""
        self._agent_accounts = agent_accounts
        """The ``lorenz-agent`` ServiceAccounts made sure of (the process's, shared; made at
        the first run in a Pod when none is given)."""
        self._runtime_task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._applied_generation: int | None = None
        self._degraded: Degradation | None = None
        self._continuations: dict[SlotKey, int] = {}
        """Continuation retries in a row per slot (see ``max_continuation_runs``)."""
        self._holding: set[SlotKey] = set()
        """Slots held by the continuation limit whose hold the watch has not shown yet (see
        :class:`HoldingClaimStore`)."""
        self._start_failures = 0
        """Failed starts in a row (the backoff doubles with each; a good poll resets it)."""
        self._term_object: Mapping[str, Any] | None = None
        """The Workflow as read after the current term began (see :meth:`_lead`), for the
        term's first claim store; taken once."""
        self._last_status: dict[str, Any] | None = None
        self._last_write_at = 0.0
        self._deferred: asyncio.TimerHandle | None = None
        """A status write postponed by the idle rate limit."""
        self._releasing = False
        self._background = BackgroundTasks(name=f"workflow {self.ref.display}", log=logger)
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
    def _body(self) -> dict[str, Any]:
        """The newest watched object (a fresh copy, decoded on each use).

        NB: every replica keeps the newest object of every Workflow it watches, and a
        follower only needs it the moment it leads. As decoded JSON it was ~15 KiB of small
        Python objects per Workflow per replica (its strings, dicts and lists); as one string
        it is the size of its JSON. It is read once per start, spec change and deletion.
        """
        body: dict[str, Any] = json.loads(self._body_text)
        return body

    @property
    def leading(self) -> bool:
        return self.lease.holds_lease()

    def start(self, *, context: contextvars.Context | None = None) -> None:
        """Run :meth:`run` as a task (in ``context``: kopf's, where its Events are posted)."""
        self.task = asyncio.get_running_loop().create_task(
            self.run(), name=f"lorenz-workflow:{self.ref.display}", context=context
        )

    def observe(self, body: Mapping[str, Any], *, text: str | None = None) -> None:
        """The newest version of the Workflow object (from the watch; ``text``: its compact
        JSON, if already made)."""
        previous_generation = self._generation
        self._body_text = text if text is not None else _compact(body)
        self._generation = generation_of(body)
        ref = workflow_ref(body)
        if ref.uid is not None and self.ref.uid is None:
            self.ref = ref
            self.lease.update_workflow(ref)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            self._deleting.set()
            self.events.silence()
            self._changed.set()
            return
        refresh = self._annotation(body)
        spec_changed = self._generation != previous_generation
        refreshed = refresh != self._refresh_value
        self._refresh_value = refresh
        if spec_changed or refreshed:
            self._changed.set()
            if self.runtime is not None:
                self._spawn(self._rebuild_candidate(refresh=refreshed))

    def gone(self) -> None:
        """The Workflow object no longer exists: clean up if leading, then leave."""
        self._deleting.set()
        self.events.silence()
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

    def claim_held(self, *, uid: str, slot_key: SlotKey, name: str, note: str) -> None:
        """A Claim of this Workflow got the hold annotation: stop its run, keep the Claim."""
        self._holding.discard(slot_key)  # NB: from now on the Claim's annotation refuses it
        store, runtime = self.store, self.runtime
        if store is None or runtime is None or not self.lease.holds_lease():
            return
        if not store.claim_held(uid=uid, slot_key=slot_key):
            return
        logger.info("Claim held, stopping its run workflow=%s slot=%s", self.ref.display, slot_key)
        self.post(
            "Normal",
            "IssueHeld",
            f"{slot_key} is held (Claim {name}, {resources.HOLD_ANNOTATION}={note!r}): its run "
            f"was stopped and it is not dispatched until the annotation is removed",
        )
        self._spawn(runtime.cancel_slot(slot_key, reason="held"))

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
        """Lead the Workflow while its shard is offered here; return once it is not (the
        supervisor keeps only the newest object until the shard comes back), the Workflow is
        cleaned up, or the operator stops."""
        try:
            while not self._stop.is_set() and not self.finished:
                if not await self.lease.win(stop=self._stop):
                    break
                self.terms += 1
                try:
                    await self._lead()
                except Exception:
                    logger.exception("Workflow controller failed workflow=%s", self.ref.display)
                    await self._abandon(reason="controller failure")
                    # NB: already failing: letting go of the term cannot fail in a way that
                    # matters (the shard's release is bounded anyway).
                    with contextlib.suppress(Exception):
                        await self.lease.release()
                    # NB: a controller that keeps failing must not spin on a held shard.
                    await self._wait(asyncio.Event(), seconds=self._settings.start_backoff_seconds)
        finally:
            for task in list(self._background):
                task.cancel()

    async def _lead(self) -> None:
        term = self._term = self.lease.begin_term()
        self._fenced = Flag()
        publisher = self._spawn(self._publish_loop())
        self._releasing = False
        record = self.lease.observed
        self.post(
            "Normal",
            "LeadershipAcquired",
            f"{self.lease.identity} leads this Workflow (shard Lease {self.lease.display}, "
            f"generation {record.transitions if record else 0})",
        )
        try:
            if self._deleting.is_set():
                await self._cleanup_deleted()
                return
            # NB: computed from the watched object, before this term's first status patch
            # (which would move the resourceVersion that adding the first finalizer tests).
            # The object the API answers with is read after the term began: the first claim
            # store of the term takes the checkpoint from it instead of reading the Workflow.
            answers: list[Mapping[str, Any]] = []
            await edit_finalizer(
                api=self._api, workflow=self.ref, add=True, seen=self._body,
                on_answer=answers.append,
            )
            self._term_object = answers[-1] if answers else None
            # NB: this frame lives as long as the term: the whole answered object (its
            # managedFields, its status) must not.
            del answers
            self._dirty()
            while True:
                if not await self._start_runtime(term):
                    break
                assert self._runtime_task is not None
                # NB: the runtime's task is only watched (shielded), never cancelled here.
                await first_of(
                    term.lost.wait(), term.yielding.wait(), self._deleting.wait(),
                    self._stop.wait(), self._fenced.wait(), asyncio.shield(self._runtime_task),
                )
                if (term.lost.is_set() or term.yielding.is_set() or self._deleting.is_set()
                        or self._stop.is_set() or self._fenced.is_set()):
                    break
                ended = self._runtime_task
                failure = ended.exception() if ended.done() and not ended.cancelled() else None
                await self._stop_runtime()
                await self._back_off(
                    term.lost,
                    self._start_failed(
                        failure or RuntimeError("the runtime stopped by itself"),
                        generation=self._applied_generation or self._generation,
                    ),
                )
            if term.lost.is_set() or self._fenced.is_set():
                fenced = not term.lost.is_set()
                left = self._departure is not None
                await self._abandon(
                    reason="a newer leader generation wrote its Claims" if fenced
                    else "the Lease was lost"
                )
                holder = self.lease.holder
                self.post(
                    "Warning",
                    "LeadershipLost",
                    f"{self.lease.identity} lost the shard Lease {self.lease.display} "
                    + ("(a newer leader generation wrote its Claims)" if fenced
                       else f"to {holder}" if holder and holder != self.lease.identity
                       else "(no renewal succeeded within the renew deadline)")
                    + ("; its runs were left to their workers for the new leader to adopt"
                       if left else "; its runs were aborted and the new leader retries them"),
                )
                if fenced:
                    # NB: the Lease view catches up within the renew deadline; until then this
                    # replica must not lead again at once (it would be fenced again).
                    await self._wait(term.lost, seconds=self._settings.start_backoff_seconds)
            elif self._deleting.is_set():
                await self._stop_runtime()
                await self._cleanup_deleted()
            else:
                # NB: the last status is written while the term still holds; letting go of
                # the term comes last, since it may release the shard at once.
                await self._stop_runtime(hand_over=True)
                await self._release()
        finally:
            self._term_object = None
            publisher.cancel()
            if self._deferred is not None:
                self._deferred.cancel()
                self._deferred = None
            await term.halt()
            self._term = None

    # -- runtime ---------------------------------------------------------------------------

    async def _start_runtime(self, term: Term) -> bool:
        """Build, hydrate and start the runtime from the newest spec; ``False`` if we must
        leave first (lost, deleting, stopping)."""
        lost = term.lost
        while True:
            if lost.is_set() or self._deleting.is_set() or self._stop.is_set():
                return False
            self._changed.clear()
            body = self._body
            generation = generation_of(body)
            # NB: a few builds at a time per replica (see START_CONCURRENCY); the waits after
            # a failure happen outside the gate.
            async with self.lease.start_gate:
                if (lost.is_set() or term.yielding.is_set() or self._deleting.is_set()
                        or self._stop.is_set()):
                    return False
                kind, failure = await self._build(body, generation=generation, term=term)
            if failure is None:
                return True
            if kind == "rejected":
                assert isinstance(failure, LorenzError)
                self._reject(failure, generation=generation)
                await self._wait(lost, self._changed)
            else:
                await self._back_off(lost, self._start_failed(failure, generation=generation))

    async def _build(
        self, body: Mapping[str, Any], *, generation: int, term: Term
    ) -> tuple[str, BaseException | None]:
        """Load the spec and launch the runtime: ``("started", None)``, ``("rejected", error)``
        (the spec is wrong: wait for a new one) or ``("failed", error)`` (back off, retry)."""
        try:
            loaded = await load_workflow_object(body, api=self._api, workflow_dir=self.workflow_dir)
            validate_dispatch(loaded.settings)
        except KubeApiError as exc:
            return "failed", exc
        except LorenzError as exc:
            return "rejected", exc
        try:
            await self._launch(loaded, generation=generation, term=term)
        except Exception as exc:  # noqa: BLE001 - any failed start backs off, never a hot loop
            return "failed", exc
        return "started", None

    def _start_failed(self, exc: BaseException, *, generation: int) -> float:
        """Record a failed start (Degraded, an Event, the log); the wait before the next."""
        self._start_failures += 1
        delay: float = min(
            self._settings.start_backoff_seconds * 2.0 ** (self._start_failures - 1),
            self._settings.start_backoff_max_seconds,
        )
        code = str(getattr(exc, "code", None) or "start_failed")
        message = str(getattr(exc, "message", None) or exc) or type(exc).__name__
        self._degraded = Degradation(
            code=code, message=message, generation=generation, stage="failed to start"
        )
        logger.warning(
            "Runtime failed to start workflow=%s code=%s error=%s retry_in=%.0fs failures=%d",
            self.ref.display, code, message, delay, self._start_failures,
        )
        self.post(
            "Warning",
            "StartFailed",
            f"{code}: {message} (attempt {self._start_failures}; next in {delay:.0f} s)",
        )
        self._dirty()
        return delay

    async def _back_off(self, lost: asyncio.Event, delay: float) -> None:
        """Wait ``delay`` before the next start, or less when the spec changes meanwhile."""
        self._changed.clear()
        await self._wait(lost, self._changed, seconds=delay)
        if self._changed.is_set():
            self._start_failures = 0  # a new spec deserves a prompt first try

    async def _launch(self, loaded: LoadedWorkflow, *, generation: int, term: Term) -> None:
        settings = loaded.settings
        base_dir = self.workflow_dir
        try:
            base_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OperatorError(
                f"the Workflow's folder {base_dir} cannot be created ({exc.strerror or exc}): "
                "check the operator's workspace volume",
                code="workflow_dir_unusable",
            ) from exc
        self._holding.clear()  # NB: a new term judges the Claims as they are
        store = HoldingClaimStore(
            holding=self._holding,
            api=self._api,
            workflow=self.ref,
            owner=self.lease.identity,
            holder=lambda: self.lease.holder,
            may_write=term.holds_lease,
            generation=term.generation,
            on_fenced=self._on_fenced,
            workflow_object=self._term_object,
            lister=self._claim_lister,
        )
        self._term_object = None
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
        self._remember_secrets(settings)
        self.candidates.adopt(loaded, generation=generation)
        await asyncio.to_thread(write_workflow_file, loaded)
        self._applied_generation = generation
        self._degraded = None
        # NB: runs execute in detached workers (worker.detached: false is refused when the
        # spec loads); only the suite's test-only switch keeps them in this process.
        workers = runs_in_workers(os.environ)
        # NB: runs are left to their workers for the next leader only where it can adopt them:
        # with a state root the replicas share (named by LORENZ_WORKER_STATE). The default one
        # is private to this replica (its Pod): a worker left there would go on beside the new
        # leader's retry of its issue, so a replica that lets go cancels its workers instead.
        # Runs in Pods of their own always outlive this replica: the next leader adopts them.
        departure = (
            Departure()
            if (workers and STATE_ROOT_ENV in os.environ) or runs_in_pods(settings)
            else None
        )
        runtime = assemble_runtime(
            workflow=loaded,
            orchestrator=orchestrator,
            base_env=self._base_env,
            trackers=tracker_factory(base_dir=base_dir, env={}),
            reload_workflow=self.candidates.reload,
            source_stamp=self.candidates.source_stamp,
            prove_leadership=self._prove_leadership,
            # Detached runs record their spawn intents on the Claims, under this term's
            # generation, and a worker process gets the agents' allow-listed environment.
            claim_store=store,
            generation=lambda: store.generation,
            worker_env=self._base_env,
            leave_workers=(lambda: departure.reason) if departure is not None else None,
            pods=functools.partial(
                self._pod_runner, workflow=str(loaded.path), store=store, departure=departure
            ),
            workers=workers,
        )
        self._departure = departure
        # NB: Kubernetes Events and the continuation count read the event's wire form.
        runtime.add_event_listener(self._on_runtime_event)
        self.store = store
        self.runtime = runtime
        # NB: told of changes, not handed a snapshot per change: a chatty agent changes its
        # run's progress many times a second, and the status is published at most once per
        # status interval; the snapshot is built when the status is (:meth:`status_inputs`).
        self._unsubscribe = runtime.on_change(self._on_runtime_change)
        self._dirty()
        if self._metrics is not None:
            self._detach_metrics = self._metrics.attach(runtime, workflow=self.ref.display)
        self._runtime_task = asyncio.get_running_loop().create_task(
            runtime.start(), name=f"lorenz-runtime:{self.ref.display}"
        )
        self._spawn(self._sweep_orphans(store, term=term))
        self._spawn(self._sweep_terminal_workspaces(runtime, store, term=term))

    async def _sweep_orphans(self, store: ClaimResourceStore, *, term: Term) -> None:
        """Delete the run Pods of this Workflow that no Claim names (see
        :func:`~lorenz.kube.pods.transport.sweep_run_pods`): a Pod the previous leader started whose
        Claim is gone, or whose Claim names a newer run; never one a Claim's intent names."""

        try:
            await sweep_orphans_of_term(
                api=self._api,
                workflow=self.ref,
                store=store,
                # NB: the store forgets its Claims when the term ends: from then on it names
                # nothing, and every Pod is the next leader's to judge.
                may_delete=lambda: term.holds_lease() and self.store is store,
                lists=self._claim_lister,
            )
        except KubeApiError as exc:
            logger.warning("Orphan sweep failed workflow=%s error=%s", self.ref.display, exc)

    async def _sweep_terminal_workspaces(
        self, runtime: LorenzRuntime, store: ClaimResourceStore, *, term: Term
    ) -> None:
        """Delete the workspace claims (PVCs) of issues that turned terminal while no replica
        tracked them (given up, then closed; or closed while the operator was away): the Pod
        runs' counterpart of the start-up workspace cleanup. Once per term; an issue this term
        holds a Claim for or tracks is left to reconciliation."""
        try:
            by_issue = await workspace_claims_by_issue(
                self._api, workflow=self.ref, lists=self._claim_lister
            )
            held = {h.record.issue_id for h in store.held.values()}
            ids = sorted(set(by_issue) - held - runtime.orchestrator.tracked_issue_ids())
            if not ids:
                return
            issues = await runtime.tracker.fetch_issues_by_ids(ids)
            terminal = {state.strip().lower() for state in runtime.settings.tracker.terminal_states}
            for issue in issues:
                if issue.state_key not in terminal:
                    continue
                if not (term.holds_lease() and self.store is store):
                    return  # NB: the term ended: the next leader sweeps again
                deleted = await delete_issue_workspaces(
                    self._api, workflow=self.ref, issue_id=issue.id
                )
                if deleted:
                    logger.info(
                        "Workspace claims of a terminal issue deleted workflow=%s issue=%s "
                        "claims=%s",
                        self.ref.display, issue.identifier, ",".join(deleted),
                    )
        except Exception as exc:  # noqa: BLE001 - reported; the next term sweeps again
            logger.warning(
                "Terminal workspace sweep failed workflow=%s error=%s", self.ref.display, exc
            )

    def _pod_runner(
        self,
        placement: RunPlacement,
        *,
        workflow: str,
        store: ClaimResourceStore,
        departure: Departure | None,
    ) -> AgentRunner:
        """The runner of one run in a Pod of its own (``worker.kind: pod``): its spawn intent
        and phases go on the Claim under this term's generation (the handle, and so the Pod's
        name, carries it), and a replica that leaves leaves the Pod to the next leader."""
        worker = placement.worker
        image = worker.pod_template.image or self._settings.worker_image
        if image is None:
            raise AgentRunError(
                "worker.kind: pod needs an image: set worker.podTemplate.image, or the "
                "operator's worker_image (the chart sets it to the operator's own image)",
                code="worker_image_missing",
            )
        if self._execs is None:
            self._execs = PodExec(self._api.configuration)
        if self._agent_accounts is None:
            self._agent_accounts = AgentAccounts()
        transport = PodTransport(
            api=self._api,
            execs=self._execs,
            workflow=self.ref,
            worker=worker,
            image=image,
            accounts=self._agent_accounts,
            operator_account=_operator_account(),
        )
        return PodWorkerRunner(
            workflow=workflow,
            transport=transport,
            placement=placement,
            generation=store.generation or 0,
            intents=store,
            leaving=(lambda: departure.reason) if departure is not None else None,
        )

    async def _stop_runtime(self, *, hand_over: bool = False) -> None:
        """Graceful: runs end as clean shutdowns (kept as continuation retries).

        ``hand_over`` (a handover, an operator shutdown): runs whose agents are under way in
        detached workers are left running instead, their Claims still ``Running`` with their
        spawn intents, so the next leader adopts them (#13: a replica that hands a Workflow
        over leaves its workers to the new leader). In-process runs cannot outlive the runtime
        and end as clean shutdowns either way.
        """
        runtime, task, store = self.runtime, self._runtime_task, self.store
        if runtime is None:
            return
        departure = self._departure
        if hand_over and departure is not None:
            departure.reason = "handed_over"
            runtime.stop(hand_over=True)
        else:
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
        if hand_over and departure is not None and store is not None:
            # The successor re-attaches after the newest seq collected here.
            with contextlib.suppress(Exception):
                await store.flush_intents()
        await self._forget_runtime()

    async def _abandon(self, *, reason: str) -> None:
        """Lost leadership: abort local runs without recording anything, then stop.

        NB: runs in detached workers are left running (never killed because this replica may
        no longer write): their Claims keep the spawn intents the new leader adopts from.
        """
        runtime, task = self.runtime, self._runtime_task
        if runtime is None:
            return
        if self._departure is not None:
            self._departure.reason = "leadership_lost"
            # Before the aborts below: a run under way is handed over (nothing recorded, no
            # after_run here: the adopting leader runs it when the run ends).
            runtime.stop(hand_over=True)
        # NB: best effort: the next holder fences the Claims anyway.
        with contextlib.suppress(Exception):
            await runtime.abandon_runs(reason=reason)
        runtime.stop()
        if task is not None:
            # NB: a runtime that does not stop in time is abandoned; it logged why.
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(
                    asyncio.shield(task), timeout=self._settings.drain_timeout_seconds
                )
        await self._forget_runtime()
        logger.info("Runtime abandoned workflow=%s reason=%s", self.ref.display, reason)

    async def _forget_runtime(self) -> None:
        runtime, store = self.runtime, self.store
        if store is not None:
            await store.close()  # NB: drops intent writes still waiting for their slot
        self._departure = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._detach_metrics is not None:
            self._detach_metrics()
            self._detach_metrics = None
        self.runtime = None
        self.store = None
        self._runtime_task = None
        if runtime is not None:
            # NB: closing the tracker's connections is best effort.
            with contextlib.suppress(Exception):
                await runtime.tracker.close()

    def _on_fenced(self, error: LorenzError) -> None:
        """The claim store refused a write: a newer leader generation wrote a Claim of ours."""
        logger.warning("Claims fenced workflow=%s error=%s", self.ref.display, error)
        self._fenced.set()

    async def _prove_leadership(self) -> None:
        term = self._term
        if term is None or not term.holds_lease():
            raise LeaseLost(
                lease=self.lease.display,
                holder=self.lease.holder if self.lease.holder != self.lease.identity else None,
                since_renew_s=self.lease.since_renewal(),
            )

    # -- spec changes ----------------------------------------------------------------------

    async def _rebuild_candidate(self, *, refresh: bool) -> None:
        if not await self.candidates.rebuild(self._body):
            return  # NB: a newer spec was built meanwhile; never go back to an older one
        runtime = self.runtime
        if runtime is not None:
            runtime.request_refresh()

    def _reject(self, exc: LorenzError, *, generation: int) -> None:
        self._degraded = Degradation(code=exc.code, message=str(exc), generation=generation)
        logger.warning("Workflow spec rejected workflow=%s error=%s", self.ref.display, exc)
        self.post("Warning", "SpecRejected", str(exc))
        self._dirty()

    # -- runtime output --------------------------------------------------------------------

    def _remember_secrets(self, settings: WorkflowSettings) -> None:
        """Have the process log scrub this Workflow's tracker token (from its Secret)."""
        if self._log_secrets is not None:
            self._log_secrets(
                tracker_secrets(api_key=settings.tracker.api_key, environ=self._base_env)
            )

    def _on_runtime_event(self, event: RuntimeEvent) -> None:
        kind = event.type
        if kind is EventType.WORKFLOW_RELOADED:
            if self.runtime is not None:
                self._remember_secrets(self.runtime.settings)
            self._degraded = None
            self._applied_generation = self.candidates.generation
            candidate = self.candidates.candidate
            if isinstance(candidate, LoadedWorkflow):
                with contextlib.suppress(OSError):  # NB: informational; the volume's problem
                    write_workflow_file(candidate)
            self._dirty()
        elif kind is EventType.WORKFLOW_RELOAD_FAILED:
            self._degraded = Degradation(
                code=event.code or "workflow_reload_failed",
                message=event.message or "",
                generation=self.candidates.generation,
            )
            self._dirty()
        elif (
            kind is EventType.WORKSPACE_CLEANUP
            and event.reason == "terminal"
            and event.issue_id
            and self.runtime is not None
            and self.runtime.settings.worker.kind is WorkerKind.POD
        ):
            # The issue is terminal: its workspace claims go too (an emptyDir went with its Pod).
            self._spawn(self._delete_issue_claims(event.issue_id))
        if kind is not EventType.LEADERSHIP_LOST:
            self.events.runtime_event(event)
        self._count_continuations(event)

    async def _delete_issue_claims(self, issue_id: str) -> None:
        try:
            deleted = await delete_issue_workspaces(self._api, workflow=self.ref, issue_id=issue_id)
        except KubeApiError as exc:
            logger.warning(
                "Workspace claims not deleted workflow=%s issue=%s error=%s",
                self.ref.display, issue_id, exc,
            )
            return
        if deleted:
            logger.info(
                "Workspace claims deleted workflow=%s issue=%s claims=%s",
                self.ref.display, issue_id, ",".join(deleted),
            )

    def _count_continuations(self, event: RuntimeEvent) -> None:
        """Hold a slot whose agent keeps ending cleanly without moving its issue."""
        kind, slot = event.type, event.slot
        identifier, issue_id = event.identifier, event.issue_id
        if kind is EventType.RUN_RECONCILED and issue_id:
            # The issue left the active states (or went away): its slots start again at 0.
            prefix = slot_key(issue_id, 0).removesuffix("0")
            for stale in [k for k in self._continuations if k.startswith(prefix)]:
                del self._continuations[stale]
            return
        if kind is not EventType.RETRY_SCHEDULED or slot is None or not identifier:
            return
        key = slot_key(issue_id or identifier, slot)
        if event.retry_kind != "continuation":
            self._continuations.pop(key, None)
            return
        count = self._continuations.get(key, 0) + 1
        self._continuations[key] = count
        limit = self._settings.max_continuation_runs
        if limit and count > limit:
            self._continuations.pop(key, None)
            # NB: at once, before the retry's timer fires: the patch below lands later.
            self._holding.add(key)
            self.post(
                "Warning",
                "ContinuationLimit",
                f"{identifier} slot {slot}: the agent ended cleanly {limit + 1} times in a row "
                f"and the issue is still active, so it is held instead of run again "
                f"({resources.HOLD_ANNOTATION} on its Claim); remove the annotation to run it "
                "again",
            )
            self._spawn(self._hold(key, note=f"{limit + 1} clean runs without progress"))

    async def _hold(self, key: SlotKey, *, note: str) -> None:
        """Annotate the slot's Claim as held (the slot is refused locally meanwhile); a patch
        that keeps failing lets the slot go again, its count started afresh."""
        path = claims_path(self.ref.namespace, resources.claim_name(self.ref.name, key))
        delay = self._settings.retry_period_seconds
        for attempt in range(1, HOLD_ATTEMPTS + 1):
            if not self.lease.holds_lease():
                break
            try:
                await self._api.merge_patch(
                    path, {"metadata": {"annotations": {resources.HOLD_ANNOTATION: note}}}
                )
            except KubeApiError as exc:
                logger.warning(
                    "Holding the issue failed workflow=%s slot=%s attempt=%d error=%s",
                    self.ref.display, key, attempt, exc,
                )
                if exc.not_found:
                    break
                await asyncio.sleep(delay * attempt)
            else:
                return  # NB: the local hold ends when the watch shows the annotation
        self._holding.discard(key)

    def _on_runtime_change(self) -> None:
        runtime = self.runtime
        if runtime is not None:
            poll = runtime.poll_status()
            if poll.last_poll_at is not None and not poll.last_error:
                self._start_failures = 0
        self._dirty()

    # -- status ----------------------------------------------------------------------------

    def _dirty(self) -> None:
        self._status_dirty.set()

    async def _publish_loop(self) -> None:
        first = True
        while True:
            await self._status_dirty.wait()
            # NB: one tick emits a burst of snapshots (start, end, next poll scheduled); letting
            # it settle first makes an idle tick cost one status patch, not three.
            await asyncio.sleep(STATUS_SETTLE_S)
            if first:
                first = False
                await self._first_status_settles()
            self._status_dirty.clear()
            try:
                await self.publish_status()
            except KubeApiError as exc:
                logger.warning("Status patch failed workflow=%s error=%s", self.ref.display, exc)
            await asyncio.sleep(self._settings.status_interval_seconds)

    async def _first_status_settles(self) -> None:
        """Hold a term's first status until it says more than "starting" (bounded).

        A runtime usually builds and polls within a second: its first status then goes out
        as ``Ready`` in one patch instead of ``Starting`` followed by ``Ready`` a moment
        later — with 1,000 Workflows starting at once, that was 1,000 patches (and 1,000 watch
        events at every replica) fewer. A start slower than ``first_status_wait_seconds``
        (queued behind other starts, or failing) still shows ``Starting`` then.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.first_status_wait_seconds
        while ready_condition(self.status_inputs())[1] == STARTING_REASON:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._status_dirty.clear()
            await first_of(self._status_dirty.wait(), timeout_s=left)

    def status_inputs(self) -> StatusInputs:
        """The facts the status depends on, now."""
        record = self.lease.observed
        runtime = self.runtime
        return StatusInputs(
            generation=self._generation,
            applied_generation=self._applied_generation,
            candidate_generation=self.candidates.generation,
            degraded=self._degraded,
            running=self.runtime is not None,
            snapshot=runtime.snapshot() if runtime is not None else None,
            nodes=self.store.pod_nodes() if self.store is not None else {},
            releasing=self._releasing,
            identity=self.lease.identity,
            lease_name=self.lease.name,
            acquired_at=record.acquired_at if record is not None else None,
            transitions=record.transitions if record is not None else 0,
            endpoint=self._settings.advertise_url,
        )

    def status_body(self) -> dict[str, Any]:
        """The status this leader would write now (conditions keep their transition times)."""
        # NB: the conditions last written are read back from that status (its wire form is
        # kept anyway) instead of being kept a second time as models: ~3 KiB per led Workflow.
        written = self._last_status
        previous = _conditions_of(
            written if written is not None else self._body.get("status") or {}
        )
        return workflow_status(self.status_inputs(), previous, _utc_now())

    async def publish_status(self, *, force: bool = False) -> bool:
        """Patch the status if it changed (and this term still holds); ``True`` if patched."""
        term = self._term
        if term is None or not term.holds_lease():
            return False
        if self._deleting.is_set():
            # NB: nobody reads the status of an object on its way out, and in a terminating
            # namespace each patch of 1,000 Workflows stopping queued before their cleanups.
            return False
        status = self.status_body()
        if not force and status == self._last_status:
            return False
        if not force and self._last_status is not None and only_bookkeeping_changed(
            status, self._last_status
        ):
            wait = self._last_write_at + self._settings.idle_status_interval_seconds
            wait -= time.monotonic()
            if wait > 0:
                # NB: nothing a user acts on changed (only when the last poll was): write it
                # later, once, instead of on every idle tick.
                if self._deferred is None:
                    self._deferred = asyncio.get_running_loop().call_later(wait, self._dirty)
                return False
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        path = workflows_path(self.ref.namespace, self.ref.name, status=True)
        try:
            await self._api.merge_patch(path, {"status": status})
        except KubeApiError as exc:
            if exc.not_found:
                return False
            raise
        self._last_status = status
        self._last_write_at = time.monotonic()
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
        """The Workflow is being deleted: delete its Claims, the run Pods nobody followed (a
        previous leader's, not adopted yet) and workspaces, let go of the shard, unblock the
        deletion."""
        deleted = await delete_claims(
            api=self._api, workflow=self.ref, lister=self._claim_lister
        )
        try:
            runs = await delete_workflow_runs(
                self._api, workflow=self.ref, lists=self._claim_lister
            )
        except KubeApiError as exc:
            # NB: the owner references to the Workflow take them along anyway; a deletion
            # must not wait on this.
            logger.warning("Run objects not deleted workflow=%s error=%s", self.ref.display, exc)
        else:
            if any(runs.values()):
                logger.info(
                    "Run objects deleted workflow=%s pods=%d secrets=%d claims=%d",
                    self.ref.display, len(runs["pods"]), len(runs["secrets"]),
                    len(runs["claims"]),
                )
        await self.lease.release()
        # NB: before the finalizer goes: only then can a Workflow of the same name be created,
        # and it must not find (or lose) this one's workspaces.
        await remove_workspaces(self.workflow_dir)
        await edit_finalizer(api=self._api, workflow=self.ref, add=False, seen=self._body)
        self.finished = True
        self._stop.set()
        logger.info(
            "Workflow cleaned up workflow=%s claims_deleted=%d", self.ref.display, deleted
        )

    # -- helpers ---------------------------------------------------------------------------

    def _annotation(self, body: Mapping[str, Any]) -> str | None:
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(resources.REFRESH_ANNOTATION)
        return str(value) if value is not None else None

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return self._background.spawn(coro)

    async def _wait(
        self, lost: asyncio.Event, *events: asyncio.Event, seconds: float | None = None
    ) -> None:
        waits = [lost.wait(), self._deleting.wait(), self._stop.wait(), *(e.wait() for e in events)]
        await first_of(*waits, timeout_s=seconds)


@functools.cache
def _operator_account() -> tuple[str, str] | None:
    """The operator's own ServiceAccount, read once per process.

    NB: it was read (a file) by every controller as it was made, on the event loop: 1,000
    reads per replica while 1,000 Workflows were created, for runs in Pods only.
    """
    return operator_service_account()


def _compact(body: Mapping[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def _conditions_of(status: Mapping[str, Any]) -> list[Condition]:
    found = []
    for raw in status.get("conditions") or ():
        with contextlib.suppress(ValueError):
            found.append(Condition.model_validate(raw))
    return found


async def sweep_orphans_of_term(
    *,
    api: KubeApi,
    workflow: WorkflowRef,
    store: ClaimResourceStore,
    may_delete: Callable[[], bool],
    lists: ClaimLister | None = None,
) -> list[str]:
    """The orphan sweep of a new term: delete the run Pods of ``workflow`` that no Claim's
    spawn intent names, once ``store`` has loaded the Claims; the handles deleted.

    NB: the sweep starts beside the runtime, whose start-up loads the store: a sweep that read
    :attr:`ClaimResourceStore.held` before that load named nothing, and deleted every Pod of
    the previous leader that this term was about to adopt (a loaded machine, a ``helm
    upgrade`` mid-run: the run was stopped and started again instead of adopted).
    """
    await store.loaded.wait()

    def named() -> set[str]:
        return {
            held.record.intent.handle
            for held in store.held.values()
            if held.record.intent is not None
        }

    return await sweep_run_pods(
        api=api, workflow=workflow, keep=named, may_delete=may_delete, lists=lists
    )
