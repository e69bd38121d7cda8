"""The SSE snapshot stream: current state first, live changes, coalescing, heartbeats, leaving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from lorenz.model import RuntimeSnapshot
from lorenz.server import HUB_KEY, SnapshotHub, encode_event
from tests.server.helpers import SseReader, issue, make_rig, release, serve
from tests.waiting import wait_until_async


def _hub(served_app: object) -> SnapshotHub:
    assert served_app is not None
    return served_app[HUB_KEY]  # type: ignore[index, no-any-return]


def test_frames_are_single_data_lines_even_for_text_with_newlines() -> None:
    frame = encode_event(event="snapshot", data={"message": "two\nlines\r\n"}, event_id=7)

    text = frame.decode()
    assert text.endswith("\n\n")
    lines = text[:-2].split("\n")
    assert lines[0] == "id: 7"
    assert lines[1] == "event: snapshot"
    assert lines[2].startswith("data: ")
    assert len(lines) == 3
    assert json.loads(lines[2][len("data: "):]) == {"message": "two\nlines\r\n"}


async def test_stream_starts_with_the_current_snapshot_then_follows_runs(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig)
    await rig.runtime.poll_once()
    await wait_until_async(
        lambda: len(rig.orchestrator.state.running) == 1,
        timeout=15.0,
        what="len(rig.orchestrator.state.running) == 1",
    )

    async with http.get(f"{served.url}/api/v1/events") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"].startswith("no-cache")
        reader = SseReader(response)
        first_frame = await reader.next_frame()
        assert first_frame["retry"] == "2000"
        assert first_frame["event"] == "snapshot"
        first = json.loads(first_frame["data"])
        assert [row["identifier"] for row in first["running"]] == ["T-1"]

        release(rig, "T-1", fail=True)
        after = await reader.snapshot_where(lambda s: not s["running"] and s["retrying"])
        assert after["retrying"][0]["identifier"] == "T-1"
        assert after["run_history"][0]["outcome"] == "failed"
        ids = [int(frame["id"]) for frame in reader.fields if "id" in frame]
        assert ids == sorted(ids)


async def test_a_burst_of_changes_is_coalesced_into_one_frame_of_the_latest_state(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    hub = _hub(served.server.app)

    async with http.get(f"{served.url}/api/v1/events") as response:
        reader = SseReader(response)
        await reader.next_snapshot()
        before = hub.broadcasts
        # NB: a burst of 100 changes inside one loop iteration, as an agent streaming deltas
        # produces; the runtime's own emitter is what every state change calls.
        for _ in range(100):
            rig.runtime._emit_snapshot()
        assert hub.broadcasts == before + 100
        frame = await reader.next_frame()

    assert frame["event"] == "snapshot"
    assert int(frame["id"]) == hub._version  # skipped straight to the latest of the burst
    assert hub.frames_encoded == 1


async def test_a_burst_of_changes_builds_one_snapshot_per_frame_not_per_change(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full snapshot is O(entries); a chatty agent is hundreds of changes a second. The hub
    # is told "changed" and builds the snapshot when it sends a frame.
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    hub = _hub(served.server.app)
    built: list[int] = []
    real = rig.runtime.snapshot

    def counted() -> RuntimeSnapshot:
        built.append(1)
        return real()

    async with http.get(f"{served.url}/api/v1/events") as response:
        reader = SseReader(response)
        await reader.next_snapshot()
        frames_before = hub.frames_encoded
        monkeypatch.setattr(rig.runtime, "snapshot", counted)
        for _ in range(100):
            rig.runtime._emit_snapshot()
        frame = await reader.next_frame()
    assert frame["event"] == "snapshot"
    assert int(frame["id"]) == hub._version
    frames = hub.frames_encoded - frames_before
    assert 1 <= frames <= 2
    assert len(built) == frames  # one per frame sent; none for the 100 changes themselves


async def test_changes_keep_flowing_to_a_watching_client_while_runs_start_and_end(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(n) for n in range(1, 11)],
                   front_matter={"agent": {"max_concurrent_agents": 20}})
    served = await serve(rig)

    async with http.get(f"{served.url}/api/v1/events") as response:
        reader = SseReader(response)
        await reader.next_snapshot()
        await rig.runtime.poll_once()
        await reader.snapshot_where(
            lambda s: len(s["running"]) == 10
            and all(r["last_agent_message"] == f"started work on {r['identifier']}"
                    for r in s["running"])
        )
        for n in range(1, 11):
            release(rig, f"T-{n}")
        final = await reader.snapshot_where(lambda s: len(s["run_history"]) == 10)

    assert final["running"] == []
    assert {h["outcome"] for h in final["run_history"]} == {"success"}


async def test_fanout_encodes_each_version_once_for_all_clients(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[issue(1)])
    served = await serve(rig)
    hub = _hub(served.server.app)
    responses = [await http.get(f"{served.url}/api/v1/events") for _ in range(5)]
    try:
        readers = [SseReader(r) for r in responses]
        for reader in readers:
            await reader.next_snapshot()
        assert hub.client_count == 5
        encoded_before = hub.frames_encoded

        await rig.runtime.poll_once()
        for reader in readers:
            await reader.snapshot_where(lambda s: len(s["running"]) == 1)
        await wait_until_async(
            lambda: len(rig.orchestrator.state.running) == 1,
            timeout=15.0,
            what="len(rig.orchestrator.state.running) == 1",
        )
        sends = sum(
            len([f for f in reader.fields if f.get("event") == "snapshot"]) - 1
            for reader in readers
        )
        assert hub.frames_encoded - encoded_before < sends
    finally:
        for response in responses:
            response.close()
    release(rig, "T-1")


async def test_heartbeat_comments_keep_an_idle_stream_alive(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig, sse_heartbeat=0.05)

    async with http.get(f"{served.url}/api/v1/events") as response:
        reader = SseReader(response)
        await reader.next_snapshot()
        frame = await reader.next_frame()
        second = await reader.next_frame()

    assert frame == {":comment": "heartbeat"}
    assert second == {":comment": "heartbeat"}


async def test_disconnect_unsubscribes_and_the_last_client_drops_the_runtime_subscription(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    hub = _hub(served.server.app)
    listeners = rig.runtime._change_listeners  # the runtime's own list: nothing may leak there

    first = await http.get(f"{served.url}/api/v1/events")
    second = await http.get(f"{served.url}/api/v1/events")
    await SseReader(first).next_snapshot()
    await SseReader(second).next_snapshot()
    assert hub.client_count == 2
    assert hub.subscribed
    assert len(listeners) == 1  # one subscription however many clients

    first.close()
    await wait_until_async(
        lambda: hub.client_count == 1,
        timeout=15.0,
        what="hub.client_count == 1",
    )
    assert hub.subscribed
    second.close()
    await wait_until_async(
        lambda: hub.client_count == 0,
        timeout=15.0,
        what="hub.client_count == 0",
    )
    assert not hub.subscribed
    assert listeners == []

    # And a new client subscribes afresh.
    async with http.get(f"{served.url}/api/v1/events") as third:
        await SseReader(third).next_snapshot()
        assert hub.subscribed


async def test_server_stop_ends_open_streams_promptly(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    rig = make_rig(tmp_path, issues=[])
    served = await serve(rig)
    response = await http.get(f"{served.url}/api/v1/events")
    reader = SseReader(response)
    await reader.next_snapshot()

    await asyncio.wait_for(served.server.stop(), timeout=10)

    ended = False
    try:
        await reader.next_frame(timeout=5)
    except (EOFError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        ended = True
    response.close()
    assert ended
    assert rig.runtime._change_listeners == []
