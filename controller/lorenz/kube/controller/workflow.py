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
import functools
import json
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from lorenz.assembly import assemble_runtime, runs_in_workers, tracker_factory
from lorenz.codes import ErrorCode
from lorenz.config import WorkerKind, WorkflowSettings
from lorenz.kube.api import resources
from lorenz.kube.api.resources import compact_json
from lorenz.kube.claims.lists import ClaimLister
from lorenz.kube.claims.store import ClaimResourceStore
from lorenz.kube.clients import KubeApi
from lorenz.kube.controller.answers import ClaimAnswers
from lorenz.kube.controller.candidates import SpecCandidates
from lorenz.kube.controller.cleanup import (
    clean_up_deleted,
    delete_issue_claims,
    edit_finalizer,
    sweep_orphans,
    sweep_terminal_workspaces,
)
from lorenz.kube.controller.enforcement import EnforcementFollower
from lorenz.kube.controller.flags import Flag
from lorenz.kube.controller.holds import ContinuationHolds, HoldingClaimStore
from lorenz.kube.controller.placement import PlacementHealth
from lorenz.kube.controller.posting import EventKind, EventPoster, Post, kopf_post
from lorenz.kube.controller.publisher import RuntimeAttacher, StatusPublisher
from lorenz.kube.controller.specs import (
    generation_of,
    load_workflow_object,
    logged_secrets,
    workflow_ref,
    write_workflow_file,
)
from lorenz.kube.controller.status import Degradation, StatusInputs
from lorenz.kube.errors import KubeApiError, LeaseLost, OperatorError
from lorenz.kube.leaderelection.leading import Term, WorkflowLeadership
from lorenz.kube.leaderelection.sharding import ShardCoordinator
from lorenz.kube.pods.runner import PodRunners
from lorenz.kube.pods.transport import AgentAccounts
from lorenz.kube.settings import OperatorSettings
from lorenz.model import (
    EventType,
    LorenzError,
    RuntimeEvent,
    SlotKey,
    SystemClock,
)
from lorenz.orchestrator import Orchestrator
from lorenz.policies.placement import runs_in_pods
from lorenz.runtime import LorenzRuntime
from lorenz.tasks import BackgroundTasks, first_of
from lorenz.workers.runner import Departure
from lorenz.workers.states import STATE_ROOT_ENV
from lorenz.workflow import LoadedWorkflow, validate_dispatch

logger = logging.getLogger("lorenz.kube.controllers")

