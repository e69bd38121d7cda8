"""The runtime end to end with real agent subprocesses: dispatch, retries, stalls, reconcile."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import itertools
import json
from pathlib import Path

import psutil
import pytest

from lorenz.daemon.logs import configure_for_workflow
from lorenz.model import Issue, ManualClock, RetryKind, slot_key
from lorenz.workflow import load_workflow
from tests.runtime.harness import build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async


def issue(n: int, *, state: str = "Todo", priority: int | None = 2, **kw: object) -> Issue:
    return Issue(
        id=f"id-{n}",
        identifier=f"T-{n}",
        title=f"Issue {n}",
        state=state,
        priority=priority,
        created_at=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        + datetime.timedelta(minutes=n),
        **kw,  # type: ignore[arg-type]
    )


RECORDING_AGENT = """
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
(ws / "prompt.txt").write_text(prompt)
(ws / "env.json").write_text(json.dumps(dict(env)))
print("working on", env["LORENZ_ISSUE_IDENTIFIER"], flush=True)
"""


async def test_once_mode_runs_every_eligible_issue_and_schedules_continuations(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent,
                        front_matter={"agents": {"test": {
                            "protocol": "command", "command": f"python3 {agent}",
                            "env": {"LINEAR_API_KEY": "sentinel-secret", "EXTRA": "yes"}}}})
    rig = build_rig(wf, issues=[issue(1), issue(2), issue(3, state="Backlog")])
    await rig.runtime.start(once=True)

    finished = rig.of_type("run_finished")
    assert sorted(e["identifier"] for e in finished) == ["T-1", "T-2"]
    ws1 = tmp_path / "workspaces" / "T-1"
    assert (ws1 / "prompt.txt").read_text().strip() == "Work on T-1 attempt="
    env = json.loads((ws1 / "env.json").read_text())
    assert env["LORENZ_ISSUE_ID"] == "id-1"
    assert env["LORENZ_ATTEMPT"] == ""
    assert env["EXTRA"] == "yes"
    assert "LINEAR_API_KEY" not in env
    retries = rig.orchestrator.state.retry_attempts
    assert {k: (r.kind, r.attempt) for k, r in retries.items()} == {
        slot_key("id-1", 0): (RetryKind.CONTINUATION, 1),
        slot_key("id-2", 0): (RetryKind.CONTINUATION, 1),
    }
    assert not rig.orchestrator.state.claimed
    snapshot = rig.runtime.snapshot().to_dict()
    assert [h["outcome"] for h in snapshot["run_history"]] == ["success", "success"]
    assert snapshot["app_status"] == "stopped"


async def test_failing_agent_retries_with_exact_exponential_backoff(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "fail", "print('boom', file=sys.stderr); sys.exit(3)\n")
    wf = write_workflow(tmp_path, agent_script=agent,
                        front_matter={"agent": {"max_retry_backoff_ms": 30000},
                                      "retry": {"max_attempts": 5}})
    clock = ManualClock()
    rig = build_rig(wf, issues=[issue(1)], clock=clock)
    key = slot_key("id-1", 0)
    expected = [(1, 10000), (2, 20000), (3, 30000), (4, 30000)]
    for attempt, delay in expected:
        await rig.runtime.poll_once(wait_for_runs=True)
        retry = rig.orchestrator.state.retry_attempts[key]
        assert retry.kind is RetryKind.FAILURE
        assert retry.attempt == attempt
        assert retry.due_at_ms - clock.monotonic_ms() == delay
        assert "agent_exited" in (retry.error or "")
        # Not due yet: a poll just before the deadline dispatches nothing.
        clock.advance(delay - 1)
        await rig.runtime.poll_once(wait_for_runs=True)
        assert rig.orchestrator.state.retry_attempts[key].attempt == attempt
        clock.advance(1)
    failed = rig.of_type("run_failed")
    assert len(failed) == 4
    # the prompt saw the retry attempt number on the later runs
    assert [h["attempt"] for h in reversed(rig.runtime.snapshot().to_dict()["run_history"])] == [
        None, 1, 2, 3]


async def test_stalled_run_is_aborted_its_process_killed_and_retried(tmp_path: Path) -> None:
    agent = write_agent(
        tmp_path,
        "hang",
        "note('pid', str(os.getpid()))\n"
        "time.sleep(120)\n",
    )
    wf = write_workflow(tmp_path, agent_script=agent,
                        front_matter={"agents": {"test": {
                            "protocol": "command", "command": f"python3 {agent}",
                            "stall_timeout_ms": 1000}}})
    clock = ManualClock()
    rig = build_rig(wf, issues=[issue(1)], clock=clock)
    await rig.runtime.poll_once()
    pid_file = tmp_path / "workspaces" / "T-1" / "pid"
    await wait_until_async(pid_file.exists, timeout=10.0, what="pid_file.exists")
    pid = int(pid_file.read_text())
    clock.advance(1001)
    await rig.runtime.poll_once()
    stalled = rig.of_type("run_stalled")
    assert len(stalled) == 1
    assert "stalled for 1001ms" in stalled[0]["message"]
    await rig.runtime.wait_for_runs()
    await wait_until_async(
        lambda: not psutil.pid_exists(pid)
        or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        timeout=10.0,
        what=f"process {pid} to be gone or a zombie",
    )
    retry = rig.orchestrator.state.retry_attempts[slot_key("id-1", 0)]
    assert (retry.kind, retry.attempt) == (RetryKind.FAILURE, 1)
    assert [h["outcome"] for h in rig.runtime.snapshot().to_dict()["run_history"]] == ["stalled"]
    assert not rig.of_type("run_failed"), "a stalled run records one outcome only"


HEARTBEAT_AGENT = """
note('pid', str(os.getpid()))
while True:
    print('tick', flush=True)
    time.sleep(0.05)
