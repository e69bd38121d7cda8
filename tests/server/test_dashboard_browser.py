"""The dashboard in a real headless Chromium, against a live runtime behind the real server.

Chromium is Debian's (``scripts/install-chromium``), driven over the Chrome DevTools Protocol
from Python — a websocket from aiohttp's client — so no browser build of any tool's own is
downloaded and node is not needed. Launch flags keep it off the network entirely.

Runs are real command-protocol agents that wait for a release file, so a test decides when a
run ends and watches the page follow through SSE, without reloading it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from lorenz.server.dashboard import dashboard_routes
from tests.server.helpers import WAITING_AGENT, Served, issue, make_rig, release, serve
from tests.waiting import wait_until_async

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
LAUNCH_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
)
XSS_TITLE = '<img src=x onerror="window.__xss=1"> Fix <b>escaping</b> & "quotes"'


class Chromium:
    """One headless Chromium and one page, spoken to over the DevTools protocol."""

    def __init__(
        self,
        *,
        process: asyncio.subprocess.Process,
        http: aiohttp.ClientSession,
        socket: aiohttp.ClientWebSocketResponse,
        profile: Path,
    ) -> None:
        self._process = process
        self._http = http
        self._socket = socket
        self._profile = profile
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._page: str | None = None
        self.errors: list[str] = []
        """Uncaught page exceptions and console errors."""
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def launch(cls) -> Chromium:
        _require_chromium()
        profile = Path(tempfile.mkdtemp(prefix="lorenz-chromium-"))
        process = await asyncio.create_subprocess_exec(
            str(CHROMIUM),
            *LAUNCH_FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = profile / "DevToolsActivePort"
        try:
            async with asyncio.timeout(30):
                while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
                    if process.returncode is not None:
                        raise AssertionError(f"chromium exited with {process.returncode}")
                    await asyncio.sleep(0.05)
            port, path = port_file.read_text().split()[:2]
            http = aiohttp.ClientSession()
            socket = await http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
        except BaseException:
            _kill(process)
            await process.wait()
            shutil.rmtree(profile, ignore_errors=True)
            raise
        return cls(process=process, http=http, socket=socket, profile=profile)

    async def _read(self) -> None:
        async for message in self._socket:
            data = json.loads(message.data)
            future = self._pending.pop(data["id"], None) if "id" in data else None
            if future is not None and not future.done():
                if "error" in data:
                    future.set_exception(AssertionError(f"CDP error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            elif data.get("method") == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.errors.append(json.dumps(details.get("exception", details))[:500])
            elif (
                data.get("method") == "Runtime.consoleAPICalled"
                and data["params"].get("type") == "error"
            ):
                self.errors.append(json.dumps(data["params"]["args"])[:500])

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        payload: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if self._page is not None and not method.startswith(("Target.", "Browser.")):
            payload["sessionId"] = self._page
        await self._socket.send_str(json.dumps(payload))
        async with asyncio.timeout(30):
            return await future

    async def open(self, url: str, *, width: int = 1440, height: int = 900) -> None:
        """A fresh tab at ``width`` x ``height`` (a laptop screen), navigated to ``url``."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        self._page = attached["sessionId"]
        await self.send("Runtime.enable")
        await self.send("Page.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        await self.send("Page.navigate", {"url": url})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float = 20.0) -> Any:
        """Poll ``expression`` in the page until it is truthy; its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: Any = None
        while True:
            try:
                last = await self.evaluate(expression)
            except AssertionError as exc:  # the page is still loading: not there yet
                last = exc
            else:
                if last:
                    return last
            if loop.time() > deadline:
                raise AssertionError(f"page never satisfied: {expression} (last: {last!r})")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        _write_png(path, base64.b64decode(shot["data"]))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._page = None
            await asyncio.wait_for(self.send("Browser.close"), 5)
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        await self._socket.close()
        await self._http.close()
        try:
            await asyncio.wait_for(self._process.wait(), 10)
        except TimeoutError:
            _kill(self._process)
            await self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


def _require_chromium() -> None:
    # NB: a FAIL, not a skip: the dashboard is only tested here, and a skip would hide that.
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}; run scripts/install-chromium",
            pytrace=False,
        )


def _write_png(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
async def browser() -> AsyncIterator[Chromium]:
    chromium = await Chromium.launch()
    try:
        yield chromium
    finally:
        await chromium.close()


async def _served(tmp_path: Path, *, issues: list[Any], **server_options: Any) -> Served:
    rig = make_rig(tmp_path, issues=issues, front_matter={"polling": {"interval_ms": 60000}})
    served = await serve(rig, static_routes=dashboard_routes(), **server_options)
    return served


def _start_loop(served: Served) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(served.rig.runtime.start())


def _cards(lane: str, testid: str) -> str:
    return f"[...document.querySelectorAll('[data-testid=lane-{lane}] [data-testid={testid}]')]"


def _lane_identifiers(lane: str, testid: str) -> str:
    return (
        f"{_cards(lane, testid)}.map(c => c.querySelector('[data-testid=card-identifier]')"
        ".textContent).sort().join(',')"
    )


def _history(identifier: str, outcome: str) -> str:
    return (
        "[...document.querySelectorAll('[data-testid=history-row]')].some(r => "
        f"r.dataset.identifier === {json.dumps(identifier)} && "
        f"r.dataset.outcome === {json.dumps(outcome)})"
    )


async def test_lanes_follow_runs_live_and_tracker_text_stays_text(
    tmp_path: Path, browser: Chromium
) -> None:
    served = await _served(
        tmp_path,
        issues=[
            issue(1, identifier="LOR-1", title=XSS_TITLE),
            issue(2, identifier="LOR-2", title="Retry budget for the GitHub adapter"),
            issue(3, identifier="LOR-3", title="Terminal view: show the poll countdown"),
        ],
    )
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    # Every run starts and shows up in the Running lane, pushed over SSE.
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === 'LOR-1,LOR-2,LOR-3'")
    assert await browser.wait_for(
        "document.querySelector('[data-testid=connection]').dataset.mode === 'live'"
    )
    # The hostile title is shown verbatim, as text: no element, no handler ran.
    card_title = await browser.evaluate(
        "document.querySelector('[data-slot-key=\"id-1#0\"] [data-testid=card-title]').textContent"
    )
    assert card_title == XSS_TITLE
    assert await browser.evaluate("document.querySelectorAll('main img, main b').length") == 0
    assert await browser.evaluate("window.__xss") is None
    # The agent's latest output and the elapsed clock are on the card.
    await browser.wait_for(
        f"{_cards('running', 'run-card')}.every(c => c.querySelector("
        "'[data-testid=card-last-event]').textContent.includes('started work on'))"
    )
    elapsed = await browser.evaluate(
        "document.querySelector('[data-slot-key=\"id-2#0\"] [data-testid=card-elapsed]')"
        ".textContent"
    )
    assert elapsed.endswith("s")
    await browser.evaluate("window.__sameDocument = true")

    # LOR-1 fails: it leaves Running for Retrying (failure, with the error) and History.
    # NB: read in one evaluation, one consistent page: its retry is due 10 s later, and on a
    # loaded machine the page may only get there after that (LOR-1 then runs and fails again).
    release(served.rig, "LOR-1", fail=True)
    retry = await browser.wait_for(
        f"(() => {{ if ({_lane_identifiers('retrying', 'retry-card')} !== 'LOR-1'"
        f" || {_lane_identifiers('running', 'run-card')} !== 'LOR-2,LOR-3'"
        f" || !({_history('LOR-1', 'failed')})) return null;"
        " const c = document.querySelector('[data-testid=retry-card]'); return {"
        "kind: c.querySelector('[data-testid=retry-kind]').textContent,"
        "attempt: c.querySelector('[data-testid=retry-attempt]').textContent,"
        "due: c.querySelector('[data-testid=retry-due]').textContent,"
        "error: c.querySelector('[data-testid=retry-error]').textContent }; })()"
    )
    assert retry["kind"] == "failure"
    assert re.fullmatch(r"attempt [1-9][0-9]*", retry["attempt"]), retry
    assert retry["due"].startswith("in ") or retry["due"] == "due now", retry
    assert "exited with status 3" in retry["error"]

    # LOR-2 finishes cleanly (and is Done in the tracker): a success row in History.
    served.rig.tracker.set_state("id-2", "Done")
    release(served.rig, "LOR-2")
    await browser.wait_for(_history("LOR-2", "success"))
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === 'LOR-3'")
    outcome_colour = await browser.evaluate(
        "getComputedStyle(document.querySelector("
        "'[data-testid=history-row][data-outcome=failed] [data-testid=history-outcome]')).color"
    )
    assert outcome_colour not in ("rgb(0, 0, 0)", "")
    await browser.wait_for(
        "[...document.querySelectorAll('[data-testid=event-row]')]"
        ".some(e => e.dataset.type === 'run_failed')"
    )
    # None of it took a reload: the page is the same document throughout.
    assert await browser.evaluate("window.__sameDocument") is True
    await asyncio.sleep(0.6)  # let the half-second ticker repaint the clocks for the picture
    await browser.screenshot(ARTIFACTS / "dashboard.png")
    assert browser.errors == []

    release(served.rig, "LOR-3")
    served.rig.runtime.stop()
    await loop


async def test_header_shows_workflow_poll_and_ticking_clocks(
    tmp_path: Path, browser: Chromium
) -> None:
    served = await _served(tmp_path, issues=[issue(1, identifier="LOR-1")])
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === 'LOR-1'")
    path = await browser.evaluate(
        "document.querySelector('[data-testid=workflow-path]').textContent"
    )
    assert path == str(served.rig.workflow.path)
    assert (
        await browser.evaluate("document.querySelector('[data-testid=app-status]').textContent")
        == "running"
    )
    await browser.wait_for(
        "document.querySelector('[data-testid=next-poll]').textContent.startsWith('in ')"
    )
    # No snapshot arrives while the one run waits; the clocks tick in the page regardless.
    first = await browser.evaluate(
        "[document.querySelector('[data-testid=next-poll]').textContent,"
        " document.querySelector('[data-testid=card-elapsed]').textContent]"
    )
    await browser.wait_for(
        "document.querySelector('[data-testid=next-poll]').textContent !== "
        f"{json.dumps(first[0])} && document.querySelector('[data-testid=card-elapsed]')"
        f".textContent !== {json.dumps(first[1])}",
        timeout=10,
    )
    assert (
        await browser.evaluate("document.querySelector('[data-testid=poll-counts]').textContent")
        == "1 / 1"
    )
    # Usage totals and the empty lanes render too.
    assert (
        await browser.evaluate("document.querySelector('[data-testid=usage-total]').textContent")
        == "0"
    )
    assert (
        await browser.evaluate(
            "document.querySelector('[data-testid=lane-count-blocked]').textContent"
        )
        == "0"
    )
    assert browser.errors == []
    release(served.rig, "LOR-1")
    served.rig.runtime.stop()
    await loop


async def test_falls_back_to_polling_when_the_stream_is_unavailable(
    tmp_path: Path, browser: Chromium
) -> None:
    async def no_stream(request: web.Request) -> web.Response:
        return web.Response(status=503, text="no stream here")

    served = await _served(
        tmp_path,
        issues=[issue(1, identifier="LOR-1")],
        extra_routes=[web.get("/api/v1/events", no_stream)],
    )
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === 'LOR-1'")
    assert await browser.wait_for(
        "document.querySelector('[data-testid=connection]').dataset.mode === 'polling'"
    )
    served.rig.tracker.set_state("id-1", "Done")
    release(served.rig, "LOR-1")
    await wait_until_async(
        lambda: not served.rig.runtime.snapshot().to_dict()["running"],
        timeout=15.0,
        what='not served.rig.runtime.snapshot().to_dict()["running"]',
    )
    # The next /api/v1/state poll (every 2 s) moves the card to History.
    await browser.wait_for(_history("LOR-1", "success"))
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === ''")
    assert browser.errors == []
    served.rig.runtime.stop()
    await loop


async def test_poll_error_banner_and_refresh_button(tmp_path: Path, browser: Chromium) -> None:
    served = await _served(tmp_path, issues=[])
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    await browser.wait_for("document.body.dataset.snapshots > 0")
    assert await browser.evaluate("document.querySelector('[data-testid=poll-error]').hidden")
    # Without the server's token the button is refused (401), and the page says what to do.
    await browser.evaluate("document.querySelector('[data-testid=refresh-button]').click()")
    notice = await browser.wait_for(
        "(() => { const n = document.querySelector('[data-testid=refresh-notice]');"
        " return !n.hidden && n.textContent; })()"
    )
    assert "#token=" in notice
    assert not served.rig.of_type("refresh_requested")

    # Opened with #token=... the page keeps it for the tab and drops it from the address bar.
    assert served.server.guard is not None
    await browser.open(f"{served.url}/#token={served.server.guard.token}")
    await browser.wait_for("document.body.dataset.snapshots > 0")
    assert await browser.evaluate("window.location.hash") == ""
    served.rig.tracker.fail_next(1, methods=["fetch_candidate_issues"])
    polls = served.rig.runtime.poll_count
    # The button asks the server for a poll; that poll fails and the banner says so.
    await browser.evaluate("document.querySelector('[data-testid=refresh-button]').click()")
    await wait_until_async(
        lambda: served.rig.runtime.poll_count > polls,
        timeout=15.0,
        what="served.rig.runtime.poll_count > polls",
    )
    banner = await browser.wait_for(
        "(() => { const b = document.querySelector('[data-testid=poll-error]');"
        " return !b.hidden && b.textContent; })()"
    )
    assert banner.startswith("Last poll failed: ")
    assert served.rig.of_type("refresh_requested")
    assert await browser.evaluate("document.querySelector('[data-testid=refresh-notice]').hidden")
    assert browser.errors == []
    served.rig.runtime.stop()
    await loop


async def test_a_failed_reload_shows_a_banner_until_the_workflow_is_fixed(
    tmp_path: Path, browser: Chromium
) -> None:
    served = await _served(tmp_path, issues=[])
    path = served.rig.workflow.path
    good = path.read_text(encoding="utf-8")
    await served.rig.runtime.poll_once()
    await browser.open(served.url + "/")
    await browser.wait_for("document.body.dataset.snapshots > 0")
    hidden = "document.querySelector('[data-testid=config-error]').hidden"
    assert await browser.evaluate(hidden)

    path.write_text("---\ntracker: [<img src=x onerror=alert(1)>\n---\nbody\n", encoding="utf-8")
    await served.rig.runtime.poll_once()
    code = await browser.wait_for(
        "(() => { const b = document.querySelector('[data-testid=config-error]');"
        " return !b.hidden && b.dataset.code; })()"
    )
    assert code == "workflow_parse_error"
    text = await browser.evaluate(
        "document.querySelector('[data-testid=config-error]').textContent"
    )
    assert text.startswith("WORKFLOW.md reload failed: workflow_parse_error")
    assert "last good workflow" in text
    assert await browser.evaluate("document.querySelectorAll('[data-testid=config-error] img')"
                                  ".length") == 0
    await browser.screenshot(ARTIFACTS / "dashboard-config-error.png")

    path.write_text(good, encoding="utf-8")
    await served.rig.runtime.poll_once()
    await browser.wait_for(hidden)
    assert browser.errors == []


SPENDING_AGENT = """
cost = 0.6 if env["LORENZ_ISSUE_IDENTIFIER"] == "LOR-2" else 0.25
pathlib.Path(env["LORENZ_USAGE_FILE"]).write_text(
    json.dumps({"input_tokens": 500, "cost_usd": cost}) + "\\n")
""" + WAITING_AGENT
"""Reports its cost once (0.6 USD on LOR-2, over its cap; 0.25 USD elsewhere), then waits."""


async def test_spend_per_run_and_issue_the_days_total_and_the_budget_lane(
    tmp_path: Path, browser: Chromium
) -> None:
    rig = make_rig(
        tmp_path,
        issues=[issue(1, identifier="LOR-1"), issue(2, identifier="LOR-2")],
        agent_body=SPENDING_AGENT,
        front_matter={
            "polling": {"interval_ms": 60000},
            "budget": {"max_usd_per_issue": 0.5, "max_usd_per_day": 5},
        },
    )
    served = await serve(rig, static_routes=dashboard_routes())
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    # LOR-1 runs, and its card says what the run and the issue spent.
    spend = await browser.wait_for(
        "(() => { const c = document.querySelector('[data-slot-key=\"id-1#0\"] "
        "[data-testid=card-spend]'); return c && c.textContent; })()"
    )
    assert spend == "$0.25 run · $0.25 issue"
    # LOR-2 crossed its cap at once: stopped, blocked (budget_exhausted).
    await browser.wait_for(f"{_lane_identifiers('blocked', 'blocked-card')} === 'LOR-2'")
    day = await browser.wait_for(
        "(() => { const t = document.querySelector('[data-testid=budget-day]').textContent;"
        " return t === '$0.85 / $5.00' && t; })()"
    )
    assert day == "$0.85 / $5.00"
    assert await browser.evaluate(
        "document.querySelector('[data-testid=budget-total]').hidden"
    ) is False
    # A refresh unblocks it, but its spend is at its cap: it waits in the Budget lane.
    rig.runtime.request_refresh()
    await browser.wait_for(f"{_lane_identifiers('budget', 'budget-card')} === 'LOR-2'")
    card = await browser.evaluate(
        "(() => { const c = document.querySelector('[data-testid=budget-card]'); return {"
        "cap: c.querySelector('[data-testid=card-cap]').textContent,"
        "spent: c.querySelector('[data-testid=card-spent]').textContent}; })()"
    )
    assert card == {"cap": "usd_per_issue", "spent": "$0.60 / $0.50"}
    assert browser.errors == []
    release(rig, "LOR-1")
    rig.runtime.stop()
    await loop


async def test_without_a_budget_cap_the_spend_parts_stay_hidden(
    tmp_path: Path, browser: Chromium
) -> None:
    served = await _served(tmp_path, issues=[issue(1, identifier="LOR-1")])
    loop = _start_loop(served)
    await browser.open(served.url + "/")
    await browser.wait_for(f"{_lane_identifiers('running', 'run-card')} === 'LOR-1'")
    hidden = await browser.evaluate(
        "[document.querySelector('[data-testid=budget-total]').hidden,"
        " document.querySelector('[data-testid=lane-budget]').hidden,"
        " document.querySelectorAll('[data-testid=card-spend]').length]"
    )
    assert hidden == [True, True, 0]
    release(served.rig, "LOR-1")
    served.rig.runtime.stop()
    await loop


def _synthetic_snapshot(*, running: int) -> dict[str, Any]:
    """A state document as the server sends it, with hostile text in every tracker field."""
    now = datetime.datetime.now(datetime.UTC)
    hostile = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
    rows = [
        {
            "slot_key": f"id-{n}#0",
            "issue_id": f"id-{n}",
            "identifier": f"BIG-{n}",
            "title": f"{hostile} title {n}",
            "slot_index": 0,
            "state": "Todo",
            "url": "javascript:window.__xss=3" if n == 0 else f"https://tracker.example/BIG-{n}",
            "host": None,
            "session_id": None,
            "attempt": None,
            "turn_count": 1,
            "last_agent_event": "notification",
            "last_agent_message": f"{hostile} message",
            "last_agent_at": now.isoformat(),
            "started_at": now.isoformat(),
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        }
        for n in range(running)
    ]
    return {
        "generated_at": now.isoformat(),
        "app_status": "running",
        "workflow_path": f"/srv/{hostile}/WORKFLOW.md",
        "poll": {
            "status": "idle",
            "interval_ms": 30000,
            "candidates": running,
            "eligible": 0,
            "last_poll_at": now.isoformat(),
            "next_poll_at": (now + datetime.timedelta(seconds=30)).isoformat(),
            "last_error": f"tracker said {hostile}",
            "count": 1,
        },
        "running": rows,
        "reserving": [],
        "retrying": [
            {
                "slot_key": "id-x#0",
                "issue_id": "id-x",
                "identifier": f"{hostile}",
                "slot_index": 0,
                "attempt": 3,
                "kind": "failure",
                "due_at": (now + datetime.timedelta(seconds=90)).isoformat(),
                "due_in_ms": 90000,
                "error": f"agent said {hostile}",
                "host": None,
                "workspace_path": None,
            }
        ],
        "blocked": [],
        "usage_totals": {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "seconds_running": 0,
            "cost_usd": 0,
        },
        "rate_limits": {hostile: hostile},
        "claimed_elsewhere": [],
        "recent_events": [
            {"type": hostile, "at": now.isoformat(), "identifier": hostile, "message": hostile}
        ],
        "run_history": [
            {
                "identifier": hostile,
                "slot": 0,
                "attempt": 1,
                "outcome": hostile,
                "error": hostile,
                "finished_at": now.isoformat(),
                "duration_ms": 1000,
                "usage": {},
                "host": None,
                "session_id": None,
            }
        ],
        "log_file": None,
    }


async def test_a_thousand_runs_and_hostile_text_everywhere(browser: Chromium) -> None:
    # The page only reads the state document; here a plain aiohttp app serves a synthetic one
    # (1000 runs is more than this machine should spawn in a test), with no event stream.
    async def state(request: web.Request) -> web.Response:
        return web.json_response(_synthetic_snapshot(running=1000))

    async def no_stream(request: web.Request) -> web.Response:
        return web.Response(status=503)

    app = web.Application()
    api = [web.get("/api/v1/state", state), web.get("/api/v1/events", no_stream)]
    app.add_routes([*api, *dashboard_routes()])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        await browser.open(f"http://127.0.0.1:{port}/")
        await browser.wait_for(
            "document.querySelector('[data-testid=lane-count-running]').textContent === '1000'"
        )
        # A capped number of cards, and a line that says how many more there are.
        cards = await browser.evaluate(f"{_cards('running', 'run-card')}.length")
        assert 0 < cards < 1000
        more = await browser.evaluate(
            "document.querySelector('[data-testid=lane-more-running]').textContent"
        )
        assert more.startswith(f"… and {1000 - cards} more")
        # Nothing hostile became markup or ran, in any field.
        assert await browser.evaluate("document.querySelectorAll('body script').length") == 0
        assert await browser.evaluate("document.querySelectorAll('body img').length") == 0
        assert await browser.evaluate("window.__xss") is None
        body = await browser.evaluate("document.body.innerText")
        assert "<script>window.__xss=1</script>" in body
        # A javascript: URL is not made a link; http(s) ones are.
        first = await browser.evaluate(
            "document.querySelector('[data-slot-key=\"id-0#0\"] [data-testid=card-identifier]')"
            ".tagName"
        )
        second = await browser.evaluate(
            "document.querySelector('[data-slot-key=\"id-1#0\"] [data-testid=card-identifier]')"
            ".getAttribute('href')"
        )
        assert first == "SPAN"
        assert second == "https://tracker.example/BIG-1"
        assert browser.errors == []
    finally:
        await runner.cleanup()
