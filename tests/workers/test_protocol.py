"""The control socket under bad input: the worker answers with an error, drops the peer, and
keeps running the run; over-long lines are refused; ping answers the heartbeat."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

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
    pong = await connection.ping()
    assert pong["phase"] == "agent"
    assert isinstance(pong["last_seq"], int)
    assert pong["last_seq"] >= collected.records[-1].seq
    await connection.close()
    scenario.open_gate("go")
    await asyncio.wait_for(follow, timeout=60)
