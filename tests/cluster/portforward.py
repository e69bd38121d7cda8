"""TCP plumbing between the host's network namespace and the test node's.

The test node (tests/cluster/node.py) runs in a network namespace of its own, so that it can
have a non-loopback address without touching the host's interfaces. The control plane stays on
the host's 127.0.0.1. Three kinds of traffic cross the boundary, all through this module:

- node → API server: a `Forwarder` listening inside the node's namespace (on the node IP and on
  the `kubernetes` Service IP, which pods use) that dials the API server on the host's loopback;
- API server → kubelet (logs, exec, port-forward): the API server's egress selector sends its
  "cluster" traffic as HTTP CONNECT over a unix socket to `ConnectProxy`, which dials addresses
  in the node's subnet from inside the node's namespace and everything else (webhooks on the
  host, say) from the host's;
- pods → test servers on the host (a fake tracker): another `Forwarder`.

A socket belongs to the network namespace its creating thread was in, so switching one thread
into the node's namespace just for `socket()` is all it takes (`in_netns`); nothing runs as a
separate process, and everything stops with `close()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import selectors
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


@contextlib.contextmanager
def in_netns(netns: Path | None) -> Iterator[None]:
    """Run the block with this thread in the network namespace at `netns` (None: stay put)."""
    if netns is None:
        yield
        return
    own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            # NB: if this failed the thread would stay in the node's namespace for good; it
            # cannot fail for a namespace fd the thread came from.
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def dial(
    address: tuple[str, int], *, netns: Path | None = None, timeout: float = 10.0
) -> socket.socket:
    """A TCP connection to `address`, made from inside `netns` (None: this namespace)."""
    with in_netns(netns):
        sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(None)
    return sock


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides closed (half-closes passed on)."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    open_ends = 2
    try:
        while open_ends:
            for key, _ in sel.select(timeout=60.0):
                src: socket.socket = key.fileobj  # type: ignore[assignment]
                dst: socket.socket = key.data
                try:
                    chunk = src.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    try:
                        dst.sendall(chunk)
                    except OSError:
                        return
                    continue
                sel.unregister(src)
                open_ends -= 1
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
    finally:
        sel.close()
        a.close()
        b.close()


@dataclass
class _Server:
    """A listening socket served by one accept thread; each connection gets a thread."""

    listener: socket.socket
    handle: Callable[[socket.socket], None]
    name: str
    _thread: threading.Thread | None = field(default=None, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._accept_loop, name=self.name, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        self.listener.settimeout(0.5)
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(
                target=self._serve, args=(conn,), name=f"{self.name}-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _tcp_listener(address: tuple[str, int], *, netns: Path | None) -> socket.socket:
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(64)
    return sock


@dataclass
class Forwarder:
    """Listens on `listen` in `listen_netns`; each connection is piped to `target`, dialled
    from `target_netns` (None: the host's namespace)."""

    listen: tuple[str, int]
    target: tuple[str, int]
    listen_netns: Path | None = None
    target_netns: Path | None = None
    _server: _Server | None = field(default=None, repr=False)

    def start(self) -> Forwarder:
        listener = _tcp_listener(self.listen, netns=self.listen_netns)
        self.listen = listener.getsockname()[:2]
        self._server = _Server(
            listener=listener,
            handle=self._handle,
            name=f"forward-{self.listen[0]}:{self.listen[1]}",
        )
        self._server.start()
        return self

    def _handle(self, conn: socket.socket) -> None:
        try:
            upstream = dial(self.target, netns=self.target_netns)
        except OSError:
            conn.close()
            return
        _pump(conn, upstream)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


_MAX_CONNECT_HEAD = 8192


@dataclass
class ConnectProxy:
    """An HTTP CONNECT proxy on a unix socket, for kube-apiserver's egress selector.

    Addresses inside a routed network (`route(network, netns)`) are dialled from that network
    namespace, the rest from the host's. With no route, a node address is simply unreachable,
    as it would be without the proxy.
    """

    path: Path
    _routes: dict[ipaddress.IPv4Network, Path] = field(default_factory=dict, repr=False)
    _server: _Server | None = field(default=None, repr=False)

    def start(self) -> ConnectProxy:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        self.path.chmod(0o600)
        listener.listen(64)
        self._server = _Server(listener=listener, handle=self._handle, name="egress-proxy")
        self._server.start()
        return self

    def route(self, network: str, netns: Path) -> None:
        with _lock:
            self._routes[ipaddress.IPv4Network(network)] = netns

    def unroute(self, network: str) -> None:
        with _lock:
            self._routes.pop(ipaddress.IPv4Network(network), None)

    def _netns_for(self, host: str) -> Path | None:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return None
        with _lock:
            for network, netns in self._routes.items():
                if ip in network:
                    return netns
        return None

    def _handle(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(1024)
            if not chunk or len(head) > _MAX_CONNECT_HEAD:
                conn.close()
                return
            head += chunk
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or parts[0] != "CONNECT" or ":" not in parts[1]:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()
            return
        host, _, port_text = parts[1].rpartition(":")
        host = host.strip("[]")
        try:
            upstream = dial((host, int(port_text)), netns=self._netns_for(host))
        except (OSError, ValueError) as err:
            conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{err}".encode())
            conn.close()
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        _pump(conn, upstream)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def egress_selector_config(proxy_socket: Path) -> str:
    """kube-apiserver's --egress-selector-config-file: "cluster" traffic via `proxy_socket`."""
    return (
        "apiVersion: apiserver.k8s.io/v1beta1\n"
        "kind: EgressSelectorConfiguration\n"
        "egressSelections:\n"
        "- name: cluster\n"
        "  connection:\n"
        "    proxyProtocol: HTTPConnect\n"
        "    transport:\n"
        "      uds:\n"
        f"        udsName: {proxy_socket}\n"
    )
