"""API abuse against a real server on 127.0.0.1: foreign Host names, cross-origin senders, missing
or wrong tokens, non-JSON bodies, deeply nested JSON, oversized request lines and headers."""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lorenz.server.bodies import MAX_BODY_DEPTH, nesting_depth
from lorenz.server.credentials import read_token_file, token_file_beside, write_token_file
from lorenz.server.guard import RequestGuard, split_host
from lorenz.server.protocol_log import ProtocolErrorLog
from tests.server.helpers import Served, make_rig, serve


async def _served(tmp_path: Path, **server_options: Any) -> Served:
    return await serve(make_rig(tmp_path, issues=[]), **server_options)


async def _post(
    http: aiohttp.ClientSession, served: Served, path: str, **options: Any
) -> tuple[int, dict[str, Any], Any]:
    async with http.post(served.url + path, **options) as response:
        return response.status, await response.json(), response.headers


def _code(body: dict[str, Any]) -> str:
    code: str = body["error"]["code"]
    return code


# -- Host (DNS rebinding) ---------------------------------------------------------------------


async def test_a_foreign_host_header_is_refused_on_every_route(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await _served(tmp_path)
    port = served.server.port
    for path in ("/api/v1/state", "/healthz", "/metrics", "/api/v1/openapi.json", "/nope"):
        for host in ("evil.example", f"evil.example:{port}", f"rebind.attacker.test:{port}"):
            async with http.get(served.url + path, headers={"Host": host}) as response:
                assert response.status == 403, (path, host)
                assert _code(await response.json()) == "host_not_allowed"
    # The same name with another port is not this server either.
    async with http.get(f"{served.url}/api/v1/state", headers={"Host": "localhost:1"}) as response:
        assert response.status == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
        async with http.get(f"{served.url}/api/v1/state", headers={"Host": host}) as response:
            assert response.status == 200, host


async def test_an_absolute_form_target_is_checked_like_a_host_header(tmp_path: Path) -> None:
    served = await _served(tmp_path)
    port = served.server.port
    assert port is not None
    for target, status in (
        (f"http://evil.example:{port}/api/v1/state", b"403"),
        (f"http://127.0.0.1:{port}/api/v1/state", b"200"),
    ):
        request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        answer = await _raw(port, request.encode())
        assert answer.split(b" ")[1] == status, (target, answer[:200])


async def test_configured_host_names_are_accepted(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await _served(tmp_path, allowed_hosts=["lorenz.internal", "proxy.example:8443"])
    for host, status in (
        ("lorenz.internal", 200),
        ("lorenz.internal:9999", 200),
        ("proxy.example:8443", 200),
        ("proxy.example", 403),
        ("proxy.example:8444", 403),
    ):
        async with http.get(f"{served.url}/api/v1/state", headers={"Host": host}) as response:
            assert response.status == status, host


async def test_the_allowed_hosts_setting_reaches_the_server(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[], front_matter={"server": {"allowed_hosts": ["box.lan"]}})
    served = await serve(rig)
    async with http.get(f"{served.url}/api/v1/state", headers={"Host": "box.lan"}) as response:
        assert response.status == 200
    async with http.get(f"{served.url}/api/v1/state", headers={"Host": "other.lan"}) as response:
        assert response.status == 403


def test_host_headers_are_parsed_strictly() -> None:
    assert split_host("Example.COM:8080") == ("example.com", 8080)
    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("localhost") == ("localhost", None)
    for bad in ("", "a b", "user@host:1", "host:99999", "host/path", "[::1", "host:port"):
        assert split_host(bad) is None, bad
    guard = RequestGuard(bind_host="0.0.0.0")
    assert guard.host_allowed("10.1.2.3:80", local_address="10.1.2.3", local_port=80)
    assert guard.host_allowed("10.1.2.3", local_address="10.1.2.3", local_port=80)
    assert not guard.host_allowed("10.9.9.9:80", local_address="10.1.2.3", local_port=80)
    assert guard.host_allowed("[::1]:81", local_address="::ffff:127.0.0.1", local_port=81)
    with pytest.raises(ValueError, match="not a host name"):
        RequestGuard(allowed_hosts=["not a host"])


# -- Origin, content type, token ----------------------------------------------------------------


async def test_a_cross_origin_text_plain_refresh_is_refused_even_with_the_token(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await _served(tmp_path)
    for headers in (
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},
        {"Origin": "null", "Content-Type": "text/plain"},
        {"Origin": "http://evil.example", **served.auth},
        {"Sec-Fetch-Site": "cross-site", **served.auth},
    ):
        status, body, _ = await _post(http, served, "/api/v1/refresh", data=b"{}", headers=headers)
        assert status in (401, 403), headers
        if "Authorization" in headers:
            assert (status, _code(body)) == (403, "cross_origin_refused")
    assert served.rig.runtime.poll_count == 0
    assert not served.rig.of_type("refresh_requested")

    same_origin = {"Origin": served.url, "Sec-Fetch-Site": "same-origin", **served.auth}
    status, body, _ = await _post(http, served, "/api/v1/refresh", headers=same_origin)
    assert status == 202, body


async def test_a_refresh_without_the_token_or_with_a_wrong_one_is_401(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await _served(tmp_path)
    status, body, headers = await _post(http, served, "/api/v1/refresh")
    assert (status, _code(body)) == (401, "auth_token_missing")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    for wrong in ("Bearer nope", "Basic dXNlcjpwYXNz", "Bearer ", "bearer x" + "y" * 100):
        status, body, _ = await _post(
            http, served, "/api/v1/refresh", headers={"Authorization": wrong}
        )
        assert status == 401, wrong
        assert _code(body) in ("auth_token_missing", "auth_token_invalid")
    assert served.rig.runtime.poll_count == 0
    status, _, _ = await _post(http, served, "/api/v1/refresh", headers=served.auth)
    assert status == 202


async def test_a_non_json_body_is_415(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    served = await _served(tmp_path)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, body, _ = await _post(
            http,
            served,
            "/api/v1/refresh",
            data=b"{}",
            headers={"Content-Type": content_type, **served.auth},
        )
        assert (status, _code(body)) == (415, "unsupported_media_type"), content_type
    assert served.rig.runtime.poll_count == 0


async def test_the_token_file_is_private_rewritten_each_start_and_honoured(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    token_file = tmp_path / ".lorenz" / "daemon" / "abc.token"
    served = await _served(tmp_path, token_file=token_file)
    first = read_token_file(token_file)
    assert first is not None
    assert served.server.guard is not None
    assert first == served.server.guard.token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert not [p for p in token_file.parent.iterdir() if p.name.endswith(".tmp")]
    bearer = {"Authorization": f"Bearer {first}"}
    status, _, _ = await _post(http, served, "/api/v1/refresh", headers=bearer)
    assert status == 202

    # Another server of the same workflow rewrites the file; both honour the token in it.
    (tmp_path / "b").mkdir()
    second_server = await _served(tmp_path / "b", token_file=token_file)
    second = read_token_file(token_file)
    assert second is not None
    assert second != first
    for target in (served, second_server):
        status, _, _ = await _post(
            http, target, "/api/v1/refresh", headers={"Authorization": f"Bearer {second}"}
        )
        assert status == 202
    status, _, _ = await _post(http, second_server, "/api/v1/refresh", headers=bearer)
    assert status == 401


async def test_an_unwritable_token_file_is_a_warning_and_the_server_serves(
    tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("", encoding="utf-8")
    served = await _served(tmp_path, token_file=blocker / "x.token")
    assert "code=server_token_file_unwritable" in caplog.text
    async with http.get(f"{served.url}/api/v1/state") as response:
        assert response.status == 200
    status, _, _ = await _post(http, served, "/api/v1/refresh", headers=served.auth)
    assert status == 202  # the token still works for whoever holds it in memory


def test_token_files_are_written_atomically_and_read_defensively(tmp_path: Path) -> None:
    path = token_file_beside(tmp_path / "d" / "0123.lock.json")
    assert path == tmp_path / "d" / "0123.token"
    write_token_file(path, "t1")
    write_token_file(path, "t2")
    assert read_token_file(path) == "t2"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.write_bytes(b"x" * 5000)
    assert read_token_file(path) is None
    assert read_token_file(tmp_path / "missing") is None


async def test_the_unix_socket_needs_no_token(tmp_path: Path) -> None:
    socket_path = tmp_path / "s" / "lorenz.sock"
    served = await serve(make_rig(tmp_path, issues=[]), port=None, unix_socket=socket_path)
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post("http://whatever/api/v1/refresh") as response,
    ):
        assert response.status == 202
    assert served.rig.of_type("refresh_requested")


# -- bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_BODY_DEPTH + 1, 5000, 10000])
async def test_deeply_nested_json_is_400_request_body_too_deep(
    tmp_path: Path, http: aiohttp.ClientSession, depth: int
) -> None:
    served = await _served(tmp_path)
    for body in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        status, answer, _ = await _post(
            http,
            served,
            "/api/v1/refresh",
            data=body,
            headers={"Content-Type": "application/json", **served.auth},
        )
        assert (status, _code(answer)) == (400, "request_body_too_deep")
        assert str(MAX_BODY_DEPTH) in answer["error"]["message"]
    assert served.rig.runtime.poll_count == 0


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth("{}") == 1
    assert nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert nesting_depth('"[[[[[[[["') == 0
    assert nesting_depth(r'["\"[[[[", {}]') == 2
    assert nesting_depth("]]]]{") == 1
    assert nesting_depth("[" * 1000, stop_above=32) == 33


# -- what the HTTP parser refuses ------------------------------------------------------------


async def _raw(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        async with asyncio.timeout(10):
            return await reader.read(4096)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_100_kb_request_line_or_header_is_one_warning_line_not_a_traceback(
    tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    served = await _served(tmp_path)
    port = served.server.port
    assert port is not None
    caplog.set_level(logging.DEBUG)
    long_line = b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    long_header = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * 100_000 + b"\r\n\r\n"
    for payload in (long_line, long_header, long_line, long_line, long_header):
        answer = await _raw(port, payload)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 414, 431), answer[:200]

    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "lorenz.server"))]
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
    assert not [r for r in records if r.exc_info], "no traceback"
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    line = warnings[0].getMessage()
    assert "malformed HTTP request refused" in line
    assert "aaaa" not in line
    assert "bbbb" not in line
    # The server still answers.
    async with http.get(f"{served.url}/healthz") as response:
        assert response.status == 200


async def test_a_body_with_broken_framing_or_encoding_is_400_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = await _served(tmp_path)
    port = served.server.port
    assert port is not None
    assert served.server.guard is not None
    caplog.set_level(logging.DEBUG)
    head = (
        f"POST /api/v1/refresh HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {served.server.guard.token}\r\n"
        "Content-Type: application/json\r\n"
    )
    for extra, body in (
        ("Content-Encoding: gzip\r\nContent-Length: 5\r\n", "abcde"),
        ("Content-Encoding: deflate\r\nContent-Length: 5\r\n", "abcde"),
        ("Transfer-Encoding: chunked\r\n", "ZZ\r\n{}\r\n0\r\n\r\n"),
        ("Content-Length: abc\r\n", "{}"),
    ):
        answer = await _raw(port, f"{head}{extra}\r\n{body}".encode())
        assert answer.split(b" ")[1] == b"400", (extra, answer[:300])
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "lorenz.server"))]
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
    assert not [r for r in records if r.exc_info], "no traceback"
    assert served.rig.runtime.poll_count == 0


def test_parser_errors_are_rate_limited_and_the_next_line_counts_what_was_left_out() -> None:
    from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

    now = [100.0]
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    target = logging.getLogger("tests.protocol-log")
    target.propagate = False
    target.addHandler(Collect())
    log = ProtocolErrorLog(interval_s=60.0, clock=lambda: now[0], warnings_to=target)
    for _ in range(5):
        too_long = LineTooLong(b"x", 8190)
        log.exception("Error handling request from %s", "10.0.0.1", exc_info=too_long)
    now[0] += 61.0
    log.exception("Error handling request from %s", "10.0.0.2", exc_info=BadHttpMessage("bad"))
    assert len(lines) == 2
    assert lines[0].startswith("WARNING malformed HTTP request refused error=LineTooLong")
    assert "left_out=0" in lines[0]
    assert "error=BadHttpMessage" in lines[1]
    assert "left_out=4" in lines[1]
