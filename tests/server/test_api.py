"""The JSON API against a real server and a real runtime running real agent subprocesses."""

from __future__ import annotations

import asyncio
import datetime
import json
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from lorenz.server import ERROR_CODES
from tests.server.helpers import SENTINEL_SECRET, get_json, issue, make_rig, release, serve
from tests.waiting import wait_until_async


def _error_of(document: dict[str, Any]) -> tuple[str, str]:
    assert set(document) == {"error"}
    error = document["error"]
    assert set(error) == {"code", "message"}
    assert error["code"] in ERROR_CODES
    return error["code"], error["message"]


async def test_state_is_the_runtime_snapshot_with_running_rows(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1), issue(2)])
    served = await serve(rig)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 2,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 2",
    )

    state = await get_json(http, f"{served.url}/api/v1/state")

    assert state["workflow_path"] == str(rig.workflow.path)
    assert sorted(row["identifier"] for row in state["running"]) == ["T-1", "T-2"]
    assert state["poll"]["count"] == 1
    assert state["poll"]["candidates"] == 2
    assert {"usage_totals", "rate_limits", "recent_events", "run_history"} <= set(state)
    assert "daemon" not in state
    release(rig, "T-1")
    release(rig, "T-2")


async def test_state_carries_the_daemon_block_when_given(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig, daemon_info=lambda: {"pid": 4242, "endpoint": "unix:///x.sock"})

    state = await get_json(http, f"{served.url}/api/v1/state")

    assert state["daemon"] == {"pid": 4242, "endpoint": "unix:///x.sock"}


async def test_issue_detail_gathers_slots_workspace_events_and_agent_messages(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1), issue(2)])
    served = await serve(rig)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: any(
            e.issue.identifier == "T-1" and e.last_agent_message == "started work on T-1"
            for e in rig.orchestrator.state.running.values()
        ),
        timeout=15.0,
        what='a running T-1 whose last agent message is "started work on T-1"',
    )

    detail = await get_json(http, f"{served.url}/api/v1/issues/T-1")

    assert detail["identifier"] == "T-1"
    assert detail["issue_id"] == "id-1"
    assert detail["status"] == "running"
    assert detail["state"] == "Todo"
    assert detail["title"] == "Issue 1"
    assert [row["slot_key"] for row in detail["running"]] == ["id-1#0"]
    assert detail["retrying"] == []
    assert detail["workspace"] == {
        "path": str((tmp_path / "workspaces" / "T-1").resolve()),
        "recorded": True,
    }
    assert detail["attempts"] == {
        "current_retry_attempt": None,
        "restart_count": 0,
        "runs_started": 1,
    }
    assert detail["last_agent"]["message"] == "started work on T-1"
    messages = [u["message"] for u in detail["agent_updates"]]
    assert messages[0] == "started work on T-1"
    assert any(m and m.startswith("command started") for m in messages[1:])
    assert [e["type"] for e in detail["recent_events"]] == ["run_started"]
    assert all(e.get("identifier") == "T-1" for e in detail["recent_events"])

    # The same issue after its run failed: retrying, with the error and the history entry.
    release(rig, "T-1", fail=True)
    await wait_until_async(
        lambda: "id-1#0" in rig.orchestrator.state.retry_attempts,
        timeout=15.0,
        what='"id-1#0" in rig.orchestrator.state.retry_attempts',
    )
    detail = await get_json(http, f"{served.url}/api/v1/issues/T-1")
    assert detail["status"] == "retrying"
    assert detail["running"] == []
    assert detail["retrying"][0]["kind"] == "failure"
    assert detail["attempts"]["current_retry_attempt"] == 1
    assert detail["last_error"] is not None
    assert "exit" in detail["last_error"]
    assert [h["outcome"] for h in detail["run_history"]] == ["failed"]
    types = [e["type"] for e in detail["recent_events"]]
    assert types[:2] == ["retry_scheduled", "run_failed"]
    assert all(h["identifier"] == "T-1" for h in detail["run_history"])
    release(rig, "T-2")


