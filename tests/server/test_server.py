"""The server attachment: TCP (ephemeral and taken ports), unix sockets, the host factory."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lorenz.server import LorenzServer, ServerError, attachment_factory
from lorenz.workflow import load_workflow
from tests.runtime.harness import write_agent, write_workflow
from tests.server.helpers import LIVE_SERVERS, make_rig, serve


async def unix_status(path: Path, route: str) -> int:
    connector = aiohttp.UnixConnector(path=str(path))
    async with aiohttp.ClientSession(connector=connector) as session, session.get(
        f"http://lorenz{route}"
    ) as response:
        return response.status


@dataclasses.dataclass(frozen=True)
class Options:
    """The part of the host's options the factory reads (HostOptions has the same field)."""

    port: int | None = None


async def test_port_zero_binds_an_ephemeral_port_on_loopback(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    server = LorenzServer(port=0, static_routes=())
    assert server.url is None

    await server.start(rig.runtime)
    LIVE_SERVERS.append(server)

    assert server.port is not None
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.endpoint == server.url
    url = server.url
    async with http.get(f"{url}/healthz") as response:
        assert response.status == 200
    await server.stop()
    assert server.url is None
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh, fresh.get(f"{url}/healthz"):
            pass


async def test_a_taken_port_is_refused_with_server_port_in_use(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    first = await serve(rig)
    assert first.server.port is not None

    second = LorenzServer(port=first.server.port, static_routes=())
    with pytest.raises(ServerError) as refused:
        await second.start(rig.runtime)

    assert refused.value.code == "server_port_in_use"
    assert str(first.server.port) in refused.value.message
    assert second.url is None


async def test_an_address_not_on_this_machine_is_refused_with_server_bind_failed(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, issues=[])
    # TEST-NET-1 (RFC 5737): never assigned to a local interface, so bind() fails at once.
    server = LorenzServer(host="192.0.2.1", port=0, static_routes=())

    with pytest.raises(ServerError) as refused:
        await server.start(rig.runtime)

    assert refused.value.code == "server_bind_failed"
    assert "server.host" in refused.value.message


def test_a_server_with_nowhere_to_listen_is_refused() -> None:
    with pytest.raises(ServerError) as refused:
        LorenzServer()
    assert refused.value.code == "server_listener_missing"


async def test_unix_socket_serves_the_api_owner_only(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    path = tmp_path / "run" / "lorenz.sock"
    server = LorenzServer(unix_socket=path, static_routes=())

    await server.start(rig.runtime)
    LIVE_SERVERS.append(server)

    assert server.url is None
    assert server.endpoint == f"unix://{path}"
    mode = path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    connector = aiohttp.UnixConnector(path=str(path))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get("http://lorenz/api/v1/state") as response:
            assert response.status == 200
            assert (await response.json())["workflow_path"] == str(rig.workflow.path)
        async with session.post("http://lorenz/api/v1/refresh") as response:
            assert response.status == 202
    await server.stop()
    assert not path.exists()


async def test_tcp_and_unix_socket_together(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    rig = make_rig(tmp_path, issues=[])
    path = tmp_path / "both.sock"
    served = await serve(rig, unix_socket=path)

    async with http.get(f"{served.url}/healthz") as response:
        assert response.status == 200
    assert await unix_status(path, "/healthz") == 200


async def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    path = tmp_path / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: a crashed daemon's leftover
    assert path.exists()

    served = await serve(rig, port=None, unix_socket=path)

    assert served.server.endpoint == f"unix://{path}"
    assert await unix_status(path, "/healthz") == 200


async def test_a_live_socket_or_a_plain_file_is_never_taken_over(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    live_path = tmp_path / "live.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(live_path))
    live.listen(1)
    plain = tmp_path / "plain.sock"
    plain.write_text("not a socket")
    try:
        with pytest.raises(ServerError) as in_use:
            await LorenzServer(unix_socket=live_path, static_routes=()).start(rig.runtime)
        with pytest.raises(ServerError) as taken:
            await LorenzServer(unix_socket=plain, static_routes=()).start(rig.runtime)
    finally:
        live.close()

    assert in_use.value.code == "server_socket_in_use"
    assert taken.value.code == "server_socket_path_taken"
    assert plain.read_text() == "not a socket"
    assert live_path.exists()


async def test_a_socket_path_too_long_for_the_kernel_is_refused(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    path = tmp_path / ("d" * 120) / "lorenz.sock"

    with pytest.raises(ServerError) as refused:
        await LorenzServer(unix_socket=path, static_routes=()).start(rig.runtime)

    assert refused.value.code == "server_socket_path_too_long"


async def test_stop_leaves_a_socket_file_it_no_longer_owns(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, issues=[])
    path = tmp_path / "moved.sock"
    served = await serve(rig, port=None, unix_socket=path)
    os.unlink(path)
    replacement = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    replacement.bind(str(path))  # another process's socket now
    try:
        await served.server.stop()
        assert path.exists()
    finally:
        replacement.close()


def test_attachment_factory_serves_only_when_a_port_is_configured(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "agent", "pass\n")
    plain = load_workflow(write_workflow(tmp_path, agent_script=agent), environ={})
    with_port = load_workflow(
        write_workflow(tmp_path, agent_script=agent, name="PORT.md",
                       front_matter={"server": {"port": 0, "host": "127.0.0.2"}}),
        environ={},
    )

    assert attachment_factory(plain, Options()) is None
    from_cli = attachment_factory(plain, Options(port=0))
    from_settings = attachment_factory(with_port, Options())
    cli_wins = attachment_factory(with_port, Options(port=8123))

    assert isinstance(from_cli, LorenzServer)
    assert from_cli._requested_port == 0
    assert from_cli._host == "127.0.0.1"
    assert isinstance(from_settings, LorenzServer)
    assert from_settings._requested_port == 0
    assert from_settings._host == "127.0.0.2"
    assert isinstance(cli_wins, LorenzServer)
    assert cli_wins._requested_port == 8123


async def test_the_factory_server_runs_on_the_settings_host(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[], front_matter={"server": {"port": 0, "host": "127.0.0.2"}})
    server = attachment_factory(rig.workflow, Options())
    assert server is not None

    await server.start(rig.runtime)
    LIVE_SERVERS.append(server)

    assert server.url is not None
    assert server.url.startswith("http://127.0.0.2:")
    async with http.get(f"{server.url}/api/v1/state") as response:
        assert response.status == 200


async def test_the_single_host_run_serves_the_api_and_stops_it_on_shutdown(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lorenz.daemon import host

    started: list[LorenzServer] = []

    def recording_factory(loaded: Any, options: Any) -> LorenzServer | None:
        server = attachment_factory(loaded, options)
        if server is not None:
            started.append(server)
        return server

    monkeypatch.setattr(host, "ATTACHMENTS", [recording_factory])
    agent = write_agent(tmp_path, "agent", "pass\n")
    (tmp_path / "issues").mkdir()
    workflow = write_workflow(
        tmp_path, agent_script=agent, front_matter={"tracker": {"kind": "files", "path": "issues"}}
    )
    ready = asyncio.Event()
    options = host.HostOptions(
        workflow_path=str(workflow), port=0, tui=False,
        environ={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
    )
    runtimes: list[Any] = []

    def on_ready(runtime: Any) -> None:
        runtimes.append(runtime)
        ready.set()

    run = asyncio.create_task(host.run_host(options, ready=on_ready))
    try:
        await asyncio.wait_for(ready.wait(), timeout=60)
        (server,) = started
        assert server.url is not None
        url = server.url
        state = await _get_state(http, url)
        assert state["workflow_path"] == str(workflow)
    finally:
        for runtime in runtimes:
            runtime.stop()
        exit_code = await asyncio.wait_for(run, timeout=60)

    assert exit_code == 0
    assert server.url is None
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as fresh, fresh.get(f"{url}/healthz"):
            pass


async def _get_state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/api/v1/state") as response:
        assert response.status == 200
        document: dict[str, Any] = await response.json()
        return document


async def test_the_default_server_mounts_the_installed_dashboard(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    server = LorenzServer(port=0)  # static_routes=None: the dashboard when installed

    await server.start(rig.runtime)
    LIVE_SERVERS.append(server)

    async with http.get(f"{server.url}/") as response:
        assert response.status == 200
        assert response.content_type == "text/html"
    async with http.post(f"{server.url}/") as response:
        assert response.status == 405
        assert (await response.json())["error"]["code"] == "method_not_allowed"
    async with http.get(f"{server.url}/api/v1/nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "route_not_found"
