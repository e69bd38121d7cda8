"""The leadership of one Workflow, as its controller sees it: its shard's, one term at a time.

Replicas hold shards (:mod:`lorenz.kube.leaderelection.sharding`), not Workflows; a Workflow is led
by the replica holding its shard, while that shard's term lasts. :class:`WorkflowLeadership` is that
view for one Workflow — the same facts the single-Lease provider gave (holder, record,
``holds_lease()``) plus :attr:`~WorkflowLeadership.generation`, the fence generation
(``spec.leaseTransitions`` of the shard Lease, strictly increasing across terms; ``None`` while
not leading).

A term of leadership starts when :meth:`WorkflowLeadership.win` returns ``True`` and
:meth:`WorkflowLeadership.begin_term` engages the Workflow in the shard's term. It ends in one
of three ways:

* ``term.lost``: the shard Lease was lost — nothing may be written any more;
* ``term.yielding``: the shard is being handed over to another replica — stop gracefully (runs
  end as clean shutdowns), then :meth:`Term.halt`; the shard is released once every Workflow
  in it has let go;
* the controller leaves on its own (deletion, shutdown) and halts the term.

NB: the writes of one term are fenced by *that* term (:meth:`Term.holds_lease`), not by whether
the shard is held now: a runtime still being abandoned after a lost term must not write because
the shard was taken again meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses

from lorenz.kube.api.resources import WorkflowRef
from lorenz.kube.leaderelection.sharding import Shard, ShardCoordinator, ShardTerm
from lorenz.leadership import LeaseRecord, LeaseStoreKind
from lorenz.tasks import first_of


class Term:
    """One term of leading one Workflow (inside one term of its shard)."""

    def __init__(self, shard_term: ShardTerm, *, token: object) -> None:
        self._shard_term = shard_term
        self._token = token
        self.lost = shard_term.lost
        """Set when the shard Lease was lost: stop without writing anything."""
        self.yielding = shard_term.yielding
        """Set when the shard is handed over: stop gracefully, then :meth:`halt`."""
        shard_term.engage(token)

    def holds_lease(self) -> bool:
        """Whether this term may still write (the claim store's fence)."""
        return self._shard_term.holds()

    @property
    def generation(self) -> int | None:
        """This term's fence generation while it holds; ``None`` once it ended."""
        return self._shard_term.generation if self._shard_term.holds() else None

    async def halt(self) -> None:
        """Let go of the term (idempotent): the shard may be released once all let go."""
        self._shard_term.disengage(self._token)


class WorkflowLeadership:
    """The leadership of one Workflow: the shard it belongs to, seen from that Workflow."""

    def __init__(self, *, coordinator: ShardCoordinator, workflow: WorkflowRef) -> None:
        self._coordinator = coordinator
        self.workflow = workflow
        self.shard: Shard = coordinator.shard_for(workflow)
        self._term: Term | None = None

    # -- facts (what the controller, the status and the API show) --------------------------

    @property
    def kind(self) -> LeaseStoreKind:
        return LeaseStoreKind.KUBERNETES

    @property
    def identity(self) -> str:
        return self._coordinator.identity

    @property
    def name(self) -> str:
        """The shard Lease's name."""
        return self.shard.lease.name

    @property
    def display(self) -> str:
        """``<operator namespace>/<shard Lease>``."""
        return self.shard.lease.display

    @property
    def holder(self) -> str | None:
        return self.shard.lease.holder

    @property
    def observed(self) -> LeaseRecord | None:
        record = self.shard.lease.observed
        if record is None:
            return None
        return dataclasses.replace(record, workflow_path=self.workflow.display)

    def holds_lease(self) -> bool:
        """Whether this replica leads the Workflow now (its shard's term holds)."""
        term = self.shard.term
        return term is not None and term.holds()

    @property
    def generation(self) -> int | None:
        """The fence generation of the current term (``None`` while not leading)."""
        term = self.shard.term
        return term.generation if term is not None and term.holds() else None

    def since_renewal(self) -> float:
        return self.shard.lease.since_renewal()

    @property
    def start_gate(self) -> asyncio.Semaphore:
        """Held while this Workflow's runtime is built (shared by the replica's Workflows)."""
        return self._coordinator.start_gate

    def update_workflow(self, workflow: WorkflowRef) -> None:
        """Learn the Workflow's uid (the shard does not depend on it)."""
        self.workflow = workflow

    # -- the campaign ----------------------------------------------------------------------

    async def win(self, *, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the shard (``True``); ``False`` once the shard is not
        offered here (not held, or being handed over) or ``stop`` is set.

        NB: a Workflow whose shard is elsewhere has no controller waiting here (the supervisor
        makes one when the shard comes, :meth:`ShardCoordinator.when_available`). Only a term
        that is offered but does not hold (its renewal is late, the coordinator has not ended
        it yet) is polled, once per retry period.
        """
        while not stop.is_set():
            term = self.shard.term
            if not self.shard.available.is_set():
                return False
            if term is not None and term.holds():
                return True
            await first_of(stop.wait(), timeout_s=self._coordinator.timing.retry_period_s)
        return False

    def begin_term(self) -> Term:
        """Engage in the shard's current term (a term that already ended is returned lost)."""
        shard_term = self.shard.term
        if shard_term is None:
            shard_term = ShardTerm(self.shard, generation=-1)
            shard_term.lost.set()
        self._term = Term(shard_term, token=self)
        return self._term

    async def release(self) -> None:
        """This Workflow let go of its shard's term (stopped, deleted, or failed)."""
        if self._term is not None:
            await self._term.halt()
            self._term = None
