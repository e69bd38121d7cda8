"""start_child: pipes read and written on the loop, the exit seen on a pidfd or by polling."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from lorenz.child_processes import DEVNULL, ChildProcess, PipeReader, start_child
from tests.waiting import wait_until_async

PY = sys.executable
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
BOTH_EXIT_WATCHES = pytest.mark.parametrize(
    "watch_exit_with_pidfd", [True, False], ids=["pidfd", "polling"]
)


def _real_path(path: Path) -> bytes:
    return os.path.realpath(path).encode()


def _wait_without_reaping(pid: int) -> None:
    """Block until ``pid`` exited, leaving it for its Popen to reap."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def python(code: str) -> list[str]:
    return [PY, "-c", code]


def registered_fds(loop: asyncio.AbstractEventLoop) -> set[int]:
    """The descriptors the loop's selector watches for anyone (readers and writers)."""
    selector = loop._selector  # type: ignore[attr-defined]
    return {key.fd for key in selector.get_map().values()}


async def read_all(reader: PipeReader | None) -> bytes:
    assert reader is not None
    data = bytearray()
    while chunk := await reader.read(65536):
        data += chunk
    return bytes(data)


@pytest.fixture
async def children() -> AsyncIterator[list[ChildProcess]]:
    """Children a test started: killed, waited for and closed at its end whatever happened."""
    started: list[ChildProcess] = []
    yield started
    for child in started:
        child.kill()
        async with asyncio.timeout(60):
            await child.wait()
        child.close()


@BOTH_EXIT_WATCHES
async def test_output_is_read_to_end_of_file_and_the_status_reported(
    tmp_path: Path, children: list[ChildProcess], watch_exit_with_pidfd: bool
) -> None:
    child = start_child(
        python("import os, sys; print(os.getcwd()); print('oops', file=sys.stderr); sys.exit(3)"),
        cwd=tmp_path, env=ENV, watch_exit_with_pidfd=watch_exit_with_pidfd,
    )
    children.append(child)
    assert await read_all(child.stdout) == _real_path(tmp_path) + b"\n"
    assert await read_all(child.stderr) == b"oops\n"
    assert await child.wait() == 3
    assert child.returncode == 3
    assert child.stdout is not None
    assert await child.stdout.read(10) == b""


@BOTH_EXIT_WATCHES
async def test_a_death_by_signal_is_a_negative_status(
    tmp_path: Path, children: list[ChildProcess], watch_exit_with_pidfd: bool
) -> None:
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV, stdin=DEVNULL,
                        watch_exit_with_pidfd=watch_exit_with_pidfd)
    children.append(child)
    child.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        assert await child.wait() == -signal.SIGTERM


