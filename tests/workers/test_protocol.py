"""The control socket under bad input: the worker answers with an error, drops the peer, and
keeps running the run; over-long lines are refused; ping answers the heartbeat."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lorenz.workers.client import WorkerConnection
from lorenz.workers.handles import LocalTransport, launch
from lorenz.workers.protocol import LINE_LIMIT_BYTES
from tests.workers.conftest import Collected, SpecFactory, base_env


async def raw_exchange(socket_path: Path, payload: bytes) -> list[dict[str, object]]:
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(payload)
    await writer.drain()
    replies = []
    async with asyncio.timeout(30):
        while True:
            line = await reader.readline()
            if not line:
                break
            replies.append(json.loads(line))
    writer.close()
    return replies


async def test_garbage_gets_an_error_and_the_run_goes_on(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="go")
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    socket_path = state_root / spec.handle / "control.sock"
    replies = await raw_exchange(socket_path, b"this is not json\n")
    assert replies[0]["op"] == "hello"
    assert replies[-1] == {
        "op": "error",
        "code": "protocol_error",
        "message": replies[-1]["message"],
    }
    replies = await raw_exchange(socket_path, b'["an", "array"]\n')
    assert replies[-1]["code"] == "protocol_error"
    too_long = b'{"op": "ping", "pad": "' + b"x" * (LINE_LIMIT_BYTES + 10) + b'"}\n'
    replies = await raw_exchange(socket_path, too_long)
    assert replies[-1]["code"] == "protocol_error"
    deep = b'{"op": "ping", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    replies = await raw_exchange(socket_path, deep)
    assert replies[-1]["code"] == "protocol_error"
    scenario.open_gate("go")
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"


async def test_ping_reports_the_last_seq_and_the_phase(
    state_root: Path, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(gate="go")
    transport = LocalTransport(state_root=state_root, env=base_env())
    handle, _ = await launch(spec, transport=transport)
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    reader, writer = await transport.connect(spec.handle)
    connection = await WorkerConnection.open(reader, writer)
    # NB: a generous bound: the worker answers at once, but a loaded machine may not run it.
    pong = await connection.ping(timeout_s=60)
    assert pong["phase"] == "agent"
    assert isinstance(pong["last_seq"], int)
    assert pong["last_seq"] >= collected.records[-1].seq
    await connection.close()
    scenario.open_gate("go")
    await asyncio.wait_for(follow, timeout=60)


def connect_as_nobody(socket_path: Path) -> bytes:
    """Connect from a forked child that switched to uid/gid 65534; what it received."""
    import os
    import socket

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no asyncio, no pytest, just the socket
        status = 1
        try:
            os.close(read_fd)
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(20)
                sock.connect(str(socket_path))
                os.write(write_fd, b"connected:" + sock.recv(4096))
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        reply = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, reply
    assert reply.startswith(b"connected:")
    return reply.removeprefix(b"connected:")


async def test_a_peer_of_another_uid_is_refused_even_when_the_modes_would_let_it_in(
    state_root: Path, make_spec: SpecFactory
) -> None:
    import os

    if os.getuid() != 0:
        pytest.fail("this test switches to another uid and needs root, as the test image has")
    spec, scenario = make_spec(gate="go")
    handle, _ = await launch(spec, transport=LocalTransport(state_root=state_root, env=base_env()))
    state_dir = state_root / spec.handle
    socket_path = state_dir / "control.sock"
    for path, mode in ((state_root, 0o711), (state_dir, 0o711), (socket_path, 0o666)):
        path.chmod(mode)
    received = connect_as_nobody(socket_path)
    assert received == b"", "closed without a hello"
    # The owner still gets in, and the run is unharmed.
    scenario.open_gate("go")
    final = await handle.follow(Collected())
    assert final.data["outcome"] == "success"