async def test_issue_detail_by_id_and_by_identifier_with_slash_and_hash(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(7, identifier="acme/widgets#7")])
    served = await serve(rig)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 1,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 1",
    )

    encoded = urllib.parse.quote("acme/widgets#7", safe="")
    by_identifier = await get_json(http, f"{served.url}/api/v1/issues/{encoded}")
    by_id = await get_json(http, f"{served.url}/api/v1/issues/id-7")
    plain_slash = await get_json(
        http, f"{served.url}/api/v1/issues/acme/widgets{urllib.parse.quote('#7')}"
    )

    assert by_identifier["identifier"] == by_id["identifier"] == "acme/widgets#7"
    assert plain_slash["issue_id"] == "id-7"
    assert by_identifier["workspace"]["recorded"] is True
    release(rig, "acme/widgets#7")


async def test_issue_known_only_from_history_is_idle_with_computed_workspace(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)], agent_body="print('done')\n")
    served = await serve(rig)
    await rig.runtime.poll_once(wait_for_runs=True)
    # Finished cleanly: a continuation retry; releasing it leaves only history and events.
    await rig.orchestrator.release_retry(next(iter(rig.orchestrator.state.retry_attempts)))

    detail = await get_json(http, f"{served.url}/api/v1/issues/t-1")  # case-insensitive

    assert detail["status"] == "idle"
    assert detail["identifier"] == "T-1"
    assert [h["outcome"] for h in detail["run_history"]] == ["success"]
    assert detail["workspace"]["recorded"] is False
    assert detail["workspace"]["path"] == str((tmp_path / "workspaces" / "T-1").resolve())


async def test_unknown_issue_is_404_issue_not_found(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig)

    document = await get_json(http, f"{served.url}/api/v1/issues/NOPE-1", status=404)

    code, message = _error_of(document)
    assert code == "issue_not_found"
    assert "NOPE-1" in message


async def test_refresh_queues_a_poll_and_answers_202(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)], agent_body="print('done')\n")
    served = await serve(rig)

    for body in (None, b"", b"{}", b"  {}  "):
        before = rig.runtime.poll_count
        async with http.post(
            f"{served.url}/api/v1/refresh",
            data=body,
            headers={**served.auth, "Content-Type": "application/json"} if body else served.auth,
        ) as response:
            assert response.status == 202
            result = await response.json()
        assert result["queued"] is True
        assert result["operations"] == ["poll", "reconcile"]
        assert isinstance(result["coalesced"], bool)

        def polled_again(before: int = before) -> bool:
            return rig.runtime.poll_count > before

        await wait_until_async(polled_again, timeout=15.0, what="another poll")
    await rig.runtime.wait_for_runs()
    assert rig.of_type("refresh_requested")


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"force": true}', b"null", b"\xff\xfe", b'"{}"'],
)
async def test_refresh_with_a_body_other_than_empty_object_is_400(
    tmp_path: Path, http: aiohttp.ClientSession, body: bytes
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)

    async with http.post(
        f"{served.url}/api/v1/refresh",
        data=body,
        headers={"Content-Type": "application/json", **served.auth},
    ) as response:
        assert response.status == 400
        code, _ = _error_of(await response.json())
    assert code == "invalid_request_body"
    assert rig.runtime.poll_count == 0


