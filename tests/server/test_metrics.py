"""``/metrics`` scraped over HTTP and parsed, after real runs: success, failure, stops, tokens."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from lorenz.agents import PlacementFailed
from lorenz.model import slot_key
from lorenz.server import LorenzMetrics, MetricsLabelInUse
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.runtime.test_placement import POD, PodRunnerStandIn
from tests.server.helpers import GatedPool, PoolGoverns, issue, make_rig, release, serve
from tests.waiting import wait_until_async

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

FAKE_CODEX = Path(__file__).resolve().parent.parent / "fakes" / "codex_agent.py"
TOKEN_SCENARIO = FAKE_CODEX.parent / "scenarios" / "codex_token_usage.json"


CHATTY_EXCEPT_T3 = """
print("hello", flush=True)
while True:
    time.sleep(0.05)
    if env["LORENZ_ISSUE_IDENTIFIER"] != "T-3":
        print("still here", flush=True)
"""
"""Keeps reporting progress, except on T-3, which goes silent (and so stalls)."""


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse(await response.text())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def test_a_successful_run_is_counted_and_timed(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig)
    wf = str(rig.workflow.path)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 1,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 1",
    )

    during = await scrape(http, served.url)
    assert value(during, "lorenz_running_slots", workflow=wf) == 1
    assert value(during, "lorenz_retrying_slots", workflow=wf) == 0
    assert value(during, "lorenz_reserving_slots", workflow=wf) == 0
    assert value(during, "lorenz_blocked_slots", workflow=wf) == 0
    assert value(during, "lorenz_dispatches_total", workflow=wf) == 1
    assert value(during, "lorenz_run_outcomes_total", workflow=wf, outcome="success") == 0

    release(rig, "T-1")
    await rig.runtime.wait_for_runs()
    after = await scrape(http, served.url)

    assert value(after, "lorenz_running_slots", workflow=wf) == 0
    assert value(after, "lorenz_retrying_slots", workflow=wf) == 1
    assert value(after, "lorenz_run_outcomes_total", workflow=wf, outcome="success") == 1
    assert value(after, "lorenz_run_outcomes_total", workflow=wf, outcome="failed") == 0
    assert value(after, "lorenz_retries_total", workflow=wf, kind="continuation") == 1
    assert value(after, "lorenz_retries_total", workflow=wf, kind="failure") == 0
    assert value(after, "lorenz_run_duration_seconds_count", workflow=wf, outcome="success") == 1
    assert value(after, "lorenz_run_duration_seconds_sum", workflow=wf, outcome="success") > 0
    ticks = len(rig.of_type("poll_completed")) + len(rig.of_type("poll_error"))
    assert value(after, "lorenz_poll_duration_seconds_count", workflow=wf) == ticks
    assert value(after, "lorenz_poll_errors_total", workflow=wf) == 0
    # Dispatch latency: measured inside the tick that found the issue, so within its duration.
    latency = value(after, "lorenz_dispatch_latency_seconds_sum", workflow=wf)
    assert value(after, "lorenz_dispatch_latency_seconds_count", workflow=wf) == 1
    assert 0 <= latency <= value(after, "lorenz_poll_duration_seconds_sum", workflow=wf)


async def test_a_failed_run_and_a_poll_error_are_counted(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)], agent_body="sys.exit(3)\n")
    served = await serve(rig)
    wf = str(rig.workflow.path)

    await rig.runtime.poll_once(wait_for_runs=True)
    rig.tracker.fail_next(1, methods=["fetch_candidate_issues"])
    with pytest.raises(Exception, match="injected failure"):
        await rig.runtime.poll_once()
    samples = await scrape(http, served.url)

    assert value(samples, "lorenz_run_outcomes_total", workflow=wf, outcome="failed") == 1
    assert value(samples, "lorenz_retries_total", workflow=wf, kind="failure") == 1
    assert value(samples, "lorenz_run_duration_seconds_count", workflow=wf, outcome="failed") == 1
    assert value(samples, "lorenz_poll_errors_total", workflow=wf) == 1
    ticks = len(rig.of_type("poll_completed")) + len(rig.of_type("poll_error"))
    assert ticks >= 2
    assert value(samples, "lorenz_poll_duration_seconds_count", workflow=wf) == ticks
    assert value(samples, "lorenz_retrying_slots", workflow=wf) == 1


async def test_a_slot_that_used_up_its_retry_budget_is_a_blocked_slot(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(
        tmp_path,
        issues=[issue(1)],
        agent_body="sys.exit(3)\n",
        front_matter={"retry": {"max_attempts": 1}},
    )
    served = await serve(rig)
    wf = str(rig.workflow.path)

    await rig.runtime.poll_once(wait_for_runs=True)
    samples = await scrape(http, served.url)

    assert value(samples, "lorenz_blocked_slots", workflow=wf) == 1
    assert value(samples, "lorenz_retrying_slots", workflow=wf) == 0
    assert value(samples, "lorenz_running_slots", workflow=wf) == 0


async def test_reconcile_stops_are_counted_by_reason(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(
        tmp_path,
        issues=[issue(1), issue(2), issue(3)],
        agent_body=CHATTY_EXCEPT_T3,
        agent_settings={"stall_timeout_ms": 2000},
        front_matter={"agent": {"terminal_grace_ms": 0}},  # a terminal stop cancels at once
    )
    served = await serve(rig)
    wf = str(rig.workflow.path)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 3,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 3",
    )

    rig.tracker.set_state("id-1", "Done")  # terminal
    rig.tracker.set_state("id-2", "Backlog")  # no longer active
    # id-3's agent printed once and is silent since: a stall after 2 s. The chatty ones report
    # every 50 ms, so only a machine starved for 2 s could make them look stalled too.
    # NB: an output line, not just the session_started message (which comes before the agent's
    # interpreter has even started): T-3's silence is counted from its one line.
    await wait_until_async(
        lambda: all(e.last_agent_event == "output"
                    for e in rig.orchestrator.state.running.values()),
        timeout=15.0,
        what='all(e.last_agent_event == "output" for e in rig.orchestrator.state.running.values())',
    )
    # NB: poll until the stall is seen, not for a fixed time: the first poll stops id-1 and
    # id-2, a later one id-3 once it has been silent long enough.
    stalled = slot_key("id-3", 0)
    async with asyncio.timeout(60):
        while stalled in rig.orchestrator.state.running:
            await rig.runtime.poll_once()
            await asyncio.sleep(0.05)
    await rig.runtime.wait_for_runs()
    samples = await scrape(http, served.url)

    assert value(samples, "lorenz_reconcile_stops_total", workflow=wf, reason="terminal") == 1
    assert value(samples, "lorenz_reconcile_stops_total", workflow=wf, reason="inactive") == 1
    assert value(samples, "lorenz_reconcile_stops_total", workflow=wf, reason="stalled") == 1
    assert value(samples, "lorenz_reconcile_stops_total", workflow=wf, reason="missing") == 0
    assert value(samples, "lorenz_run_outcomes_total", workflow=wf, outcome="canceled") == 2
    assert value(samples, "lorenz_run_outcomes_total", workflow=wf, outcome="stalled") == 1
    assert value(samples, "lorenz_running_slots", workflow=wf) == 0


async def test_tokens_are_counted_from_agent_usage_reports(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    agent = write_agent(tmp_path, "unused", "pass\n")
    command = " ".join(shlex.quote(p) for p in (sys.executable, str(FAKE_CODEX),
                                                 str(TOKEN_SCENARIO)))
    workflow = write_workflow(
        tmp_path, agent_script=agent,
        front_matter={"agents": {"test": {"protocol": "codex-app-server", "command": command}}},
    )
    rig = build_rig(workflow, issues=[issue(1)])
    served = await serve(rig)
    wf = str(workflow)

    await rig.runtime.poll_once(wait_for_runs=True)
    samples = await scrape(http, served.url)

    assert rig.of_type("run_finished"), rig.events
    assert value(samples, "lorenz_tokens_total", workflow=wf, direction="input") == 90
    assert value(samples, "lorenz_tokens_total", workflow=wf, direction="output") == 30
    assert value(samples, "lorenz_run_outcomes_total", workflow=wf, outcome="success") == 1


async def test_dispatch_latency_of_a_pool_run_counts_from_the_tick_that_reserved_it(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    pool = GatedPool(["h1"])
    rig = make_rig(tmp_path, issues=[issue(1)], pool=pool, capacity=PoolGoverns())
    served = await serve(rig)
    wf = str(rig.workflow.path)

    await rig.runtime.poll_once()
    reserving = await scrape(http, served.url)
    assert value(reserving, "lorenz_reserving_slots", workflow=wf) == 1
    assert value(reserving, "lorenz_dispatch_latency_seconds_count", workflow=wf) == 0

    pool.gate.set()
    await wait_until_async(
        lambda: slot_key("id-1", 0) in rig.orchestrator.state.running,
        timeout=15.0,
        what='slot_key("id-1", 0) in rig.orchestrator.state.running',
    )
    started = await scrape(http, served.url)

    assert value(started, "lorenz_reserving_slots", workflow=wf) == 0
    assert value(started, "lorenz_running_slots", workflow=wf) == 1
    assert value(started, "lorenz_dispatch_latency_seconds_count", workflow=wf) == 1
    # The run started after its tick ended: the latency covers at least the whole tick.
    assert value(started, "lorenz_dispatch_latency_seconds_sum", workflow=wf) >= value(
        started, "lorenz_poll_duration_seconds_sum", workflow=wf
    )
    release(rig, "T-1")


async def test_several_runtimes_share_one_registry_under_workflow_labels(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rig_a = make_rig(tmp_path / "a", issues=[issue(1)], agent_body="print('ok')\n")
    rig_b = make_rig(tmp_path / "b", issues=[issue(1), issue(2)], agent_body="sys.exit(1)\n")
    metrics = LorenzMetrics()
    detach_a = metrics.attach(rig_a.runtime, workflow="team/a")
    metrics.attach(rig_b.runtime, workflow="team/b")
    with pytest.raises(MetricsLabelInUse) as refused:
        metrics.attach(rig_b.runtime, workflow="team/a")
    assert refused.value.code == "metrics_workflow_label_in_use"

    await rig_a.runtime.poll_once(wait_for_runs=True)
    await rig_b.runtime.poll_once(wait_for_runs=True)
    body, content_type = metrics.exposition()
    samples = parse(body.decode())

    assert content_type.startswith("text/plain")
    assert value(samples, "lorenz_dispatches_total", workflow="team/a") == 1
    assert value(samples, "lorenz_dispatches_total", workflow="team/b") == 2
    assert value(samples, "lorenz_run_outcomes_total", workflow="team/a", outcome="success") == 1
    assert value(samples, "lorenz_run_outcomes_total", workflow="team/b", outcome="failed") == 2
    assert value(samples, "lorenz_retrying_slots", workflow="team/b") == 2

    detach_a()
    await rig_a.runtime.poll_once(wait_for_runs=True)  # no longer counted anywhere
    after = parse(metrics.exposition()[0].decode())
    assert not any(("workflow", "team/a") in labels for _, labels in after)
    assert value(after, "lorenz_dispatches_total", workflow="team/b") == 2
    assert metrics.workflows == ["team/b"]


async def test_openmetrics_is_served_when_asked_for(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)

    async with http.get(
        f"{served.url}/metrics", headers={"Accept": "application/openmetrics-text"}
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = await response.text()
    assert text.rstrip().endswith("# EOF")
    assert "lorenz_running_slots" in text


async def test_each_app_has_its_own_registry(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rig_a = make_rig(tmp_path / "a", issues=[issue(1)], agent_body="print('ok')\n")
    rig_b = make_rig(tmp_path / "b", issues=[])
    served_a = await serve(rig_a)
    served_b = await serve(rig_b)

    await rig_a.runtime.poll_once(wait_for_runs=True)
    samples_a = await scrape(http, served_a.url)
    samples_b = await scrape(http, served_b.url)

    assert value(samples_a, "lorenz_dispatches_total", workflow=str(rig_a.workflow.path)) == 1
    assert value(samples_b, "lorenz_dispatches_total", workflow=str(rig_b.workflow.path)) == 0
    assert not any(("workflow", str(rig_a.workflow.path)) in labels for _, labels in samples_b)


def _same_but_created(
    ours: CollectorRegistry, theirs: CollectorRegistry, *, created_prefix: str
) -> list[str]:
    """Assert both registries expose the same samples (text and OpenMetrics) but for their
    ``_created`` lines; return our ``created_prefix`` lines."""

    def without_created(text: bytes) -> list[str]:
        return [line for line in text.decode().splitlines() if "_created" not in line]

    assert without_created(generate_latest(ours)) == without_created(generate_latest(theirs))
    assert without_created(openmetrics(ours)) == without_created(openmetrics(theirs))  # type: ignore[no-untyped-call]
    return [
        line
        for line in generate_latest(ours).decode().splitlines()
        if line.startswith(created_prefix)
    ]


def test_the_compact_series_expose_exactly_what_prometheus_client_would() -> None:
    from lorenz.server.metrics import RUN_DURATION_BUCKETS, _Family

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ("workflow", "outcome")
    counters = (_Family("x_runs", "Runs.", labels, registry=ours),
                Counter("x_runs", "Runs.", labels, registry=theirs))
    histograms = (
        _Family("x_seconds", "Time.", labels, registry=ours, buckets=RUN_DURATION_BUCKETS),
        Histogram("x_seconds", "Time.", labels, registry=theirs, buckets=RUN_DURATION_BUCKETS),
    )
    for family in (*counters, *histograms):
        family.labels("a/b", "success")
        family.labels("a/b", "failed")
        family.labels("c/d", "success")
    for counter in counters:
        counter.labels("a/b", "success").inc()
        counter.labels("a/b", "success").inc(2.5)
        counter.labels("c/d", "success").inc()
        counter.remove("c/d", "success")
    for histogram in histograms:
        for seconds in (0.0, 1.0, 4.999, 5.0, 61.0, 14400.0, 99999.0):
            histogram.labels("a/b", "success").observe(seconds)
        histogram.labels("a/b", "failed").observe(2.0)

    created = _same_but_created(ours, theirs, created_prefix="x_runs_created")
    assert len(created) == 2


async def test_a_pod_run_times_its_placement_and_counts_a_placement_failure_by_reason(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    runner = PodRunnerStandIn([
        PlacementFailed("exceeded quota: one-run-pod", code="pod_refused", reason="quota")
    ])
    rig = make_rig(tmp_path, issues=[issue(1)], front_matter=POD, runner_factory=runner)
    served = await serve(rig)
    wf = str(rig.workflow.path)
    fresh = await scrape(http, served.url)
    for reason in ("unschedulable", "image_pull", "container_config", "start_timeout", "quota"):
        assert value(fresh, "lorenz_placement_failures_total", workflow=wf, reason=reason) == 0
    assert value(fresh, "lorenz_placement_duration_seconds_count", workflow=wf) == 0

    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: bool(rig.of_type("placement_failed")),
        timeout=15.0,
        what='bool(rig.of_type("placement_failed"))',
    )
    refused = await scrape(http, served.url)
    assert value(refused, "lorenz_placement_failures_total", workflow=wf, reason="quota") == 1
    assert value(refused, "lorenz_placement_duration_seconds_count", workflow=wf) == 0
    assert value(refused, "lorenz_run_outcomes_total", workflow=wf, outcome="failed") == 0

    # placed after the placement wait: timed from its reservation to its binding
    await wait_until_async(
        lambda: bool(rig.of_type("run_started")),
        timeout=30,
        what='bool(rig.of_type("run_started"))',
    )
    placed = await scrape(http, served.url)
    assert value(placed, "lorenz_placement_duration_seconds_count", workflow=wf) == 1
    assert value(placed, "lorenz_placement_failures_total", workflow=wf, reason="quota") == 1
    assert value(placed, "lorenz_dispatches_total", workflow=wf) == 1


def test_zero_series_are_drawn_as_prometheus_client_would_show_them_made_at_attach() -> None:
    from lorenz.server.metrics import RUN_DURATION_BUCKETS, _Family

    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ("workflow", "outcome")
    zeros = (("success",), ("failed",))
    roster = {"a/b": 1000.0, "c/d": 2000.0}
    counters = (_Family("x_runs", "Runs.", labels, registry=ours, zeros=zeros, roster=roster),
                Counter("x_runs", "Runs.", labels, registry=theirs))
    histograms = (
        _Family("x_seconds", "Time.", labels, registry=ours, buckets=RUN_DURATION_BUCKETS,
                zeros=zeros, roster=roster),
        Histogram("x_seconds", "Time.", labels, registry=theirs, buckets=RUN_DURATION_BUCKETS),
    )
    # prometheus-client's children made eagerly, in the order ours are drawn: every zero of
    # each attached workflow, then the series beyond the zeros.
    for family in (counters[1], histograms[1]):
        for workflow in roster:
            for (outcome,) in zeros:
                family.labels(workflow, outcome)
        family.labels("a/b", "stalled")
    counters[0].labels("a/b", "failed", created=1000.0).inc(2)
    counters[1].labels("a/b", "failed").inc(2)
    counters[0].labels("a/b", "stalled", created=1000.0).inc()
    counters[1].labels("a/b", "stalled").inc()
    histograms[0].labels("c/d", "success", created=2000.0).observe(7.0)
    histograms[1].labels("c/d", "success").observe(7.0)
    histograms[0].labels("a/b", "stalled", created=1000.0)

    created = _same_but_created(ours, theirs, created_prefix="x_runs_created")
    # Drawn or touched, a series is created when its workflow was attached.
    assert created == [
        'x_runs_created{outcome="success",workflow="a/b"} 1000.0',
        'x_runs_created{outcome="failed",workflow="a/b"} 1000.0',
        'x_runs_created{outcome="success",workflow="c/d"} 2000.0',
        'x_runs_created{outcome="failed",workflow="c/d"} 2000.0',
        'x_runs_created{outcome="stalled",workflow="a/b"} 1000.0',
    ]
    del roster["c/d"]  # detached: its zeros are no longer drawn (its touched series are removed)
    histograms[0].remove("c/d", "success")
    assert "c/d" not in generate_latest(ours).decode()


async def test_an_attached_runtime_shows_every_known_series_at_zero_until_touched(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, issues=[])
    metrics = LorenzMetrics()
    metrics.attach(rig.runtime, workflow="team/a")
    samples = parse(metrics.exposition()[0].decode())
    label = {"workflow": "team/a"}
    assert value(samples, "lorenz_dispatches_total", **label) == 0
    assert value(samples, "lorenz_poll_errors_total", **label) == 0
    for outcome in ("success", "failed", "stalled", "canceled"):
        assert value(samples, "lorenz_run_outcomes_total", outcome=outcome, **label) == 0
        assert value(samples, "lorenz_run_duration_seconds_count", outcome=outcome, **label) == 0
    for kind in ("continuation", "failure"):
        assert value(samples, "lorenz_retries_total", kind=kind, **label) == 0
    for reason in ("terminal", "stalled", "claim_deleted"):
        assert value(samples, "lorenz_reconcile_stops_total", reason=reason, **label) == 0
    for reason in ("unschedulable", "quota"):
        assert value(samples, "lorenz_placement_failures_total", reason=reason, **label) == 0
    assert value(samples, "lorenz_poll_duration_seconds_count", **label) == 0
    assert value(samples, "lorenz_dispatch_latency_seconds_count", **label) == 0
    assert value(samples, "lorenz_placement_duration_seconds_count", **label) == 0
    created = value(samples, "lorenz_poll_duration_seconds_created", **label)

    await rig.runtime.poll_once(wait_for_runs=True)
    after = parse(metrics.exposition()[0].decode())
    assert value(after, "lorenz_poll_duration_seconds_count", **label) == 1
    assert value(after, "lorenz_poll_duration_seconds_created", **label) == created
    assert value(after, "lorenz_run_outcomes_total", outcome="success", **label) == 0
    assert len(after) == len(samples)


async def test_spend_and_the_days_remaining_budget_are_exposed(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    agent = write_agent(
        tmp_path,
        "reports_usage",
        "pathlib.Path(env['LORENZ_USAGE_FILE']).write_text(json.dumps("
        "{'input_tokens': 100, 'output_tokens': 20, 'cost_usd': 0.25}) + '\\n')\n",
    )
    workflow = write_workflow(
        tmp_path, agent_script=agent, front_matter={"budget": {"max_usd_per_day": 10}}
    )
    rig = build_rig(workflow, issues=[issue(1)])
    served = await serve(rig)
    wf = str(workflow)
    before = await scrape(http, served.url)
    assert value(before, "lorenz_spend_usd_total", workflow=wf) == 0
    assert value(before, "lorenz_budget_remaining_usd", workflow=wf) == 10

    await rig.runtime.poll_once(wait_for_runs=True)
    samples = await scrape(http, served.url)

    assert rig.of_type("run_finished"), rig.events
    assert value(samples, "lorenz_spend_usd_total", workflow=wf) == 0.25
    assert value(samples, "lorenz_budget_remaining_usd", workflow=wf) == 9.75
    assert value(samples, "lorenz_tokens_total", workflow=wf, direction="input") == 100
    assert value(samples, "lorenz_tokens_total", workflow=wf, direction="output") == 20
