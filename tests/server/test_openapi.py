"""The OpenAPI document against the real server: schemathesis over every operation, and every
kind of lane row validated against its schema.

The runtime behind the server holds a slot in every lane while the tests run: a running agent
(bound to a worker host), a reservation waiting for a host, a failed run waiting to retry, and
its entry in the run history.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
import hypothesis
import jsonschema
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from lorenz.model import SlotKey
from lorenz.server import openapi_document
from tests.server.helpers import (
    WAITING_AGENT,
    PoolGoverns,
    PoolHost,
    Served,
    get_json,
    issue,
    make_rig,
    release,
    serve,
)
from tests.waiting import wait_until_async

EXAMPLES_PER_OPERATION = 25
STREAMING_OPERATIONS = {"streamEvents"}
"""Never ends by design (tested in test_sse.py); a plain request/response checker would hang."""

FAILS_AT_ONCE = """
if env["LORENZ_ISSUE_IDENTIFIER"] == "T-3":
    print("giving up", flush=True)
    sys.exit(4)
""" + WAITING_AGENT


class OnePlacePool:
    """Hands a host to T-1's slot at once and keeps every other slot waiting (reserved)."""

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def acquire(self, *, key: SlotKey, timeout_ms: int) -> PoolHost | None:
        if key in ("id-1#0", "id-3#0"):
            return PoolHost("h1")
        await self.never.wait()
        return None

    async def release(self, slot: PoolHost, *, poison: bool) -> None:
        return None

    async def drain(self, *, deadline_ms: int) -> None:
        return None


async def serve_every_lane(tmp_path: Path) -> Served:
    rig = make_rig(
        tmp_path,
        issues=[issue(1), issue(2), issue(3, title="<img src=x onerror=alert(1)> ünïcode")],
        agent_body=FAILS_AT_ONCE,
        pool=OnePlacePool(),
        capacity=PoolGoverns(),
    )
    served = await serve(rig)
    await rig.runtime.poll_once()
    state = rig.orchestrator.state
    await wait_until_async(
        lambda: "id-1#0" in state.running
        and "id-2#0" in state.reserved
        and "id-3#0" in state.retry_attempts,
        timeout=15.0,
        what="id-1#0 running, id-2#0 reserved and id-3#0 retrying",
    )
    return served


def _validator(component: str) -> jsonschema.protocols.Validator:
    document = openapi_document()
    schema = {**document, "$ref": f"#/components/schemas/{component}"}
    validator_class = jsonschema.validators.validator_for(
        {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    )
    validator_class.check_schema(document["components"]["schemas"][component])
    return validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)  # type: ignore[no-any-return]


def _assert_valid(component: str, instance: Any) -> None:
    errors = sorted(_validator(component).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


async def test_every_lane_row_and_issue_detail_matches_the_document(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await serve_every_lane(tmp_path)

    state = await get_json(http, f"{served.url}/api/v1/state")
    assert state["running"]
    assert state["reserving"]
    assert state["retrying"]
    assert state["run_history"]
    _assert_valid("Snapshot", state)
    for identifier, status in (("T-1", "running"), ("T-2", "reserving"), ("T-3", "retrying")):
        detail = await get_json(http, f"{served.url}/api/v1/issues/{identifier}")
        assert detail["status"] == status
        _assert_valid("IssueDetail", detail)
    async with http.post(f"{served.url}/api/v1/refresh", headers=served.auth) as response:
        _assert_valid("RefreshAccepted", await response.json())
    async with http.get(f"{served.url}/api/v1/nope") as response:
        _assert_valid("Error", await response.json())
    _assert_valid("Health", await get_json(http, f"{served.url}/healthz"))

    # The schemas are strict enough to catch drift: a row with a missing or mistyped field fails.
    broken = dict(state["running"][0])
    del broken["usage"]
    assert list(_validator("RunningRow").iter_errors(broken))
    assert list(_validator("RetryRow").iter_errors({**state["retrying"][0], "kind": "later"}))
    assert list(_validator("Snapshot").iter_errors({**state, "poll": {}}))
    release(served.rig, "T-1")


def _run_schemathesis(base_url: str, *, headers: dict[str, str]) -> list[str]:
    """Every operation, positive and negative examples; returns the failures (none expected)."""
    # NB: the served document, loaded as a dict (from_url leaves out the document's own route).
    served_document = requests.get(f"{base_url}/api/v1/openapi.json", timeout=10).json()
    assert served_document == openapi_document()
    schema = schemathesis.openapi.from_dict(served_document)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # an Err has no operation (ok() would raise)
        operation = result.ok()
        if operation.definition.raw.get("operationId") in STREAMING_OPERATIONS:
            continue
        operations += 1
        raw = operation.definition.raw
        # Negative data needs something to violate: only request bodies have room for it (a
        # path parameter's only violation, the empty string, cannot be put in a URL).
        negative = [GenerationMode.NEGATIVE] if raw.get("requestBody") else []
        modes = [GenerationMode.POSITIVE, *negative]
        for mode in modes:

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
                print_blob=False,
            )
            def check(case: Any) -> None:
                case.call_and_validate(base_url=base_url, headers=headers, timeout=10)

            try:
                check()
            # NB: schemathesis reports failures as a BaseExceptionGroup, not an Exception.
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{operation.label} [{mode}]: {exc}")
    assert operations == 7, (operations, failures)
    return failures


async def test_schemathesis_finds_no_nonconformance_and_no_server_error(tmp_path: Path) -> None:
    served = await serve_every_lane(tmp_path)

    # NB: schemathesis is synchronous (requests); it runs in a thread while this loop serves.
    failures = await asyncio.to_thread(_run_schemathesis, served.url, headers=served.auth)

    assert not failures, "\n\n".join(failures)
    assert threading.active_count() >= 1
    state = served.rig.runtime.snapshot().to_dict()
    assert state["running"], "the runtime kept running through the fuzzing"
    release(served.rig, "T-1")
