"""The worker's control socket on the loop's reader/writer callbacks (control_socket.py): what a
client that does not read gets, over-long lines, the final record flushed at close, a client
dropped for reading too slowly or gone mid-call (its calls failed or handed on), a served socket
refused, nothing left registered on the loop once the worker closed, and the start time its
status records.

The worker here runs in the test's own loop (``bind`` and ``journal`` called directly, as the
launcher's rehearsal does); its clients are plain sockets that read only when a test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lorenz.codes import ErrorCode
from lorenz.workers import control_socket
from lorenz.workers.journal import FINAL
from lorenz.workers.protocol import LINE_LIMIT_BYTES, LineBuffer, ProtocolError
from lorenz.workers.spec import RunSpec
from lorenz.workers.states import STATUS_NAME, WorkerStateError, worker_pid
from lorenz.workers.worker import ForwardedTools, Worker, _start_time
from tests.waiting import wait_until_async
from tests.workers.conftest import SpecFactory


class RawClient:
    """One plain connection to a control socket; it reads only when asked to."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = b""

    @classmethod
    async def connect(cls, path: Path) -> RawClient:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, str(path))
        return cls(sock)

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_bytes(json.dumps(message).encode() + b"\n")

    async def send_bytes(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def next_message(self) -> dict[str, Any] | None:
        """The next message, ``None`` at a clean end of stream (a reset raises)."""
        loop = asyncio.get_running_loop()
        while b"\n" not in self._pending:
            async with asyncio.timeout(60):
                chunk = await loop.sock_recv(self.sock, 1 << 16)
            if not chunk:
                assert not self._pending, "the stream ended inside a message"
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def attach(self, *, after_seq: int = 0) -> None:
        """Attach as a controller and read up to ``live`` (then read nothing more)."""
        assert (await self.next_message() or {}).get("op") == "hello"
        await self.send({"op": "attach", "after_seq": after_seq})
        while (message := await self.next_message()) is not None:
            if message["op"] == "live":
                return
        raise AssertionError("the connection ended before live")

    def buffered_bytes(self) -> int:
        """What the kernel can hold between the worker and this client, generously."""
        sizes = (
            self.sock.getsockopt(socket.SOL_SOCKET, option)
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF)
        )
        return 2 * sum(sizes)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def here() -> Iterator[Path]:
    """A short root for the state directories of workers that run in this process.

    NB: not the ``state_root`` fixture: its teardown kills the process group of every worker
    whose ``worker.json`` it finds, and this worker's pid is the test's.
    """
    root = Path(tempfile.mkdtemp(prefix="lzc", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(spec: RunSpec, root: Path) -> AsyncIterator[Worker]:
    state_dir = root / spec.handle
    state_dir.mkdir(mode=0o700)
    worker = Worker(spec=spec, state_dir=state_dir)
    await worker.bind()
    try:
        yield worker
    finally:
        await worker.close()


def flood(worker: Worker, *, at_least_bytes: int) -> list[int]:
    """Journal records until more than ``at_least_bytes`` went out; their seqs."""
    pad = "x" * 2048
    count = at_least_bytes // len(pad) + 1
    return [worker.journal("bulk", {"n": n, "pad": pad}).seq for n in range(count)]


async def test_a_client_that_does_not_read_gets_every_record_in_order(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    async with serving(spec, here) as worker:
        client = await RawClient.connect(worker.socket_path)
        try:
            await client.attach()
            # NB: journal() returns with the client reading nothing: what the socket could not
            # take waits in the worker, behind what it took.
            written = flood(worker, at_least_bytes=4 * client.buffered_bytes())
            await client.send({"op": "ping", "id": 7})
            received = []
            while (message := await client.next_message()) is not None:
                if message["op"] == "pong":
                    break
                assert message["op"] == "record"
                received.append(message["record"])
            assert [record["seq"] for record in received] == written
            assert [record["data"]["n"] for record in received] == list(range(len(written)))
            assert message is not None
            assert message["id"] == 7
            assert message["last_seq"] == written[-1]
        finally:
            client.close()


async def test_the_final_record_reaches_a_slow_client_before_the_worker_closes(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    async with serving(spec, here) as worker:
        client = await RawClient.connect(worker.socket_path)
        try:
            await client.attach()
            written = flood(worker, at_least_bytes=4 * client.buffered_bytes())
            final = worker.journal(FINAL, {"outcome": "success", "exit_status": 0})
            closing = asyncio.create_task(worker.close())
            await wait_until_async(
                lambda: not worker.socket_path.exists(),
                timeout=60,
                what="close() to stop accepting and remove the socket path",
            )
            assert not closing.done(), "close() waits while the client has lines to take"
            records = []
            while (message := await client.next_message()) is not None:
                records.append(message["record"])
            assert [record["seq"] for record in records] == [*written, final.seq]
            assert records[-1] == final.to_json()
            await asyncio.wait_for(closing, timeout=60)
        finally:
            client.close()


async def test_a_line_over_the_limit_gets_an_error_after_the_lines_before_it(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    async with serving(spec, here) as worker:
        client = await RawClient.connect(worker.socket_path)
        try:
            assert (await client.next_message() or {})["op"] == "hello"
            ping = b'{"op": "ping", "id": 1}\n'
            # NB: one byte over the limit and no newline: the worker knows it is over-long
            # from what it was sent, and nothing stays unsent when it closes the connection.
            await client.send_bytes(ping + b"x" * (LINE_LIMIT_BYTES + 1))
            pong = await client.next_message()
            assert pong is not None
            assert pong["op"] == "pong"
            error = await client.next_message()
            assert error == {
                "op": "error",
                "code": ErrorCode.PROTOCOL_ERROR,
                "message": f"a message is longer than {LINE_LIMIT_BYTES} bytes",
            }
            assert await client.next_message() is None, "closed (cleanly, not reset)"
        finally:
            client.close()
        # The worker goes on serving others.
        other = await RawClient.connect(worker.socket_path)
        try:
            assert (await other.next_message() or {})["op"] == "hello"
        finally:
            other.close()


def test_lines_are_split_across_reads_and_bounded_without_their_newline() -> None:
    lines = LineBuffer(limit=5)
    lines.feed(b"ab")
    assert lines.next_line() is None
    lines.feed(b"cde\nf")
    assert lines.next_line() == b"abcde\n"  # five bytes and the newline: at the limit
    assert lines.next_line() is None
    lines.feed(b"\n\n")
    assert lines.next_line() == b"f\n"
    assert lines.next_line() == b"\n"
    lines.feed(b"abcdef\n")
    with pytest.raises(ProtocolError, match="longer than 5 bytes"):
        lines.next_line()
    unfinished = LineBuffer(limit=5)
    unfinished.feed(b"abcdef")
    with pytest.raises(ProtocolError, match="longer than 5 bytes"):
        unfinished.next_line()
    ended = LineBuffer(limit=5)
    ended.feed(b"ab")
    assert ended.next_line() is None
    with pytest.raises(ProtocolError, match="ended inside a message"):
        ended.end()
    blank = LineBuffer(limit=5)
    blank.feed(b"  ")
    blank.end()


async def test_nothing_stays_registered_on_the_loop_once_the_worker_closed(
    here: Path, make_spec: SpecFactory
) -> None:
    loop = asyncio.get_running_loop()
    before = set(os.listdir("/proc/self/fd"))
    spec, _ = make_spec()
    worker_state = here / spec.handle
    worker_state.mkdir(mode=0o700)
    worker = Worker(spec=spec, state_dir=worker_state)
    await worker.bind()
    reading = await RawClient.connect(worker.socket_path)
    stalled = await RawClient.connect(worker.socket_path)
    gone = await RawClient.connect(worker.socket_path)
    clients = (reading, stalled, gone)
    try:
        for client in clients:
            await client.attach()
        gone.close()
        flood(worker, at_least_bytes=4 * stalled.buffered_bytes())
        opened = set(os.listdir("/proc/self/fd")) - before

        async def read_to_the_end() -> int:
            count = 0
            while await reading.next_message() is not None:
                count += 1
            return count

        read = asyncio.create_task(read_to_the_end())
        # NB: the stalled client never reads: close() gives up on it after its bound.
        await worker.close()
        assert await asyncio.wait_for(read, timeout=60) > 0
        assert not worker.socket_path.exists()
        mine = {reading.sock.fileno(), stalled.sock.fileno()}
        theirs = {int(fd) for fd in opened} - mine
        assert theirs, "the worker's sockets were among the descriptors opened"
        assert not {fd for fd in theirs if loop.remove_reader(fd) or loop.remove_writer(fd)}
        still_open = set(os.listdir("/proc/self/fd")) - before
        assert {int(fd) for fd in still_open} & theirs == set(), "the worker's sockets closed"
    finally:
        for client in clients:
            client.close()
        await worker.close()


async def test_a_controller_dropped_for_reading_too_slowly_hands_its_call_to_the_next(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec(controller_wait_ms=120_000)
    async with serving(spec, here) as worker:
        slow = await RawClient.connect(worker.socket_path)
        fast = await RawClient.connect(worker.socket_path)
        try:
            await slow.attach()
            asking = asyncio.create_task(worker.call("issue_active", {}, idempotent=True))
            await asyncio.sleep(0)  # NB: the call is sent (queued) to the only controller
            # More lines than one client may have queued beyond what its socket holds (each
            # line is over 50 bytes): the slow one is dropped.
            for n in range(control_socket.QUEUE_LIMIT + slow.buffered_bytes() // 50):
                worker.journal("bulk", {"n": n})
            received = 0
            while await slow.next_message() is not None:
                received += 1
            assert received < control_socket.QUEUE_LIMIT, "dropped, not flushed"
            await _answer_the_activity_check(fast, worker, mark="after_the_drop", active=True)
            assert await asyncio.wait_for(asking, timeout=60) is True
        finally:
            slow.close()
            fast.close()


async def _answer_the_activity_check(
    client: RawClient, worker: Worker, *, mark: str, active: bool
) -> None:
    """Attach ``client`` after a new record ``mark``, take the call waiting for a controller
    (the between-turn activity check) and answer it."""
    await client.attach(after_seq=worker.journal(mark, {}).seq)
    while (message := await client.next_message()) is not None:
        if message["op"] == "call":
            break
    assert message is not None
    assert message["method"] == "issue_active"
    await client.send({"op": "reply", "id": message["id"], "result": active})


async def test_a_second_worker_for_a_served_socket_is_refused_and_a_stale_one_replaced(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    async with serving(spec, here) as worker:
        second = Worker(spec=spec, state_dir=worker.state_dir)
        with pytest.raises(WorkerStateError) as refused:
            await second.bind()
        assert refused.value.code == ErrorCode.WORKER_ALREADY_RUNNING
    # A socket path nobody listens on (a worker killed before it removed it) is taken over.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(worker.socket_path))
    assert worker.socket_path.exists()
    after = Worker(spec=spec, state_dir=worker.state_dir)
    await after.bind()
    try:
        client = await RawClient.connect(after.socket_path)
        try:
            assert (await client.next_message() or {})["op"] == "hello"
        finally:
            client.close()
    finally:
        await after.close()


async def test_a_controller_gone_mid_call_fails_its_tool_call_and_hands_on_its_check(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec(controller_wait_ms=120_000)
    async with serving(spec, here) as worker:
        first = await RawClient.connect(worker.socket_path)
        second = await RawClient.connect(worker.socket_path)
        try:
            await first.attach()
            tools = ForwardedTools(worker, [{"name": "linear_graphql"}])
            tool = asyncio.create_task(tools.call_tool("linear_graphql", {"query": "{}"}))
            check = asyncio.create_task(worker.call("issue_active", {}, idempotent=True))
            methods: list[str] = []
            while len(methods) < 2 and (message := await first.next_message()) is not None:
                if message["op"] == "call":
                    methods.append(message["method"])
            assert sorted(methods) == ["issue_active", "tool"]
            first.close()
            result = await asyncio.wait_for(tool, timeout=60)
            assert result["success"] is False
            assert "may or may not have run" in result["output"]
            await _answer_the_activity_check(second, worker, mark="after_the_loss", active=False)
            assert await asyncio.wait_for(check, timeout=60) is False
        finally:
            first.close()
            second.close()


async def test_a_bound_worker_records_the_start_time_psutil_reads(
    here: Path, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec()
    async with serving(spec, here) as worker:
        status = json.loads((worker.state_dir / STATUS_NAME).read_text())
        assert status["pid"] == os.getpid()
        assert status["create_time"] == psutil.Process(os.getpid()).create_time()
        assert worker_pid(worker.state_dir) == os.getpid()


def test_the_start_time_of_a_process_whose_name_holds_parentheses_and_spaces(
    here: Path,
) -> None:
    # NB: /proc/<pid>/stat puts the name in parentheses; its fields come after the last ")".
    odd = here / "x) 1 2 3 4 5"
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    process = subprocess.Popen([str(odd), "60"])
    try:
        assert psutil.Process(process.pid).name() == "x) 1 2 3 4 5"
        assert _start_time(process.pid) == psutil.Process(process.pid).create_time()
    finally:
        process.kill()
        process.wait(timeout=60)
