"""A real runtime's logs and event log file: run context on run lines, secrets never written.

The sentinel token reaches the runtime the ways a real one would: in an agent's stderr (an
agent that printed what it found), and in a tracker error (an adapter echoing its request).
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from lorenz.agents import build_runner
from lorenz.config import LogFormat, LoggingSettings
from lorenz.daemon.logs import (
    REDACTED,
    LogFileSink,
    RunContextAttachment,
    configure_logging,
    tracker_secrets,
)
from lorenz.model import Issue
from lorenz.runtime import LorenzRuntime
from lorenz.trackers import TrackerError
from tests.runtime.harness import LIVE_RUNTIMES, build_rig, write_agent, write_workflow
from tests.waiting import wait_until_async

SENTINEL = "lin_api_SENTINEL_5b1d0e77c4"
ENV_SENTINEL = "ghp_ENVSENTINEL_90af11"


def _issue(n: int, *, title: str = "Do the thing") -> Issue:
    return Issue(id=f"id-{n}", identifier=f"LOR-{n}", title=title, state="Todo")


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_an_agent_output_line_with_the_token_is_shown_scrubbed(tmp_path: Path) -> None:
    agent = write_agent(
        tmp_path,
        "echoing",
        f"""
        print("found {SENTINEL} in the config", flush=True)
        time.sleep(30)
        """,
    )
    workflow = write_workflow(
        tmp_path, agent_script=agent,
        front_matter={"tracker": {"kind": "memory", "api_key": SENTINEL},
                      "polling": {"interval_ms": 60000}},
    )
    rig = build_rig(workflow, issues=[_issue(1)])
    await rig.runtime.poll_once()

    def message() -> str:
        running = list(rig.orchestrator.state.running.values())
        return (running[0].last_agent_message or "") if running else ""

    await wait_until_async(
        lambda: message().startswith("found"),
        timeout=60,
        what='message().startswith("found")',
    )
    assert message() == f"found {REDACTED} in the config"
    assert SENTINEL not in json.dumps(rig.runtime.snapshot().to_dict())


async def test_sentinel_token_never_reaches_process_logs_or_the_log_file(tmp_path: Path) -> None:
    log_file = tmp_path / "events" / "lorenz.jsonl"
    agent = write_agent(
        tmp_path,
        "leaky",
        f"""
        sys.stderr.write("auth failed: Authorization: Bearer {SENTINEL} and {ENV_SENTINEL}\\n")
        sys.exit(3)
        """,
    )
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "tracker": {"kind": "memory", "api_key": SENTINEL},
            "polling": {"interval_ms": 60000},
            "logging": {"log_file": str(log_file), "format": "json"},
        },
    )
    rig = build_rig(workflow, issues=[_issue(1)])
    # The controller's own environment holds a token too (as GITHUB_TOKEN would in CI).
    runtime = LorenzRuntime(
        workflow=rig.workflow,
        orchestrator=rig.orchestrator,
        tracker=rig.tracker,
        workspaces=rig.workspaces,
        runner_factory=build_runner,
        base_env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GITHUB_TOKEN": ENV_SENTINEL},
    )
    LIVE_RUNTIMES.append(runtime)
    runtime.add_event_listener(lambda event: rig.events.append(event.to_dict()))
    rig.runtime = runtime
    stream = io.StringIO()
    setup = configure_logging(
        rig.workflow.settings.logging,
        stream=stream,
        secrets=tracker_secrets(rig.workflow.settings, {"GITHUB_TOKEN": ENV_SENTINEL}),
    )
    attachment = RunContextAttachment(setup=setup, environ={"GITHUB_TOKEN": ENV_SENTINEL})
    await attachment.start(rig.runtime)
    try:
        # 1. the agent prints the tokens on stderr and fails: run_failed + retry_scheduled.
        await rig.runtime.poll_once(wait_for_runs=True)
        assert rig.of_type("run_failed"), rig.events
        assert REDACTED in json.dumps(rig.of_type("run_failed"))
        # 2. the tracker echoes the token in its error: poll_error.
        rig.tracker.fail_next(
            1,
            TrackerError(f"401 Unauthorized for token {SENTINEL}", code="linear_api_status"),
            methods=["fetch_candidate_issues"],
        )
        with pytest.raises(TrackerError):
            await rig.runtime.poll_once()
        assert rig.of_type("poll_error"), rig.events
        # 3. a traceback that carries the token, from any logger.
        try:
            raise RuntimeError(f"GET /graphql Authorization={SENTINEL}")
        except RuntimeError:
            logging.getLogger("lorenz.trackers.linear").exception("request failed")
    finally:
        await attachment.stop()

    process_log = stream.getvalue()
    event_log = log_file.read_text(encoding="utf-8")
    for text in (process_log, event_log):
        assert SENTINEL not in text
        assert ENV_SENTINEL not in text
    # The lines are there, with the secret replaced rather than the line dropped.
    lines = _json_lines(process_log)
    failed = next(line for line in lines if line.get("type") == "run_failed")
    assert f"Bearer {REDACTED}" in failed["message"]
    assert failed["identifier"] == "LOR-1"
    poll_error = next(line for line in lines if line.get("type") == "poll_error")
    assert REDACTED in poll_error["message"]
    assert any("RuntimeError" in line.get("exception", "") for line in lines)
    events = _json_lines(event_log)
    assert {"run_started", "run_failed", "retry_scheduled", "poll_error"} <= {
        e["type"] for e in events
    }
    # And what the dashboard and API show is scrubbed too.
    assert SENTINEL not in json.dumps(rig.runtime.snapshot().to_dict())


async def test_log_file_appends_every_event_as_a_json_line(tmp_path: Path) -> None:
    log_file = tmp_path / "deep" / "dir" / "events.jsonl"
    log_file.parent.mkdir(parents=True)
    log_file.write_text('{"type": "earlier", "at": "2024-01-01T00:00:00+00:00"}\n')
    agent = write_agent(tmp_path, "ok", "print('working', flush=True)\n")
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "polling": {"interval_ms": 60000},
            "logging": {"log_file": str(log_file)},
        },
    )
    rig = build_rig(workflow, issues=[_issue(1), _issue(2)])
    rig.runtime.add_event_listener(LogFileSink(settings=lambda: rig.runtime.settings))
    await rig.runtime.poll_once(wait_for_runs=True)
    events = _json_lines(log_file.read_text(encoding="utf-8"))
    assert events[0]["type"] == "earlier"  # appended, not truncated
    logged = [e for e in events[1:] if e["type"] != "run_update"]
    assert [e["type"] for e in logged] == [
        e["type"] for e in rig.events if e["type"] != "run_update"
    ]
    started = [e for e in logged if e["type"] == "run_started"]
    assert {e["identifier"] for e in started} == {"LOR-1", "LOR-2"}
    assert all({"at", "issue_id", "slot"} <= e.keys() for e in started)
    assert snapshot_log_file(rig) == str(log_file)


def snapshot_log_file(rig: Any) -> Any:
    return rig.runtime.snapshot().to_dict()["log_file"]


async def test_an_unwritable_log_file_does_not_stop_the_runtime(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a folder should be")
    agent = write_agent(tmp_path, "ok", "pass\n")
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "polling": {"interval_ms": 60000},
            "logging": {"log_file": str(blocker / "events.jsonl")},
        },
    )
    rig = build_rig(workflow, issues=[_issue(1)])
    rig.runtime.add_event_listener(LogFileSink(settings=lambda: rig.runtime.settings))
    stream = io.StringIO()
    configure_logging(LoggingSettings(), stream=stream)
    await rig.runtime.poll_once(wait_for_runs=True)
    assert rig.of_type("run_finished")
    assert "cannot append to log_file" in stream.getvalue()


async def test_the_runtime_only_emits_events_the_process_writes_the_log_file(
    tmp_path: Path,
) -> None:
    log_file = tmp_path / "events.jsonl"
    agent = write_agent(tmp_path, "ok", "pass\n")
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={"polling": {"interval_ms": 60000}, "logging": {"log_file": str(log_file)}},
    )
    # A runtime on its own (as the operator runs it) writes no file, whatever the settings say.
    rig = build_rig(workflow, issues=[_issue(1)])
    await rig.runtime.poll_once(wait_for_runs=True)
    assert rig.of_type("run_finished")
    assert not log_file.exists()
    # The single-host process's logs attachment adds the sink; stopping it removes it again.
    setup = configure_logging(LoggingSettings(), stream=io.StringIO())
    attachment = RunContextAttachment(setup=setup, environ={})
    await attachment.start(rig.runtime)
    await rig.runtime.poll_once(wait_for_runs=True)
    await attachment.stop()
    written = _json_lines(log_file.read_text(encoding="utf-8"))
    assert "poll_completed" in {event["type"] for event in written}
    assert "run_update" not in {event["type"] for event in written}
    count = len(written)
    await rig.runtime.poll_once(wait_for_runs=True)
    assert len(_json_lines(log_file.read_text(encoding="utf-8"))) == count


async def test_run_lines_carry_issue_slot_and_session(tmp_path: Path) -> None:
    marker = tmp_path / "release"
    agent = write_agent(
        tmp_path,
        "waits",
        f"""
        print("started", flush=True)
        while not os.path.exists({str(marker)!r}):
            time.sleep(0.02)
        """,
    )
    hook_marker = "hook-ran"
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "polling": {"interval_ms": 60000},
            "hooks": {"before_run": f"echo {hook_marker}"},
        },
    )
    rig = build_rig(workflow, issues=[_issue(7)])
    stream = io.StringIO()
    setup = configure_logging(LoggingSettings(format=LogFormat.JSON), stream=stream)
    attachment = RunContextAttachment(setup=setup, environ={})
    await attachment.start(rig.runtime)
    try:
        await rig.runtime.poll_once()
        await wait_until_async(
            lambda: any(r.session_id for r in rig.runtime.snapshot().lanes.running),
            timeout=15.0,
            what="any(r.session_id for r in rig.runtime.snapshot().lanes.running)",
        )
        session_id = rig.runtime.snapshot().lanes.running[0].session_id
        marker.write_text("go")
        await rig.runtime.wait_for_runs()
    finally:
        await attachment.stop()
    lines = _json_lines(stream.getvalue())
    finished = next(line for line in lines if line.get("type") == "run_finished")
    assert (finished["issue_id"], finished["identifier"], finished["slot"]) == ("id-7", "LOR-7", 0)
    assert finished["session_id"] == session_id
    retry = next(line for line in lines if line.get("type") == "retry_scheduled")
    assert retry["session_id"] == session_id
    # A line logged from inside the run's own task (the workspace hook) names the run too.
    hook_lines = [line for line in lines if "workspace hook" in line["message"]]
    assert hook_lines, [line["message"] for line in lines]
    assert all(line["issue_id"] == "id-7" and line["slot"] == 0 for line in hook_lines)
    # Lines about no run carry no run fields.
    poll = next(line for line in lines if line.get("type") == "poll_completed")
    assert "issue_id" not in poll


async def test_the_run_context_builds_no_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run context reads the runtime's run identities on each change that is not agent
    # progress alone; it built a whole snapshot (rows, totals, recent events, history) per
    # change before, about two a run, for this listener only.
    agent = write_agent(
        tmp_path, "chatty", "for n in range(5):\n    print('step', n, flush=True)\n"
    )
    workflow = write_workflow(
        tmp_path, agent_script=agent, front_matter={"polling": {"interval_ms": 60000}}
    )
    rig = build_rig(workflow, issues=[_issue(1), _issue(2)])
    built: list[str] = []
    real_snapshot, real_identities = rig.runtime.snapshot, rig.runtime.run_identities

    def snapshot() -> object:
        built.append("snapshot")
        return real_snapshot()

    def run_identities() -> object:
        built.append("identities")
        return real_identities()

    monkeypatch.setattr(rig.runtime, "snapshot", snapshot)
    monkeypatch.setattr(rig.runtime, "run_identities", run_identities)
    stream = io.StringIO()
    setup = configure_logging(LoggingSettings(format=LogFormat.JSON), stream=stream)
    attachment = RunContextAttachment(setup=setup, environ={})
    await attachment.start(rig.runtime)
    try:
        await rig.runtime.poll_once(wait_for_runs=True)
    finally:
        await attachment.stop()
    assert "snapshot" not in built
    updates = len(rig.of_type("run_update"))
    assert updates >= 10  # five output lines per run, at least
    # Runs, sessions and ends are followed, the agents' output lines are not.
    assert 2 <= built.count("identities") < updates
    finished = [line for line in _json_lines(stream.getvalue())
                if line.get("type") == "run_finished"]
    assert {line["identifier"] for line in finished} == {"LOR-1", "LOR-2"}
    assert all(line.get("session_id") for line in finished)


async def test_a_reloaded_tracker_key_is_scrubbed_from_then_on(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "noop", "pass\n")
    front_matter: dict[str, Any] = {
        "tracker": {"kind": "memory", "api_key": "lin_api_OLD_KEY_1234"},
        "polling": {"interval_ms": 60000},
    }
    workflow = write_workflow(tmp_path, agent_script=agent, front_matter=front_matter)
    rig = build_rig(workflow, issues=[])
    stream = io.StringIO()
    setup = configure_logging(
        rig.workflow.settings.logging,
        stream=stream,
        secrets=tracker_secrets(rig.workflow.settings, {}),
    )
    attachment = RunContextAttachment(setup=setup, environ={})
    await attachment.start(rig.runtime)
    try:
        front_matter["tracker"]["api_key"] = "lin_api_NEW_KEY_5678"
        write_workflow(tmp_path, agent_script=agent, front_matter=front_matter)
        await rig.runtime.poll_once()
        assert rig.of_type("workflow_reloaded")
        logging.getLogger("lorenz.trackers").warning("sent lin_api_NEW_KEY_5678")
    finally:
        await attachment.stop()
    assert "lin_api_NEW_KEY_5678" not in stream.getvalue()
    assert "sent ***" in stream.getvalue()


async def test_a_json_escaped_token_in_a_tracker_error_is_scrubbed_from_events(
    tmp_path: Path,
) -> None:
    # A token with a quote and a backslash: a tracker that echoes its request as JSON carries
    # the escaped form (\" and \\), which a raw-value match never finds.
    token = 'lin_api_"ESC\\APED"_77'
    agent = write_agent(tmp_path, "noop", "pass\n")
    workflow = write_workflow(
        tmp_path,
        agent_script=agent,
        front_matter={
            "tracker": {"kind": "memory", "api_key": token},
            "polling": {"interval_ms": 60000},
        },
    )
    rig = build_rig(workflow, issues=[])
    body = json.dumps({"errors": [{"message": f"bad token {token}"}]})
    rig.tracker.fail_next(
        1, TrackerError(f"400 {body}", code="linear_api_status"), methods=["fetch_candidate_issues"]
    )
    with pytest.raises(TrackerError):
        await rig.runtime.poll_once()
    shown = json.dumps(rig.of_type("poll_error")) + json.dumps(rig.runtime.snapshot().to_dict())
    assert rig.of_type("poll_error"), rig.events
    assert json.dumps(token)[1:-1] not in shown
    assert token not in shown
    assert REDACTED in shown
