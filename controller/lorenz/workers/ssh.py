"""SSH placement: workers on another host, reached with nothing but OpenSSH.

The remote host needs ``lorenz`` installed and passwordless ``ssh`` from the controller (keys
or an agent; ``BatchMode`` is always on, so a prompt is a failure, never a hang). Three kinds
of ssh invocation do everything:

* ``ssh HOST lorenz worker --spec - --state-root ROOT --detach`` with the spec on stdin starts
  the worker exactly as a local launch does; it returns once the worker serves its socket;
* ``ssh -N -L LOCAL.sock:REMOTE.sock HOST`` (stream-local forwarding, one per followed run)
  makes the remote control socket a local one, so the protocol and :class:`WorkerHandle` are
  the same as for local workers; tool calls travel back through it, so the tracker token
  stays on the controller's host;
* ``ssh HOST lorenz worker --probe|--journal-after|--kill …`` answers probes and catch-up
  reads, and kills a stopped run's processes on the host when its worker did not end it (a
  frozen or gone worker: :mod:`lorenz.workers.leftovers`).

ssh's exit status 255 means it could not reach or log in to the host: a launch then fails
with ``worker_host_unreachable``, a probe says ``unknown`` (the worker may well live on; a
network failure proves nothing about it) and a kill is unconfirmed (``worker_kill_unconfirmed``:
the slot stays held until a later kill gets through).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from lorenz.codes import ErrorCode
from lorenz.workers.handles import WorkerKillUnconfirmed
from lorenz.workers.journal import Record
from lorenz.workers.launch import (
    LaunchResult,
    WorkerLaunchError,
    launch_arguments,
    run_launch_command,
    worker_process_env,
)
from lorenz.workers.protocol import LINE_LIMIT_BYTES
from lorenz.workers.spec import RunSpec
from lorenz.workers.states import Probe, ProbeState

logger = logging.getLogger(__name__)

SSH_UNREACHABLE: Final = 255
"""ssh's own failure status (connection, authentication, forwarding)."""

DEFAULT_REMOTE_COMMAND: Final = ("lorenz", "worker")
DEFAULT_REMOTE_STATE_ROOT: Final = "~/.lorenz/workers"

BASE_OPTIONS: Final = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=15",
    "-o", "ServerAliveCountMax=3",
)

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::(?P<port>\d{1,5}))?$")


def ssh_destination(host: str) -> tuple[str, list[str]]:
    """``user@host:port`` / ``[v6]:port`` → (destination, port options) for the ssh command."""
    match = _HOST_PORT.match(host.strip())
    if match is None:
        raise WorkerLaunchError(
            f"{host!r} is not host, host:port or [v6]:port (worker.ssh_hosts)",
            code=ErrorCode.WORKER_HOST_INVALID,
        )
    destination = match["host"]
    if destination.startswith("[") and destination.endswith("]"):
        destination = destination[1:-1]
    return destination, (["-p", match["port"]] if match["port"] else [])


