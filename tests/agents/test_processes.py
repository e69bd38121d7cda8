"""AgentProcess: line framing, stderr draining, exact environments, whole-group termination."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import psutil
import pytest

from lorenz.agents.base import AgentRunError
from lorenz.agents.processes import (
    MAX_LINE_BYTES,
    AgentProcess,
    AgentStdinClosed,
    LineTooLong,
    descendant_pids,
    spawn_agent,
)
from tests.agents.conftest import assert_gone, base_env
from tests.waiting import wait_until_async

PY = sys.executable


def py(code: str) -> str:
    """A bash command running ``code`` with this interpreter."""
    return f"{PY} -c {json.dumps(code)}"


async def test_a_line_over_ten_megabytes_arrives_whole(tmp_path: Path) -> None:
    size = 12 * 1024 * 1024
    proc = await spawn_agent(
        command=py(f"import sys; sys.stdout.write('a' * {size} + '\\nafter\\n')"),
        cwd=tmp_path,
        env=base_env(),
    )
    try:
        line = await proc.read_line(timeout_s=30)
        assert line is not None
        assert len(line) == size
        assert set(line) == {ord("a")}
        assert await proc.read_line(timeout_s=60) == b"after"
        assert await proc.read_line(timeout_s=60) is None
    finally:
        await proc.terminate()


async def test_a_line_over_the_limit_is_reported_and_the_stream_goes_on(tmp_path: Path) -> None:
    too_long = MAX_LINE_BYTES + 1024
    code = (
        "import sys; w = sys.stdout.write; "
        f"w('first\\n'); w('b' * {too_long} + '\\n'); w('second\\n')"
    )
    proc = await spawn_agent(command=py(code), cwd=tmp_path, env=base_env())
    try:
        assert await proc.read_line(timeout_s=60) == b"first"
        with pytest.raises(LineTooLong) as caught:
            await proc.read_line(timeout_s=30)
        assert caught.value.code == "agent_line_too_long"
        assert await proc.read_line(timeout_s=30) == b"second"
        assert await proc.read_line(timeout_s=60) is None
    finally:
        await proc.terminate()


async def test_partial_lines_wait_for_their_newline(tmp_path: Path) -> None:
    code = (
        "import sys, time; o = sys.stdout; o.write('{\"half\": '); o.flush(); "
        "time.sleep(0.3); o.write('1}\\nlast-without-newline'); o.flush()"
    )
    proc = await spawn_agent(command=py(code), cwd=tmp_path, env=base_env())
    try:
        assert await proc.read_line(timeout_s=60) == b'{"half": 1}'
        assert await proc.read_line(timeout_s=60) == b"last-without-newline"
        assert await proc.read_line(timeout_s=60) is None
    finally:
        await proc.terminate()


async def test_a_read_timeout_keeps_the_partial_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.stdout.write('par'); sys.stdout.flush(); "
        "sys.stdin.readline(); sys.stdout.write('tial\\n'); sys.stdout.flush()"
    )
    proc = await spawn_agent(command=py(code), cwd=tmp_path, env=base_env())
    try:
        with pytest.raises(TimeoutError):
            await proc.read_line(timeout_s=0.3)
        await proc.write_line(b"go")
        assert await proc.read_line(timeout_s=60) == b"partial"
    finally:
        await proc.terminate()


async def test_a_stderr_flood_does_not_block_stdout(tmp_path: Path) -> None:
    # 8 MB of stderr is far more than a pipe buffer: without a drain the child would block on
    # its stderr write and never print its stdout line.
    code = (
        "import sys; e = sys.stderr; "
        "[e.write('noise ' * 100 + '\\n') for _ in range(13000)]; e.write('LAST ERROR LINE\\n'); "
        "e.flush(); print('stdout survived', flush=True)"
    )
    proc = await spawn_agent(command=py(code), cwd=tmp_path, env=base_env())
    try:
        assert await proc.read_line(timeout_s=30) == b"stdout survived"
        assert await proc.wait(timeout_s=60) == 0
        await proc.stderr_drained(timeout_s=60)
        assert proc.stderr_bytes_total > 7_000_000
        tail = proc.stderr_tail(max_bytes=100)
        assert tail.endswith("LAST ERROR LINE")
        assert len(tail.encode()) <= 100
    finally:
        await proc.terminate()


async def test_the_environment_is_exactly_the_one_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LORENZ_CONTROLLER_ONLY", "must-not-leak")
    env = {**base_env(), "AGENT_VISIBLE": "yes"}
    proc = await spawn_agent(
        command=py("import json, os; print(json.dumps(dict(os.environ)))"),
        cwd=tmp_path,
        env=env,
    )
    try:
        line = await proc.read_line(timeout_s=60)
        assert line is not None
        seen = json.loads(line)
    finally:
        await proc.terminate()
    assert seen["AGENT_VISIBLE"] == "yes"
    assert "LORENZ_CONTROLLER_ONLY" not in seen
    # bash -l may add its own bookkeeping (PWD, SHLVL, _) and profile settings, nothing of ours.
    assert not {k for k in seen if k.startswith("LORENZ_")}


def _real_path(path: Path) -> bytes:
    return os.path.realpath(path).encode()


async def test_the_workspace_is_the_working_directory(tmp_path: Path) -> None:
    proc = await spawn_agent(command="pwd -P", cwd=tmp_path, env=base_env())
    try:
        assert await proc.read_line(timeout_s=60) == _real_path(tmp_path)
    finally:
        await proc.terminate()


async def test_terminate_kills_the_whole_tree(tmp_path: Path) -> None:
    # A child that ignores SIGTERM, a grandchild, and one that left the process group with
    # setsid: all must be gone after terminate().
    script = tmp_path / "tree.sh"
    script.write_text(
        "trap '' TERM\n"
        "sleep 300 &\n"
        "echo $!\n"
        "bash -c 'trap \"\" TERM; sleep 300 & echo $!; wait' &\n"
        "setsid sleep 300 &\n"
        "echo $!\n"
        "wait\n"
    )
    proc = await spawn_agent(command=f"bash {script}", cwd=tmp_path, env=base_env())
    pids = [proc.pid]
    for _ in range(3):
        line = await proc.read_line(timeout_s=60)
        assert line is not None
        pids.append(int(line))
    await wait_until_async(
        lambda: len(psutil.Process(proc.pid).children(recursive=True)) >= 4,
        timeout=10.0,
        what="len(psutil.Process(proc.pid).children(recursive=True)) >= 4",
    )
    descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    returncode = await proc.terminate(grace_s=0.3)
    assert returncode is not None
    assert proc.returncode == returncode
    assert_gone(pids + descendants)


def _tree_script(tmp_path: Path) -> Path:
    script = tmp_path / "tree.sh"
    script.write_text(
        "trap '' TERM\n"
        "bash -c 'sleep 300 & echo $!; wait' &\n"
        "setsid sleep 300 &\n"
        "echo $!\n"
        "wait\n"
    )
    return script


async def test_terminate_follows_the_agents_tree_without_walking_the_process_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The grandchild and the one that left the group (setsid) are found from the agent's own
    # tree: with psutil's whole-table walks made to fail, terminate() still kills them all.
    proc = await spawn_agent(command=f"bash {_tree_script(tmp_path)}", cwd=tmp_path,
                             env=base_env())
    pids = [proc.pid]
    for _ in range(2):
        line = await proc.read_line(timeout_s=60)
        assert line is not None
        pids.append(int(line))
    await wait_until_async(
        lambda: len(descendant_pids(proc.pid)) >= 3,
        timeout=10.0,
        what="len(descendant_pids(proc.pid)) >= 3",
    )
    walked = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert set(descendant_pids(proc.pid)) == walked

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole process table was walked")

    monkeypatch.setattr(psutil.Process, "children", no_walk)
    monkeypatch.setattr(psutil, "process_iter", no_walk)
    await proc.terminate(grace_s=0.3)
    monkeypatch.undo()
    assert_gone(pids + sorted(walked))


def test_descendant_pids_of_a_gone_process_are_none() -> None:
    assert descendant_pids(2**22 + 12345) == []


async def test_terminate_is_idempotent_and_reports_the_status(tmp_path: Path) -> None:
    proc = await spawn_agent(command="exit 7", cwd=tmp_path, env=base_env())
    assert await proc.wait(timeout_s=60) == 7
    assert await proc.terminate() == 7
    assert await proc.terminate() == 7


async def test_concurrent_terminates_wait_for_the_first(tmp_path: Path) -> None:
    proc = await spawn_agent(command="sleep 300", cwd=tmp_path, env=base_env())
    first, second = await asyncio.gather(proc.terminate(), proc.terminate())
    assert first == second
    assert first is not None
    assert first < 0
    assert_gone([proc.pid])


async def test_cancelling_terminate_still_kills(tmp_path: Path) -> None:
    proc = await spawn_agent(
        command="trap '' TERM; echo ready; sleep 300", cwd=tmp_path, env=base_env()
    )
    assert await proc.read_line(timeout_s=60) == b"ready"
    task = asyncio.create_task(proc.terminate(grace_s=30))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until_async(
        lambda: not psutil.pid_exists(proc.pid) or _zombie(proc.pid),
        timeout=10.0,
        what="not psutil.pid_exists(proc.pid) or _zombie(proc.pid)",
    )
    assert_gone([proc.pid])


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_writing_to_an_exited_agent_is_a_coded_error(tmp_path: Path) -> None:
    proc = await spawn_agent(command="echo bye >&2; exit 0", cwd=tmp_path, env=base_env())
    await proc.wait(timeout_s=60)
    with pytest.raises(AgentStdinClosed) as caught:
        await _write_until_refused(proc)
    assert caught.value.code == "agent_exited"
    await proc.terminate()


async def _write_until_refused(proc: AgentProcess) -> None:
    for _ in range(50):  # the first writes may still land in the pipe buffer
        await proc.write_line(b"x" * 65536)


async def test_a_missing_workspace_is_a_coded_spawn_error(tmp_path: Path) -> None:
    with pytest.raises(AgentRunError) as caught:
        await spawn_agent(command="true", cwd=tmp_path / "missing", env=base_env())
    assert caught.value.code == "agent_spawn_failed"
    assert "workspace" in caught.value.message


async def test_the_agent_runs_in_its_own_process_group(tmp_path: Path) -> None:
    proc = await spawn_agent(command="sleep 300", cwd=tmp_path, env=base_env())
    try:
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getpgid(proc.pid) != os.getpgid(0)
    finally:
        await proc.terminate()


async def test_without_stdin_the_agent_reads_end_of_file(tmp_path: Path) -> None:
    proc = await spawn_agent(
        command=py("import sys; print(repr(sys.stdin.read()))"),
        cwd=tmp_path,
        env=base_env(),
        stdin=False,
    )
    try:
        assert await proc.read_line(timeout_s=60) == b"''"
        with pytest.raises(AgentStdinClosed):
            await proc.write_line(b"hello")
    finally:
        await proc.terminate()


async def test_stderr_lines_are_logged_as_diagnostics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="lorenz.agents.processes")
    proc = await spawn_agent(
        command="echo 'warn: not JSON {' >&2; echo out", cwd=tmp_path, env=base_env()
    )
    try:
        assert await proc.read_line(timeout_s=60) == b"out"
        await proc.wait(timeout_s=60)
        await proc.stderr_drained(timeout_s=60)
    finally:
        await proc.terminate()
    assert "agent stderr: warn: not JSON {" in caplog.messages


async def test_a_timed_out_close_of_stdin_leaves_the_loop_consistent(tmp_path: Path) -> None:
    """A cancelled stdin close reports nothing to the loop, and terminate() still closes the
    pipe and takes its writer off the loop."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        # The agent never reads stdin: a full pipe keeps the close pending.
        proc = await spawn_agent(command="echo ready; sleep 300", cwd=tmp_path, env=base_env())
        assert await proc.read_line(timeout_s=60) == b"ready"
        stdin = proc._child.stdin
        assert stdin is not None
        fd = stdin.fileno()
        stdin.write(b"x" * (4 * 1024 * 1024))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(proc.close_stdin(), timeout=0.05)
        await proc.terminate(grace_s=0.5)
        for _ in range(20):  # let any late callbacks run
            await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("exception") for c in errors] == []
    assert stdin.fileno() == -1
    assert not loop.remove_writer(fd)


async def test_closing_the_pipes_of_a_running_child_neither_reaps_nor_kills_it(
    tmp_path: Path,
) -> None:
    """Closing the pipes early must not reap the child behind anyone's back: it keeps running,
    and terminate() still reports its status."""
    proc = await spawn_agent(command="sleep 300", cwd=tmp_path, env=base_env())
    for pipe in (proc._child.stdin, proc._child.stdout, proc._child.stderr):
        assert pipe is not None
        pipe.close()
    await asyncio.sleep(0.3)
    assert psutil.pid_exists(proc.pid)
    assert psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
    assert proc.returncode is None
    assert await proc.terminate(grace_s=0.5) is not None
    assert_gone([proc.pid])


async def test_a_non_login_shell_is_bash_c(tmp_path: Path) -> None:
    command = "shopt -q login_shell && echo login || echo plain"
    login = await spawn_agent(command=command, cwd=tmp_path, env=base_env())
    plain = await spawn_agent(command=command, cwd=tmp_path, env=base_env(), login_shell=False)
    try:
        assert await login.read_line(timeout_s=60) == b"login"
        assert await plain.read_line(timeout_s=60) == b"plain"
    finally:
        await login.terminate()
        await plain.terminate()