"""


@pytest.mark.parametrize(("new_state", "workspace_kept"), [("Done", False), ("Backlog", True)])
async def test_reconciliation_stops_a_run_whose_issue_left_the_active_states(
    tmp_path: Path, new_state: str, workspace_kept: bool
) -> None:
    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    # No grace: a terminal issue's run is stopped at once (test_terminal_grace covers grace).
    wf = write_workflow(tmp_path, agent_script=agent,
                        front_matter={"agent": {"terminal_grace_ms": 0}})
    rig = build_rig(wf, issues=[issue(1)])
    await rig.runtime.poll_once()
    ws = tmp_path / "workspaces" / "T-1"
    await wait_until_async((ws / "pid").exists, timeout=10.0, what='(ws / "pid").exists')
    pid = int((ws / "pid").read_text())
    rig.tracker.set_state("id-1", new_state)
    await rig.runtime.poll_once()
    await rig.runtime.wait_for_runs()
    canceled = rig.of_type("run_canceled")
    assert len(canceled) == 1
    reason = "terminal" if new_state == "Done" else "inactive"
    assert canceled[0]["reason"] == reason
    assert ws.exists() is workspace_kept
    assert bool(rig.of_type("workspace_cleanup")) is (not workspace_kept)
    if not workspace_kept:
        # The one line about it names what went (the manager's own line is DEBUG).
        assert [e["removed"] for e in rig.of_type("workspace_cleanup")] == [[str(ws)]]
    assert not rig.orchestrator.state.running
    assert not rig.orchestrator.state.retry_attempts
    assert [h["outcome"] for h in rig.runtime.snapshot().to_dict()["run_history"]] == ["canceled"]
    await wait_until_async(
        lambda: not psutil.pid_exists(pid)
        or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        timeout=10.0,
        what=f"process {pid} to be gone or a zombie",
    )


async def test_refresh_failure_keeps_runs_alive(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: (tmp_path / "workspaces" / "T-1" / "pid").exists(),
        timeout=10.0,
        what='(tmp_path / "workspaces" / "T-1" / "pid").exists()',
    )
    rig.tracker.fail_next(1, methods=["fetch_issues_by_ids"])
    rig.tracker.set_state("id-1", "Done")
    await rig.runtime.poll_once()
    assert rig.of_type("reconcile_refresh_failed")
    assert slot_key("id-1", 0) in rig.orchestrator.state.running
    rig.runtime.stop()
    await rig.runtime.wait_for_runs()


async def test_a_failed_dispatch_validation_aborts_the_tick_before_reconciliation(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: (tmp_path / "workspaces" / "T-1" / "pid").exists(),
        timeout=10.0,
        what='(tmp_path / "workspaces" / "T-1" / "pid").exists()',
    )
    # Break the dispatch config on disk: the reload keeps the old workflow...
    wf.write_text(wf.read_text().replace("kind: memory", "kind: linear"))
    rig.tracker.reset_counters()
    await rig.runtime.poll_once()
    assert rig.of_type("workflow_reload_failed")
    assert rig.tracker.calls["fetch_issues_by_ids"] == 1
    # ...and with no last-known-good to fall back on, validation aborts the whole tick.
    broken = rig.workflow.settings.model_copy(
        update={"tracker": rig.workflow.settings.tracker.model_copy(update={"kind": None})})
    rig.runtime._parts.workflow.current = rig.runtime.workflow.__class__(
        **{**{f: getattr(rig.runtime.workflow, f) for f in rig.runtime.workflow.__slots__},
           "settings": broken})
    rig.tracker.reset_counters()
    with pytest.raises(Exception, match="missing_tracker_kind"):
        await rig.runtime.poll_once()
    assert rig.tracker.calls["fetch_issues_by_ids"] == 0
    assert rig.tracker.calls["fetch_candidate_issues"] == 0
    assert rig.of_type("poll_error")[-1]["code"] == "missing_tracker_kind"
    rig.runtime.stop()
    await rig.runtime.wait_for_runs()


async def test_dry_run_dispatches_nothing(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1), issue(2)])
    await rig.runtime.start(once=True, dry_run=True)
    assert sorted(e["identifier"] for e in rig.of_type("dry_run")) == ["T-1", "T-2"]
    assert not rig.of_type("run_started")
    assert not (tmp_path / "workspaces").exists() or not any((tmp_path / "workspaces").iterdir())


async def test_concurrent_polls_serialize_and_merge(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    gate = asyncio.Event()
    fetch = rig.tracker.fetch_candidate_issues

    async def gated_fetch() -> list[Issue]:
        await gate.wait()
        issues: list[Issue] = await fetch()
        return issues

    rig.tracker.fetch_candidate_issues = gated_fetch
    first = asyncio.create_task(rig.runtime.poll_once(dry_run=True))
    await wait_until_async(
        lambda: rig.runtime.poll_count == 1,
        timeout=10.0,
        what="rig.runtime.poll_count == 1",
    )
    queued = [asyncio.create_task(rig.runtime.poll_once(dry_run=d)) for d in (True, False, True)]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in [first, *queued]), "polls must wait for the one running"
    gate.set()
    await asyncio.gather(first, *queued)
    # one tick for the first request, one merged tick for the three queued (dry AND → real)
    assert rig.runtime.poll_count == 2
    assert len(rig.of_type("dry_run")) == 1
    assert len(rig.of_type("run_started")) == 1
    await rig.runtime.wait_for_runs()


async def test_stop_aborts_runs_as_a_clean_shutdown(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1), issue(2)])
    task = asyncio.create_task(rig.runtime.start())
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 2,
        timeout=10.0,
        what="len(rig.orchestrator.state.running) == 2",
    )
    ws = tmp_path / "workspaces"
    await wait_until_async(
        lambda: (ws / "T-1" / "pid").exists() and (ws / "T-2" / "pid").exists(),
        timeout=10.0,
        what='(ws / "T-1" / "pid").exists() and (ws / "T-2" / "pid").exists()',
    )
    pids = [int((ws / f"T-{n}" / "pid").read_text()) for n in (1, 2)]
    rig.runtime.stop()
    rig.runtime.stop()
    await asyncio.wait_for(task, 10)
    assert not rig.of_type("run_failed")
    retries = rig.orchestrator.state.retry_attempts.values()
    assert sorted((r.kind, r.attempt) for r in retries) == [(RetryKind.CONTINUATION, 1)] * 2
    for pid in pids:

        def reaped(pid: int = pid) -> bool:
            if not psutil.pid_exists(pid):
                return True
            return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)

        await wait_until_async(
            reaped,
            timeout=10.0,
            what=f"process {pid} to be gone or a zombie",
        )


async def test_retry_timer_fires_between_polls(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={"polling": {
        "interval_ms": 600000}})
    rig = build_rig(wf, issues=[issue(1)])
    task = asyncio.create_task(rig.runtime.start())
    # the continuation retry (1000 ms) re-dispatches long before the 10-minute poll interval
    await wait_until_async(
        lambda: len(rig.of_type("run_started")) >= 2,
        timeout=60,
        what='len(rig.of_type("run_started")) >= 2',
    )
    second = rig.of_type("run_started")[1]
    assert second["attempt"] == 1
    rig.runtime.stop()
    await asyncio.wait_for(task, 10)


async def test_startup_cleanup_removes_workspaces_of_terminal_issues(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1, state="Done"), issue(2, state="Backlog")])
    for n in (1, 2):
        await rig.workspaces.prepare(issue(n), slot_index=0, attempt=None)
    assert (tmp_path / "workspaces" / "T-1").exists()
    await rig.runtime.poll_once()
    assert not (tmp_path / "workspaces" / "T-1").exists()
    assert (tmp_path / "workspaces" / "T-2").exists()
    assert rig.of_type("startup_workspace_cleanup")[0]["removed"] == ["T-1"]
    await rig.runtime.poll_once()
    assert len(rig.of_type("startup_workspace_cleanup")) == 1


async def test_refresh_request_is_coalesced_while_polling(tmp_path: Path) -> None:
    from lorenz.trackers.memory import MemoryTracker
    from lorenz.workflow import load_workflow

    class GatedTracker(MemoryTracker):
        """Holds every candidate scan until the test opens the gate."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.gate = asyncio.Event()
            self.scanning = asyncio.Event()
            self.scans = 0

        async def fetch_candidate_issues(self) -> list[Issue]:
            self.scans += 1
            self.scanning.set()
            await self.gate.wait()
            return await super().fetch_candidate_issues()

    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={"polling": {
        "interval_ms": 600000}})
    tracker = GatedTracker([], settings=load_workflow(wf, environ={}).settings)
    rig = build_rig(wf, tracker=tracker)
    task = asyncio.create_task(rig.runtime.start())
    await asyncio.wait_for(tracker.scanning.wait(), 10)  # the first tick is mid-poll
    first = rig.runtime.request_refresh()
    second = rig.runtime.request_refresh()
    assert (first.queued, first.coalesced) == (True, True)
    assert (second.queued, second.coalesced) == (True, True)
    assert first.operations == ("poll", "reconcile")
    tracker.gate.set()
    # Both requests merged into one follow-up tick, not two.
    await wait_until_async(
        lambda: rig.runtime.poll_count == 2 and not rig.runtime._polling.in_progress,
        timeout=10.0,
        what="rig.runtime.poll_count == 2 and not rig.runtime._polling.in_progress",
    )
    await asyncio.sleep(0.2)
    assert (rig.runtime.poll_count, tracker.scans) == (2, 2)
    assert len(rig.of_type("refresh_requested")) == 2
    rig.runtime.stop()
    await asyncio.wait_for(task, 10)


