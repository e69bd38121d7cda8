"""Leadership per Workflow through a ``coordination.k8s.io/v1`` Lease, with client-go semantics.

Replicas shard Workflows by Lease: for each Workflow every replica campaigns for the Lease
``lorenz-wf-<name>`` in the Workflow's namespace, and the holder runs that Workflow's runtime.
The rules are client-go's leader election (tools/leaderelection), re-derived:

* **Every write is a compare-and-swap.** Updates are a PUT of the object last read, carrying its
  ``resourceVersion``; a concurrent writer makes ours fail with 409 and we lose the round. A
  create racing another create gets 409 AlreadyExists and loses too.
* **Expiry is judged on the local monotonic clock, never on the record's timestamps.** A
  candidate remembers *when it last saw the record change*; the holder counts as gone only
  after ``leaseDurationSeconds`` without an observed change. Clock offsets between nodes do
  not matter; only clock *rates* do, and the lease-duration/renew-deadline ratio bounds that.
* **The leader renews every retry period and gives up after the renew deadline.** A leader
  whose renewals have not succeeded for ``renew_deadline`` stops counting itself as leader
  (:meth:`KubernetesLeaseProvider.holds_lease` turns false at that instant, which is what
  fences the claim store) — strictly before any follower may take over, since
  ``renew_deadline < lease_duration``.
* ``acquireTime`` and ``leaseTransitions`` are kept across renewals by the same holder; a new
  holder sets ``acquireTime`` and bumps ``leaseTransitions``.
* **Release on a graceful stop**: once all guarded work has stopped, the holder writes an empty
  ``holderIdentity`` with ``leaseDurationSeconds: 1`` (what client-go's ReleaseOnCancel
  writes), so a follower takes over at its next retry instead of waiting a full duration.

NB: like client-go, this is not fencing. Two replicas can briefly both *believe* they lead
(a stalled process that has not noticed its deadline yet); the claim store re-checks
:meth:`~KubernetesLeaseProvider.holds_lease` before every write, and the margin between renew
deadline and lease duration is what keeps the overlap from reaching the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import math
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorenz.kube import resources
from lorenz.kube.clients import KubeApi, leases_path
from lorenz.kube.errors import InvalidOperatorSettings, KubeApiError, LeaseHeldElsewhere
from lorenz.kube.resources import WorkflowRef
from lorenz.leadership import LeadershipLost, LeaseRecord, LeaseStoreKind

logger = logging.getLogger("lorenz.kube.leases")

HOST_ANNOTATION = f"{resources.GROUP}/host"
JITTER = 0.2
"""Followers wait ``retry_period * (1 + U(0, JITTER))`` between attempts (client-go: 1.2)."""


LEASE_RULES: tuple[tuple[str, str, float, str | None, str], ...] = (
    ("lease_duration_s", ">=", 1.0, None, "lease duration must be at least 1 s"),
    ("lease_duration_s", ">", 1.0, "renew_deadline_s",
     "lease duration must be longer than the renew deadline"),
    ("renew_deadline_s", ">", 1 + JITTER, "retry_period_s",
     f"renew deadline must be longer than {1 + JITTER:g} x the retry period"),
    ("retry_period_s", ">", 0.0, None, "retry period must be positive"),
)
"""client-go's rules for the three durations, as data: ``left op factor * right`` (``right``
``None``: ``left op factor``). :class:`LeaseTiming` checks them, and the Helm chart's template
check is generated from them (``charts/lorenz/generate.py``), so the chart never renders
timings the operator refuses."""


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseTiming:
    """client-go's three durations (defaults 15 s / 10 s / 2 s, as core components use)."""

    lease_duration_s: int = 15
    """How long followers wait, without observing a renewal, before taking over."""
    renew_deadline_s: float = 10.0
    """How long the leader keeps trying to renew before it stops acting as leader."""
    retry_period_s: float = 2.0
    """How often the leader renews and followers try to acquire."""

    def __post_init__(self) -> None:
        problems = []
        for left, op, factor, right, message in LEASE_RULES:
            value = float(getattr(self, left))
            bound = factor * (float(getattr(self, right)) if right is not None else 1.0)
            if not (value >= bound if op == ">=" else value > bound):
                problems.append(message)
        if problems:
            raise InvalidOperatorSettings(problems)

    @property
    def request_timeout_s(self) -> float:
        """Per request: half the renew deadline, at least 1 s (controller-runtime's rule)."""
        return max(1.0, self.renew_deadline_s / 2)


