"""What webhooks buy: idle tracker requests, event → agent start latency, the cost of a burst.

One runtime on the fake Linear server (in its own thread, so its work is not counted), served by
the real HTTP server with ``tracker.webhook_secret`` set; deliveries are signed the way Linear
signs them and sent over HTTP from a client thread of their own. Three parts:

* **idle**: the tracker requests of one idle poll tick, measured over ``--idle-ticks`` ticks
  at a short interval, then per hour at 30 s polling (the default without webhooks) and at the
  5 min backstop (the default with them; an idle tracker sends no deliveries);
* **latency**: ``--events`` times, an issue is created in the fake and its ``Issue create``
  delivery sent; the time from sending to the ``run_started`` event of its run (p50, p99,
  max). The poll interval is 10 minutes, so only the delivery starts a run. Deliveries are
  spaced by ``--spacing`` s (more than the 250 ms refresh gap, so each one asks at once);
* **burst**: ``--burst`` (1,000) signed ``Issue update`` deliveries, 50 at a time: wall time,
  refreshes asked, poll ticks, tracker requests, and CPU seconds of the server's loop thread
  (HTTP server, verification, runtime, tracker client); then the same with the 250 ms gap off
  (only the runtime's own merging of refreshes asked during a tick).

Run: ``.venv/bin/python bench/webhook_bench.py [--events 50] [--burst 1000]``. Prints figures
and the machine's load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml
from tests.fakes.linear_server import FakeLinearServer
from tests.runtime.harness import build_rig

from lorenz.server import LorenzServer
from lorenz.server.app import WEBHOOKS_KEY
from lorenz.server.webhooks import RefreshCoalescer, WebhookIntake
from lorenz.trackers import LinearTracker
from lorenz.workflow import load_workflow

SECRET = "whsec-bench-4b9e0d27c1"
AGENT = "import sys\nsys.stdin.read()\nprint('started', flush=True)\n"


def write_workflow(tmp: Path, linear: FakeLinearServer, *, interval_ms: int) -> Path:
    script = tmp / "agent.py"
    script.write_text(AGENT, encoding="utf-8")
    config: dict[str, Any] = {
        "tracker": {"kind": "linear", "endpoint": linear.url, "api_key": linear.api_key,
                    "project_slug": linear.project_slug, "webhook_secret": SECRET,
                    "terminal_states": ["Done", "Canceled", "Duplicate"]},
        "polling": {"interval_ms": interval_ms},
        "workspace": {"root": str(tmp / "workspaces")},
        "agent": {"kind": "bench", "max_turns": 1, "max_concurrent_agents": 20},
        "agents": {"bench": {"protocol": "command", "command": f"{sys.executable} {script}",
                             "stall_timeout_ms": 60000, "turn_timeout_ms": 60000}},
    }
    path = tmp / "WORKFLOW.md"
    path.write_text(f"---\n{yaml.safe_dump(config)}---\nWork on {{{{ issue.identifier }}}}\n",
                    encoding="utf-8")
    return path


def delivery(issue_id: str, identifier: str, *, action: str, n: int) -> tuple[dict[str, str],
                                                                               bytes]:
    payload: dict[str, Any] = {"action": action, "type": "Issue",
                               "data": {"id": issue_id, "identifier": identifier},
                               "webhookTimestamp": int(time.time() * 1000)}
    if action == "update":
        payload["updatedFrom"] = {"title": "before"}
    body = json.dumps(payload).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "Linear-Signature": signature,
            "Linear-Delivery": f"bench-{action}-{n}"}, body


class Sender:
    """An HTTP client on a thread and loop of its own (its CPU is not the server's)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sender", daemon=True)
        self.thread.start()
        self.session: aiohttp.ClientSession = self.call(self._open())

    async def _open(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50))

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def post(self, headers: dict[str, str], body: bytes) -> int:
        async with self.session.post(f"{self.url}/api/v1/webhooks/linear", data=body,
                                     headers=headers) as response:
            await response.read()
            return response.status

    async def many(self, deliveries: list[tuple[dict[str, str], bytes]]) -> list[int]:
        return list(await asyncio.gather(*(self.post(h, b) for h, b in deliveries)))

    def close(self) -> None:
        self.call(self.session.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def settle(runtime: Any, *, quiet_s: float = 0.6) -> None:
    """Wait until no tick runs and none started for ``quiet_s`` (trailing refreshes done)."""
    last = runtime.poll_count
    quiet_since = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        if runtime.poll_count != last or runtime.poll_status().status != "idle":
            last, quiet_since = runtime.poll_count, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return


async def idle_part(tmp: Path, *, ticks: int) -> dict[str, Any]:
    with FakeLinearServer().running_in_thread() as linear:
        for n in range(5):
            linear.add_issue(title=f"parked {n}", state="Backlog")
        path = write_workflow(tmp, linear, interval_ms=100)
        settings = load_workflow(path, environ={}).settings
        rig = build_rig(path, tracker=LinearTracker(settings=settings, api_key=linear.api_key,
                                                    endpoint=linear.url))
        task = asyncio.get_running_loop().create_task(rig.runtime.start())
        while rig.runtime.poll_count < 2:
            await asyncio.sleep(0.02)
        start_polls, start_requests = rig.runtime.poll_count, len(linear.requests)
        while rig.runtime.poll_count < start_polls + ticks:
            await asyncio.sleep(0.02)
        # NB: poll_count counts ticks started; let the last one finish its requests.
        while rig.runtime.poll_status().status != "idle":
            await asyncio.sleep(0.005)
        polls = rig.runtime.poll_count - start_polls
        requests = len(linear.requests) - start_requests
        rig.runtime.stop()
        await task
    per_tick = requests / polls
    return {"ticks": polls, "requests": requests, "per_tick": per_tick,
            "per_hour_30s": per_tick * 3600 / 30, "per_hour_backstop": per_tick * 3600 / 300}


async def webhook_parts(tmp: Path, *, events: int, spacing: float, burst: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with FakeLinearServer().running_in_thread() as linear:
        path = write_workflow(tmp, linear, interval_ms=600_000)
        settings = load_workflow(path, environ={}).settings
        rig = build_rig(path, tracker=LinearTracker(settings=settings, api_key=linear.api_key,
                                                    endpoint=linear.url))
        runtime = rig.runtime
        started: dict[str, float] = {}
        waiting: dict[str, asyncio.Event] = {}

        def listen(event: Any) -> None:
            document = event.to_dict()
            if document.get("type") == "run_started":
                identifier = str(document.get("issue_identifier") or document.get("identifier"))
                started.setdefault(identifier, time.perf_counter())
                if identifier in waiting:
                    waiting[identifier].set()

        runtime.add_event_listener(listen)
        server = LorenzServer(port=0, static_routes=())
        await server.start(runtime)
        assert server.url is not None
        assert server.app is not None
        intake: WebhookIntake = server.app[WEBHOOKS_KEY]
        task = asyncio.get_running_loop().create_task(runtime.start())
        while runtime.poll_count < 1 or runtime.poll_status().status != "idle":
            await asyncio.sleep(0.02)
        sender = Sender(server.url)
        try:
            latencies: list[float] = []
            for n in range(events):
                issue = linear.add_issue(title=f"pushed {n}", state="Todo")
                waiting[issue.identifier] = asyncio.Event()
                headers, body = delivery(issue.id, issue.identifier, action="create", n=n)
                sent = time.perf_counter()
                status = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                    sender.post(headers, body), sender.loop))
                assert status == 202, status
                await asyncio.wait_for(waiting[issue.identifier].wait(), timeout=60)
                latencies.append(started[issue.identifier] - sent)
                linear.set_state(issue.id, "Done")
                await asyncio.sleep(spacing)
            latencies.sort()
            figures["latency"] = {
                "events": len(latencies),
                "p50_ms": statistics.median(latencies) * 1000,
                "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
                "max_ms": latencies[-1] * 1000,
            }
            await settle(runtime)
            target = linear.add_issue(title="edited in bulk", state="Backlog")
            for label, gap in (("coalesced", None), ("gap_off", 0.0)):
                if gap is not None:
                    intake.refreshes = RefreshCoalescer(request=runtime.request_refresh,
                                                        min_gap_s=gap)
                await settle(runtime)
                asked_before = intake.refreshes.asked
                polls, requests = runtime.poll_count, len(linear.requests)
                deliveries = [delivery(target.id, target.identifier, action="update",
                                       n=n + (burst if gap is not None else 0))
                              for n in range(burst)]
                cpu_before = time.thread_time()
                wall_before = time.perf_counter()
                future = asyncio.run_coroutine_threadsafe(sender.many(deliveries), sender.loop)
                statuses = await asyncio.wrap_future(future)
                wall = time.perf_counter() - wall_before
                await settle(runtime)
                figures[f"burst_{label}"] = {
                    "deliveries": burst,
                    "accepted": statuses.count(202),
                    "wall_s": wall,
                    "refreshes": intake.refreshes.asked - asked_before,
                    "ticks": runtime.poll_count - polls,
                    "tracker_requests": len(linear.requests) - requests,
                    "loop_cpu_s": time.thread_time() - cpu_before,
                }
        finally:
            sender.close()
            runtime.stop()
            await task
            await server.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-ticks", type=int, default=20)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--spacing", type=float, default=0.3)
    parser.add_argument("--burst", type=int, default=1000)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="lorenz-webhook-bench-") as raw:
        tmp = Path(raw)
        (tmp / "idle").mkdir()
        (tmp / "hooks").mkdir()
        idle = asyncio.run(idle_part(tmp / "idle", ticks=args.idle_ticks))
        hooks = asyncio.run(webhook_parts(tmp / "hooks", events=args.events,
                                          spacing=args.spacing, burst=args.burst))
    print(f"load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"idle: {idle['requests']} tracker requests in {idle['ticks']} ticks = "
          f"{idle['per_tick']:.2f} per tick")
    print(f"  idle tracker requests per hour: 30 s polling {idle['per_hour_30s']:.0f}, "
          f"webhooks with the 5 min backstop {idle['per_hour_backstop']:.0f} "
          f"({idle['per_hour_30s'] / idle['per_hour_backstop']:.0f}x fewer)")
    latency = hooks["latency"]
    print(f"event -> agent start over {latency['events']} deliveries: "
          f"p50 {latency['p50_ms']:.0f} ms, p99 {latency['p99_ms']:.0f} ms, "
          f"max {latency['max_ms']:.0f} ms (poll interval 10 min)")
    for label, title in (("coalesced", "250 ms refresh gap"),
                         ("gap_off", "gap off, runtime merging only")):
        burst = hooks[f"burst_{label}"]
        print(f"burst of {burst['deliveries']} ({title}): {burst['accepted']} accepted in "
              f"{burst['wall_s']:.2f} s; {burst['refreshes']} refreshes asked, "
              f"{burst['ticks']} ticks, {burst['tracker_requests']} tracker requests; "
              f"server loop CPU {burst['loop_cpu_s']:.2f} s")


if __name__ == "__main__":
    main()