async def test_snapshot_subscribers_get_the_current_snapshot_first(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    seen: list[dict[str, object]] = []
    unsubscribe = rig.runtime.subscribe(lambda snap: seen.append(snap.to_dict()))
    assert len(seen) == 1
    assert seen[0]["app_status"] == "starting"
    await rig.runtime.start(once=True)
    unsubscribe()
    count = len(seen)
    assert any(s["running"] for s in seen)  # type: ignore[truthy-bool]
    await rig.runtime.poll_once()
    assert len(seen) == count
    assert seen[-1]["app_status"] == "stopped"


PROGRESS_AGENT = """
for n in range(5):
    print("step", n, flush=True)
"""


async def test_a_progress_blind_subscriber_gets_runs_and_sessions_but_no_agent_chatter(
    tmp_path: Path,
) -> None:
    # The log's run context follows which runs exist and their sessions: it subscribes with
    # agent_progress=False and is not handed (nor made to build) a snapshot per agent line.
    agent = write_agent(tmp_path, "agent", PROGRESS_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    everything: list[dict[str, object]] = []
    structure: list[dict[str, object]] = []
    rig.runtime.subscribe(lambda snap: everything.append(snap.to_dict()))
    rig.runtime.subscribe(lambda snap: structure.append(snap.to_dict()), agent_progress=False)
    await rig.runtime.start(once=True)
    await rig.runtime.wait_for_runs()

    def sessions(seen: list[dict[str, object]]) -> set[object]:
        return {row["session_id"] for snap in seen for row in snap["running"]  # type: ignore[attr-defined]
                if row.get("session_id")}

    def messages(seen: list[dict[str, object]]) -> set[object]:
        return {row.get("last_agent_message") for snap in seen
                for row in snap["running"]}  # type: ignore[attr-defined]

    assert sessions(structure)
    assert sessions(structure) == sessions(everything)
    assert {"step 4"} <= {str(m) for m in messages(everything)}
    assert not {f"step {n}" for n in range(5)} & {str(m) for m in messages(structure)}
    assert len(structure) < len(everything)


@pytest.mark.parametrize("agent_progress", [True, False])
async def test_only_progress_blind_subscribers_build_no_snapshot_for_agent_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent_progress: bool
) -> None:
    agent = write_agent(tmp_path, "agent", PROGRESS_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[issue(1)])
    timeline: list[str] = []
    rig.runtime.add_event_listener(
        lambda event: timeline.append(f"{event.type}:{event.agent_event or ''}")
    )
    rig.runtime.subscribe(lambda snap: None, agent_progress=agent_progress)
    real = rig.runtime.snapshot

    def counted() -> object:
        timeline.append("snapshot built")
        return real()

    monkeypatch.setattr(rig.runtime, "snapshot", counted)
    await rig.runtime.start(once=True)
    await rig.runtime.wait_for_runs()
    assert timeline.count("run_update:output") >= 5
    # NB: an agent update is reported to the event listeners, then its snapshot is emitted.
    for_output = sum(
        1 for before, after in itertools.pairwise(timeline)
        if (before, after) == ("run_update:output", "snapshot built")
    )
    assert for_output == (timeline.count("run_update:output") if agent_progress else 0)


async def test_lost_claims_abort_local_runs_without_recording_a_result(tmp_path: Path) -> None:
    from lorenz.claims.sqlite import SqliteClaimStore

    agent = write_agent(tmp_path, "beat", HEARTBEAT_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    db = tmp_path / "claims.db"
    ours = await SqliteClaimStore.open(db, owner="host:1:ours", owner_stale_ms=200)
    theirs = await SqliteClaimStore.open(db, owner="host:2:theirs", owner_stale_ms=200)
    rig = build_rig(wf, issues=[issue(1)], store=ours)
    await rig.runtime.poll_once()
    pid_file = tmp_path / "workspaces" / "T-1" / "pid"
    await wait_until_async(pid_file.exists, timeout=10.0, what="pid_file.exists")
    pid = int(pid_file.read_text())
    await asyncio.sleep(0.3)  # our heartbeat goes stale...
    taken = await theirs.take_over(from_owners=["host:1:ours"])  # ...and another owner takes over
    assert [r.slot_key for r in taken] == [slot_key("id-1", 0)]
    await rig.runtime.poll_once()
    await rig.runtime.wait_for_runs()
    assert rig.of_type("leadership_lost")
    assert not rig.orchestrator.state.running
    assert not rig.of_type("run_failed")
    assert not rig.of_type("run_finished")
    await wait_until_async(
        lambda: not psutil.pid_exists(pid)
        or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        timeout=10.0,
        what=f"process {pid} to be gone or a zombie",
    )
    # the slot stays the other owner's: we neither released nor re-claimed it
    state = await theirs.load()
    assert [(c.slot_key, c.owner) for c in state.claims] == [
        (slot_key("id-1", 0), "host:2:theirs")]
    await theirs.close()
    await ours.close()


async def test_subscribers_see_the_poll_go_idle_after_every_tick(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    rig = build_rig(wf, issues=[])
    seen: list[str] = []
    rig.runtime.subscribe(lambda snap: seen.append(snap.poll.status))
    await rig.runtime.poll_once()
    assert "polling" in seen
    assert seen[-1] == "idle"


async def test_an_issue_with_a_nul_byte_is_reported_once_and_never_run_until_it_changes(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "hooks": {"after_create": "true"}})
    bad = dataclasses.replace(issue(1), title="bad\x00title")
    rig = build_rig(wf, issues=[bad])
    await rig.runtime.poll_once(wait_for_runs=True)
    await rig.runtime.poll_once(wait_for_runs=True)

    [skipped] = rig.of_type("dispatch_skipped")
    assert (skipped["reason"], skipped["code"], skipped["fields"]) == (
        "issue_field_invalid", "issue_field_invalid", ["title"])
    assert rig.of_type("run_started") == []
    assert rig.of_type("poll_error") == []
    assert rig.runtime.snapshot().to_dict()["retrying"] == []
    assert not (tmp_path / "workspaces" / "T-1").exists()

    rig.tracker.update("id-1", title="good title")  # fixed: it runs
    await rig.runtime.poll_once(wait_for_runs=True)
    assert [e["identifier"] for e in rig.of_type("run_started")] == ["T-1"]


async def test_an_issue_with_an_identifier_over_the_run_spec_limit_is_refused_once(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", RECORDING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent)
    long = dataclasses.replace(issue(1), identifier="T-" + "9" * 598)
    rig = build_rig(wf, issues=[long])
    await rig.runtime.poll_once(wait_for_runs=True)
    await rig.runtime.poll_once(wait_for_runs=True)

    [skipped] = rig.of_type("dispatch_skipped")
    assert (skipped["reason"], skipped["code"], skipped["fields"]) == (
        "issue_field_invalid", "issue_field_invalid", ["identifier"])
    assert "identifier is 600 characters long, over the limit of 200" in skipped["message"]
    assert rig.of_type("run_started") == []
    assert rig.of_type("poll_error") == []
    assert rig.runtime.snapshot().to_dict()["retrying"] == []


WEBHOOK_SECRET = "whsec-literal-sentinel-7f3a"

LEAKING_AGENT = f"""
ws = pathlib.Path(env["LORENZ_WORKSPACE"])
(ws / "env.json").write_text(json.dumps(dict(env)))
print("my token is {WEBHOOK_SECRET}", flush=True)
raise SystemExit("failed holding {WEBHOOK_SECRET}")
"""


async def test_a_literal_webhook_secret_never_reaches_the_agent_nor_the_events_or_log(
    tmp_path: Path,
) -> None:
    agent = write_agent(tmp_path, "agent", LEAKING_AGENT)
    wf = write_workflow(tmp_path, agent_script=agent, front_matter={
        "tracker": {"kind": "memory", "webhook_secret": WEBHOOK_SECRET},
        "logging": {"level": "debug"},
        "agents": {"test": {
            "protocol": "command", "command": f"python3 {agent}",
            # NB: a variable whose name says nothing: only the value gives the secret away.
            "env": {"SIGNING": WEBHOOK_SECRET, "EXTRA": "yes"}}}})
    log = io.StringIO()
    # The daemon's log handler, configured for this workflow as the host does.
    setup = configure_for_workflow(load_workflow(wf, environ={}), environ={}, stream=log)
    try:
        rig = build_rig(wf, issues=[issue(1)])
        await rig.runtime.start(once=True)
    finally:
        setup.close()

    assert rig.of_type("run_failed")
    env = json.loads((tmp_path / "workspaces" / "T-1" / "env.json").read_text())
    assert env["EXTRA"] == "yes"
    assert WEBHOOK_SECRET not in json.dumps(env)
    assert WEBHOOK_SECRET not in json.dumps(rig.events)
    assert WEBHOOK_SECRET not in json.dumps(rig.runtime.snapshot().to_dict())
    assert "agent stderr: failed holding" in log.getvalue()  # the agent's own words are logged
    assert WEBHOOK_SECRET not in log.getvalue()
