"""Commands in a Pod's container through the API server's exec channel, as streams.

The operator reaches the worker inside a run's Pod the way ``kubectl exec`` does: a WebSocket
to ``pods/{name}/exec`` on the API server (authenticated and authorized there, proxied by the
kubelet), speaking the channel protocol ``v5.channel.k8s.io`` (``v4`` as a fallback): each
binary frame starts with one byte naming the stream — 0 stdin, 1 stdout, 2 stderr, 3 the
command's final status (a ``metav1.Status`` JSON), and with v5, 255 closes one of the others.

Two shapes serve the Pod transport:

* :func:`run_in_pod` runs a short command (``lorenz worker --probe``) and returns its exit
  status and output;
* :func:`open_pod_stream` runs a long one (``lorenz worker --bridge``, which splices its stdio
  onto the worker's unix socket inside the Pod) and hands back an ``asyncio`` stream pair, so the
  worker's control protocol and :class:`~lorenz.workers.handles.WorkerHandle` work unchanged.
  The pair is one end of a local ``socketpair``; a pump task moves bytes between its other end
  and the WebSocket. Either side closing closes the other: the reader then sees EOF, which the
  handle treats as a lost connection (probe, re-attach after the last seq).

NB: the credentials are the operator's :class:`~lorenz.kube.clients.KubeApi` configuration
(client certificates, a bearer token that may rotate, the CA bundle), read again for every
connection, so a rotated ServiceAccount token is picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiohttp

from lorenz.workers.protocol import LINE_LIMIT_BYTES

logger = logging.getLogger(__name__)

PROTOCOLS: Final = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
OUTPUT_LIMIT_BYTES: Final = 64 * 1024 * 1024
"""The most a short command may print (a journal catch-up can be large, never unbounded)."""


class PodExecError(Exception):
    """The exec channel could not be opened (the Pod, the container or the API refused)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    message: str = ""
    """The status message of a failed command (``command terminated with non-zero exit``…)."""


def _exit_code(status: dict[str, Any]) -> tuple[int, str]:
    if status.get("status") == "Success":
        return 0, ""
    message = str(status.get("message") or "")
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message")), message
    return 1, message or json.dumps(status)[:300]