async def test_a_write_bigger_than_the_pipe_is_buffered_and_drained(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    # The child reads only after a pause: 4 MiB cannot fit a pipe (64 KiB), so the rest waits
    # in the writer's buffer and goes out as the pipe empties.
    child = start_child(
        python(
            "import hashlib, sys, time; time.sleep(0.3); data = sys.stdin.buffer.read(); "
            "print(len(data), hashlib.sha256(data).hexdigest())"
        ),
        cwd=tmp_path, env=ENV,
    )
    children.append(child)
    data = os.urandom(4 * 1024 * 1024)
    stdin = child.stdin
    assert stdin is not None
    fd = stdin.fileno()
    stdin.write(data)
    assert stdin.buffered_bytes > 0
    assert fd in registered_fds(asyncio.get_running_loop())
    async with asyncio.timeout(60):
        await stdin.drain()
    assert stdin.buffered_bytes == 0
    assert fd not in registered_fds(asyncio.get_running_loop())
    stdin.close()
    assert stdin.is_closing()
    assert stdin.fileno() == -1
    size, digest = (await read_all(child.stdout)).split()
    assert int(size) == len(data)
    assert digest.decode() == hashlib.sha256(data).hexdigest()


async def test_writing_after_the_child_closed_its_stdin_is_a_broken_pipe(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    child = start_child(
        python("import os, time; os.close(0); print('closed', flush=True); time.sleep(300)"),
        cwd=tmp_path, env=ENV,
    )
    children.append(child)
    assert child.stdout is not None
    assert await child.stdout.read(100) == b"closed\n"
    stdin = child.stdin
    assert stdin is not None
    with pytest.raises(BrokenPipeError):
        stdin.write(b"hello\n")
    assert stdin.is_closing()
    with pytest.raises(BrokenPipeError):
        await stdin.drain()
    with pytest.raises(BrokenPipeError):
        stdin.write(b"again\n")


async def test_a_broken_pipe_while_draining_fails_the_drain(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    # The child reads a line, then closes stdin: the rest of a large buffered write fails.
    child = start_child(
        python("import os, sys; sys.stdin.buffer.readline(); os.close(0); "
               "print('closed', flush=True); import time; time.sleep(300)"),
        cwd=tmp_path, env=ENV,
    )
    children.append(child)
    stdin = child.stdin
    assert stdin is not None
    stdin.write(b"first\n" + b"x" * (4 * 1024 * 1024))
    with pytest.raises(BrokenPipeError):
        async with asyncio.timeout(60):
            await stdin.drain()
    assert stdin.buffered_bytes == 0
    assert stdin.fileno() == -1


@BOTH_EXIT_WATCHES
async def test_the_exit_is_seen_while_a_grandchild_keeps_stdout_open(
    tmp_path: Path, children: list[ChildProcess], watch_exit_with_pidfd: bool
) -> None:
    child = start_child(["sh", "-c", "sleep 300 & echo $!; exit 5"], cwd=tmp_path, env=ENV,
                        watch_exit_with_pidfd=watch_exit_with_pidfd)
    children.append(child)
    assert child.stdout is not None
    grandchild = int(await child.stdout.read(100))
    try:
        async with asyncio.timeout(60):
            assert await child.wait() == 5
        assert psutil.pid_exists(grandchild)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await child.stdout.read(100)  # the grandchild still holds the pipe
    finally:
        os.kill(grandchild, signal.SIGKILL)
    assert await read_all(child.stdout) == b""


async def test_cancelling_a_read_leaves_no_reader_registered(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    loop = asyncio.get_running_loop()
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
    children.append(child)
    assert child.stdout is not None
    fd = child.stdout.fileno()
    reading = asyncio.create_task(child.stdout.read(100))
    await wait_until_async(lambda: fd in registered_fds(loop), timeout=10.0,
                           what="the read to register its reader")
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert fd not in registered_fds(loop)


async def test_a_second_concurrent_read_is_refused(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    loop = asyncio.get_running_loop()
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
    children.append(child)
    stdout = child.stdout
    assert stdout is not None
    reading = asyncio.create_task(stdout.read(100))
    await wait_until_async(lambda: stdout.fileno() in registered_fds(loop), timeout=10.0,
                           what="the first read to register its reader")
    with pytest.raises(RuntimeError, match="already being read"):
        await stdout.read(100)
    stdout.close()
    assert await reading == b""


async def test_a_cancelled_drain_still_writes_the_rest_then_unregisters(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    loop = asyncio.get_running_loop()
    # The child starts reading only once the file "go" exists.
    child = start_child(
        python("import os, sys, time\nwhile not os.path.exists('go'): time.sleep(0.01)\n"
               "sys.stdin.buffer.readline(); print(len(sys.stdin.buffer.read()))"),
        cwd=tmp_path, env=ENV,
    )
    children.append(child)
    stdin = child.stdin
    assert stdin is not None
    fd = stdin.fileno()
    stdin.write(b"x" * (1024 * 1024))
    draining = asyncio.create_task(stdin.drain())
    await asyncio.sleep(0.05)
    draining.cancel()
    with pytest.raises(asyncio.CancelledError):
        await draining
    assert fd in registered_fds(loop)  # the rest still goes out: a message is never cut
    stdin.write(b"\nend")
    (tmp_path / "go").touch()
    stdin.close()
    await wait_until_async(lambda: stdin.fileno() == -1, timeout=10.0,
                           what="the buffer to be written and the pipe closed")
    assert fd not in registered_fds(loop)
    assert await read_all(child.stdout) == b"3\n"


async def test_closing_a_child_takes_everything_off_the_loop(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    loop = asyncio.get_running_loop()
    before = registered_fds(loop)
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
    children.append(child)
    stdin, stdout, stderr = child.stdin, child.stdout, child.stderr
    assert stdin is not None
    assert stdout is not None
    assert stderr is not None
    stdin.write(b"x" * (1024 * 1024))  # a writer registered, as the child reads nothing
    draining = asyncio.create_task(stdin.drain())
    reading = asyncio.create_task(stdout.read(100))
    await wait_until_async(lambda: stdout.fileno() in registered_fds(loop), timeout=10.0,
                           what="the read to register its reader")
    child.kill()
    async with asyncio.timeout(60):
        assert await child.wait() == -signal.SIGKILL
    child.close()
    assert await reading == b""
    with pytest.raises(BrokenPipeError):
        await draining
    assert (stdin.fileno(), stdout.fileno(), stderr.fileno()) == (-1, -1, -1)
    assert registered_fds(loop) == before


def test_closing_on_a_closed_loop_still_closes_the_pipes(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()

    async def start() -> ChildProcess:
        child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
        assert child.stdin is not None
        child.stdin.write(b"x" * (1024 * 1024))
        return child

    try:
        child = loop.run_until_complete(start())
    finally:
        loop.close()
    child.kill()
    _wait_without_reaping(child.pid)
    child.close()
    assert child.returncode == -signal.SIGKILL
    assert child.stdin is not None
    assert child.stdout is not None
    assert child.stderr is not None
    assert (child.stdin.fileno(), child.stdout.fileno(), child.stderr.fileno()) == (-1, -1, -1)


async def test_waiting_for_a_child_no_longer_watched_is_an_error(tmp_path: Path) -> None:
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
    waiting = asyncio.create_task(child.wait())
    await asyncio.sleep(0)
    child.close()
    with pytest.raises(ChildProcessError):
        await waiting
    child.kill()
    _wait_without_reaping(child.pid)
    child.close()


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


async def test_a_failed_start_leaves_no_descriptor_open(tmp_path: Path) -> None:
    before = _open_fds()
    with pytest.raises(FileNotFoundError):
        start_child(["true"], cwd=tmp_path / "missing", env=ENV)
    with pytest.raises(ValueError, match="null byte"):
        start_child(["true"], cwd=tmp_path, env={**ENV, "BAD": "a\x00b"})
    assert _open_fds() == before


async def test_the_child_gets_exactly_its_environment_in_a_session_of_its_own(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    child = start_child(
        python("import json, os; print(json.dumps([dict(os.environ), os.getsid(0)]))"),
        cwd=tmp_path, env={**ENV, "ONLY_THIS": "1"}, stdin=DEVNULL,
    )
    children.append(child)
    assert child.stdin is None
    environment, session = json.loads(await read_all(child.stdout))
    assert environment == {**ENV, "ONLY_THIS": "1"}
    assert session == child.pid


@BOTH_EXIT_WATCHES
async def test_the_exit_is_watched_on_a_pidfd_unless_told_to_poll(
    tmp_path: Path, children: list[ChildProcess], watch_exit_with_pidfd: bool
) -> None:
    loop = asyncio.get_running_loop()
    before = registered_fds(loop)
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV, stdin=DEVNULL,
                        stdout=DEVNULL, stderr=DEVNULL,
                        watch_exit_with_pidfd=watch_exit_with_pidfd)
    children.append(child)
    watched = registered_fds(loop) - before
    if watch_exit_with_pidfd:
        assert len(watched) == 1
        assert os.readlink(f"/proc/self/fd/{watched.pop()}") == "anon_inode:[pidfd]"
    else:
        assert watched == set()
    child.kill()
    async with asyncio.timeout(60):
        assert await child.wait() == -signal.SIGKILL
    assert registered_fds(loop) == before


async def test_aborting_a_writer_fails_the_drain_waiting_for_it(
    tmp_path: Path, children: list[ChildProcess]
) -> None:
    loop = asyncio.get_running_loop()
    child = start_child(["sleep", "300"], cwd=tmp_path, env=ENV)
    children.append(child)
    stdin = child.stdin
    assert stdin is not None
    fd = stdin.fileno()
    stdin.write(b"x" * (1024 * 1024))
    draining = asyncio.create_task(stdin.drain())
    await asyncio.sleep(0)
    stdin.abort()
    with pytest.raises(BrokenPipeError, match="not yet written"):
        await draining
    assert stdin.fileno() == -1
    assert fd not in registered_fds(loop)