def micro_time(value: datetime.datetime) -> str:
    """RFC 3339 with exactly six fractional digits, UTC (``MicroTime`` as the server wants it)."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: Any) -> datetime.datetime | None:
    if not text:
        return None
    parsed = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class KubernetesLeaseProvider:
    """:class:`~lorenz.leadership.LeadershipProvider` over one Workflow's Lease."""

    def __init__(
        self,
        *,
        api: KubeApi,
        workflow: WorkflowRef,
        identity: str,
        timing: LeaseTiming | None = None,
        host: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self._api = api
        self._workflow = workflow
        self._identity = identity
        self._timing = timing or LeaseTiming()
        self._host = host or socket.gethostname()
        self._monotonic = monotonic
        self._wall = wall
        self.name = resources.lease_name(workflow.name)
        self._path = leases_path(workflow.namespace, self.name)
        self._cached: dict[str, Any] | None = None
        """The Lease as we last read or wrote it (the fast renew path PUTs it back)."""
        self._observed_raw: str | None = None
        self._observed_at: float = 0.0
        """Local monotonic time at which the record was last seen to change."""
        self._leading = False
        self._last_renew_ok: float = -math.inf
        """Monotonic time at which the last successful write of ours was *sent*."""
        self._endpoint: str | None = None
        self.namespace_terminating = False
        """The Lease's namespace refused to create it because it is being deleted."""

    # -- facts -----------------------------------------------------------------------------

    @property
    def kind(self) -> LeaseStoreKind:
        return LeaseStoreKind.KUBERNETES

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def timing(self) -> LeaseTiming:
        return self._timing

    @property
    def workflow(self) -> WorkflowRef:
        return self._workflow

    def update_workflow(self, workflow: WorkflowRef) -> None:
        """Learn the Workflow's uid (owner reference of a Lease created from now on)."""
        self._workflow = workflow

    @property
    def holder(self) -> str | None:
        """The holder as last observed (``None`` when nobody holds it or nothing was read)."""
        if self._cached is None:
            return None
        holder = (self._cached.get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    @property
    def observed(self) -> LeaseRecord | None:
        """The last observed record, as a :class:`LeaseRecord`."""
        return self._record(self._cached) if self._cached is not None else None

    def expires_in(self) -> float | None:
        """Seconds until another holder's lease expires as observed here (``None``: no such
        holder observed)."""
        holder = self.holder
        if self._cached is None or holder is None or holder == self._identity:
            return None
        duration = int((self._cached.get("spec") or {}).get("leaseDurationSeconds") or 0)
        return self._observed_at + duration - self._monotonic()

    def since_renewal(self) -> float:
        """Seconds since our last successful write was sent (infinite if there was none)."""
        return self._monotonic() - self._last_renew_ok

    def holds_lease(self) -> bool:
        """Whether we may act as leader *now*: we hold it and renewed within the renew deadline.

        The claim store asks this before every write; it needs no API call.
        """
        if not self._leading:
            return False
        return self._monotonic() - self._last_renew_ok < self._timing.renew_deadline_s

    # -- the LeadershipProvider protocol ---------------------------------------------------

    async def acquire(self) -> LeaseRecord:
        """One attempt (``tryAcquireOrRenew``); :class:`LeaseHeldElsewhere` if it lost."""
        if await self.try_acquire_or_renew():
            record = self.observed
            assert record is not None
            return record
        raise LeaseHeldElsewhere(
            lease=f"{self._workflow.namespace}/{self.name}", record=self.observed
        )

    async def read(self) -> LeaseRecord | None:
        try:
            lease = await self._api.get(self._path)
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise
        self._observe(lease)
        record = self._record(lease)
        return record if record.holder else None

    async def heartbeat(self) -> None:
        """Renew; :class:`LeadershipLost` if the Lease is not ours any more."""
        if not await self.try_acquire_or_renew() or not self._leading:
            raise LeadershipLost(path=Path(self._path), holder=self.holder)

    async def set_endpoint(self, endpoint: str | None) -> None:
        """Publish ``endpoint`` on the Lease with the next write (annotation)."""
        self._endpoint = endpoint

    def is_stale(self, record: LeaseRecord, *, now: datetime.datetime) -> bool:
        """Whether ``record`` went unrenewed for its duration, as *observed locally*.

        ``now`` (wall clock) is deliberately unused: only a change observed on our own
        monotonic clock counts (client-go's clock-skew rule). A record we have not observed
        yet is not stale.
        """
        if self._cached is None or self._record(self._cached) != record:
            return False
        return self._expired(self._cached)

    async def release(self) -> None:
        """Give the Lease up if we hold it: empty holder, duration 1 (client-go's release)."""
        if not self._leading or self._cached is None:
            self._leading = False
            return
        self._leading = False
        for _ in range(2):
            body = copy.deepcopy(self._cached)
            spec = body.setdefault("spec", {})
            if spec.get("holderIdentity") != self._identity:
                return
            now = micro_time(self._wall())
            spec.update(
                {
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": now,
                    "renewTime": now,
                }
            )
            try:
                self._remember(await self._replace(body))
                logger.info("Lease released lease=%s identity=%s", self.name, self._identity)
                return
            except KubeApiError as exc:
                if not exc.conflict:
                    logger.warning("Lease release failed lease=%s error=%s", self.name, exc)
                    return
                with contextlib.suppress(KubeApiError):
                    self._remember(await self._api.get(self._path))

    # -- election --------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """client-go's ``tryAcquireOrRenew``: one round; ``True`` if we hold the Lease after it."""
        sent_at = self._monotonic()
        now = micro_time(self._wall())
        if self._leading and self._cached is not None and self.holds_lease():
            body = copy.deepcopy(self._cached)
            self._stamp(body, now=now, taking_over=False)
            try:
                self._remember(await self._replace(body))
                self._last_renew_ok = sent_at
                return True
            except KubeApiError as exc:
                logger.debug("Lease fast renew failed lease=%s error=%s", self.name, exc)
        try:
            current = await self._api.request(
                "GET", self._path, timeout_s=self._timing.request_timeout_s
            )
        except KubeApiError as exc:
            if not exc.not_found:
                raise
            return await self._create(now=now, sent_at=sent_at)
        self._observe(current)
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self._identity and not self._expired(current):
            self._leading = False
            return False
        body = copy.deepcopy(current)
        self._stamp(body, now=now, taking_over=holder != self._identity)
        try:
            updated = await self._replace(body)
        except KubeApiError as exc:
            if exc.conflict:
                self._leading = False
                return False
            raise
        taking_over = holder != self._identity
        self._remember(updated)
        self._leading = True
        self._last_renew_ok = sent_at
        if taking_over:
            logger.info(
                "Lease acquired lease=%s/%s identity=%s previous=%s transitions=%s",
                self._workflow.namespace,
                self.name,
                self._identity,
                holder or "<none>",
                (updated.get("spec") or {}).get("leaseTransitions"),
            )
        return True

    async def wait_for_leadership(self, *, stop: asyncio.Event) -> bool:
        """Try every (jittered) retry period until we lead (``True``) or ``stop`` is set.

        ``False`` also when the Lease cannot be created because its namespace is being deleted
        (:attr:`namespace_terminating` tells which).
        """
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    return True
            except KubeApiError as exc:
                if exc.namespace_terminating:
                    # NB: nobody can create this Lease any more; retrying would spin until the
                    # namespace is gone, and it never goes while the finalizer waits for us.
                    self.namespace_terminating = True
                    logger.info("Lease cannot be created, namespace terminating lease=%s/%s",
                                self._workflow.namespace, self.name)
                    return False
                logger.warning("Lease acquire failed lease=%s error=%s", self.name, exc)
            delay = self._timing.retry_period_s * (1 + random.random() * JITTER)
            expires_in = self.expires_in()
            if expires_in is not None:
                # NB: try again right when the holder's lease runs out (as observed here)
                # rather than up to a retry period later; the rule is unchanged: the takeover
                # still needs a whole lease duration without an observed renewal.
                delay = min(delay, max(expires_in, 0.0) + 0.01)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
        return False

    async def renew_until_lost(self, *, stop: asyncio.Event) -> None:
        """Renew every retry period; return once leadership is lost (or ``stop`` is set).

        Lost means: a round saw another holder or lost a write race, or no renewal succeeded
        within the renew deadline. :meth:`holds_lease` is already false when this returns.
        """
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._timing.retry_period_s)
            if stop.is_set():
                return
            remaining = self._timing.renew_deadline_s - (self._monotonic() - self._last_renew_ok)
            try:
                ok = await asyncio.wait_for(
                    self.try_acquire_or_renew(), timeout=max(remaining, 0.05)
                )
            except (KubeApiError, TimeoutError) as exc:
                # NB: a TimeoutError has no message: name it, or the log says "error=".
                logger.warning(
                    "Lease renew failed lease=%s error=%s", self.name, str(exc) or repr(exc)
                )
                ok = False
            if ok:
                continue
            if not self._leading or not self.holds_lease():
                self._leading = False
                logger.warning(
                    "Lease lost lease=%s/%s identity=%s holder=%s",
                    self._workflow.namespace,
                    self.name,
                    self._identity,
                    self.holder,
                )
                return

    # -- pieces ----------------------------------------------------------------------------

    async def _replace(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._api.request(
            "PUT", self._path, body=body, verb="update", timeout_s=self._timing.request_timeout_s
        )

    async def _create(self, *, now: str, sent_at: float) -> bool:
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self._workflow.namespace,
            "labels": {resources.WORKFLOW_LABEL: resources.workflow_label(self._workflow.name)},
        }
        if self._workflow.uid is not None:
            metadata["ownerReferences"] = [resources.owner_reference(self._workflow)]
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {"leaseTransitions": 0},
        }
        self._stamp(body, now=now, taking_over=True)
        body["spec"]["leaseTransitions"] = 0
        try:
            created = await self._api.request(
                "POST",
                leases_path(self._workflow.namespace),
                body=body,
                verb="create",
                timeout_s=self._timing.request_timeout_s,
            )
        except KubeApiError as exc:
            if exc.status == 409:
                return False
            raise
        self._remember(created)
        self._leading = True
        self._last_renew_ok = sent_at
        logger.info(
            "Lease created lease=%s/%s identity=%s",
            self._workflow.namespace,
            self.name,
            self._identity,
        )
        return True

    def _stamp(self, body: dict[str, Any], *, now: str, taking_over: bool) -> None:
        spec = body.setdefault("spec", {})
        if taking_over:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self._identity
        spec["leaseDurationSeconds"] = int(self._timing.lease_duration_s)
        spec["renewTime"] = now
        metadata = body.setdefault("metadata", {})
        annotations = metadata.setdefault("annotations", {})
        annotations[HOST_ANNOTATION] = self._host
        if self._endpoint:
            annotations[resources.ENDPOINT_ANNOTATION] = self._endpoint
        else:
            annotations.pop(resources.ENDPOINT_ANNOTATION, None)
        if self._workflow.uid is not None and not metadata.get("ownerReferences"):
            metadata["ownerReferences"] = [resources.owner_reference(self._workflow)]

    def _observe(self, lease: dict[str, Any]) -> None:
        raw = json.dumps(lease.get("spec") or {}, sort_keys=True)
        if raw != self._observed_raw:
            self._observed_raw = raw
            self._observed_at = self._monotonic()
        self._cached = lease

    def _remember(self, lease: dict[str, Any]) -> None:
        """Our own write: it is the newest record, observed now."""
        self._observe(lease)

    def _expired(self, lease: dict[str, Any]) -> bool:
        duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or 0)
        return self._observed_at + duration < self._monotonic()

    def _record(self, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        renewed = _parse_time(spec.get("renewTime")) or datetime.datetime.fromtimestamp(
            0, datetime.UTC
        )
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            pid=None,
            process_started_at=None,
            host=str(annotations.get(HOST_ANNOTATION) or ""),
            endpoint=annotations.get(resources.ENDPOINT_ANNOTATION),
            heartbeat_at=renewed,
            acquired_at=_parse_time(spec.get("acquireTime")) or renewed,
            workflow_path=self._workflow.display,
            store=LeaseStoreKind.KUBERNETES,
            transitions=int(spec.get("leaseTransitions") or 0),
        )
