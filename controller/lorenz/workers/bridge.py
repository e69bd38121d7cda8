"""``lorenz worker --bridge``: this process's stdin and stdout spliced onto a control socket.

A worker in a Pod is reached through the Kubernetes API's exec channel, which gives a byte
stream to a command's stdio, not a socket. The bridge is that command: it connects to the
worker's unix socket as the worker's own uid (so the 0600 socket and the worker's
``SO_PEERCRED`` check stay as they are) and copies bytes both ways until either side ends. The
control protocol runs through it unchanged.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
from pathlib import Path
from typing import Final

CHUNK: Final = 65536


def bridge(socket_path: Path) -> int:
    """Copy stdin → socket and socket → stdout until one of them ends; 0, or 1 without a
    worker to connect to."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(socket_path))
    except OSError as exc:
        print(f"lorenz worker: cannot connect to {socket_path}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ)
    selector.register(sock, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj == stdin:
                    data = os.read(stdin, CHUNK)
                    if not data:
                        return 0
                    sock.sendall(data)
                else:
                    data = sock.recv(CHUNK)
                    if not data:
                        return 0
                    _write_all(stdout, data)
    except OSError:
        return 0  # NB: either side going away ends the bridge; the caller reconnects.
    finally:
        selector.close()
        sock.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
