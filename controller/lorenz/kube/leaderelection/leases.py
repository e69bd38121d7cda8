"""One ``coordination.k8s.io/v1`` Lease, campaigned for with client-go's semantics.

The operator's leadership is sharded (:mod:`lorenz.kube.leaderelection.sharding`): a fixed set of
shard Leases and one membership Lease per replica, all in the operator's own namespace. Each of
them is a :class:`KubernetesLeaseProvider`, which re-derives client-go's leader election
(tools/leaderelection):

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
  ``renew_deadline < lease_duration``. The deadline counts from when the last successful
  renewal was *sent*, so a slow answer never extends it.
* ``acquireTime`` and ``leaseTransitions`` are kept across renewals by the same holder; a new
  holder sets ``acquireTime`` and bumps ``leaseTransitions`` (to at least the provider's
  ``transitions_floor``: shard Leases number their terms above every term seen before, which is
  what makes ``leaseTransitions`` a generation fence that only grows).
* **Release on a graceful stop**: once all guarded work has stopped, the holder writes an empty
  ``holderIdentity`` with ``leaseDurationSeconds: 1`` (what client-go's ReleaseOnCancel
  writes), so a follower takes over at its next retry instead of waiting a full duration.

NB: like client-go, this alone is not fencing. Two replicas can briefly both *believe* they
lead (a stalled process that has not noticed its deadline yet); the claim store re-checks
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
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lorenz.kube.api import resources
from lorenz.kube.clients import KubeApi, leases_path
from lorenz.kube.errors import InvalidOperatorSettings, KubeApiError, LeaseHeldElsewhere
from lorenz.leadership import LeadershipLost, LeaseRecord, LeaseStoreKind
from lorenz.model.clocks import utc_now

logger = logging.getLogger("lorenz.kube.leases")

HOST_ANNOTATION = f"{resources.GROUP}/host"
JITTER = 0.2
"""client-go's jitter factor (its followers wait ``retry_period * (1 + U(0, JITTER))``); kept
for its rule that the renew deadline exceeds ``1 + JITTER`` retry periods (:data:`LEASE_RULES`)."""


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


class KubernetesLeaseProvider:
    """:class:`~lorenz.leadership.LeadershipProvider` over one Lease."""

    def __init__(
        self,
        *,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        describes: str | None = None,
        transitions_floor: Callable[[], int] | None = None,
        endpoint: str | None = None,
        host: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = utc_now,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self._identity = identity
        self._timing = timing or LeaseTiming()
        self._labels = dict(labels or {})
        self._annotations = dict(annotations or {})
        self._describes = describes or f"{namespace}/{name}"
        self._transitions_floor = transitions_floor
        self._host = host or socket.gethostname()
        self._monotonic = monotonic
        self._wall = wall
        self._path = leases_path(namespace, name)
        self._cached: dict[str, Any] | None = None
        """The Lease as we last read or wrote it (the fast renew path PUTs it back)."""
        self._observed_raw: str | None = None
        self._observed_at: float = 0.0
        """Local monotonic time at which the record was last seen to change."""
        self._leading = False
        self._last_renew_ok: float = -math.inf
        """Monotonic time at which the last successful write of ours was *sent*."""
        self._endpoint: str | None = endpoint

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
    def display(self) -> str:
        """``<namespace>/<name>`` of the Lease."""
        return f"{self.namespace}/{self.name}"

    @property
    def holder(self) -> str | None:
        """The holder as last observed (``None`` when nobody holds it or nothing was read)."""
        if self._cached is None:
            return None
        holder = (self._cached.get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    @property
    def transitions(self) -> int:
        """``spec.leaseTransitions`` as last observed (0 before anything was read)."""
        if self._cached is None:
            return 0
        return int((self._cached.get("spec") or {}).get("leaseTransitions") or 0)

    @property
    def annotations(self) -> Mapping[str, str]:
        """The Lease's annotations as last observed."""
        if self._cached is None:
            return {}
        return dict((self._cached.get("metadata") or {}).get("annotations") or {})

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

    def free(self) -> bool:
        """Whether, as observed here, nobody holds the Lease: no holder, or one whose record
        did not change for its whole duration (a Lease never read is not free)."""
        if self._cached is None:
            return False
        return self.holder is None or self._expired(self._cached)

    def since_renewal(self) -> float:
        """Seconds since our last successful write was sent (infinite if there was none)."""
        return self._monotonic() - self._last_renew_ok

    def remaining(self) -> float:
        """Seconds left before the renew deadline (negative once passed)."""
        return self._timing.renew_deadline_s - self.since_renewal()

    def holds_lease(self) -> bool:
        """Whether we may act as leader *now*: we hold it and renewed within the renew deadline.

        The claim store asks this before every write; it needs no API call.
        """
        if not self._leading:
            return False
        return self._monotonic() - self._last_renew_ok < self._timing.renew_deadline_s

    def observe(self, lease: dict[str, Any]) -> None:
        """A version of the Lease read elsewhere (a LIST): it counts as observed now.

        NB: ignored while we lead: our own last write is at least as new, and a stale listing
        must not replace the object the next renewal PUTs back.
        """
        if not self._leading:
            self._observe(lease)

    def forget(self) -> None:
        """The Lease does not exist (a LIST did not show it)."""
        if not self._leading:
            self._cached = None
            self._observed_raw = None

    # -- the LeadershipProvider protocol ---------------------------------------------------

    async def acquire(self) -> LeaseRecord:
        """One attempt (``tryAcquireOrRenew``); :class:`LeaseHeldElsewhere` if it lost."""
        if await self.try_acquire_or_renew():
            record = self.observed
            assert record is not None
            return record
        raise LeaseHeldElsewhere(lease=self.display, record=self.observed)

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

    def drop(self) -> None:
        """Stop counting ourselves as holder without writing (the Lease was lost)."""
        self._leading = False

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
                logger.info("Lease released lease=%s identity=%s", self.display, self._identity)
                return
            except KubeApiError as exc:
                if not exc.conflict:
                    logger.warning("Lease release failed lease=%s error=%s", self.display, exc)
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
                logger.debug("Lease fast renew failed lease=%s error=%s", self.display, exc)
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
        if holder == self._identity and not self.holds_lease():
            # NB: still naming us, but our term ended (the renew deadline passed, or we gave
            # it up): taking it again is a new term with a new generation, so the old term's
            # fence never becomes valid again.
            holder = ""
        body = copy.deepcopy(current)
        taking_over = holder != self._identity
        self._stamp(body, now=now, taking_over=taking_over)
        try:
            updated = await self._replace(body)
        except KubeApiError as exc:
            if exc.conflict:
                self._leading = False
                return False
            raise
        self._remember(updated)
        self._leading = True
        self._last_renew_ok = sent_at
        if taking_over:
            logger.info(
                "Lease acquired lease=%s identity=%s previous=%s transitions=%s",
                self.display,
                self._identity,
                spec.get("holderIdentity") or "<none>",
                (updated.get("spec") or {}).get("leaseTransitions"),
            )
        return True

    async def renew(self) -> bool:
        """One renewal, bounded by what is left of the renew deadline; ``False`` when the
        Lease is lost (another holder, a lost race, or the deadline passed)."""
        try:
            ok = await asyncio.wait_for(
                self.try_acquire_or_renew(), timeout=max(self.remaining(), 0.05)
            )
        except (KubeApiError, TimeoutError) as exc:
            # NB: a TimeoutError has no message: name it, or the log says "error=".
            logger.warning(
                "Lease renew failed lease=%s error=%s", self.display, str(exc) or repr(exc)
            )
            ok = False
        if ok:
            return True
        if not self._leading or not self.holds_lease():
            self._leading = False
            logger.warning(
                "Lease lost lease=%s identity=%s holder=%s",
                self.display,
                self._identity,
                self.holder,
            )
            return False
        return True

    # -- pieces ----------------------------------------------------------------------------

    async def _replace(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._api.request(
            "PUT", self._path, body=body, verb="update", timeout_s=self._timing.request_timeout_s
        )

    async def _create(self, *, now: str, sent_at: float) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self._labels},
            "spec": {},
        }
        self._stamp(body, now=now, taking_over=True)
        floor = self._transitions_floor() if self._transitions_floor is not None else 0
        body["spec"]["leaseTransitions"] = max(0, floor)
        try:
            created = await self._api.request(
                "POST",
                leases_path(self.namespace),
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
        logger.info("Lease created lease=%s identity=%s", self.display, self._identity)
        return True

    def _stamp(self, body: dict[str, Any], *, now: str, taking_over: bool) -> None:
        spec = body.setdefault("spec", {})
        if taking_over:
            spec["acquireTime"] = now
            bumped = int(spec.get("leaseTransitions") or 0) + 1
            floor = self._transitions_floor() if self._transitions_floor is not None else 0
            spec["leaseTransitions"] = max(bumped, floor)
        spec["holderIdentity"] = self._identity
        spec["leaseDurationSeconds"] = int(self._timing.lease_duration_s)
        spec["renewTime"] = now
        metadata = body.setdefault("metadata", {})
        if self._labels:
            metadata.setdefault("labels", {}).update(self._labels)
        annotations = metadata.setdefault("annotations", {})
        annotations.update(self._annotations)
        annotations[HOST_ANNOTATION] = self._host
        if self._endpoint:
            annotations[resources.ENDPOINT_ANNOTATION] = self._endpoint
        else:
            annotations.pop(resources.ENDPOINT_ANNOTATION, None)

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
            workflow_path=self._describes,
            store=LeaseStoreKind.KUBERNETES,
            transitions=int(spec.get("leaseTransitions") or 0),
        )