class SshTransport:
    """Workers on one ssh host (one ``worker.ssh_hosts`` entry)."""

    name = "ssh"

    def __init__(
        self,
        *,
        host: str,
        ssh_command: Sequence[str] = ("ssh",),
        ssh_options: Sequence[str] = (),
        remote_command: Sequence[str] = DEFAULT_REMOTE_COMMAND,
        remote_state_root: str = DEFAULT_REMOTE_STATE_ROOT,
        env: Mapping[str, str] | None = None,
        secret_values: Sequence[str] = (),
        launch_timeout_s: float = 60.0,
        forward_timeout_s: float = 30.0,
        probe_timeout_s: float = 30.0,
    ) -> None:
        self.host = host
        destination, port_options = ssh_destination(host)
        self._ssh = [*ssh_command, *BASE_OPTIONS, *port_options, *ssh_options]
        self._destination = destination
        self.remote_command = tuple(remote_command)
        self.remote_state_root = remote_state_root
        self.env = worker_process_env(base=env, secret_values=secret_values)
        """The ssh processes' environment (tracker secrets stripped by name and value)."""
        self.launch_timeout_s = launch_timeout_s
        self.forward_timeout_s = forward_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self._local_dir = Path(tempfile.mkdtemp(prefix="lzs"))
        os.chmod(self._local_dir, 0o700)
        self._remote_sockets: dict[str, str] = {}
        self._forwards: dict[str, asyncio.subprocess.Process] = {}

    @property
    def local_dir(self) -> Path:
        """The private (0700) directory of this transport's forwarded sockets."""
        return self._local_dir

    def _remote(self, *args: str) -> list[str]:
        return [*self._ssh, "--", self._destination, shlex.join([*self.remote_command, *args])]

    def _state_dir(self, handle: str) -> str:
        return f"{self.remote_state_root.rstrip('/')}/{handle}"

    async def launch(self, spec: RunSpec) -> LaunchResult:
        result = await run_launch_command(
            self._remote(*launch_arguments(self.remote_state_root)),
            spec=spec,
            env=self.env,
            timeout_s=self.launch_timeout_s,
            unreachable_status=SSH_UNREACHABLE,
        )
        self._remote_sockets[result.handle] = result.socket
        return result

    async def probe(self, handle: str) -> Probe:
        try:
            status, out, err = await self._run(
                self._remote("--probe", "--state-dir", self._state_dir(handle))
            )
        except TimeoutError:
            return Probe(state=ProbeState.UNKNOWN, detail=f"no answer from {self.host}")
        if status != 0:
            return Probe(
                state=ProbeState.UNKNOWN,
                detail=f"ssh {self.host} failed with status {status}: {err[-300:]}",
            )
        try:
            raw = json.loads(out)
            probe = Probe.from_json(raw)
        except ValueError as exc:
            return Probe(state=ProbeState.UNKNOWN, detail=f"unreadable probe answer ({exc})")
        socket_path = raw.get("socket")
        if isinstance(socket_path, str):
            self._remote_sockets[handle] = socket_path
        return probe

    async def read_journal(self, handle: str, *, after_seq: int) -> list[Record]:
        status, out, err = await self._run(
            self._remote(
                "--journal-after", str(after_seq), "--state-dir", self._state_dir(handle)
            )
        )
        if status != 0:
            raise OSError(f"reading the journal on {self.host} failed: {err[-300:]}")
        return [Record.from_json(json.loads(line)) for line in out.splitlines() if line.strip()]

    async def kill(self, handle: str) -> None:
        """Kill the run's processes on the host (``lorenz worker --kill``), bounded by
        ``probe_timeout_s``; :class:`WorkerKillUnconfirmed` unless the host confirms."""
        try:
            status, out, err = await self._run(
                self._remote("--kill", "--state-dir", self._state_dir(handle))
            )
        except TimeoutError:
            raise WorkerKillUnconfirmed(
                f"no answer from {self.host} to the kill of the run {handle} within "
                f"{self.probe_timeout_s:.0f} s; the slot stays held and the kill is tried again"
            ) from None
        if status != 0:
            said = (err.strip() or out.strip())[-300:]
            raise WorkerKillUnconfirmed(
                f"the kill of the run {handle} on {self.host} was not confirmed (ssh status "
                f"{status}: {said}); check the host, the slot stays held and the kill is tried "
                "again"
            )
        logger.info("killed the run's processes on the host handle=%s host=%s", handle, self.host)

    async def connect(self, handle: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        local = await self._forward(handle)
        return await asyncio.open_unix_connection(str(local), limit=LINE_LIMIT_BYTES)

    async def close_forward(self, handle: str) -> None:
        process = self._forwards.pop(handle, None)
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            # NB: an ssh that outlives SIGTERM is left to the transport's kill.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), timeout=5)
        with contextlib.suppress(FileNotFoundError):
            (self._local_dir / f"{handle}.sock").unlink()

    async def close(self) -> None:
        for handle in list(self._forwards):
            await self.close_forward(handle)
        shutil.rmtree(self._local_dir, ignore_errors=True)

    async def _forward(self, handle: str) -> Path:
        """The local end of ``handle``'s forwarded socket, starting ssh -L when needed."""
        local = self._local_dir / f"{handle}.sock"
        process = self._forwards.get(handle)
        if process is not None and process.returncode is None and local.exists():
            return local
        await self.close_forward(handle)
        remote = self._remote_sockets.get(handle)
        if remote is None:
            probe = await self.probe(handle)
            remote = self._remote_sockets.get(handle)
            if remote is None:
                raise OSError(f"cannot locate the socket of {handle} on {self.host}: {probe}")
        argv = [
            *self._ssh,
            "-N",
            "-o", "ExitOnForwardFailure=yes",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "StreamLocalBindMask=0177",
            "-L", f"{local}:{remote}",
            "--", self._destination,
        ]
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        self._forwards[handle] = process
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.forward_timeout_s
        while not local.exists():
            if process.returncode is not None or loop.time() > deadline:
                await self.close_forward(handle)
                raise OSError(f"ssh could not forward the socket of {handle} from {self.host}")
            await asyncio.sleep(0.02)
        return local

    async def _run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                out, err = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")
