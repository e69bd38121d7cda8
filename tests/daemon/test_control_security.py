"""A real daemon on ``--port``, attacked as a web page and a stranger would: it stays up.

Cross-origin and token-less stops, a foreign Host, malformed stop bodies, and the token file
(``0600``, fresh at every start) that ``lorenz stop`` reads; on the unix socket, another local
user is refused by the peer's uid (``SO_PEERCRED``) even when the file modes would let it in.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

from lorenz.daemon import attach
from lorenz.daemon.discovery import (
    find_target,
    lease_file_for,
    read_lease,
    read_token,
    token_file_for,
)
from lorenz.server.credentials import token_file_beside, write_token_file
from tests.daemon.harness import DaemonProcess
from tests.daemon.test_cli import lorenz, start


def _send(
    endpoint: str, method: str, path: str, *, body: bytes = b"", headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}
    finally:
        connection.close()


def _code(body: dict[str, Any]) -> str:
    code: str = body["error"]["code"]
    return code


def _still_serving(daemon: DaemonProcess, endpoint: str) -> None:
    # NB: an accepted stop is recorded (stop_requested) in the loop iteration right after its
    # answer is written, so this later request would see it; no waiting needed.
    assert daemon.alive()
    status, body = _send(endpoint, "GET", "/api/v1/daemon", headers={})
    assert status == 200
    assert body["stop_requested"] is None


def test_a_web_page_cannot_stop_a_daemon_on_a_port(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    daemon = start(root, daemon_env, daemons, "--port", "0")
    lease = read_lease(lease_file_for(root / "WORKFLOW.md"))
    assert lease is not None
    endpoint = lease["endpoint"]
    netloc = endpoint.removeprefix("http://")
    token = read_token(token_file_for(root / "WORKFLOW.md"))
    assert token is not None

    # What a page on http://evil.example can send without a preflight: text/plain, no token.
    page = {"Origin": "http://evil.example", "Content-Type": "text/plain", "Host": netloc}
    status, body = _send(endpoint, "POST", "/api/v1/stop", body=b"{}", headers=page)
    assert status in (401, 403), body
    _still_serving(daemon, endpoint)
    # Even a page that somehow held the token is refused for its origin.
    status, body = _send(
        endpoint,
        "POST",
        "/api/v1/stop",
        headers={"Origin": "http://evil.example", "Authorization": f"Bearer {token}"},
    )
    assert (status, _code(body)) == (403, "cross_origin_refused")
    _still_serving(daemon, endpoint)
    # DNS rebinding: the page's own name now points at 127.0.0.1.
    rebound = {"Host": f"evil.example:{netloc.rsplit(':', 1)[1]}"}
    status, body = _send(endpoint, "GET", "/api/v1/state", headers=rebound)
    assert (status, _code(body)) == (403, "host_not_allowed")
    status, body = _send(
        endpoint,
        "POST",
        "/api/v1/stop",
        headers={**rebound, "Authorization": f"Bearer {token}"},
    )
    assert (status, _code(body)) == (403, "host_not_allowed")
    _still_serving(daemon, endpoint)
    # A local stranger without the token file.
    for headers, code in (
        ({}, "auth_token_missing"),
        ({"Authorization": "Bearer guessed"}, "auth_token_invalid"),
    ):
        status, body = _send(endpoint, "POST", "/api/v1/stop", headers=headers)
        assert (status, _code(body)) == (401, code)
        status, body = _send(endpoint, "POST", "/api/v1/refresh", headers=headers)
        assert (status, _code(body)) == (401, code)
    _still_serving(daemon, endpoint)
    # Malformed stop bodies are refused like refresh's, token or not.
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for bad in (b"{", b'{"now": "yes"}', b'{"later": true}', b"[]", b"[" * 5000 + b"]" * 5000):
        status, body = _send(endpoint, "POST", "/api/v1/stop", body=bad, headers=auth)
        assert status == 400, bad[:20]
        assert _code(body) in ("invalid_request_body", "request_body_too_deep")
    _still_serving(daemon, endpoint)
    # Parser bombs: a 100 KB request line and a 100 KB header, three times each.
    host, port = netloc.rsplit(":", 1)
    for payload in (
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 100_000 + b"\r\n\r\n",
    ) * 3:
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(payload)
            assert raw.recv(64).split(b" ")[1] == b"400"
    _still_serving(daemon, endpoint)
    log = daemon.log()
    assert "stop requested" not in log
    assert log.count("malformed HTTP request refused") == 1, log[-3000:]
    assert "Traceback" not in log
    assert " ERROR " not in log
    assert "aaaaaaaa" not in log
    assert "bbbbbbbb" not in log

    # The owner's command reads the token file and stops it.
    stop = lorenz("stop", "WORKFLOW.md", "--wait", env=daemon_env, cwd=root)
    assert stop.returncode == 0, stop.stderr
    assert daemon.wait() == 0
    assert "stop requested reason=api" in daemon.log()


def test_the_token_file_is_private_and_fresh_at_every_start(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    workflow = root / "WORKFLOW.md"
    first = start(root, daemon_env, daemons, "--port", "0")
    path = token_file_for(workflow)
    assert path == token_file_beside(lease_file_for(workflow))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    old = read_token(path)
    assert old is not None
    assert old not in (lease_file_for(workflow).read_text(encoding="utf-8"), first.log())
    stop = lorenz("stop", "--wait", env=daemon_env, cwd=root)
    assert stop.returncode == 0, stop.stderr
    assert first.wait() == 0

    second = start(root, daemon_env, daemons, "--port", "0")
    new = read_token(path)
    assert new is not None
    assert new != old
    lease = read_lease(lease_file_for(workflow))
    assert lease is not None
    status, body = _send(
        lease["endpoint"], "POST", "/api/v1/stop", headers={"Authorization": f"Bearer {old}"}
    )
    assert (status, _code(body)) == (401, "auth_token_invalid")
    _still_serving(second, lease["endpoint"])

    # Without the file (another host, another user), --token-file names a copy of it.
    copy = root / "copied.token"
    copy.write_text(new + "\n", encoding="utf-8")
    path.unlink()
    refused = lorenz("refresh", "--url", lease["endpoint"], env=daemon_env, cwd=root)
    assert refused.returncode == 1
    assert "auth_token_missing" in refused.stderr
    refresh = lorenz(
        "refresh", "--url", lease["endpoint"], "--token-file", str(copy),
        env=daemon_env, cwd=root,
    )
    assert refresh.returncode == 0, refresh.stderr
    stop = lorenz("stop", "--token-file", str(copy), "--wait", env=daemon_env, cwd=root)
    assert stop.returncode == 0, stop.stderr
    assert second.wait() == 0


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b'{"queued": true}'
        self.send_response(200 if self.command == "GET" else 202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        return None


def test_the_token_goes_only_to_state_changing_requests_on_this_machine(tmp_path: Path) -> None:
    workflow = tmp_path / "WORKFLOW.md"
    workflow.write_text("---\n---\n", encoding="utf-8")
    write_token_file(token_file_for(workflow), "local-secret")
    copy = tmp_path / "copy.token"
    copy.write_text("copied-secret\n", encoding="utf-8")
    addresses = ("127.0.0.1", "127.0.0.2")
    servers = [http.server.ThreadingHTTPServer((address, 0), _Recorder) for address in addresses]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local, other = (
            f"http://{address}:{s.server_port}"
            for address, s in zip(addresses, servers, strict=True)
        )
        cases = [
            (find_target(workflow=str(workflow), url=local), "Bearer local-secret"),
            (find_target(workflow=str(workflow), port=servers[0].server_address[1]),
             "Bearer local-secret"),
            (find_target(workflow=str(workflow), url=other), None),
            (find_target(workflow=str(workflow), url=other, token_file=str(copy)),
             "Bearer copied-secret"),
        ]
        for target, expected in cases:
            _Recorder.seen.clear()
            attach.call(target, "GET", "/api/v1/state")
            attach.call(target, "POST", "/api/v1/refresh")
            assert _Recorder.seen == [("GET", None), ("POST", expected)], target.endpoint
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


STRANGER_UID = 65534
"""``nobody``: another local user."""

UNIX_HTTP = """\
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(30)
sock.connect(sys.argv[1])
body = b"{}" if sys.argv[2] == "POST" else b""
head = (
    f"{sys.argv[2]} {sys.argv[3]} HTTP/1.1\\r\\nHost: localhost\\r\\n"
    f"Content-Type: application/json\\r\\nContent-Length: {len(body)}\\r\\n"
    "Connection: close\\r\\n\\r\\n"
).encode()
sock.sendall(head + body)
answer = b""
while chunk := sock.recv(65536):
    answer += chunk