async def test_refresh_and_health_after_the_runtime_stopped_are_503(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    async with http.get(f"{served.url}/healthz") as response:
        assert response.status == 200
        assert (await response.json())["status"] == "ok"

    rig.runtime.stop()

    async with http.post(f"{served.url}/api/v1/refresh", headers=served.auth) as response:
        assert response.status == 503
        assert _error_of(await response.json())[0] == "orchestrator_unavailable"
    async with http.get(f"{served.url}/healthz") as response:
        assert response.status == 503
        assert _error_of(await response.json())[0] == "orchestrator_unavailable"


@pytest.mark.parametrize("path", ["/", "/api/v1", "/api/v1/nope", "/api/v2/state", "/metrics/x"])
async def test_unknown_route_is_404_route_not_found(
    tmp_path: Path, http: aiohttp.ClientSession, path: str
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)

    for method in ("GET", "POST", "DELETE"):
        async with http.request(method, served.url + path) as response:
            assert response.status == 404
            assert response.content_type == "application/json"
            assert _error_of(await response.json())[0] == "route_not_found"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/api/v1/state", {"GET", "HEAD"}),
        ("DELETE", "/api/v1/issues/T-1", {"GET", "HEAD"}),
        ("GET", "/api/v1/refresh", {"POST"}),
        ("PUT", "/api/v1/refresh", {"POST"}),
        ("POST", "/metrics", {"GET", "HEAD"}),
        ("PATCH", "/healthz", {"GET", "HEAD"}),
        ("POST", "/api/v1/events", {"GET", "HEAD"}),
        ("DELETE", "/api/v1/openapi.json", {"GET", "HEAD"}),
    ],
)
async def test_wrong_method_is_405_with_allow_header(
    tmp_path: Path, http: aiohttp.ClientSession, method: str, path: str, allowed: set[str]
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)

    async with http.request(method, served.url + path) as response:
        assert response.status == 405
        assert {m.strip() for m in response.headers["Allow"].split(",")} == allowed
        code, message = _error_of(await response.json())
    assert code == "method_not_allowed"
    assert method in message


