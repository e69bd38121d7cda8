#!/usr/bin/env python3
"""A scripted stand-in for ``codex app-server``: speaks its stdio wire format, checks ours.

Run as ``python codex_agent.py SCENARIO.json`` (or with ``FAKE_CODEX_SCENARIO`` set). The
scenario says how to answer the handshake and what each turn does; every message the client
sends is validated (method names, no ``jsonrpc`` member, required params, expected policy
fields) and appended to a JSON-lines record file (``scenario["record"]`` or
``FAKE_CODEX_RECORD``) that tests read back. A protocol violation is recorded, printed to stderr
and ends the process with status 97.

Scenario keys (all optional)::

    thread_id        "thr-1"
    model            the model thread/start answers with (top level; absent when unset)
    record_sent      also record every (small) message the fake sends, as {"sent": ...}
    banner           stderr text printed at start (non-JSON stderr must not disturb parsing)
    expect           {experimental_api, tools, approval_policy, sandbox, sandbox_policy,
                      title, cwd, client_name}: what the client must send (null = absent)
    initialize       {no_response, error, exit, delay_s, overload_times}
    thread_start     {no_response, error, overload_times, result}
    thread_resume    {error}: thread/resume answers the thread it was asked for (recorded as
                     {"resume": THREAD_ID}) unless an error is set; later turns run on it

With ``CODEX_HOME`` set (as the real one, it must name an existing folder), thread/start keeps
the thread in ``$CODEX_HOME/sessions/<id>.json`` and thread/resume of a thread not kept there
fails as the real one does (``no rollout found for thread id <id>``).
    resumed_turns    the turns played after a thread/resume (default: ``turns``)
    turn_start       {no_response, error, overload_times}
    turns            [{steps: [...], status: completed|failed|interrupted, error: "msg",
                       completion: "turn/completed" | "turn/failed" | "none"}]
                     turn N uses turns[N-1], or the last entry when there are fewer

Steps::

    {"notify": METHOD, "params": {...}}           a notification (threadId/turnId filled in)
    {"agent_message": TEXT}                        item/started + delta + item/completed
    {"token_usage": {"input", "output", "total", "last": {...}}}
    {"rate_limits": {...}}
    {"request": METHOD, "params": {...}, "expect_result": {...}, "expect_error_code": N}
                                                   a server request; the answer is recorded
    {"garbage": TEXT}                              a raw non-JSON stdout line
    {"huge": BYTES}                                a notification of about BYTES bytes
    {"partial": TEXT}                              a delta notification written in 2 pieces
    {"stderr": TEXT, "repeat": N}                  stderr output
    {"flood": {"count": N, "rate": PER_S | null}}  many agentMessage deltas
    {"sleep": SECONDS}
    {"hang": true}                                 stop talking (stall)
    {"spawn_child": true}                          start a grandchild; its pid is recorded
    {"exit": STATUS, "stderr": TEXT}               die mid-turn
    {"spend": {"input": N, "cached": N, "output": N, "interval_s": S, "max_updates": N}}
                                                   keep spending: a cumulative tokenUsage update
                                                   every interval_s until the client sends
                                                   turn/interrupt (answered, then the turn ends
                                                   "interrupted"); each update is recorded
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

VIOLATION_EXIT = 97


class Violation(Exception):
    pass


class FakeCodex:
    def __init__(self, scenario: dict[str, Any], record_path: str | None) -> None:
        self.scenario = scenario
        self.expect: dict[str, Any] = scenario.get("expect", {})
        self.record_path = record_path
        self.thread_id: str = scenario.get("thread_id", "thr-1")
        self.turn_number = 0
        self.turn_id: str | None = None
        self.initialized = False
        self.initialize_seen = False
        self.initialize_answered = False
        self.server_request_seq = 0
        self.overloads: dict[str, int] = {}
        self.item_seq = 0
        self.resumed = False
        self.stdin = sys.stdin.buffer
        self.stdout = sys.stdout.buffer

    # -- io ----------------------------------------------------------------------------

    def record(self, entry: dict[str, Any]) -> None:
        if self.record_path:
            with open(self.record_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")

    def write_raw(self, data: bytes) -> None:
        self.stdout.write(data)
        self.stdout.flush()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        if self.scenario.get("record_sent") and len(data) < 65536:
            self.record({"sent": message})
        self.write_raw(data + b"\n")

    def notify(self, method: str, params: dict[str, Any]) -> None:
        if method == "item/started":
            params = {"startedAtMs": int(time.time() * 1000), **params}
        elif method == "item/completed":
            params = {"completedAtMs": int(time.time() * 1000), **params}
        self.send({"method": method, "params": params})

    def read(self) -> dict[str, Any] | None:
        line = self.stdin.readline()
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise Violation(f"client sent a line that is not JSON: {line[:200]!r}") from exc
        if not isinstance(message, dict):
            raise Violation(f"client sent a non-object: {message!r}")
        self.record({"received": message})
        if "jsonrpc" in message:
            raise Violation("client sent the jsonrpc member, which codex leaves out")
        return message

    # -- main loop ----------------------------------------------------------------------

    def run(self) -> int:
        banner = self.scenario.get("banner", "fake codex app-server: starting (not JSON)")
        if banner:
            sys.stderr.write(banner + "\n")
            sys.stderr.flush()
        try:
            while True:
                message = self.read()
                if message is None:
                    self.record({"eof": True})
                    return 0
                self.dispatch(message)
        except Violation as exc:
            self.record({"violation": str(exc)})
            sys.stderr.write(f"fake codex: protocol violation: {exc}\n")
            sys.stderr.flush()
            return VIOLATION_EXIT

    def dispatch(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method is None:
            raise Violation(f"unexpected response from the client: {message}")
        if not isinstance(method, str):
            raise Violation(f"method must be a string: {message}")
        is_request = "id" in message
        if method == "initialize":
            self.on_initialize(message)
        elif method == "initialized":
            if is_request:
                raise Violation("initialized must be a notification (no id)")
            if not self.initialize_seen:
                raise Violation("initialized before initialize")
            self.initialized = True
        elif method == "thread/start":
            self.on_thread_start(message)
        elif method == "thread/resume":
            self.on_thread_resume(message)
        elif method == "turn/interrupt":
            self.record({"interrupt": (message.get("params") or {}).get("turnId")})
            self.send({"id": message["id"], "result": {}})
        elif method == "turn/start":
            self.on_turn_start(message)
        else:
            raise Violation(f"unexpected client method {method!r}")

    def check_request(self, message: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(message.get("id"), int | str):
            raise Violation(f"{message['method']} must carry an integer or string id")
        params = message.get("params")
        if not isinstance(params, dict):
            raise Violation(f"{message['method']} must carry an object params")
        if message["method"] != "initialize" and not self.initialized:
            raise Violation(f"{message['method']} before the initialized notification")
        return params

    def handshake_stage(self, name: str, message: dict[str, Any]) -> bool:
        """Apply the scenario's failure knobs for a request; True when it was answered."""
        stage = self.scenario.get(name, {})
        delay = stage.get("delay_s")
        if delay:
            time.sleep(delay)
        if "exit" in stage:
            sys.stderr.write(stage.get("stderr", f"fake codex: exiting during {name}") + "\n")
            sys.stderr.flush()
            os._exit(stage["exit"])
        if stage.get("no_response"):
            return True
        overload_times = stage.get("overload_times", 0)
        seen = self.overloads.get(name, 0)
        if seen < overload_times:
            self.overloads[name] = seen + 1
            self.record({"overloaded": name})
            self.send(
                {
                    "id": message["id"],
                    "error": {"code": -32001, "message": "Server overloaded; retry later."},
                }
            )
            return True
        if stage.get("error"):
            self.send({"id": message["id"], "error": {"code": -32600, "message": stage["error"]}})
            return True
        return False

    def on_initialize(self, message: dict[str, Any]) -> None:
        if self.initialize_answered:
            raise Violation("initialize sent twice")
        self.initialize_seen = True
        params = self.check_request(message)
        info = params.get("clientInfo")
        if not isinstance(info, dict) or not all(
            isinstance(info.get(k), str) and info.get(k) for k in ("name", "version")
        ):
            raise Violation(f"initialize.clientInfo needs name and version: {info!r}")
        if "client_name" in self.expect and info["name"] != self.expect["client_name"]:
            raise Violation(f"clientInfo.name {info['name']!r} != {self.expect['client_name']!r}")
        if "experimental_api" in self.expect:
            caps = params.get("capabilities") or {}
            got = bool(caps.get("experimentalApi", False))
            if got != self.expect["experimental_api"]:
                raise Violation(f"capabilities.experimentalApi is {got}, expected otherwise")
        if self.handshake_stage("initialize", message):
            return
        self.initialize_answered = True
        self.send(
            {
                "id": message["id"],
                "result": {
                    "userAgent": "fake-codex/0.0",
                    "codexHome": "/nonexistent",
                    "platformFamily": "unix",
                    "platformOs": "linux",
                },
            }
        )

    def expect_field(self, key: str, params: dict[str, Any], field: str, where: str) -> None:
        if key not in self.expect:
            return
        wanted = self.expect[key]
        if wanted is None:
            if field in params:
                raise Violation(f"{where}.{field} must be absent, got {params[field]!r}")
        elif params.get(field) != wanted:
            raise Violation(f"{where}.{field} is {params.get(field)!r}, expected {wanted!r}")

    def on_thread_start(self, message: dict[str, Any]) -> None:
        params = self.check_request(message)
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise Violation(f"thread/start.cwd must be an absolute path, got {cwd!r}")
        if "cwd" in self.expect and cwd != self.expect["cwd"]:
            raise Violation(f"thread/start.cwd {cwd!r} != {self.expect['cwd']!r}")
        self.expect_field("approval_policy", params, "approvalPolicy", "thread/start")
        self.expect_field("sandbox", params, "sandbox", "thread/start")
        tools = params.get("dynamicTools")
        if tools is not None:
            for spec in tools:
                missing = [
                    k for k in ("type", "name", "description", "inputSchema") if k not in spec
                ]
                if missing or spec["type"] != "function":
                    raise Violation(f"bad dynamic tool spec {spec!r} (missing {missing})")
        if "tools" in self.expect:
            names = [spec["name"] for spec in tools or []]
            if names != self.expect["tools"]:
                raise Violation(f"dynamicTools names {names} != {self.expect['tools']}")
        if self.handshake_stage("thread_start", message):
            return
        now = int(time.time())
        thread = {
            "id": self.thread_id,
            "sessionId": f"session-{self.thread_id}",
            "preview": "",
            "cliVersion": "0.0.0-fake",
            "createdAt": now,
            "updatedAt": now,
            "cwd": cwd,
            "modelProvider": "fake",
            "projectId": None,
            "source": "appServer",
            "status": {"type": "idle"},
            "ephemeral": False,
            "turns": [],
        }
        thread.update(self.scenario.get("thread_start", {}).get("result_thread", {}))
        default_result: dict[str, Any] = {"thread": thread}
        if self.scenario.get("model"):
            default_result["model"] = self.scenario["model"]
        result = self.scenario.get("thread_start", {}).get("result", default_result)
        store = self.thread_store(str(thread["id"]))
        if store is not None:
            os.makedirs(os.path.dirname(store), exist_ok=True)
            with open(store, "w", encoding="utf-8") as handle:
                json.dump(thread, handle)
        self.send({"id": message["id"], "result": result})
        self.notify("thread/started", {"thread": thread})

    @staticmethod
    def thread_store(thread_id: str) -> str | None:
        """Where a thread is kept (``None``: no ``CODEX_HOME``, threads are not kept)."""
        home = os.environ.get("CODEX_HOME")
        if not home:
            return None
        if not os.path.isdir(home):
            raise Violation(f"CODEX_HOME {home!r} does not name an existing folder")
        return os.path.join(home, "sessions", f"{os.path.basename(thread_id)}.json")

    def on_thread_resume(self, message: dict[str, Any]) -> None:
        params = self.check_request(message)
        thread_id = params.get("threadId")
        if not isinstance(thread_id, str) or not thread_id:
            raise Violation(f"thread/resume needs a threadId: {params!r}")
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise Violation(f"thread/resume.cwd must be an absolute path, got {cwd!r}")
        self.record({"resume": thread_id})
        error = self.scenario.get("thread_resume", {}).get("error")
        store = self.thread_store(thread_id)
        if not error and store is not None and not os.path.exists(store):
            error = f"no rollout found for thread id {thread_id}"
        if error:
            self.send({"id": message["id"], "error": {"code": -32600, "message": error}})
            return
        self.thread_id = thread_id
        self.resumed = True
        self.send({"id": message["id"], "result": {"thread": {"id": thread_id}}})

    def on_turn_start(self, message: dict[str, Any]) -> None:
        params = self.check_request(message)
        if params.get("threadId") != self.thread_id:
            raise Violation(f"turn/start.threadId {params.get('threadId')!r} != {self.thread_id!r}")
        items = params.get("input")
        if (
            not isinstance(items, list)
            or not items
            or not all(
                isinstance(i, dict) and i.get("type") == "text" and isinstance(i.get("text"), str)
                for i in items
            )
        ):
            raise Violation(f"turn/start.input must be a list of text items: {items!r}")
        self.expect_field("sandbox_policy", params, "sandboxPolicy", "turn/start")
        self.expect_field("approval_policy", params, "approvalPolicy", "turn/start")
        self.expect_field("title", params, "title", "turn/start")
        if self.handshake_stage("turn_start", message):
            return
        self.turn_number += 1
        self.turn_id = f"turn-{self.turn_number}"
        self.record({"turn": self.turn_number, "text": items[0]["text"]})
        turns = self.scenario.get("turns") or [{}]
        if getattr(self, "resumed", False) and "resumed_turns" in self.scenario:
            turns = self.scenario["resumed_turns"] or [{}]
        spec = turns[min(self.turn_number, len(turns)) - 1]
        turn: dict[str, Any] = {
            "id": self.turn_id, "status": "inProgress", "items": [], "error": None
        }
        self.send({"id": message["id"], "result": {"turn": turn}})
        self.notify("turn/started", {"threadId": self.thread_id, "turn": turn})
        for step in spec.get("steps", []):
            if "spend" in step:
                if self.spend(step["spend"]):
                    return
                continue
            self.step(step)
        status = spec.get("status", "completed")
        error = {"message": spec["error"]} if spec.get("error") else None
        completion = spec.get("completion", "turn/completed")
        if completion == "none":
            return
        final = {"id": self.turn_id, "status": status, "items": [], "error": error}
        self.notify(completion, {"threadId": self.thread_id, "turn": final})

    # -- steps --------------------------------------------------------------------------

    def ids(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"threadId": self.thread_id, "turnId": self.turn_id, **params}

    def step(self, step: dict[str, Any]) -> None:
        if "exit" in step:
            sys.stderr.write(step.get("stderr", "fake codex: exiting") + "\n")
            sys.stderr.flush()
            self.stdout.flush()
            os._exit(int(step["exit"]))
        elif "notify" in step:
            self.notify(step["notify"], self.ids(step.get("params", {})))
        elif "agent_message" in step:
            self.item_seq += 1
            item_id = f"item-{self.item_seq}"
            text = step["agent_message"]
            self.notify(
                "item/started",
                self.ids({"item": {"type": "agentMessage", "id": item_id, "text": ""}}),
            )
            self.notify("item/agentMessage/delta", self.ids({"itemId": item_id, "delta": text}))
            self.notify(
                "item/completed",
                self.ids({"item": {"type": "agentMessage", "id": item_id, "text": text}}),
            )
        elif "token_usage" in step:
            usage = step["token_usage"]
            total = {
                "inputTokens": usage.get("input", 0),
                "cachedInputTokens": 0,
                "outputTokens": usage.get("output", 0),
                "reasoningOutputTokens": 0,
                "totalTokens": usage.get("total", usage.get("input", 0) + usage.get("output", 0)),
            }
            last = {
                "inputTokens": 1,
                "cachedInputTokens": 0,
                "outputTokens": 1,
                "reasoningOutputTokens": 0,
                "totalTokens": 2,
                **usage.get("last", {}),
            }
            self.notify(
                "thread/tokenUsage/updated",
                self.ids(
                    {"tokenUsage": {"total": total, "last": last, "modelContextWindow": 1000}}
                ),
            )
        elif "rate_limits" in step:
            self.notify("account/rateLimits/updated", {"rateLimits": step["rate_limits"]})
        elif "request" in step:
            self.server_request(step)
        elif "garbage" in step:
            self.write_raw(step["garbage"].encode() + b"\n")
        elif "huge" in step:
            filler = "x" * int(step["huge"])
            self.notify("item/agentMessage/delta", self.ids({"itemId": "huge", "delta": filler}))
        elif "partial" in step:
            data = json.dumps(
                {
                    "method": "item/agentMessage/delta",
                    "params": self.ids({"delta": step["partial"]}),
                }
            ).encode()
            half = len(data) // 2
            self.write_raw(data[:half])
            time.sleep(0.05)
            self.write_raw(data[half:] + b"\n")
        elif "stderr" in step:
            for _ in range(int(step.get("repeat", 1))):
                sys.stderr.write(step["stderr"] + "\n")
            sys.stderr.flush()
        elif "flood" in step:
            self.flood(step["flood"])
        elif "sleep" in step:
            time.sleep(step["sleep"])
        elif "hang" in step:
            while True:
                time.sleep(3600)
        elif "spawn_child" in step:
            child = subprocess.Popen(
                ["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            self.record({"child_pid": child.pid})
        else:
            raise Violation(f"scenario error: unknown step {step!r}")

    def spend(self, spec: dict[str, Any]) -> bool:
        """Usage updates until turn/interrupt; True when the turn was interrupted (and ended)."""
        per_input, per_output = int(spec.get("input", 1000)), int(spec.get("output", 100))
        per_cached = int(spec.get("cached", 0))
        interval = float(spec.get("interval_s", 0.02))
        total = {"inputTokens": 0, "cachedInputTokens": 0, "outputTokens": 0}
        for update in range(1, int(spec.get("max_updates", 100_000)) + 1):
            total["inputTokens"] += per_input
            total["cachedInputTokens"] += per_cached
            total["outputTokens"] += per_output
            totals = {
                **total,
                "reasoningOutputTokens": 0,
                "totalTokens": total["inputTokens"] + total["outputTokens"],
            }
            self.record({"usage_update": update, "total": totals})
            self.notify(
                "thread/tokenUsage/updated",
                self.ids(
                    {"tokenUsage": {"total": totals, "last": totals, "modelContextWindow": 1}}
                ),
            )
            # NB: the client sends nothing else mid-turn, so stdin's buffer is empty here and
            # select on its descriptor sees the interrupt as soon as it is written.
            readable, _, _ = select.select([self.stdin], [], [], interval)
            if not readable:
                continue
            message = self.read()
            if message is None:
                self.record({"eof": True})
                os._exit(0)
            if message.get("method") != "turn/interrupt":
                raise Violation(f"unexpected {message.get('method')!r} mid-turn")
            params = self.check_request(message)
            if params.get("threadId") != self.thread_id or params.get("turnId") != self.turn_id:
                raise Violation(f"turn/interrupt names another turn: {params!r}")
            self.record({"interrupted_after": update})
            self.send({"id": message["id"], "result": {}})
            final: dict[str, Any] = {
                "id": self.turn_id, "status": "interrupted", "items": [], "error": None
            }
            self.notify("turn/completed", {"threadId": self.thread_id, "turn": final})
            return True
        return False

    def flood(self, spec: dict[str, Any]) -> None:
        count = int(spec.get("count", 1000))
        rate = spec.get("rate")
        interval = 1.0 / rate if rate else 0.0
        started = time.monotonic()
        for n in range(count):
            self.notify(
                "item/agentMessage/delta", self.ids({"itemId": "flood", "delta": f"chunk {n} "})
            )
            if interval:
                delay = started + (n + 1) * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)

    def server_request(self, step: dict[str, Any]) -> None:
        self.server_request_seq += 1
        request_id = step.get("id", self.server_request_seq + 1000)
        method = step["request"]
        params = {"itemId": f"item-{self.server_request_seq}", **self.ids(step.get("params", {}))}
        self.send({"id": request_id, "method": method, "params": params})
        if step.get("no_wait"):
            return
        while True:
            message = self.read()
            if message is None:
                raise Violation(f"stdin closed before {method} was answered")
            if "method" in message:
                self.dispatch(message)
                continue
            break
        if message.get("id") != request_id:
            raise Violation(f"answer id {message.get('id')!r} != {request_id!r}")
        has_result, has_error = "result" in message, "error" in message
        if has_result == has_error:
            raise Violation(f"answer to {method} needs exactly one of result/error: {message}")
        self.record({"server_request": method, "answer": message})
        if "expect_result" in step and message.get("result") != step["expect_result"]:
            raise Violation(
                f"{method} answered {message.get('result')!r}, expected {step['expect_result']!r}"
            )
        if "expect_error_code" in step:
            code = (message.get("error") or {}).get("code")
            if code != step["expect_error_code"]:
                raise Violation(f"{method} error code {code!r} != {step['expect_error_code']}")


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else os.environ.get("FAKE_CODEX_SCENARIO")
    scenario: dict[str, Any] = {}
    if path:
        with open(path, encoding="utf-8") as fh:
            scenario = json.load(fh)
    record = scenario.get("record") or os.environ.get("FAKE_CODEX_RECORD")
    return FakeCodex(scenario, record).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
