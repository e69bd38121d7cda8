"""The composition root in daemon mode, in-process: lease first, shutdown order, lost lease."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz import assembly, claims, trackers
from lorenz.daemon import host
from lorenz.daemon.discovery import lease_file_for, read_lease
from lorenz.daemon.host import HostOptions, run_host
from lorenz.daemon.shutdown import SHUTDOWN_ORDER, STEP_MESSAGE
from lorenz.leadership import LeadershipLost
from lorenz.runtime import LorenzRuntime
from tests.daemon.harness import call, in_process, read_agent_log, write_daemon_workflow
from tests.waiting import wait_until_async
from tests.workers.conftest import process_gone


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    """In-process runs (the suite's test-only switch): these tests are about the host's
    composition and shutdown order, with runs that end when the runtime stops."""
    return in_process(daemon_env)

SLOW = {"AGENT_MIN_S": "30", "AGENT_MAX_S": "30", "AGENT_FAIL_RATE": "0"}


class StepRecorder(logging.Handler):
    def __init__(self, journal: list[str]) -> None:
        super().__init__()
        self.journal = journal

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == STEP_MESSAGE:
            self.journal.append(f"step {record.args[0]}")  # type: ignore[index]


class Recording:
    """An attachment that notes when it is stopped (and what it saw at that moment)."""

    def __init__(self, name: str, journal: list[str], *, serves: bool, probe: Any) -> None:
        self.name = name
        self.journal = journal
        self.serves = serves
        self.probe = probe

    async def start(self, runtime: LorenzRuntime) -> None:
        self.journal.append(f"{self.name} started")

    async def stop(self) -> None:
        self.journal.append(f"{self.name} stopped {self.probe()}")


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    entries: list[str] = []
    handler = StepRecorder(entries)
    logger = logging.getLogger("lorenz.daemon")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield entries
    logger.removeHandler(handler)
    logger.setLevel(previous)


def options(workflow: Path, env: dict[str, str], *features: str, **kwargs: Any) -> HostOptions:
    # NB: these tests stop with runs in flight and mean "stop now" (the drain: test_drain.py).
    kwargs.setdefault("grace_seconds", 0.0)
    return HostOptions(
        workflow_path=str(workflow),
        cli_features=["daemon", *features],
        tui=False,
        environ=env,
        **kwargs,
    )


async def test_shutdown_runs_in_the_seed_order(
    root: Path, daemon_env: dict[str, str], journal: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow = write_daemon_workflow(root, issues=("A-1",), agent_env=SLOW)
    lease_file = lease_file_for(workflow)
    agent_log = root / "agent.log"

    def run_ended() -> str:
        entries = read_agent_log(agent_log)
        return "run-ended" if any(e["event"] == "end" for e in entries) else "run-alive"

    def lease_state() -> str:
        return "lease-held" if lease_file.exists() else "lease-gone"

    monkeypatch.setattr(
        host,
        "ATTACHMENTS",
        [
            lambda loaded, opts: Recording("tui", journal, serves=False, probe=run_ended),
            lambda loaded, opts: Recording("server", journal, serves=True, probe=lease_state),
        ],
    )
    # NB: the functions assembly and host hold (imported from these packages).
    real_build_tracker = trackers.build_tracker
    real_open_store = claims.open_claim_store

    def build_tracker(settings: Any, **kwargs: Any) -> Any:
        tracker = real_build_tracker(settings, **kwargs)
        close = tracker.close

        async def recorded_close() -> None:
            journal.append("tracker closed")
            await close()

        monkeypatch.setattr(tracker, "close", recorded_close)
        return tracker

    async def open_claim_store(settings: Any, **kwargs: Any) -> Any:
        store = await real_open_store(settings, **kwargs)
        close = store.close

        async def recorded_close() -> None:
            journal.append(f"claim store closed {lease_state()}")
            await close()

        monkeypatch.setattr(store, "close", recorded_close)
        return store

    monkeypatch.setattr(assembly, "build_tracker", build_tracker)
    monkeypatch.setattr(host, "open_claim_store", open_claim_store)

    task = asyncio.create_task(run_host(options(workflow, daemon_env, "durable_claims")))
    await wait_until_async(
        lambda: any(e["event"] == "start" for e in read_agent_log(agent_log)),
        timeout=30.0,
        what='any(e["event"] == "start" for e in read_agent_log(agent_log))',
    )
    lease = read_lease(lease_file)
    assert lease is not None
    assert lease["endpoint"].startswith("unix://")
    reply = await asyncio.to_thread(call, lease["endpoint"], "POST", "/api/v1/stop")
    assert reply.status == 202
    assert reply.body["stopping"] is True
    assert await asyncio.wait_for(task, 60) == 0

    steps = [entry.removeprefix("step ") for entry in journal if entry.startswith("step ")]
    assert steps == list(SHUTDOWN_ORDER)
    after_start = journal[journal.index("server started") + 1 :]
    assert after_start == [
        "step stop_runtime",
        "step unmount_tui",
        "tui stopped run-ended",  # runs were aborted before the view went away
        "step drain_worker_pool",
        "step stop_server",
        "server stopped lease-held",
        "step close_tracker",
        "tracker closed",
        "step close_claim_store",
        "claim store closed lease-held",  # the lease is given back last
        "step release_lease",
    ]
    assert not lease_file.exists()
    ends = [e for e in read_agent_log(agent_log) if e["event"] == "end"]
    assert ends
    assert ends[-1]["rc"] == -15


@pytest.mark.parametrize("detected_by", ["tick", "heartbeat"])
async def test_a_removed_lease_stops_the_daemon_with_leadership_lost(
    root: Path, daemon_env: dict[str, str], detected_by: str
) -> None:
    interval_ms = 50 if detected_by == "tick" else 600000
    heartbeat_ms = 600000 if detected_by == "tick" else 50
    workflow = write_daemon_workflow(
        root,
        issues=(),
        front_matter={
            "polling": {"interval_ms": interval_ms},
            "flags": {"daemon.heartbeat_ms": heartbeat_ms},
        },
    )
    lease_file = lease_file_for(workflow)
    runtimes: list[LorenzRuntime] = []
    task = asyncio.create_task(run_host(options(workflow, daemon_env), ready=runtimes.append))
    await wait_until_async(
        lambda: bool(runtimes) and runtimes[0].poll_count >= 1,
        timeout=30.0,
        what="bool(runtimes) and runtimes[0].poll_count >= 1",
    )
    await wait_until_async(
        lambda: (read_lease(lease_file) or {}).get("endpoint") is not None,
        timeout=30.0,
        what='(read_lease(lease_file) or {}).get("endpoint") is not None',
    )
    polls_before = runtimes[0].poll_count
    lease_file.unlink()  # what a daemon_lock_stale message tells an operator to do
    with pytest.raises(LeadershipLost) as lost:
        await asyncio.wait_for(task, 60)
    assert lost.value.code == "leadership_lost"
    assert runtimes[0].stopped
    assert not lease_file.exists()  # release() never recreates someone else's (or no) lease
    if detected_by == "heartbeat":
        assert runtimes[0].poll_count == polls_before


async def test_once_and_no_feature_take_no_lease(root: Path, daemon_env: dict[str, str]) -> None:
    workflow = write_daemon_workflow(root, issues=())
    lease_dir = lease_file_for(workflow).parent
    assert await run_host(options(workflow, daemon_env, once=True)) == 0
    assert not lease_dir.exists()
    plain = HostOptions(workflow_path=str(workflow), once=True, tui=False, environ=daemon_env)
    assert await run_host(plain) == 0
    assert not lease_dir.exists()
    runtimes: list[LorenzRuntime] = []
    recurring = HostOptions(workflow_path=str(workflow), tui=False, environ=daemon_env)
    task = asyncio.create_task(run_host(recurring, ready=runtimes.append))
    await wait_until_async(
        lambda: bool(runtimes) and runtimes[0].poll_count >= 2,
        timeout=30.0,
        what="bool(runtimes) and runtimes[0].poll_count >= 2",
    )
    assert not lease_dir.exists()
    runtimes[0].stop()
    assert await asyncio.wait_for(task, 60) == 0


async def test_the_start_up_objects_are_frozen_while_the_host_runs(
    root: Path, daemon_env: dict[str, str]
) -> None:
    """Full collections during the run skip what start-up made (see lorenz.tasks)."""
    workflow = write_daemon_workflow(root, issues=())
    runtimes: list[LorenzRuntime] = []
    recurring = HostOptions(workflow_path=str(workflow), tui=False, environ=daemon_env)
    task = asyncio.create_task(run_host(recurring, ready=runtimes.append))
    await wait_until_async(
        lambda: bool(runtimes) and runtimes[0].poll_count >= 1,
        timeout=30.0,
        what="bool(runtimes) and runtimes[0].poll_count >= 1",
    )
    assert gc.get_freeze_count() > 0
    runtimes[0].stop()
    assert await asyncio.wait_for(task, 60) == 0
    assert gc.get_freeze_count() == 0


async def test_with_a_port_the_daemon_serves_the_whole_api_once(
    root: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain server factory is replaced by the daemon's transport: one listener, not two."""
    from lorenz import server

    monkeypatch.setattr(host, "ATTACHMENTS", [server.attachment_factory])
    workflow = write_daemon_workflow(root, issues=())
    before = listening_ports()
    runtimes: list[LorenzRuntime] = []
    task = asyncio.create_task(
        run_host(options(workflow, daemon_env, port=0), ready=runtimes.append)
    )
    await wait_until_async(
        lambda: (read_lease(lease_file_for(workflow)) or {}).get("endpoint") is not None,
        timeout=30.0,
        what='(read_lease(lease_file_for(workflow)) or {}).get("endpoint") is not None',
    )
    lease = read_lease(lease_file_for(workflow))
    assert lease is not None
    assert lease["endpoint"].startswith("http://127.0.0.1:")
    state = await asyncio.to_thread(call, lease["endpoint"], "GET", "/api/v1/state")
    assert state.status == 200
    assert state.body["daemon"]["endpoint"] == lease["endpoint"]
    page = await asyncio.to_thread(call, lease["endpoint"], "GET", "/api/v1/daemon")
    assert page.body["pid"] == lease["pid"]
    assert listening_ports() - before == {int(lease["endpoint"].rsplit(":", 1)[1])}
    runtimes[0].stop()
    assert await asyncio.wait_for(task, 60) == 0


def listening_ports() -> set[int]:
    import psutil

    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def _launchers() -> list[psutil.Process]:
    """This test process's warm launchers (``lorenz worker --launcher``), alive."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "--launcher" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


# NB: runs on this machine (Linux); only a machine without PR_SET_PDEATHSIG skips it.
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the launcher needs PR_SET_PDEATHSIG (Linux)"
)
async def test_the_host_closes_the_launcher_of_its_workers_when_it_stops(
    root: Path, daemon_env: dict[str, str]
) -> None:
    """The transport the host built (and warmed up) is the one it closes, after the drain."""
    workers_env = {k: v for k, v in daemon_env.items() if k != assembly.IN_PROCESS_RUNS_ENV}
    assert assembly.runs_in_workers(workers_env)
    before = {process.pid for process in _launchers()}
    workflow = write_daemon_workflow(root, issues=())
    runtimes: list[LorenzRuntime] = []
    recurring = HostOptions(workflow_path=str(workflow), tui=False, environ=workers_env)
    task = asyncio.create_task(run_host(recurring, ready=runtimes.append))
    await wait_until_async(
        lambda: bool(runtimes) and runtimes[0].poll_count >= 1,
        timeout=60.0,
        what="the host's first poll",
    )
    # NB: the launcher warms up in the background from assembly on, before any dispatch.
    await wait_until_async(
        lambda: any(p.pid not in before for p in _launchers()),
        timeout=60.0,
        what="a launcher of this host's, warmed up",
    )
    ours = [p for p in _launchers() if p.pid not in before]
    runtimes[0].stop()
    assert await asyncio.wait_for(task, 60) == 0
    assert [p.pid for p in ours if not process_gone(p.pid)] == []