T = TypeVar("T")


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
            api=api,
            workflow_dir=self.workflow_dir,
            retry_period_s=settings.retry_period_seconds,
            allow_local=settings.allows_local_runs(self.ref.namespace),
            continuation_ceiling=settings.max_continuation_runs,
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
        self._refresh_value = resources.refresh_of(body)
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
        self.pod_runners = PodRunners(
            api=api, workflow=self.ref, worker_image=settings.worker_image,
            accounts=agent_accounts,
        )
        self._runtime_task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._applied_generation: int | None = None
        self._degraded: Degradation | None = None
        self._start_failures = 0
        """Failed starts in a row (the backoff doubles with each; a good poll resets it)."""
        self._placement = PlacementHealth()
        """Runs in a row that were not placed (a run that starts, or a new spec, resets it)."""
        self._term_object: Mapping[str, Any] | None = None
        """The Workflow as read after the current term began (see :meth:`_lead`), for the
        term's first claim store; taken once."""
        self._releasing = False
        self._background = BackgroundTasks(name=f"workflow {self.ref.display}", log=logger)
        self.holds = ContinuationHolds(
            api=api,
            workflow=self.ref,
            settings=settings,
            limit=self._continuation_limit,
            holds_lease=self.lease.holds_lease,
            post=self.post,
            background=self._background,
        )
        self.answers = ClaimAnswers(api=api, workflow=self.ref, post=self.post)
        """The ``lorenz.dev/answer`` annotations of the Workflow's Claims, taken."""
        self.status = StatusPublisher(
            api=api,
            workflow=self.ref,
            settings=settings,
            inputs=self.status_inputs,
            seen_status=lambda: self._body.get("status") or {},
            may_write=self._may_publish,
        )
        self.enforcement = EnforcementFollower(
            api=api, settings=settings, post=self.post, changed=self.status.dirty,
            accounts=agent_accounts,
        )
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
        self._body_text = text if text is not None else compact_json(body)
        self._generation = generation_of(body)
        ref = workflow_ref(body)
        if ref.uid is not None and self.ref.uid is None:
            self.ref = ref
            self.lease.update_workflow(ref)
            self.pod_runners.update_workflow(ref)
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            self._deleting.set()
            self.events.silence()
            self._changed.set()
            return
        refresh = resources.refresh_of(body)
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
        self.holds.holding.discard(slot_key)  # NB: from now on the Claim's annotation refuses it
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

    def claim_answered(self, answer: resources.ClaimAnswer) -> None:
        """A Claim of this Workflow carries the answer annotation: answer its issue with it
        (:mod:`.answers`)."""
        runtime = self.runtime
        if runtime is None or not self.lease.holds_lease() or self.answers.taking(answer):
            return
        self._spawn(self.answers.take(runtime, answer))

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
        publisher = self._spawn(self.status.run())
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
            self.status.dirty()
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
            self.status.end_term()
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
            loaded = await load_workflow_object(
                body,
                api=self._api,
                workflow_dir=self.workflow_dir,
                allow_local=self._settings.allows_local_runs(self.ref.namespace),
                continuation_ceiling=self._settings.max_continuation_runs,
            )
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
        code = str(getattr(exc, "code", None) or ErrorCode.START_FAILED)
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
        self.status.dirty()
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
                code=ErrorCode.WORKFLOW_DIR_UNUSABLE,
            ) from exc
        self.holds.holding.clear()  # NB: a new term judges the Claims as they are
        store = HoldingClaimStore(
            holding=self.holds.holding,
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
            "Runtime starting workflow=%s interrupted=%d restored=%d",
            self.ref.display,
            len(report.interrupted),
            len(report.restored_retries),
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
            if (workers and STATE_ROOT_ENV in os.environ) or runs_in_pods(settings.worker)
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
            leave_workers=departure,
            # NB: a replica that leaves leaves the runs' Pods to the next leader.
            pods=functools.partial(
                self.pod_runners.runner, workflow=str(loaded.path), store=store,
                leaving=departure,
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
        self.status.dirty()
        if self._metrics is not None:
            self._detach_metrics = self._metrics.attach(runtime, workflow=self.ref.display)
        self._runtime_task = asyncio.get_running_loop().create_task(
            runtime.start(), name=f"lorenz-runtime:{self.ref.display}"
        )
        # NB: the store forgets its Claims when the term ends: from then on it names
        # nothing, and every Pod is the next leader's to judge.
        still_ours = functools.partial(self._still_ours, term=term, store=store)
        for answer in store.found_answers:  # NB: annotated while nobody led the Workflow
            self.claim_answered(answer)
        self._spawn(sweep_orphans(
            api=self._api, workflow=self.ref, store=store, may_delete=still_ours,
            lists=self._claim_lister,
        ))
        self._spawn(sweep_terminal_workspaces(
            api=self._api, workflow=self.ref, runtime=runtime, store=store,
            still_ours=still_ours, lists=self._claim_lister,
        ))
        self.enforcement.start(self._spawn, workflow=lambda: self.ref, active=still_ours,
                               runtime=lambda: self.runtime)

    def _still_ours(self, *, term: Term, store: ClaimResourceStore) -> bool:
        """Whether ``term`` still holds and ``store`` is still its claim store."""
        return term.holds_lease() and self.store is store

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
            departure.leave(reason="handed_over")
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
            self._departure.leave(reason="leadership_lost")
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
        self.status.dirty()

    # -- runtime output --------------------------------------------------------------------

    def _remember_secrets(self, settings: WorkflowSettings) -> None:
        """Have the process log scrub this Workflow's secrets (:func:`logged_secrets`)."""
        if self._log_secrets is not None:
            self._log_secrets(logged_secrets(settings, environ=self._base_env))

    def _on_runtime_event(self, event: RuntimeEvent) -> None:
        kind = event.type
        if kind is EventType.WORKFLOW_RELOADED:
            if self.runtime is not None:
                self._remember_secrets(self.runtime.settings)
            self._degraded = None
            self._placement.reset()
            self._applied_generation = self.candidates.generation
            candidate = self.candidates.candidate
            if isinstance(candidate, LoadedWorkflow):
                with contextlib.suppress(OSError):  # NB: informational; the volume's problem
                    write_workflow_file(candidate)
            self.status.dirty()
        elif kind is EventType.WORKFLOW_RELOAD_FAILED:
            self._degraded = Degradation(
                code=event.code or ErrorCode.WORKFLOW_RELOAD_FAILED,
                message=event.message or "",
                generation=self.candidates.generation,
            )
            self.status.dirty()
        elif kind is EventType.PLACEMENT_FAILED:
            generation = self._applied_generation or self._generation
            if self._placement.failed(event, generation=generation):
                self.status.dirty()
        elif kind is EventType.RUN_STARTED and self._placement.reset():
            self.status.dirty()
        elif (
            kind is EventType.WORKSPACE_CLEANUP
            and event.reason == "terminal"
            and event.issue_id
            and self.runtime is not None
            and self.runtime.settings.worker.kind is WorkerKind.POD
        ):
            # The issue is terminal: its workspace claims go too (an emptyDir went with its Pod).
            self._spawn(
                delete_issue_claims(api=self._api, workflow=self.ref, issue_id=event.issue_id)
            )
        if kind is not EventType.LEADERSHIP_LOST:
            self.events.runtime_event(event)
        self.holds.on_runtime_event(event)

    def _continuation_limit(self) -> int:
        """``agent.max_continuation_runs`` of the runtime in force (the operator's flag when
        none runs, which bounds it)."""
        runtime = self.runtime
        if runtime is None:
            return self._settings.max_continuation_runs
        return runtime.settings.agent.max_continuation_runs

    def _on_runtime_change(self) -> None:
        runtime = self.runtime
        if runtime is not None:
            poll = runtime.poll_status()
            if poll.last_poll_at is not None and not poll.last_error:
                self._start_failures = 0
        self.status.dirty()

    # -- status ----------------------------------------------------------------------------

    def status_inputs(self) -> StatusInputs:
        """The facts the status depends on, now."""
        record = self.lease.observed
        runtime = self.runtime
        return StatusInputs(
            generation=self._generation,
            applied_generation=self._applied_generation,
            candidate_generation=self.candidates.generation,
            degraded=self._degraded or self._placement.degraded,
            running=self.runtime is not None,
            snapshot=runtime.snapshot() if runtime is not None else None,
            nodes=self.store.pod_nodes() if self.store is not None else {},
            releasing=self._releasing,
            identity=self.lease.identity,
            lease_name=self.lease.name,
            acquired_at=record.acquired_at if record is not None else None,
            transitions=record.transitions if record is not None else 0,
            endpoint=self._settings.advertise_url,
            network_policy=self.enforcement.condition(),
        )

    def _may_publish(self) -> bool:
        """Whether the status may be written: the term holds, and the Workflow is not on its
        way out (nobody reads the status of an object being deleted, and in a terminating
        namespace each patch of 1,000 Workflows stopping queued before their cleanups)."""
        term = self._term
        if term is None or not term.holds_lease():
            return False
        return not self._deleting.is_set()

    # -- cluster objects -------------------------------------------------------------------

    async def _release(self) -> None:
        self._releasing = True
        with contextlib.suppress(KubeApiError):
            await self.status.publish(force=True)
        await self.lease.release()
        logger.info(
            "Workflow released workflow=%s identity=%s", self.ref.display, self.lease.identity
        )

    async def _cleanup_deleted(self) -> None:
        """The Workflow is being deleted: clean up after it (see
        :func:`~lorenz.kube.controller.cleanup.clean_up_deleted`), then leave."""
        deleted = await clean_up_deleted(
            api=self._api,
            workflow=self.ref,
            lister=self._claim_lister,
            workflow_dir=self.workflow_dir,
            seen=self._body,
            release=self.lease.release,
        )
        self.finished = True
        self._stop.set()
        logger.info(
            "Workflow cleaned up workflow=%s claims_deleted=%d", self.ref.display, deleted
        )

    # -- helpers ---------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return self._background.spawn(coro)

    async def _wait(
        self, lost: asyncio.Event, *events: asyncio.Event, seconds: float | None = None
    ) -> None:
        waits = [lost.wait(), self._deleting.wait(), self._stop.wait(), *(e.wait() for e in events)]
        await first_of(*waits, timeout_s=seconds)
