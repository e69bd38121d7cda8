"""Prometheus metrics for one or many runtimes, each series labelled by ``workflow``.

Why not prometheus-client's module-level metrics on the default registry: a test process builds
dozens of runtimes, and the Kubernetes operator serves several Workflows from one process, so
global metrics would either collide or mix workflows. :class:`LorenzMetrics` owns its own
:class:`~prometheus_client.CollectorRegistry`; any number of runtimes attach to it, each under a
``workflow`` label, and detach again (their series disappear) when a Workflow goes away.

Two feeds, chosen per metric for accuracy and cost:

* lane gauges and token counters are read from the orchestrator's state **at scrape time**
  (``len()`` of a few dicts and one pass over running entries): always exact, nothing to keep
  in sync, and no snapshot is built;
* counters and histograms of things that *happen* (dispatches, outcomes, retries, poll errors,
  reconcile stops, durations, latencies) are fed by the runtime's **event listener**.

Dispatch latency is the time from the start of the poll tick that selected a slot to the
``run_started`` event of its run. The runtime emits no "tick started" event, but the tick's
closing ``poll_completed`` / ``poll_error`` event carries the tick's ``duration_ms``, so the start
is ``at - duration_ms``: the ``run_started`` events seen during a tick are held until it closes,
then observed. A pool-governed slot that only binds a host after its tick ended is observed
when its ``run_started`` arrives, against the start of the tick that reserved it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from lorenz.codes import ErrorCode
from lorenz.model import (
    EventType,
    LorenzError,
    RetryKind,
    RunOutcome,
    RuntimeEvent,
    SlotKey,
    StopReason,
    slot_key,
)
from lorenz.runtime import LorenzRuntime

WORKFLOW_LABEL = "workflow"

POLL_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RUN_DURATION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
                        7200.0, 14400.0)
DISPATCH_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                            5.0, 10.0, 30.0, 60.0)
ANSWER_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0)
"""``lorenz_answer_wait_seconds`` buckets: a person answers in minutes to days."""
PLACEMENT_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
PLACEMENT_REASONS = ("unschedulable", "image_pull", "container_config", "start_timeout", "quota")
"""``lorenz_placement_failures_total`` reasons (``PlacementFailed.reason`` of the Pod runner)."""

STALLED_REASON = "stalled"
"""``lorenz_reconcile_stops_total`` reason for a run stopped by stall reconciliation."""
CLAIM_DELETED_REASON = "claim_deleted"
"""... and for a run cancelled from outside (a deleted ``Claim``)."""
KNOWN_STOP_REASONS = (*(r.value for r in StopReason), STALLED_REASON, CLAIM_DELETED_REASON)

_PENDING_CAP = 10_000
"""Bound on starts/reservations waiting for their tick's end (a tick never closes on a crash)."""

_END_OUTCOMES: dict[EventType, str] = {
    EventType.RUN_FINISHED: RunOutcome.SUCCESS.value,
    EventType.RUN_FAILED: RunOutcome.FAILED.value,
    EventType.RUN_STALLED: RunOutcome.STALLED.value,
    EventType.RUN_CANCELED: RunOutcome.CANCELED.value,
}


class _Series:
    """One labelled series of a counter or a histogram.

    NB: prometheus-client's own children keep a lock-guarded value object per bucket — about
    200 objects and 36 KiB for the series one workflow starts with (every outcome, retry kind
    and stop reason at zero), most of an idle Workflow's memory in the operator. These series
    are fed by the runtime's event listener and read by scrapes, both on the event loop's
    thread, so a plain slot per value does.
    """

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...], *, created: float | None = None) -> None:
        self.bounds = bounds
        """Upper bounds of a histogram's buckets, ``+Inf`` last (empty for a counter)."""
        self.counts: list[int] = [0] * len(bounds)
        """Observations per bucket (not cumulative)."""
        self.total = 0.0
        """A counter's value, a histogram's sum."""
        self.created = time.time() if created is None else created

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.total += amount

    def observe(self, amount: float) -> None:
        self.total += amount
        for index, bound in enumerate(self.bounds):
            if amount <= bound:
                self.counts[index] += 1
                return


