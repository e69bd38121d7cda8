"""``POST /api/v1/issues/<identifier>/answer`` on a real server: authenticated and same-origin
like the other control routes, coded refusals, and an accepted answer resumes the waiting
slot's thread (the scripted Codex app-server sees ``thread/resume`` and the rendered answer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.runtime.questions_rig import (
    asking_scenario,
    build,
    codex_workflow,
    issue,
    records,
    turn_texts,
    until,
    waiting_rows,
)
from tests.server.helpers import Served, serve
from tests.server.test_metrics import scrape, value


async def waiting_server(tmp_path: Path, **front_matter: Any) -> Served:
    workflow = codex_workflow(
        tmp_path, scenarios={"T-1": asking_scenario(tmp_path, "T-1")}, front_matter=front_matter
    )
    rig = build(tmp_path, workflow, [issue(1)])
    served = await serve(rig)
    asyncio.get_running_loop().create_task(rig.runtime.start())
    await until(lambda: bool(waiting_rows(rig)), what="T-1 waiting")
    return served


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: Any,
    *,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, headers=headers or {}) as response:
        return response.status, await response.json()


async def test_an_answer_through_the_api_resumes_the_waiting_thread(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await waiting_server(tmp_path)
    url = f"{served.url}/api/v1/issues/T-1/answer"
    wf = str(served.rig.workflow.path)
    before = await scrape(http, served.url)
    assert value(before, "lorenz_waiting_slots", workflow=wf) == 1
    assert value(before, "lorenz_blocked_slots", workflow=wf) == 0
    assert value(before, "lorenz_answer_wait_seconds_count", workflow=wf) == 0

    status, body = await post(http, url, {"text": "Postgres"}, headers=served.auth)

    assert status == 202, body
    assert body == {
        "identifier": "T-1", "slot_keys": ["id-1#0"], "session_ids": ["thr-T-1"], "resumed": True
    }
    rig = served.rig
    (answered,) = rig.of_type("input_answered")
    assert answered["reason"] == "api"
    await until(lambda: len(turn_texts(tmp_path, "T-1")) == 2, what="the resumed turn")
    assert {"resume": "thr-T-1"} in records(tmp_path, "T-1")
    assert turn_texts(tmp_path, "T-1")[1] == "The answer to your question: Postgres"
    after = await scrape(http, served.url)
    assert value(after, "lorenz_waiting_slots", workflow=wf) == 0
    assert value(after, "lorenz_answer_wait_seconds_count", workflow=wf) == 1

    # Answered already: nothing waits any more.
    status, body = await post(http, url, {"text": "again"}, headers=served.auth)
    assert (status, body["error"]["code"]) == (404, "issue_not_waiting")


async def test_the_answer_route_refuses_what_it_cannot_take(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await waiting_server(tmp_path)
    url = f"{served.url}/api/v1/issues/T-1/answer"
    auth = served.auth

    refusals = [
        (await post(http, url, {"text": "x"}), 401, "auth_token_missing"),
        (
            await post(http, url, {"text": "x"},
                       headers={**auth, "Origin": "http://evil.example"}),
            403, "cross_origin_refused",
        ),
        (await post(http, url, {"text": "  "}, headers=auth), 400, "answer_invalid"),
        (await post(http, url, {"text": "x" * 20_001}, headers=auth), 400, "answer_invalid"),
        (await post(http, url, {"text": 3}, headers=auth), 400, "answer_invalid"),
        (await post(http, url, {"answer": "x"}, headers=auth), 400, "invalid_request_body"),
        (
            await post(http, url, {"text": "x", "source": "tracker"}, headers=auth),
            400, "invalid_request_body",
        ),
        (
            await post(http, f"{served.url}/api/v1/issues/T-9/answer", {"text": "x"},
                       headers=auth),
            404, "issue_not_waiting",
        ),
    ]
    for (status, body), wanted_status, wanted_code in refusals:
        assert (status, body["error"]["code"]) == (wanted_status, wanted_code), body
    # Nothing of it answered: the slot still waits, the agent was not resumed.
    assert waiting_rows(served.rig)
    assert served.rig.of_type("input_answered") == []


async def test_a_template_that_does_not_render_refuses_the_answer_and_keeps_the_wait(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    served = await waiting_server(tmp_path, input={"answer_template": "{{ answr }}"})
    status, body = await post(
        http, f"{served.url}/api/v1/issues/T-1/answer", {"text": "x"}, headers=served.auth
    )
    assert (status, body["error"]["code"]) == (422, "template_render_error")
    assert waiting_rows(served.rig)
