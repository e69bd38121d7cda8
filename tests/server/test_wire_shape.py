"""The JSON the API and the event stream carry, pinned key by key.

The runtime's snapshot and events are typed objects inside the process; they become JSON only
at the HTTP edge. These tests hold that JSON to a recorded shape: every object's keys in their
order and each value's JSON type (``null`` matches any type, since optional fields are ``null``
until known). A field renamed, dropped, added, retyped or reordered fails here. Events differ by
type, so they are pinned per type (``EVENT_KEYS``).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.server.helpers import SseReader, get_json, release
from tests.server.test_openapi import serve_every_lane

Shape = Any


def shape_of(value: Any) -> Shape:
    """``{"object": [[key, shape], ...]}``, ``{"array": [distinct element shapes]}`` or a type."""
    if isinstance(value, dict):
        return {"object": [[key, shape_of(item)] for key, item in value.items()]}
    if isinstance(value, list):
        distinct: list[Shape] = []
        for item in value:
            if isinstance(item, dict) and "type" in item and "at" in item:
                continue  # an event: pinned per type
            item_shape = shape_of(item)
            if item_shape not in distinct:
                distinct.append(item_shape)
        return {"array": distinct}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string"


def mismatches(actual: Shape, expected: Shape, path: str = "$") -> list[str]:
    """Where ``actual`` departs from ``expected`` (``null`` on either side matches anything)."""
    if actual == "null" or expected == "null":
        return []
    if isinstance(actual, dict) and isinstance(expected, dict) and actual.keys() == expected.keys():
        if "object" in actual:
            keys, wanted = [k for k, _ in actual["object"]], [k for k, _ in expected["object"]]
            if keys != wanted:
                return [f"{path}: keys {keys} != {wanted}"]
            return [
                problem
                for (key, a), (_, e) in zip(actual["object"], expected["object"], strict=True)
                for problem in mismatches(a, e, f"{path}.{key}")
            ]
        problems: list[str] = []
        for element in actual["array"]:
            options: list[list[str]] = [
                mismatches(element, e, f"{path}[]") for e in expected["array"]
            ]
            if options and all(options):
                problems.extend(sorted(options, key=len)[0])
            elif not options:
                problems.append(f"{path}[]: no element expected here, got {element}")
        return problems
    return [] if actual == expected else [f"{path}: {actual} != {expected}"]


def event_mismatches(events: list[dict[str, Any]]) -> list[str]:
    problems = []
    for event in events:
        wanted = EVENT_KEYS.get(event["type"])
        if wanted is not None and list(event) != wanted:
            problems.append(f"{event['type']}: keys {list(event)} != {wanted}")
    return problems


_USAGE = {"object": [["input_tokens", "number"], ["output_tokens", "number"],
                     ["total_tokens", "number"]]}
RUNNING_ROW = {"object": [
    ["slot_key", "string"], ["issue_id", "string"], ["identifier", "string"],
    ["title", "string"], ["slot_index", "number"], ["state", "string"], ["url", "null"],
    ["agent_kind", "string"], ["host", "string"], ["workspace_path", "string"],
    ["session_id", "string"], ["agent_pid", "number"], ["attempt", "null"],
    ["retry_kind", "null"],
    ["turn_count", "number"], ["last_agent_event", "string"], ["last_agent_message", "string"],
    ["last_agent_at", "string"], ["started_at", "string"], ["runtime_seconds", "number"],
    ["usage", _USAGE], ["cost_usd", "number"],
]}
RESERVING_ROW = {"object": [
    ["slot_key", "string"], ["issue_id", "string"], ["identifier", "string"],
    ["title", "string"], ["slot_index", "number"], ["state", "string"], ["attempt", "null"],
    ["reserved_at", "string"], ["expires_at", "string"], ["expires_in_ms", "number"],
]}
RETRY_ROW = {"object": [
    ["slot_key", "string"], ["issue_id", "string"], ["identifier", "string"],
    ["slot_index", "number"], ["attempt", "number"], ["kind", "string"], ["due_at", "string"],
    ["due_in_ms", "number"], ["error", "string"], ["host", "string"],
    ["workspace_path", "string"],
]}
HISTORY_ENTRY = {"object": [
    ["issue_id", "string"], ["identifier", "string"], ["slot", "number"], ["attempt", "null"],
    ["outcome", "string"], ["error", "string"], ["started_at", "string"],
    ["finished_at", "string"], ["duration_ms", "number"], ["host", "string"],
    ["session_id", "string"], ["turn_count", "number"], ["usage", _USAGE],
]}
STATE = {"object": [
    ["generated_at", "string"],
    ["app_status", "string"],
    ["workflow_path", "string"],
    ["poll", {"object": [
        ["status", "string"], ["interval_ms", "number"], ["candidates", "number"],
        ["eligible", "number"], ["last_poll_at", "string"], ["next_poll_at", "null"],
        ["last_error", "null"], ["count", "number"], ["dispatch_paused", "null"],
    ]}],
    ["running", {"array": [RUNNING_ROW]}],
    ["reserving", {"array": [RESERVING_ROW]}],
    ["retrying", {"array": [RETRY_ROW]}],
    ["blocked", {"array": []}],
    ["waiting", {"array": []}],
    ["usage_totals", {"object": [
        ["input_tokens", "number"], ["output_tokens", "number"], ["total_tokens", "number"],
        ["seconds_running", "number"], ["cost_usd", "number"],
    ]}],
    ["rate_limits", "null"],
    ["claimed_elsewhere", {"array": []}],
    ["recent_events", {"array": []}],
    ["run_history", {"array": [HISTORY_ENTRY]}],
    ["log_file", "null"],
    ["config_error", "null"],
]}
DETAIL = {"object": [
    ["issue_id", "string"], ["identifier", "string"], ["status", "string"],
    ["title", "null"], ["state", "null"], ["url", "null"],
    ["workspace", {"object": [["path", "string"], ["recorded", "boolean"]]}],
    ["attempts", {"object": [
        ["current_retry_attempt", "number"], ["restart_count", "number"],
        ["runs_started", "number"],
    ]}],
    ["running", {"array": [RUNNING_ROW]}],
    ["reserving", {"array": [RESERVING_ROW]}],
    ["retrying", {"array": [RETRY_ROW]}],
    ["blocked", {"array": []}],
    ["last_agent", "null"],
    ["agent_updates", {"array": [{"object": [
        ["at", "null"], ["slot_key", "string"], ["event", "null"], ["message", "null"],
    ]}]}],
    ["tokens", _USAGE],
    ["recent_events", {"array": []}],
    ["run_history", {"array": [HISTORY_ENTRY]}],
    ["last_error", "string"],
]}
EVENT_KEYS = {
    "run_reserving": ["type", "at", "issue_id", "identifier", "slot", "message"],
    "run_started": ["type", "at", "issue_id", "identifier", "slot", "message", "host"],
    "run_failed": ["type", "at", "issue_id", "identifier", "slot", "message", "outcome"],
    "retry_scheduled": [
        "type", "at", "issue_id", "identifier", "slot", "message", "attempt", "retry_kind",
        "due_at", "delay_ms", "error",
    ],
    "poll_completed": ["type", "at", "message", "duration_ms", "candidates", "eligible"],
}
"""The keys of each event type these tests see, in order."""


async def test_the_state_document_keeps_its_shape(
    tmp_path: Any, http: aiohttp.ClientSession
) -> None:
    served = await serve_every_lane(tmp_path)

    state = await get_json(http, f"{served.url}/api/v1/state")
    detail = await get_json(http, f"{served.url}/api/v1/issues/T-3")

    assert mismatches(shape_of(state), STATE) == []
    assert mismatches(shape_of(detail), DETAIL) == []
    seen = {event["type"] for event in state["recent_events"] + detail["recent_events"]}
    assert set(EVENT_KEYS) <= seen, seen
    assert event_mismatches(state["recent_events"] + detail["recent_events"]) == []
    release(served.rig, "T-1")


async def test_the_event_stream_carries_the_state_document(
    tmp_path: Any, http: aiohttp.ClientSession
) -> None:
    served = await serve_every_lane(tmp_path)

    async with http.get(f"{served.url}/api/v1/events") as response:
        frame = await SseReader(response).next_snapshot()

    assert mismatches(shape_of(frame), STATE) == []
    assert frame["recent_events"]
    assert event_mismatches(frame["recent_events"]) == []
    release(served.rig, "T-1")


def test_the_shape_check_catches_a_renamed_or_reordered_field() -> None:
    row = {"slot_key": "a#0", "issue_id": "a", "identifier": "A-1"}
    expected = shape_of(row)
    assert mismatches(shape_of(dict(reversed(list(row.items())))), expected)
    assert mismatches(shape_of({**row, "slot_key": 1}), expected)
    assert mismatches(shape_of({"slot": "a#0", "issue_id": "a", "identifier": "A-1"}), expected)
    assert mismatches(shape_of({**row, "identifier": None}), expected) == []
    assert json.dumps(expected)  # the pins are plain JSON