class _Family(Collector):
    """A labelled counter or histogram, exposed exactly as prometheus-client's would be
    (``_total``/``_created``; ``_bucket``/``_count``/``_sum``/``_created``).

    ``zeros`` (with ``roster``, the attached workflows and when each was attached): the label
    values after ``workflow`` every attached workflow shows from the start, at zero, until
    something touches them (then they are real series, with the same ``_created``).

    NB: these zero series were real series made at attach: ~30 per Workflow, most of them
    never touched (every outcome, retry kind, stop reason and placement failure reason), ~13
    KiB per led Workflow in the operator. Drawn at scrape time, they cost nothing until then.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        *,
        registry: CollectorRegistry,
        buckets: tuple[float, ...] | None = None,
        zeros: tuple[tuple[str, ...], ...] = (),
        roster: Mapping[str, float] | None = None,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = labelnames
        self._type = "counter" if buckets is None else "histogram"
        self._bounds: tuple[float, ...] = () if buckets is None else (*buckets, math.inf)
        self._le: tuple[str, ...] = tuple(
            floatToGoString(b) for b in self._bounds  # type: ignore[no-untyped-call]
        )
        self._series: dict[tuple[str, ...], _Series] = {}
        self._zeros = zeros
        self._zero_set = frozenset(zeros)
        self._roster: Mapping[str, float] = roster if roster is not None else {}
        registry.register(self)

    def labels(self, *values: str, created: float | None = None) -> _Series:
        """The series of ``values`` (made at the first call; ``created``: its ``_created``)."""
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
            series = self._series[values] = _Series(self._bounds, created=created)
        return series

    def remove(self, *values: str) -> None:
        del self._series[values]

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, self._type)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._documentation, self._type)
        known = self._series
        for workflow, created in list(self._roster.items()):
            for extra in self._zeros:
                values = (workflow, *extra)
                series = known.get(values)
                if series is None:
                    self._sample(metric, values, total=0.0, counts=(), created=created)
                else:
                    self._sample(metric, values, total=series.total, counts=series.counts,
                                 created=series.created)
        for values, series in list(known.items()):
            if values[1:] in self._zero_set and values[0] in self._roster:
                continue  # NB: drawn above, with the zeros of its workflow
            self._sample(metric, values, total=series.total, counts=series.counts,
                         created=series.created)
        return [metric]

    def _sample(
        self,
        metric: Metric,
        values: tuple[str, ...],
        *,
        total: float,
        counts: Iterable[int],
        created: float,
    ) -> None:
        name = metric.name
        labels = dict(zip(self._labelnames, values, strict=True))
        if self._type == "counter":
            metric.add_sample(f"{name}_total", labels, total)
            metric.add_sample(f"{name}_created", labels, created)
            return
        cumulative = 0
        counted = iter(counts)
        for le in self._le:
            cumulative += next(counted, 0)
            metric.add_sample(f"{name}_bucket", {**labels, "le": le}, float(cumulative))
        metric.add_sample(f"{name}_count", labels, float(cumulative))
        metric.add_sample(f"{name}_sum", labels, total)
        metric.add_sample(f"{name}_created", labels, created)


class MetricsLabelInUse(LorenzError):
    code = ErrorCode.METRICS_WORKFLOW_LABEL_IN_USE


@dataclasses.dataclass(slots=True)
class _Feed:
    """One attached runtime and what its event stream has told us so far."""

    workflow: str
    runtime: LorenzRuntime
    created: float = dataclasses.field(default_factory=time.time)
    """When it was attached: the ``_created`` of its series (drawn at zero until touched)."""
    remove_listener: Callable[[], None] | None = None
    run_started_at: dict[SlotKey, datetime.datetime] = dataclasses.field(default_factory=dict)
    tick_starts: list[tuple[SlotKey, datetime.datetime]] = dataclasses.field(default_factory=list)
    tick_reservations: set[SlotKey] = dataclasses.field(default_factory=set)
    reserved_in_tick: collections.OrderedDict[SlotKey, datetime.datetime] = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    reserved_at: collections.OrderedDict[SlotKey, datetime.datetime] = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    """When each slot now being placed was reserved (its placement time ends at the bind)."""
    series: set[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=set)
    """Every (metric, label values) this workflow touched, to remove them on detach (its
    untouched zero series are drawn while it is attached, see :class:`_Family`)."""


class LorenzMetrics:
    """A registry of Lorenz metrics that any number of runtimes feed (see the module docstring)."""

    def __init__(self, *, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._feeds: dict[str, _Feed] = {}
        self._attached: dict[str, float] = {}
        """Attached workflow label → when (the roster of the zero series)."""
        wf = (WORKFLOW_LABEL,)
        # NB: every known series of an attached workflow shows at zero from the start, so
        # rates and absent-alerts work at once (see _Family: drawn, not kept).
        one: tuple[tuple[str, ...], ...] = ((),)
        self._dispatches = _Family(
            "lorenz_dispatches", "Runs started (a slot bound to a worker and its agent launched).",
            wf, registry=self.registry, zeros=one, roster=self._attached,
        )
        self._outcomes = _Family(
            "lorenz_run_outcomes", "Runs ended, by outcome (success, failed, stalled, canceled).",
            (*wf, "outcome"), registry=self.registry,
            zeros=tuple((o.value,) for o in RunOutcome), roster=self._attached,
        )
        self._retries = _Family(
            "lorenz_retries", "Retries scheduled, by kind (continuation, failure).",
            (*wf, "kind"), registry=self.registry,
            zeros=tuple((k.value,) for k in RetryKind), roster=self._attached,
        )
        self._poll_errors = _Family(
            "lorenz_poll_errors", "Poll ticks that ended in an error.", wf, registry=self.registry,
            zeros=one, roster=self._attached,
        )
        self._reconcile_stops = _Family(
            "lorenz_reconcile_stops",
            "Runs stopped by reconciliation, by reason (terminal, inactive, unrouted, blocked, "
            "missing, stalled, claim_deleted).",
            (*wf, "reason"), registry=self.registry,
            zeros=tuple((r,) for r in KNOWN_STOP_REASONS), roster=self._attached,
        )
        self._poll_duration = _Family(
            "lorenz_poll_duration_seconds", "Duration of one poll tick (successful or not).",
            wf, registry=self.registry, buckets=POLL_DURATION_BUCKETS,
            zeros=one, roster=self._attached,
        )
        self._run_duration = _Family(
            "lorenz_run_duration_seconds", "Duration of one run, from run start to its end.",
            (*wf, "outcome"), registry=self.registry, buckets=RUN_DURATION_BUCKETS,
            zeros=tuple((o.value,) for o in RunOutcome), roster=self._attached,
        )
        self._dispatch_latency = _Family(
            "lorenz_dispatch_latency_seconds",
            "Start of the poll tick that selected a slot to the start of its run.",
            wf, registry=self.registry, buckets=DISPATCH_LATENCY_BUCKETS,
            zeros=one, roster=self._attached,
        )
        self._placement = _Family(
            "lorenz_placement_duration_seconds",
            "A reservation to its binding: for a run in a Pod, creating the Pod until its worker "
            "serves (the Pod's start).",
            wf, registry=self.registry, buckets=PLACEMENT_BUCKETS,
            zeros=one, roster=self._attached,
        )
        self._answer_wait = _Family(
            "lorenz_answer_wait_seconds",
            "An agent's question to its answer (any channel): how long the slot waited.",
            wf, registry=self.registry, buckets=ANSWER_BUCKETS,
            zeros=one, roster=self._attached,
        )
        self._placement_failures = _Family(
            "lorenz_placement_failures",
            "Runs not placed, their reservation given back, by reason (unschedulable, "
            "image_pull, container_config, start_timeout, quota).",
            (*wf, "reason"), registry=self.registry,
            zeros=tuple((r,) for r in PLACEMENT_REASONS), roster=self._attached,
        )
        self._webhooks = _Family(
            "lorenz_webhook_requests",
            "Webhook deliveries, by tracker kind and outcome (accepted, ignored, or the code "
            "they were refused with).",
            (*wf, "tracker", "outcome"), registry=self.registry,
        )
        self.registry.register(_StateCollector(self._feeds))

    # ---------------------------------------------------------------- attaching

    @property
    def workflows(self) -> list[str]:
        """The ``workflow`` label values currently attached."""
        return list(self._feeds)

    def attach(self, runtime: LorenzRuntime, *, workflow: str | None = None) -> Callable[[], None]:
        """Feed this registry from ``runtime``; returns the matching :meth:`detach` call.

        ``workflow`` is the label value (default: the workflow file path). The operator passes
        ``<namespace>/<name>``.
        """
        label = workflow if workflow is not None else str(runtime.workflow.path)
        if label in self._feeds:
            raise MetricsLabelInUse(
                f"a runtime is already attached under workflow={label!r}; detach it first or "
                "choose another workflow label"
            )
        feed = _Feed(workflow=label, runtime=runtime)
        self._feeds[label] = feed
        self._attached[label] = feed.created
        feed.remove_listener = runtime.add_event_listener(lambda event: self._on_event(feed, event))
        return lambda: self.detach(label)

    def detach(self, workflow: str) -> None:
        """Stop feeding from that workflow's runtime and drop all of its series."""
        feed = self._feeds.pop(workflow, None)
        if feed is None:
            return
        self._attached.pop(workflow, None)
        if feed.remove_listener is not None:
            feed.remove_listener()
        metrics = self._by_name()
        for name, labels in feed.series:
            metric = metrics[name]
            with contextlib.suppress(KeyError):
                metric.remove(*labels)

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)`` for a scrape, in the format the ``Accept`` header asks for."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    # ---------------------------------------------------------------- feeding

    def _by_name(self) -> dict[str, _Family]:
        return {
            "dispatches": self._dispatches,
            "outcomes": self._outcomes,
            "retries": self._retries,
            "poll_errors": self._poll_errors,
            "reconcile_stops": self._reconcile_stops,
            "poll_duration": self._poll_duration,
            "run_duration": self._run_duration,
            "dispatch_latency": self._dispatch_latency,
            "placement": self._placement,
            "placement_failures": self._placement_failures,
            "webhooks": self._webhooks,
            "answer_wait": self._answer_wait,
        }

    def count_webhook(self, *, workflow: str, tracker: str, outcome: str) -> None:
        """Count one webhook delivery to ``workflow``'s route (its series go on detach)."""
        feed = self._feeds.get(workflow)
        if feed is not None:
            self._child(feed, "webhooks", tracker, outcome).inc()
        else:
            self._webhooks.labels(workflow, tracker, outcome).inc()

    def _child(self, feed: _Feed, name: str, *extra: str) -> _Series:
        labels = (feed.workflow, *extra)
        feed.series.add((name, labels))
        return self._by_name()[name].labels(*labels, created=feed.created)

    def _on_event(self, feed: _Feed, event: RuntimeEvent) -> None:
        kind = event.type
        if kind is EventType.RUN_UPDATE:
            return  # the bulk of the traffic; tokens are read at scrape time
        at = event.at
        key = _slot_of(event)
        if kind is EventType.RUN_STARTED:
            self._child(feed, "dispatches").inc()
            if key is None:
                return
            feed.run_started_at[key] = at
            reserved = feed.reserved_at.pop(key, None)
            if reserved is not None:
                self._child(feed, "placement").observe(max((at - reserved).total_seconds(), 0.0))
            feed.tick_reservations.discard(key)
            tick_start = feed.reserved_in_tick.pop(key, None)
            if tick_start is not None:
                self._observe_latency(feed, started=at, tick_start=tick_start)
            elif len(feed.tick_starts) < _PENDING_CAP:
                feed.tick_starts.append((key, at))
        elif kind is EventType.RUN_RESERVING:
            if key is not None:
                feed.reserved_at[key] = at
                while len(feed.reserved_at) > _PENDING_CAP:
                    feed.reserved_at.popitem(last=False)
            if key is not None and len(feed.tick_reservations) < _PENDING_CAP:
                feed.tick_reservations.add(key)
        elif kind in (EventType.DISPATCH_SKIPPED, EventType.PLACEMENT_FAILED):
            if kind is EventType.PLACEMENT_FAILED:
                self._child(feed, "placement_failures", event.reason or "unknown").inc()
            if key is not None:
                feed.reserved_at.pop(key, None)
                feed.reserved_in_tick.pop(key, None)
                feed.tick_reservations.discard(key)
        elif kind in (EventType.POLL_COMPLETED, EventType.POLL_ERROR):
            self._on_tick_end(feed, event, at=at, error=kind is EventType.POLL_ERROR)
        elif kind in _END_OUTCOMES:
            outcome = event.outcome or _END_OUTCOMES[kind]
            self._child(feed, "outcomes", outcome).inc()
            started = feed.run_started_at.pop(key, None) if key is not None else None
            if started is not None:
                seconds = max((at - started).total_seconds(), 0.0)
                self._child(feed, "run_duration", outcome).observe(seconds)
            if kind is EventType.RUN_CANCELED:
                self._child(feed, "reconcile_stops", event.reason or "unknown").inc()
            elif kind is EventType.RUN_STALLED:
                self._child(feed, "reconcile_stops", STALLED_REASON).inc()
        elif kind is EventType.RETRY_SCHEDULED:
            self._child(feed, "retries", event.retry_kind or "unknown").inc()
        elif kind is EventType.INPUT_ANSWERED and event.duration_ms is not None:
            self._child(feed, "answer_wait").observe(max(event.duration_ms / 1000.0, 0.0))
        elif kind is EventType.STOPPING:
            feed.reserved_at.clear()
            feed.tick_starts.clear()
            feed.tick_reservations.clear()
            feed.reserved_in_tick.clear()

    def _on_tick_end(
        self, feed: _Feed, event: RuntimeEvent, *, at: datetime.datetime, error: bool
    ) -> None:
        if error:
            self._child(feed, "poll_errors").inc()
        duration_ms = event.duration_ms
        if duration_ms is None:
            feed.tick_starts.clear()
            feed.tick_reservations.clear()
            return
        self._child(feed, "poll_duration").observe(max(float(duration_ms), 0.0) / 1000.0)
        tick_start = at - datetime.timedelta(milliseconds=float(duration_ms))
        for _, started in feed.tick_starts:
            self._observe_latency(feed, started=started, tick_start=tick_start)
        feed.tick_starts.clear()
        for key in feed.tick_reservations:
            feed.reserved_in_tick[key] = tick_start
        feed.tick_reservations.clear()
        while len(feed.reserved_in_tick) > _PENDING_CAP:
            feed.reserved_in_tick.popitem(last=False)

    def _observe_latency(
        self, feed: _Feed, *, started: datetime.datetime, tick_start: datetime.datetime
    ) -> None:
        seconds = max((started - tick_start).total_seconds(), 0.0)
        self._child(feed, "dispatch_latency").observe(seconds)