class PodExec:
    """Opens exec channels with the credentials of one API client configuration."""

    def __init__(
        self,
        configuration: Any,
        *,
        connect_timeout_s: float = 30.0,
        parent: PodExec | None = None,
    ) -> None:
        self._configuration = configuration
        self.connect_timeout_s = connect_timeout_s
        self._ssl: ssl.SSLContext | bool | None = None
        self._parent = parent
        self.opened = 0
        """Channels opened so far (for figures; a scope's count its parent's too)."""
        self._sessions: set[aiohttp.ClientSession] = set()
        """The sessions of channels still open (each closes its own when it ends)."""

    def scoped(self) -> PodExec:
        """A PodExec with the same credentials whose :meth:`close` closes only the channels
        opened through it (one run's transport: its streams end with the run)."""
        return PodExec(self._configuration, connect_timeout_s=self.connect_timeout_s, parent=self)

    @property
    def open_channels(self) -> int:
        """Channels opened through this PodExec that are not closed yet."""
        return len(self._sessions)

    async def close(self) -> None:
        """Close every channel still open (a bridge's pump ends; its reader sees EOF).

        NB: an abandoned runtime leaves its followers cancelled mid-read; without this their
        sessions were only found by the garbage collector ("Unclosed client session")."""
        sessions = list(self._sessions)
        self._sessions.clear()
        for session in sessions:
            with contextlib.suppress(Exception):
                await session.close()

    def http_base(self) -> str:
        """The API server's base URL (``https://host:port``)."""
        return str(self._configuration.host).rstrip("/")

    def auth_headers(self) -> dict[str, str]:
        """The credentials' headers, read anew (a rotated token is the one sent)."""
        return self._headers()

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS context of the credentials (client certificate, CA bundle)."""
        if self._parent is not None:
            return self._parent.ssl_context()
        return self._ssl_context()

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if self._ssl is None:
            config = self._configuration
            if not str(config.host).startswith("https"):
                self._ssl = False
            else:
                context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
                if config.cert_file:
                    context.load_cert_chain(config.cert_file, config.key_file or None)
                if not config.verify_ssl:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                self._ssl = context
        return self._ssl

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        # NB: auth_settings() asks the configuration's refresh hook first, so an in-cluster
        # token that the kubelet rotated is the one sent.
        for setting in self._configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"])] = str(setting["value"])
        return headers

    def _url(
        self, *, namespace: str, pod: str, container: str, command: Sequence[str], stdin: bool
    ) -> str:
        query: list[tuple[str, str]] = [("container", container), ("stdout", "true"),
                                        ("stderr", "true"), ("stdin", "true" if stdin else "false")]
        query += [("command", part) for part in command]
        base = str(self._configuration.host).rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base.removeprefix("https://")
        elif base.startswith("http://"):
            base = "ws://" + base.removeprefix("http://")
        path = (
            f"/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods/"
            f"{urllib.parse.quote(pod, safe='')}/exec"
        )
        return f"{base}{path}?{urllib.parse.urlencode(query)}"

    async def _connect(
        self, *, namespace: str, pod: str, container: str, command: Sequence[str], stdin: bool
    ) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
        )
        self._sessions.add(session)
        try:
            socket_ = await asyncio.wait_for(
                session.ws_connect(
                    self._url(
                        namespace=namespace,
                        pod=pod,
                        container=container,
                        command=command,
                        stdin=stdin,
                    ),
                    protocols=PROTOCOLS,
                    headers=self._headers(),
                    ssl=self.ssl_context(),
                    max_msg_size=LINE_LIMIT_BYTES + 1024,
                    autoping=True,
                    heartbeat=30.0,
                ),
                timeout=self.connect_timeout_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            await self._end(session)
            raise PodExecError(
                f"exec into {namespace}/{pod} refused: {exc.status} {exc.message}",
                status=exc.status,
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self._end(session)
            raise PodExecError(f"exec into {namespace}/{pod} failed: {exc}") from None
        except BaseException:
            # NB: a cancelled connect (a run abandoned mid-probe) closes its session too.
            await asyncio.shield(self._end(session))
            raise
        self.opened += 1
        if self._parent is not None:
            self._parent.opened += 1
        return session, socket_

    async def _end(self, session: aiohttp.ClientSession) -> None:
        self._sessions.discard(session)
        await session.close()

    async def run(
        self,
        *,
        namespace: str,
        pod: str,
        container: str,
        command: Sequence[str],
        timeout_s: float = 60.0,
    ) -> ExecResult:
        """Run ``command`` to its end; its exit status and output."""
        session, ws = await self._connect(
            namespace=namespace, pod=pod, container=container, command=command, stdin=False
        )
        out, err = bytearray(), bytearray()
        status: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(timeout_s):
                async for message in ws:
                    if message.type is not aiohttp.WSMsgType.BINARY or not message.data:
                        continue
                    channel, payload = message.data[0], message.data[1:]
                    if channel == STDOUT:
                        out += payload
                    elif channel == STDERR:
                        err += payload
                    elif channel == STATUS and payload:
                        with contextlib.suppress(ValueError):
                            status = json.loads(payload)
                    if len(out) + len(err) > OUTPUT_LIMIT_BYTES:
                        raise PodExecError(f"{command[0]} in {pod} printed too much")
        except TimeoutError:
            what = " ".join(command[:3])
            raise PodExecError(f"{what} in {pod} took over {timeout_s} s") from None
        finally:
            # NB: shielded: a cancelled probe still closes its channel and session.
            await asyncio.shield(self._close_channel(ws, session))
        if status is None:
            raise PodExecError(f"exec into {namespace}/{pod} ended without a status")
        code, text = _exit_code(status)
        return ExecResult(exit_code=code, stdout=bytes(out), stderr=bytes(err), message=text)

    async def open_stream(
        self, *, namespace: str, pod: str, container: str, command: Sequence[str]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start ``command`` with stdin and stdout spliced onto the returned streams."""
        session, ws = await self._connect(
            namespace=namespace, pod=pod, container=container, command=command, stdin=True
        )
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        try:
            reader, writer = await asyncio.open_connection(sock=theirs, limit=LINE_LIMIT_BYTES)
        except BaseException:
            ours.close()
            theirs.close()
            await asyncio.shield(self._close_channel(ws, session))
            raise
        pump = asyncio.get_running_loop().create_task(
            _pump(ws, session, ours, label=f"{namespace}/{pod}", ended=self._sessions.discard),
            name=f"lorenz-exec:{pod}",
        )
        # NB: a strong reference until the pump ends (the loop keeps only weak ones).
        _PUMPS.add(pump)
        pump.add_done_callback(_PUMPS.discard)
        return reader, writer

    async def _close_channel(
        self, ws: aiohttp.ClientWebSocketResponse, session: aiohttp.ClientSession
    ) -> None:
        with contextlib.suppress(Exception):
            await ws.close()
        await self._end(session)


_PUMPS: set[asyncio.Task[None]] = set()


async def _pump(
    ws: aiohttp.ClientWebSocketResponse,
    session: aiohttp.ClientSession,
    local: socket.socket,
    *,
    label: str,
    ended: Callable[[aiohttp.ClientSession], None],
) -> None:
    loop = asyncio.get_running_loop()

    async def upstream() -> None:
        while True:
            data = await loop.sock_recv(local, 65536)
            if not data:
                return
            await ws.send_bytes(bytes([STDIN]) + data)

    async def downstream() -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.BINARY or not message.data:
                continue
            channel, payload = message.data[0], message.data[1:]
            if channel == STDOUT and payload:
                await loop.sock_sendall(local, payload)
            elif channel == STDERR and payload:
                logger.debug("exec stderr %s: %s", label, payload[:500].decode(errors="replace"))
            elif channel == STATUS and payload:
                logger.debug("exec ended %s: %s", label, payload[:300].decode(errors="replace"))
                return

    tasks = [
        asyncio.ensure_future(upstream()),
        asyncio.ensure_future(downstream()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            # NB: a pump side ending with a connection error is just the channel closing.
            with contextlib.suppress(BaseException):
                await task
        local.close()
        with contextlib.suppress(Exception):
            await ws.close()
        ended(session)
        await session.close()
