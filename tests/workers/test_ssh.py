"""SSH placement against a real OpenSSH server on 127.0.0.1, started by the tests with its own
host key and a test-only client key (scripts/install-sshd installs Debian's openssh-server)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from lorenz.workers.handles import WorkerHandle, WorkerUnknown, launch
from lorenz.workers.launch import WorkerLaunchError
from lorenz.workers.ssh import SshTransport, ssh_destination
from lorenz.workers.states import ProbeState
from tests.waiting import wait_until_async
from tests.workers.conftest import (
    SECRET,
    Collected,
    SpecFactory,
    environ_of,
    kill_workers_under,
    process_gone,
)

SSHD = Path("/usr/sbin/sshd")
REMOTE_COMMAND = (sys.executable, "-m", "lorenz.cli.worker")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class Sshd:
    dir: Path
    port: int
    config: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def remote_root(self) -> Path:
        return self.dir / "remote"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "sshd.log").open("ab"),
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # Only the listener: sessions it already forked live on, as on a real host.
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        self.process = None

    def transport(self, **options: object) -> SshTransport:
        return SshTransport(
            host="lorenz-test",
            ssh_options=["-F", str(self.client_config)],
            remote_command=REMOTE_COMMAND,
            remote_state_root=str(self.remote_root),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir),
                 "LINEAR_API_KEY": SECRET},
            secret_values=[SECRET],
            **options,  # type: ignore[arg-type]
        )


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True
    )


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.fail("openssh-server is missing: run scripts/install-sshd")
    base = Path(tempfile.mkdtemp(prefix="lzh", dir="/tmp"))
    os.chmod(base, 0o700)
    user = getpass.getuser()
    _keygen(base / "host_key")
    _keygen(base / "client_key")
    (base / "authorized_keys").write_text((base / "client_key.pub").read_text())
    os.chmod(base / "authorized_keys", 0o600)
    port = free_port()
    config = base / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {base / 'host_key'}",
                f"PidFile {base / 'sshd.pid'}",
                f"AuthorizedKeysFile {base / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                # NB: /tmp is world-writable; the key files themselves are 0600 in a 0700 dir.
                "StrictModes no",
                "UsePAM no",
                f"AllowUsers {user}",
                # NB: with OpenSSH 9.2, `AllowTcpForwarding no` also refuses stream-local
                # (unix socket) forwarding, whatever AllowStreamLocalForwarding says.
                "AllowStreamLocalForwarding yes",
                "X11Forwarding no",
                "PrintMotd no",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    host_pub = (base / "host_key.pub").read_text().split()
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (base / "ssh_config").write_text(
        "\n".join(
            [
                "Host lorenz-test",
                "  HostName 127.0.0.1",
                f"  Port {port}",
                f"  User {user}",
                f"  IdentityFile {base / 'client_key'}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {base / 'known_hosts'}",
                "  StrictHostKeyChecking yes",
                "  LogLevel ERROR",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    server = Sshd(dir=base, port=port, config=config)
    server.start()
    try:
        _wait_for_login(server)
        yield server
    finally:
        server.stop()
        kill_workers_under(server.remote_root)
        shutil.rmtree(base, ignore_errors=True)


def _wait_for_login(server: Sshd) -> None:
    for _ in range(300):
        done = subprocess.run(
            ["ssh", "-F", str(server.client_config), "-o", "BatchMode=yes", "lorenz-test", "true"],
            capture_output=True,
        )
        if done.returncode == 0:
            return
        if server.process is not None and server.process.poll() is not None:
            break
        import time

        time.sleep(0.1)
    log = (server.dir / "sshd.log").read_text(errors="replace")
    pytest.fail(f"the test sshd does not accept logins: {done.stderr!r}\n{log[-2000:]}")


@pytest.fixture
async def transport(sshd: Sshd) -> AsyncIterator[SshTransport]:
    if sshd.process is None:
        sshd.start()
        _wait_for_login(sshd)
    ssh = sshd.transport()
    try:
        yield ssh
    finally:
        await ssh.close()


def remote_workspace(sshd: Sshd, name: str) -> Path:
    return sshd.dir / "remote-ws" / name


async def test_dispatch_runs_the_worker_on_the_host_with_a_remote_workspace(
    sshd: Sshd, transport: SshTransport, make_spec: SpecFactory
) -> None:
    from lorenz.workers.spec import HookSpec

    workspace = remote_workspace(sshd, "dispatch")
    hooks = HookSpec(after_create="echo made-remotely > origin.txt", env={"PATH": "/usr/bin:/bin"})
    spec, scenario = make_spec(workspace=workspace, create_workspace=True, hooks=hooks)
    handle, result = await launch(spec, transport=transport)
    assert result.state_dir == str(sshd.remote_root / spec.handle)
    collected = Collected()
    final = await handle.follow(collected)
    assert final.data["outcome"] == "success"
    assert collected.seqs() == list(range(1, final.seq + 1))
    assert handle.attaches == 1, "followed live through the forwarded socket"
    assert (workspace / "origin.txt").read_text() == "made-remotely\n"
    assert scenario.marks.read_text().split("\n")[:2] == ["start 1", "end 1"]


async def test_tool_calls_come_back_over_the_forwarded_socket_and_the_token_stays_home(
    sshd: Sshd, transport: SshTransport, make_spec: SpecFactory
) -> None:
    from lorenz.workers.client import CallHandlers
    from tests.workers.test_crashes import TokenTools

    tools = TokenTools()
    spec, scenario = make_spec(
        workspace=remote_workspace(sshd, "tools"),
        create_workspace=True,
        turns=[{"steps": [{"tool": "linear_graphql", "arguments": {"query": "{ a }"}},
                          {"gate": "/nonexistent-until-cancel"}]}],
        tools=tools.tool_specs(),
    )
    handle, result = await launch(spec, transport=transport, handlers=CallHandlers(tools=tools))
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.kind == "tool_call" for r in rs))
    assert tools.calls == [("linear_graphql", {"query": "{ a }"})]
    await wait_until_async(
        lambda: bool(scenario.answers()),
        timeout=60.0,
        what="bool(scenario.answers())",
    )
    assert scenario.answers()[0]["answer"]["success"] is True
    assert result.pid is not None
    assert SECRET.encode() not in environ_of(result.pid)
    assert SECRET.encode() not in environ_of(scenario.agent_pid())
    assert await handle.cancel("enough")
    final = await asyncio.wait_for(follow, timeout=60)
    assert final.data["outcome"] == "canceled"


async def test_cancel_over_ssh_stops_the_remote_agent(
    sshd: Sshd, transport: SshTransport, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(
        workspace=remote_workspace(sshd, "cancel"), create_workspace=True, gate="never"
    )
    handle, _ = await launch(spec, transport=transport)
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    assert await handle.cancel("issue moved to Done")
    final = await asyncio.wait_for(follow, timeout=60)
    assert final.data["outcome"] == "canceled"
    assert final.data["reason"] == "issue moved to Done"
    await wait_until_async(
        lambda: process_gone(scenario.agent_pid()),
        timeout=60.0,
        what="process_gone(scenario.agent_pid())",
    )


async def test_a_restarted_controller_adopts_the_remote_worker_without_gap_or_rerun(
    sshd: Sshd, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(
        workspace=remote_workspace(sshd, "adopt"), create_workspace=True, gate="go"
    )
    first = sshd.transport()
    handle, result = await launch(spec, transport=first)
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    # The controller goes away: its task, its forward, everything it had.
    follow.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follow
    await first.close()
    last = collected.records[-1].seq
    assert result.pid is not None
    assert not process_gone(result.pid)
    # A new controller knows only the handle and the last seq it persisted.
    second = sshd.transport()
    try:
        probe = await second.probe(spec.handle)
        assert probe.state is ProbeState.ALIVE
        adopted = WorkerHandle(transport=second, handle=spec.handle, last_seq=last)
        rest = Collected()
        scenario.open_gate("go")
        final = await adopted.follow(rest)
    finally:
        await second.close()
    assert final.data["outcome"] == "success"
    assert collected.seqs() + rest.seqs() == list(range(1, final.seq + 1))
    assert scenario.marks.read_text().split().count("start") == 1


async def test_a_worker_that_finished_while_nobody_watched_is_collected_from_its_journal(
    sshd: Sshd, transport: SshTransport, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec(
        workspace=remote_workspace(sshd, "late"), create_workspace=True, linger_ms=0
    )
    await transport.launch(spec)

    async def finished() -> bool:
        return (await transport.probe(spec.handle)).state is ProbeState.FINAL

    async with asyncio.timeout(60):
        while not await finished():
            await asyncio.sleep(0.1)
    late = WorkerHandle(transport=transport, handle=spec.handle, last_seq=2)
    collected = Collected()
    final = await late.follow(collected)
    assert collected.seqs() == list(range(3, final.seq + 1))
    assert final.data["outcome"] == "success"


async def test_host_down_is_a_coded_launch_error_and_an_unknown_probe(
    sshd: Sshd, make_spec: SpecFactory
) -> None:
    spec, _ = make_spec(workspace=remote_workspace(sshd, "down"), create_workspace=True)
    down = SshTransport(
        host=f"127.0.0.1:{free_port()}",
        ssh_options=["-F", str(sshd.client_config), "-o", "ConnectTimeout=5"],
        remote_command=REMOTE_COMMAND,
    )
    try:
        with pytest.raises(WorkerLaunchError) as caught:
            await down.launch(spec)
        assert caught.value.code == "worker_host_unreachable"
        probe = await down.probe(spec.handle)
        assert probe.state is ProbeState.UNKNOWN
        handle = WorkerHandle(transport=down, handle=spec.handle, unknown_patience_s=0.5)
        with pytest.raises(WorkerUnknown):
            await handle.follow(Collected())
    finally:
        await down.close()


async def test_sshd_down_mid_run_then_back_the_run_is_still_adopted(
    sshd: Sshd, make_spec: SpecFactory
) -> None:
    spec, scenario = make_spec(
        workspace=remote_workspace(sshd, "flap"), create_workspace=True, gate="go"
    )
    first = sshd.transport()
    handle, _ = await launch(spec, transport=first)
    collected = Collected()
    follow = asyncio.create_task(handle.follow(collected))
    await collected.wait_for(lambda rs: any(r.data.get("event") == "session_started" for r in rs))
    follow.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follow
    await first.close()
    sshd.stop()
    second = sshd.transport()
    try:
        assert (await second.probe(spec.handle)).state is ProbeState.UNKNOWN
        sshd.start()
        _wait_for_login(sshd)
        adopted = WorkerHandle(
            transport=second, handle=spec.handle, last_seq=collected.records[-1].seq
        )
        scenario.open_gate("go")
        rest = Collected()
        final = await adopted.follow(rest)
    finally:
        await second.close()
    assert final.data["outcome"] == "success"
    assert collected.seqs() + rest.seqs() == list(range(1, final.seq + 1))


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("build-1", ("build-1", [])),
        ("ci@build-1:2222", ("ci@build-1", ["-p", "2222"])),
        ("[::1]:22", ("::1", ["-p", "22"])),
    ],
)
def test_ssh_destinations(host: str, expected: tuple[str, list[str]]) -> None:
    assert ssh_destination(host) == expected


def test_a_malformed_host_is_a_coded_error() -> None:
    with pytest.raises(WorkerLaunchError) as caught:
        ssh_destination("a:b:c")
    assert caught.value.code == "worker_host_invalid"
    assert json.dumps(caught.value.message)
