"""A run in a local worker, end to end: real `lorenz worker` processes, a scripted Codex agent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorenz.workers.handles import LocalTransport, WorkerHandle, launch
from lorenz.workers.journal import read_journal
from lorenz.workers.launch import LOCAL_WORKER_COMMAND
from lorenz.workers.spec import HookSpec, SpecInvalid, encode_spec
from lorenz.workers.states import (
    HANDLE_BUDGET_BYTES,
    ROOT_BUDGET_BYTES,
    ProbeState,
    StateRootUnreachable,
    probe_local,
    reachable_state_root,
    state_root_of,
    worker_pid,
)
from tests.waiting import wait_until_async
from tests.workers.conftest import (
    Collected,
    SpecFactory,
    base_env,
    kill_workers_under,
    process_gone,
)


@pytest.fixture
def links() -> Iterator[Path]:
    """A private stand-in for ``/tmp/lorenz-<uid>`` (not yet created, as on a fresh boot)."""
    parent = Path(tempfile.mkdtemp(prefix="lzl", dir="/tmp"))
    try:
        yield parent / "links"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


async def test_a_run_executes_hooks_and_agent_and_ends_with_a_final_record(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    hooks = HookSpec(
        before_run=f"echo before > {tmp_path}/before.txt",
        after_run=f"echo after > {tmp_path}/after.txt",
        env=base_env(),
    )
    spec, scenario = make_spec(
        turns=[{"steps": [{"message": "one"}, {"usage": 42}]}], hooks=hooks
    )
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, result = await launch(spec, transport=transport)
    assert result.existing is None
    assert result.handle == spec.handle
    collected = Collected()

    final = await handle.follow(collected)

    assert final.data["outcome"] == "success"
    assert final.data["exit_status"] == 0
    assert final.data["usage"] == {"input_tokens": 41, "output_tokens": 1, "total_tokens": 42}
    assert final.data["turns"] == 1
    assert collected.seqs() == list(range(1, len(collected.records) + 1))
    kinds = collected.kinds()
    assert kinds[0] == "run_started"
    assert kinds[-1] == "final"
    hooks_seen = [
        (r.data["hook"], r.data["ok"]) for r in collected.records if r.kind == "hook_finished"
    ]
    assert hooks_seen == [("before_run", True), ("after_run", True)]
    assert "session_started" in collected.events()
    assert "turn_completed" in collected.events()
    assert (tmp_path / "before.txt").read_text() == "before\n"
    assert (tmp_path / "after.txt").read_text() == "after\n"
    assert scenario.marks.read_text().split("\n")[:2] == ["start 1", "end 1"]
    # The journal on disk is what the controller saw.
    state_dir = state_root / spec.handle
    on_disk = read_journal(state_dir / "journal.jsonl")
    assert [r.to_json() for r in on_disk] == [r.to_json() for r in collected.records]
    # The ack lets the worker exit at once.
    await wait_until_async(
        lambda: worker_pid(state_dir) is None,
        timeout=60.0,
        what="worker_pid(state_dir) is None",
    )
    assert not (state_dir / "control.sock").exists()


async def test_a_controller_still_attached_at_the_exit_is_let_go_without_an_error(
    state_root: Path, make_spec: SpecFactory
) -> None:
    # NB: Python 3.11's stream server logged the connection's task, cancelled by asyncio.run,
    # as an error with a traceback (and its CPU) when a worker exited with a client attached.
    spec, _scenario = make_spec(turns=[{"steps": [{"message": "one"}]}])
    transport = LocalTransport(state_root=state_root, env=base_env())
    _, result = await launch(spec, transport=transport)
    reader, writer = await asyncio.open_unix_connection(result.socket)
    writer.write(b'{"op":"attach","after_seq":0,"role":"controller"}\n')
    await writer.drain()
    final_seq = None
    async with asyncio.timeout(120):
        while final_seq is None:
            line = await reader.readline()
            assert line, "the worker closed before its final record"
            message = json.loads(line)
            if message["op"] == "record" and message["record"]["kind"] == "final":
                final_seq = message["record"]["seq"]
    writer.write(b'{"op":"ack","seq":%d}\n' % final_seq)
    await writer.drain()
    async with asyncio.timeout(120):
        while await reader.readline():
            pass  # NB: attached until the worker itself ends the connection
    writer.close()
    state_dir = state_root / spec.handle
    await wait_until_async(
        lambda: worker_pid(state_dir) is None, timeout=60.0, what="the worker exited"
    )
    assert " ERROR " not in (state_dir / "worker.log").read_text()


async def test_state_directory_socket_and_files_are_private(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _scenario = make_spec(turns=[{"steps": [{"gate": "/nonexistent/gate"}]}])
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, _ = await launch(spec, transport=transport)
    state_dir = state_root / spec.handle
    try:
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        for name in ("control.sock", "spec.json", "journal.jsonl", "worker.json", "worker.log"):
            assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600, name
    finally:
        await handle.cancel("test over")
        await handle.follow(Collected())


async def test_launching_a_live_handle_again_finds_the_worker_instead_of_starting_one(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="go")
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, first = await launch(spec, transport=transport)
    _, again = await launch(spec, transport=transport)
    assert again.existing == "alive"
    assert again.pid == first.pid
    scenario.open_gate("go")
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"
    _, after = await launch(spec, transport=transport)
    assert after.existing == "final"
    marks = scenario.marks.read_text().split()
    assert marks.count("start") == 1, "the agent ran exactly once"


async def test_a_failing_before_run_hook_ends_the_run_failed_without_the_agent(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    hooks = HookSpec(
        before_run="echo nope; exit 3", after_run=f"touch {tmp_path}/after", env=base_env()
    )
    spec, scenario = make_spec(hooks=hooks)
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "failed"
    assert final.data["error_code"] == "workspace_hook_failed"
    assert final.data["exit_status"] == 1
    assert not scenario.marks.exists(), "the agent never started"
    assert (tmp_path / "after").exists(), "after_run still ran"


async def test_a_failed_turn_is_a_failed_run(state_root: Path, make_spec: SpecFactory) -> None:
    spec, _ = make_spec(turns=[{"steps": [{"fail": "model refused"}]}])
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "failed"
    assert final.data["error_code"] == "turn_failed"
    assert "model refused" in final.data["error"]


async def test_a_remote_style_spec_creates_its_workspace_and_runs_after_create(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    workspace = tmp_path / "remote" / "ABC-9"
    hooks = HookSpec(after_create="echo created > created.txt", env=base_env())
    spec, _ = make_spec(workspace=workspace, create_workspace=True, hooks=hooks)
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"
    assert (workspace / "created.txt").read_text() == "created\n"


async def test_each_hook_the_worker_runs_is_named_in_lorenz_hook(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    workspace = tmp_path / "remote" / "ABC-8"
    hooks = HookSpec(
        after_create=f'echo "$LORENZ_HOOK" >> {tmp_path}/hooks.txt',
        before_run=f'echo "$LORENZ_HOOK" >> {tmp_path}/hooks.txt',
        after_run=f'echo "$LORENZ_HOOK" >> {tmp_path}/hooks.txt',
        env=base_env(),
    )
    spec, _ = make_spec(workspace=workspace, create_workspace=True, hooks=hooks)
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"
    assert (tmp_path / "hooks.txt").read_text().split() == [
        "after_create", "before_run", "after_run"
    ]


@pytest.mark.parametrize("failure", ["exit 7", "sleep 30"], ids=["fails", "times-out"])
async def test_a_workspace_whose_after_create_failed_is_removed_and_made_again_next_time(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path, failure: str
) -> None:
    workspace = tmp_path / "remote" / "ABC-7"
    runs = tmp_path / "after_create_runs"
    transport = LocalTransport(state_root=state_root, env=base_env())
    failing = HookSpec(
        after_create=f"echo x >> {runs}; echo half-made > clone.txt; {failure}",
        after_run=f"touch {tmp_path}/after_run",
        timeout_ms=1000,
        env=base_env(),
    )
    spec, scenario = make_spec(workspace=workspace, create_workspace=True, hooks=failing)
    handle, _ = await launch(spec, transport=transport)
    sink = Collected()
    final = await handle.follow(sink)
    assert final.data["outcome"] == "failed"
    assert final.data["error_code"] in {"workspace_hook_failed", "workspace_hook_timeout"}
    assert not workspace.exists(), "the half-made workspace is gone"
    assert workspace.parent.is_dir(), "only the workspace itself is removed"
    assert "workspace_discarded" in sink.kinds()
    assert not scenario.marks.exists(), "the agent never started"
    assert not (tmp_path / "after_run").exists(), "no after_run for a workspace never made"

    succeeding = HookSpec(after_create=f"echo x >> {runs}; echo whole > clone.txt",
                          env=base_env())
    spec, _ = make_spec(workspace=workspace, create_workspace=True, hooks=succeeding)
    handle, _ = await launch(spec, transport=transport)
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"
    assert runs.read_text().split() == ["x", "x"], "the next attempt ran after_create again"
    assert (workspace / "clone.txt").read_text() == "whole\n"


async def test_a_missing_workspace_fails_the_run_with_a_code(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path
) -> None:
    spec, _ = make_spec(workspace=tmp_path / "nowhere", create_workspace=False)
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    final = await handle.follow(Collected())
    assert final.data["error_code"] == "workspace_missing"


async def test_probe_reports_final_after_the_worker_exited(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    handle, result = await launch(
        spec, transport=LocalTransport(state_root=state_root, env=base_env())
    )
    await handle.follow(Collected())
    assert result.pid is not None
    await wait_until_async(
        lambda: process_gone(result.pid or 0),
        timeout=60.0,
        what="process_gone(result.pid or 0)",
    )
    probe = await probe_local(state_root / spec.handle)
    assert probe.state is ProbeState.FINAL
    assert probe.final is not None
    assert probe.final.data["outcome"] == "success"
    # A later controller with a fresh handle collects the same final record, and only it.
    late = WorkerHandle(
        transport=LocalTransport(state_root=state_root, env=base_env()),
        handle=spec.handle,
        last_seq=probe.final.seq - 1,
    )
    collected = Collected()
    final = await late.follow(collected)
    assert collected.seqs() == [final.seq]


def test_spec_file_holds_no_secret_and_the_handle_is_deterministic(
    make_spec: SpecFactory,
) -> None:
    spec, _ = make_spec(identifier="ABC-7")
    same = dataclasses.replace(spec)
    assert spec.handle == same.handle
    bumped = dataclasses.replace(spec, generation=spec.generation + 1)
    assert bumped.handle != spec.handle
    assert spec.handle.startswith("lzw-ABC-7-s0-a0-g0-")
    assert b"SECRET" not in encode_spec(spec)
    assert os.sep not in spec.handle


def test_a_spec_needs_one_continuation_prompt_per_later_turn(make_spec: SpecFactory) -> None:
    spec, _ = make_spec(max_turns=3)
    assert len(spec.continuation_prompts) == 2
    with pytest.raises(SpecInvalid, match="continuation_prompts"):
        dataclasses.replace(spec, continuation_prompts=["only one"])


def test_lorenz_worker_refuses_a_bad_spec_with_a_code(state_root: Path) -> None:
    done = subprocess.run(
        [*LOCAL_WORKER_COMMAND, "--spec", "-", "--state-root", str(state_root), "--detach"],
        input=b'{"version": 1, "workflow": "w"}',
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["ok"] is False
    assert answer["code"] == "worker_spec_invalid"
    assert list(state_root.iterdir()) == []


async def test_a_state_root_too_deep_for_a_socket_is_refused_with_a_code(
    tmp_path: Path, make_spec: SpecFactory
) -> None:
    from lorenz.workers.launch import WorkerLaunchError

    deep = tmp_path / ("d" * 80)
    spec, _ = make_spec()
    with pytest.raises(WorkerLaunchError) as caught:
        await LocalTransport(state_root=deep, env=base_env()).launch(spec)
    assert caught.value.code == "worker_socket_path_too_long"
    assert not deep.exists(), "nothing is created for a spec that cannot run"


async def test_a_state_root_too_long_for_its_sockets_is_reached_through_a_short_private_link(
    tmp_path: Path, make_spec: SpecFactory, links: Path
) -> None:
    """A long HOME (or ``LORENZ_WORKER_STATE``) used to fail every run with
    ``worker_socket_path_too_long``; the root is now reached through a short link, and a real
    run goes through it while its files stay under the long root."""
    long_root = tmp_path / ("d" * 80) / "workers"
    root = reachable_state_root(long_root, link_parent=links)
    assert root.parent == links
    assert len(str(root)) <= ROOT_BUDGET_BYTES
    assert os.readlink(root) == str(long_root)
    assert stat.S_IMODE(os.stat(links).st_mode) == 0o700
    assert reachable_state_root(long_root, link_parent=links) == root, "stable across starts"
    other = reachable_state_root(tmp_path / ("e" * 80), link_parent=links)
    assert other != root, "two roots never share a link"
    short = tmp_path.parent / "w"
    if len(str(short)) <= ROOT_BUDGET_BYTES:
        assert reachable_state_root(short, link_parent=links) == short

    spec, _ = make_spec(turns=[{"steps": [{"message": "one"}]}])
    try:
        handle, _ = await launch(spec, transport=LocalTransport(state_root=root, env=base_env()))
        final = await handle.follow(Collected())
        assert final.data["outcome"] == "success"
        assert (long_root / spec.handle / "journal.jsonl").exists()
        assert (await probe_local(root / spec.handle)).state is ProbeState.FINAL
    finally:
        kill_workers_under(long_root)


def test_a_link_parent_others_may_write_is_refused_with_a_code(
    tmp_path: Path, links: Path
) -> None:
    links.mkdir()
    links.chmod(0o755)
    long_root = tmp_path / ("d" * 80)
    with pytest.raises(StateRootUnreachable) as caught:
        reachable_state_root(long_root, link_parent=links)
    assert caught.value.code == "worker_state_root_too_long"
    assert str(links) in caught.value.message
    assert "set LORENZ_WORKER_STATE to a directory of at most 32 bytes" in caught.value.message
    assert list(links.iterdir()) == [], "no link in a directory others may write"


def test_the_default_state_root_of_a_long_home_is_reachable(tmp_path: Path) -> None:
    home = tmp_path / ("h" * 80)
    root = state_root_of({"HOME": str(home)})
    try:
        assert len(str(root / ("h" * HANDLE_BUDGET_BYTES) / "control.sock")) <= 107
        assert root.resolve() == (home / ".lorenz" / "workers").resolve()
    finally:
        root.unlink()


async def test_a_worker_exiting_at_once_still_delivers_its_final_record_live(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(linger_ms=0, gate="go", after_gate=[{"burst": 5000}])
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    scenario.open_gate("go")  # a flood, then at once the final record and the exit
    final = await asyncio.wait_for(follow, timeout=60)
    assert final.data["outcome"] == "success"
    assert handle.attaches == 1
    assert handle.journal_reads == 0, "the final record arrived whole, over the socket"


async def test_a_controller_that_had_collected_the_final_record_gets_it_again_once(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, _ = await launch(spec, transport=transport)
    final = await handle.follow(Collected())
    # Killed after collecting the final record, before acting on it: the successor knows
    # the final seq only.
    successor = WorkerHandle(transport=transport, handle=spec.handle, last_seq=final.seq)
    collected = Collected()
    again = await successor.follow(collected)
    assert again.to_json() == final.to_json()
    assert collected.records == [], "nothing delivered twice"


PROMPT_FILE_AGENT = """\
import os, pathlib, sys, time
path = os.environ["LORENZ_PROMPT_FILE"]
print("prompt-file " + path, flush=True)
print("prompt " + pathlib.Path(path).read_text(), flush=True)
gate = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 120  # never outlives a test that failed before opening it
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("ending", ["exits", "killed"])
async def test_a_command_agents_prompt_file_is_in_the_workers_state_directory(
    state_root: Path, make_spec: SpecFactory, tmp_path: Path, ending: str
) -> None:
    from lorenz.config import AgentLaunch, AgentProtocol

    agent = tmp_path / "prompt_agent.py"
    agent.write_text(PROMPT_FILE_AGENT)
    gate = tmp_path / "gate"
    spec, _ = make_spec()
    spec = dataclasses.replace(spec, agent=AgentLaunch(
        command=f"{shlex.quote(sys.executable)} {agent} {gate}", protocol=AgentProtocol.COMMAND
    ))
    # The worker's temporary directory is private to this test: a prompt file left in it
    # by a killed worker would show.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    transport = LocalTransport(
        state_root=state_root, env={**base_env(), "TMPDIR": str(private_tmp)}
    )
    handle, result = await launch(spec, transport=transport)
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))

    def said(prefix: str) -> str | None:
        for record in collected.records:
            message = str(record.data.get("message", ""))
            if record.kind == "agent_update" and message.startswith(prefix):
                return message.removeprefix(prefix)
        return None

    await collected.wait_for(lambda _: said("prompt ") is not None)
    state_dir = state_root / spec.handle
    prompt_file = said("prompt-file ") or ""
    assert os.path.dirname(prompt_file) == str(state_dir)
    assert said("prompt ") == spec.prompt
    assert stat.S_IMODE(os.stat(prompt_file).st_mode) == 0o600
    if ending == "exits":
        gate.write_text("open")
        final = await asyncio.wait_for(follow, timeout=60)
        assert final.data["outcome"] == "success"
        assert os.path.basename(prompt_file) not in os.listdir(state_dir), "removed at the end"
    else:
        assert result.pid is not None
        os.killpg(os.getpgid(result.pid), signal.SIGKILL)
        await wait_until_async(
            lambda: worker_pid(state_dir) is None,
            timeout=60.0,
            what="worker_pid(state_dir) is None",
        )
        gate.write_text("open")  # the agent, in a process group of its own, ends too
        follow.cancel()
        with contextlib.suppress(BaseException):
            await follow
        assert os.path.basename(prompt_file) in os.listdir(state_dir), "kept as evidence"
    assert list(private_tmp.iterdir()) == [], "nothing left in the temporary directory"