class _StateCollector(Collector):
    """Lane gauges and token counters, read from each orchestrator when scraped."""

    def __init__(self, feeds: Mapping[str, _Feed]) -> None:
        self._feeds = feeds

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        return list(self._families(fill=True))

    def _families(self, *, fill: bool = False) -> Iterator[Metric]:
        gauges = {
            "running": GaugeMetricFamily(
                "lorenz_running_slots", "Slots with a run in flight.", labels=[WORKFLOW_LABEL]
            ),
            "reserving": GaugeMetricFamily(
                "lorenz_reserving_slots", "Slots reserved while a worker pool finds a host.",
                labels=[WORKFLOW_LABEL],
            ),
            "retrying": GaugeMetricFamily(
                "lorenz_retrying_slots", "Slots waiting for their retry to come due.",
                labels=[WORKFLOW_LABEL],
            ),
            "blocked": GaugeMetricFamily(
                "lorenz_blocked_slots", "Slots waiting for operator input.",
                labels=[WORKFLOW_LABEL],
            ),
            "waiting": GaugeMetricFamily(
                "lorenz_waiting_slots",
                "Slots waiting for the answer to their agent's question.",
                labels=[WORKFLOW_LABEL],
            ),
        }
        tokens = CounterMetricFamily(
            "lorenz_tokens", "Agent tokens used (ended runs plus runs in flight), by direction.",
            labels=[WORKFLOW_LABEL, "direction"],
        )
        spend = CounterMetricFamily(
            "lorenz_spend_usd",
            "USD this process charged to the spend ledger (priced tokens, or the agent's own "
            "cost).",
            labels=[WORKFLOW_LABEL],
        )
        remaining = GaugeMetricFamily(
            "lorenz_budget_remaining_usd",
            "What budget.max_usd_per_day leaves of the UTC day's spend (only while it is set).",
            labels=[WORKFLOW_LABEL],
        )
        if fill:
            for label, feed in self._feeds.items():
                state = feed.runtime.orchestrator.state
                gauges["running"].add_metric([label], len(state.running))
                gauges["reserving"].add_metric([label], len(state.reserved))
                gauges["retrying"].add_metric([label], len(state.retry_attempts))
                waiting = sum(1 for blocked in state.blocked.values() if blocked.waiting)
                gauges["blocked"].add_metric([label], len(state.blocked) - waiting)
                gauges["waiting"].add_metric([label], waiting)
                totals = state.usage_totals
                input_tokens = totals.input_tokens
                output_tokens = totals.output_tokens
                for entry in state.running.values():
                    input_tokens += entry.usage.input_tokens
                    output_tokens += entry.usage.output_tokens
                tokens.add_metric([label, "input"], input_tokens)
                tokens.add_metric([label, "output"], output_tokens)
                spending = feed.runtime.spending
                spend.add_metric([label], spending.charged_usd)
                cap = feed.runtime.settings.budget.max_usd_per_day
                if cap > 0:
                    remaining.add_metric([label], max(cap - spending.day_total().usd, 0.0))
        yield from gauges.values()
        yield tokens
        yield spend
        yield remaining


def _slot_of(event: RuntimeEvent) -> SlotKey | None:
    if event.issue_id is None or event.slot is None or event.slot < 0:
        return None
    return slot_key(event.issue_id, event.slot)
