"""The dashboard's answer box, in a real headless Chromium: a waiting issue shows its question,
the box refuses nothing typed, needs the server's token, and an answer typed there resumes the
agent's thread (the scripted Codex app-server sees ``thread/resume`` and the answer)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lorenz.server.dashboard import dashboard_routes
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
from tests.server.helpers import serve
from tests.server.test_dashboard_browser import Chromium, browser

__all__ = ["browser"]  # NB: the fixture, re-exported for this module's tests

pytestmark = pytest.mark.browser

CARD = "document.querySelector('[data-testid=lane-waiting] [data-testid=waiting-card]')"
NOTICE = (
    f"(() => {{ const n = {CARD}.querySelector('[data-testid=answer-notice]');"
    " return !n.hidden && n.textContent; })()"
)


def typed(text: str) -> str:
    return (
        f"(() => {{ const box = {CARD}.querySelector('[data-testid=answer-text]');"
        f" box.value = {json.dumps(text)}; box.dispatchEvent(new Event('input'));"
        f" {CARD}.querySelector('[data-testid=answer-button]').click(); return true; }})()"
    )


async def test_an_answer_typed_on_the_dashboard_resumes_the_thread(
    tmp_path: Path, browser: Chromium
) -> None:
    workflow = codex_workflow(tmp_path, scenarios={"T-1": asking_scenario(tmp_path, "T-1")})
    rig = build(tmp_path, workflow, [issue(1)])
    served = await serve(rig, static_routes=dashboard_routes())
    loop = asyncio.get_running_loop().create_task(rig.runtime.start())
    await until(lambda: bool(waiting_rows(rig)), what="T-1 waiting")

    # Without the token the answer is refused, and the card says how to get one.
    await browser.open(served.url + "/")
    question = await browser.wait_for(
        f"{CARD} && {CARD}.querySelector('[data-testid=waiting-question]').textContent"
    )
    assert question == "Database — Which database should the cache use?"
    assert await browser.evaluate(
        f"{CARD}.querySelector('[data-testid=waiting-options]').textContent"
    ) == "Redis · Postgres"
    await browser.evaluate(typed("   "))
    assert "Write an answer first" in await browser.wait_for(NOTICE)
    await browser.evaluate(typed("Postgres"))
    await browser.wait_for(f"({NOTICE} || '').includes('#token=')")
    assert rig.of_type("input_answered") == []

    assert served.server.guard is not None
    await browser.open(f"{served.url}/#token={served.server.guard.token}")
    await browser.wait_for(f"!!{CARD}")
    await browser.evaluate(typed("Postgres, from the dashboard"))
    await until(lambda: bool(rig.of_type("input_answered")), what="the answer")
    (answered,) = rig.of_type("input_answered")
    assert answered["reason"] == "dashboard"
    await until(lambda: len(turn_texts(tmp_path, "T-1")) == 2, what="the resumed turn")
    assert {"resume": "thr-T-1"} in records(tmp_path, "T-1")
    assert turn_texts(tmp_path, "T-1")[1] == (
        "The answer to your question: Postgres, from the dashboard"
    )
    await browser.wait_for(
        "document.querySelector('[data-testid=lane-count-waiting]').textContent === '0'"
    )
    assert browser.errors == []
    rig.runtime.stop()
    await loop