async def test_extra_routes_override_builtins_and_static_routes_mount(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    calls: list[str] = []

    async def daemon_refresh(request: web.Request) -> web.Response:
        calls.append("refresh")
        return web.json_response({"queued": True, "by": "daemon"}, status=202)

    async def daemon_stop(request: web.Request) -> web.Response:
        return web.json_response({"stopping": True}, status=202)

    async def index(request: web.Request) -> web.Response:
        return web.Response(text="<h1>dashboard</h1>", content_type="text/html")

    rig = make_rig(tmp_path, issues=[])
    served = await serve(
        rig,
        extra_routes=[web.post("/api/v1/refresh", daemon_refresh),
                      web.post("/api/v1/stop", daemon_stop)],
        static_routes=[web.get("/", index)],
        extra_openapi_paths={"/api/v1/stop": {"post": {"responses": {"202": {
            "description": "stopping"}}}}},
    )

    async with http.post(f"{served.url}/api/v1/refresh", headers=served.auth) as response:
        assert response.status == 202
        assert (await response.json())["by"] == "daemon"
    async with http.post(f"{served.url}/api/v1/stop", headers=served.auth) as response:
        assert response.status == 202
    async with http.get(f"{served.url}/") as response:
        assert "dashboard" in await response.text()
    async with http.get(f"{served.url}/api/v1/stop") as response:
        assert response.status == 405
    document = await get_json(http, f"{served.url}/api/v1/openapi.json")
    assert "/api/v1/stop" in document["paths"]
    assert calls == ["refresh"]
    assert rig.runtime.poll_count == 0


async def test_a_failing_handler_answers_500_internal_error_and_the_server_lives_on(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    def broken_daemon_info() -> dict[str, Any]:
        raise RuntimeError("daemon lease unreadable")

    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig, daemon_info=broken_daemon_info)

    async with http.get(f"{served.url}/api/v1/state") as response:
        assert response.status == 500
        code, message = _error_of(await response.json())
    assert code == "internal_error"
    assert "daemon lease unreadable" not in message
    async with http.get(f"{served.url}/healthz") as response:
        assert response.status == 200


async def test_malformed_requests_never_crash_the_server(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig)
    assert served.server.port is not None
    weird_paths = [
        "/api/v1/issues/%00", "/api/v1/issues/%ZZ", "/api/v1/issues/" + "x" * 5000,
        "/api/v1/issues/%F0%9F%92%A5", "/api/v1/issues/..%2F..%2Fetc", "//api//v1//state",
    ]
    for path in weird_paths:
        async with http.get(served.url + path) as response:
            assert response.status in (400, 404, 414, 431), path
            if response.status == 404:
                assert response.content_type == "application/json"

    # Raw garbage on the socket: the connection may be refused, the server must survive it.
    for garbage in (b"NOT HTTP\r\n\r\n", b"GET / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):
        reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
        writer.write(garbage)
        await writer.drain()
        await asyncio.wait_for(reader.read(4096), timeout=5)
        writer.close()
        await writer.wait_closed()

    # A large body on refresh is refused without reading it all into a crash.
    async with http.post(
        f"{served.url}/api/v1/refresh",
        data=b"{" * (3 * 1024 * 1024),
        headers={**served.auth, "Content-Type": "application/json"},
    ) as resp:
        assert resp.status in (400, 413)
        assert _error_of(await resp.json())[0] in ("invalid_request_body", "request_rejected")

    state = await get_json(http, f"{served.url}/api/v1/state")
    assert state["app_status"] == "starting"


async def test_no_response_ever_contains_the_tracker_api_key(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(
        tmp_path,
        issues=[issue(1), issue(2)],
        front_matter={"tracker": {"kind": "memory", "api_key": SENTINEL_SECRET}},
    )
    assert rig.runtime.settings.tracker.api_key == SENTINEL_SECRET
    served = await serve(rig, sse_heartbeat=0.05)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 2,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 2",
    )
    release(rig, "T-2", fail=True)
    await wait_until_async(
        lambda: len(rig.orchestrator.state.retry_attempts) == 1,
        timeout=15.0,
        what="len(rig.orchestrator.state.retry_attempts) == 1",
    )

    bodies: list[str] = []
    for path in ("/api/v1/state", "/api/v1/issues/T-1", "/api/v1/issues/T-2", "/metrics",
                 "/healthz", "/api/v1/openapi.json", "/api/v1/nope", "/api/v1/issues/ZZ-9"):
        async with http.get(served.url + path) as response:
            bodies.append(await response.text())
            bodies.append(json.dumps(dict(response.headers)))
    async with http.post(f"{served.url}/api/v1/refresh", headers=served.auth) as response:
        bodies.append(await response.text())
    async with http.get(f"{served.url}/api/v1/events") as response:
        chunks = b""
        while chunks.count(b"\n\n") < 3:
            chunks += await response.content.read(65536)
        bodies.append(chunks.decode())

    assert all(SENTINEL_SECRET not in body for body in bodies)
    assert any("T-2" in body for body in bodies)  # the bodies really carry the state
    release(rig, "T-1")


async def test_a_failed_reload_is_in_the_state_until_a_reload_succeeds(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    path = rig.workflow.path
    good = path.read_text(encoding="utf-8")
    await rig.runtime.poll_once()
    assert (await get_json(http, f"{served.url}/api/v1/state"))["config_error"] is None

    path.write_text("---\ntracker: [unterminated\n---\nbody\n", encoding="utf-8")
    await rig.runtime.poll_once()
    error = (await get_json(http, f"{served.url}/api/v1/state"))["config_error"]
    assert error["code"] == "workflow_parse_error"
    assert error["message"]
    since = datetime.datetime.fromisoformat(error["since"])
    assert since.tzinfo is not None

    # Still broken (differently): the error is the new one, its start stays the first failure's.
    path.write_text("---\npolling: {interval_ms: -5}\n---\nbody\n", encoding="utf-8")
    await rig.runtime.poll_once()
    again = (await get_json(http, f"{served.url}/api/v1/state"))["config_error"]
    assert again["since"] == error["since"]
    assert again["message"] != error["message"]

    # Put back as it was: the workflow in force is the file again, nothing is failing.
    path.write_text(good, encoding="utf-8")
    await rig.runtime.poll_once()
    assert (await get_json(http, f"{served.url}/api/v1/state"))["config_error"] is None

    path.write_text("---\ntracker: [unterminated\n---\nbody\n", encoding="utf-8")
    await rig.runtime.poll_once()
    assert (await get_json(http, f"{served.url}/api/v1/state"))["config_error"] is not None
    path.write_text(good.replace("interval_ms: 50", "interval_ms: 60"), encoding="utf-8")
    await rig.runtime.poll_once()
    assert rig.of_type("workflow_reloaded")
    assert (await get_json(http, f"{served.url}/api/v1/state"))["config_error"] is None