status = int(answer.split(b" ", 2)[1])
print(json.dumps({"status": status, "body": json.loads(answer.split(b"\\r\\n\\r\\n", 1)[1])}))
"""


def _as_user(uid: int | None, socket_path: Path, method: str, path: str) -> dict[str, Any]:
    """One HTTP request over the unix socket, from a process running as ``uid``."""
    done = subprocess.run(
        ["/usr/bin/python3", "-c", UNIX_HTTP, str(socket_path), method, path],
        capture_output=True,
        text=True,
        timeout=60,
        user=uid,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        check=True,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_another_user_cannot_use_the_control_socket_even_with_loosened_modes(
    root: Path, daemon_env: dict[str, str], daemons: list[DaemonProcess]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("connecting as another user needs root to switch to it")
    daemon = start(root, daemon_env, daemons)
    lease = read_lease(lease_file_for(root / "WORKFLOW.md"))
    assert lease is not None
    socket_path = Path(lease["endpoint"].removeprefix("unix://"))
    # The modes loosened (a chmod, a restored backup): the socket is world-connectable, and a
    # hard link in an open folder puts it where the stranger can reach it.
    os.chmod(socket_path, 0o666)
    open_dir = Path(tempfile.mkdtemp(prefix="lzp", dir="/tmp"))
    try:
        os.chmod(open_dir, 0o755)
        reachable = open_dir / "control.sock"
        os.link(socket_path, reachable)

        for method, path in (("POST", "/api/v1/stop"), ("GET", "/api/v1/state")):
            answer = _as_user(STRANGER_UID, reachable, method, path)
            assert answer["status"] == 403, answer
            assert answer["body"]["error"]["code"] == "peer_uid_refused"
        assert daemon.alive()
        mine = _as_user(None, reachable, "GET", "/api/v1/daemon")
        assert mine["status"] == 200, mine
        assert mine["body"]["stop_requested"] is None
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)
