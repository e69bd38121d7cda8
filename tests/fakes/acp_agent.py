"""A scripted Agent Client Protocol agent: the far end of Lorenz's ACP runner in tests.

Run as ``python acp_agent.py <scenario.json>`` with the workspace as its working directory. It
speaks ACP v1 over stdio the way a real agent does (JSON-RPC 2.0 with ``"jsonrpc": "2.0"``, one
message per line) and checks everything it receives against the protocol: the ``jsonrpc``
member, the method names, and the params (validated with the schema models of the official
``agent-client-protocol`` package). A violation is fatal: it prints ``ACP FAKE VIOLATION: ...``
on stderr and exits with status 70, so a client bug can never pass unnoticed.

Written here (in the working directory) for the tests to read:

* ``acp_env.json``       — the environment the agent was started with;
* ``acp_received.jsonl`` — every message received, in order;
* ``acp_answers.jsonl``  — the client's answers to the requests the agent made
  (permission requests and the deliberately unsupported ones);
* ``acp_child.pid``      — the pid of a helper process, when the scenario spawns one.

The scenario (JSON)::

    {
      "initialize": {"protocolVersion": 1, "error": null, "hang": false},
      "session": {"sessionId": "sess-1", "error": null},
      "turns": [
        {"steps": [<step>, ...], "stopReason": "end_turn", "usage": {...}, "error": null}
      ]
    }

Steps (one key each): ``message`` / ``thought`` (text chunk), ``update`` (a raw
``session/update`` payload), ``usage_update`` (``{used, size, cost}``), ``permission``
(``{toolCall, options}``; the answer is recorded), ``request`` (``{method, params}``; the answer
is recorded), ``raw`` (a line written verbatim), ``huge_message_bytes`` (one message chunk of
that many bytes), ``stderr`` (text), ``sleep`` (seconds), ``spawn_child`` (a ``sleep`` helper),
``hang`` (``"ignore_cancel"`` or ``"stop_on_cancel"``), ``exit`` (status) and ``spend``
(``{cost, interval_s}``: a ``usage_update`` whose cumulative USD cost grows by ``cost`` every
interval until the client sends ``session/cancel``; each update is appended to
``acp_spend.jsonl`` before it is sent, and ``{"cancelled_after": n}`` when the cancel came).

``session.model`` (optional) is offered as the session's ``model`` config option.

``initialize.loadSession: true`` advertises ``loadSession``; ``session/load`` of the scenario's
session is then answered (``null``, after one replayed ``user_message_chunk``), recorded in
``acp_loads.jsonl``, and the prompts that follow play ``loaded_turns`` instead of ``turns``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from acp import schema
from pydantic import BaseModel, ValidationError

VIOLATION_STATUS = 70

CLIENT_TO_AGENT_REQUESTS: dict[str, type[BaseModel]] = {
    "initialize": schema.InitializeRequest,
    "authenticate": schema.AuthenticateRequest,
    "session/new": schema.NewSessionRequest,
    "session/load": schema.LoadSessionRequest,
    "session/prompt": schema.PromptRequest,
    "session/set_mode": schema.SetSessionModeRequest,
    "session/close": schema.CloseSessionRequest,
}
CLIENT_TO_AGENT_NOTIFICATIONS: dict[str, type[BaseModel]] = {
    "session/cancel": schema.CancelNotification
}


class Fake:
    def __init__(self, scenario: dict[str, Any]) -> None:
        self.scenario = scenario
        self.cwd = Path.cwd()
        self.next_id = 1000
        self.session_id = str(scenario.get("session", {}).get("sessionId", "sess-fake"))
        self.cancelled = False
        self.initialized = False
        self.prompts = 0
        self.loaded = False

    # -- framing ----------------------------------------------------------------------------

    def violation(self, text: str) -> NoReturn:
        sys.stderr.write(f"ACP FAKE VIOLATION: {text}\n")
        sys.stderr.flush()
        os._exit(VIOLATION_STATUS)

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()

    def record(self, name: str, entry: Any) -> None:
        with (self.cwd / name).open("a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")

    def receive(self) -> dict[str, Any] | None:
        """The next message from the client, validated; ``None`` once stdin is closed."""
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            self.violation(f"not JSON: {line[:200]!r}")
        if not isinstance(message, dict):
            self.violation(f"not a JSON object: {line[:200]!r}")
        self.record("acp_received.jsonl", message)
        if message.get("jsonrpc") != "2.0":
            self.violation(f"missing or wrong jsonrpc member: {message!r}")
        method = message.get("method")
        if method is None:
            if "id" not in message or ("result" in message) == ("error" in message):
                self.violation(f"a response needs an id and exactly one of result/error: {message}")
            return message
        params = message.get("params")
        if "id" in message:
            model = CLIENT_TO_AGENT_REQUESTS.get(method)
            if model is None:
                self.violation(f"unknown client-to-agent request {method!r}")
        else:
            model = CLIENT_TO_AGENT_NOTIFICATIONS.get(method)
            if model is None:
                self.violation(f"unknown client-to-agent notification {method!r}")
        try:
            model.model_validate(params)
        except ValidationError as exc:
            self.violation(f"invalid params for {method}: {exc}")
        return message

    # -- the conversation ---------------------------------------------------------------------

    def main(self) -> None:
        (self.cwd / "acp_env.json").write_text(json.dumps(dict(os.environ)), encoding="utf-8")
        while True:
            message = self.receive()
            if message is None:
                return
            method = message.get("method")
            if method is None:
                self.violation(f"unexpected response outside a request: {message}")
            if "id" not in message:
                if method == "session/cancel":
                    continue  # nothing in flight: nothing to stop
                self.violation(f"unexpected notification {method}")
            if method == "initialize":
                self.on_initialize(message)
            elif not self.initialized:
                self.violation(f"{method} before initialize")
            elif method == "session/new":
                self.on_new_session(message)
            elif method == "session/load" and self.scenario.get("initialize", {}).get(
                "loadSession"
            ):
                self.on_load_session(message)
            elif method == "session/prompt":
                self.on_prompt(message)
            else:
                self.send(
                    {"id": message["id"], "error": {"code": -32601, "message": "not scripted"}}
                )

    def on_initialize(self, message: dict[str, Any]) -> None:
        spec = self.scenario.get("initialize", {})
        params = message["params"]
        if not isinstance(params.get("protocolVersion"), int):
            self.violation("protocolVersion must be an integer")
        capabilities = params.get("clientCapabilities")
        if capabilities != {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
        }:
            self.violation(f"clientCapabilities must be explicit and all off: {capabilities}")
        if spec.get("hang"):
            self.hang("ignore_cancel")
        if spec.get("error"):
            self.send({"id": message["id"], "error": spec["error"]})
            return
        self.initialized = True
        self.send(
            {
                "id": message["id"],
                "result": {
                    "protocolVersion": spec.get("protocolVersion", 1),
                    "agentCapabilities": {
                        "loadSession": bool(spec.get("loadSession", False)),
                        "promptCapabilities": {"image": False, "audio": False},
                    },
                    "agentInfo": {"name": "fake-acp", "version": "1.0"},
                    "authMethods": spec.get("authMethods", []),
                },
            }
        )

    def on_new_session(self, message: dict[str, Any]) -> None:
        spec = self.scenario.get("session", {})
        params = message["params"]
        cwd = params["cwd"]
        if not os.path.isabs(cwd):
            self.violation(f"session/new cwd must be absolute: {cwd!r}")
        if os.path.realpath(cwd) != os.path.realpath(self.cwd):
            self.violation(f"session/new cwd {cwd!r} is not the working directory {self.cwd}")
        if params.get("mcpServers") != []:
            self.violation(f"mcpServers must be an empty list: {params.get('mcpServers')!r}")
        if spec.get("error"):
            self.send({"id": message["id"], "error": spec["error"]})
            return
        result: dict[str, Any] = {"sessionId": self.session_id}
        if spec.get("model"):
            result["configOptions"] = [
                {
                    "type": "select",
                    "id": "model",
                    "name": "Model",
                    "category": "model",
                    "currentValue": spec["model"],
                    "options": [{"value": spec["model"], "name": spec["model"]}],
                }
            ]
        self.send({"id": message["id"], "result": result})

    def on_load_session(self, message: dict[str, Any]) -> None:
        params = message["params"]
        if params["sessionId"] != self.session_id:
            self.send({"id": message["id"], "error": {"code": -32002, "message": "no session"}})
            return
        if os.path.realpath(params["cwd"]) != os.path.realpath(self.cwd):
            self.violation(f"session/load cwd {params['cwd']!r} is not {self.cwd}")
        self.record("acp_loads.jsonl", {"sessionId": params["sessionId"]})
        self.update(
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "old"}}
        )
        self.loaded = True
        self.send({"id": message["id"], "result": None})

    def on_prompt(self, message: dict[str, Any]) -> None:
        params = message["params"]
        if params["sessionId"] != self.session_id:
            self.violation(f"prompt for unknown session {params['sessionId']!r}")
        blocks = params["prompt"]
        if not blocks or any(block.get("type") != "text" for block in blocks):
            self.violation(f"prompt must be non-empty text blocks: {blocks!r}")
        turns = self.scenario.get("loaded_turns" if self.loaded else "turns", [])
        self.record("acp_prompts.jsonl", {"text": blocks[0]["text"], "loaded": self.loaded})
        if self.prompts >= len(turns):
            self.violation(f"prompt {self.prompts + 1} but the scenario has {len(turns)} turns")
        turn = turns[self.prompts]
        self.prompts += 1
        self.cancelled = False
        for step in turn.get("steps", []):
            self.run_step(step)
        if turn.get("error"):
            self.send({"id": message["id"], "error": turn["error"]})
            return
        result: dict[str, Any] = {"stopReason": turn.get("stopReason", "end_turn")}
        if self.cancelled:
            result["stopReason"] = "cancelled"
        if "usage" in turn:
            result["usage"] = turn["usage"]
        self.send({"id": message["id"], "result": result})

    # -- steps --------------------------------------------------------------------------------

    def update(self, update: dict[str, Any]) -> None:
        self.send(
            {
                "method": "session/update",
                "params": {"sessionId": self.session_id, "update": update},
            }
        )

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and wait for its answer (recording cancels meanwhile)."""
        request_id = self.next_id
        self.next_id += 1
        self.send({"id": request_id, "method": method, "params": params})
        while True:
            message = self.receive()
            if message is None:
                self.violation(f"stdin closed while waiting for the answer to {method}")
            if message.get("method") == "session/cancel":
                self.cancelled = True
                continue
            if message.get("method") is not None:
                self.violation(f"got {message['method']} while waiting for the answer to {method}")
            if message.get("id") != request_id:
                self.violation(f"answer for id {message.get('id')!r}, expected {request_id}")
            answer = {"method": method, "params": params}
            answer.update({k: message[k] for k in ("result", "error") if k in message})
            self.record("acp_answers.jsonl", answer)
            return message

    def run_step(self, step: dict[str, Any]) -> None:
        ((kind, value),) = step.items()
        if kind == "message":
            self.update(
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": value}}
            )
        elif kind == "thought":
            self.update(
                {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": value}}
            )
        elif kind == "update":
            self.update(value)
        elif kind == "usage_update":
            self.update({"sessionUpdate": "usage_update", **value})
        elif kind == "huge_message_bytes":
            text = "x" * int(value)
            self.update(
                {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
            )
        elif kind == "permission":
            answer = self.request(
                "session/request_permission", {"sessionId": self.session_id, **value}
            )
            if "result" in answer:
                try:
                    schema.RequestPermissionResponse.model_validate(answer["result"])
                except ValidationError as exc:
                    self.violation(f"invalid permission answer: {exc}")
                outcome = answer["result"]["outcome"]
                option_ids = {option["optionId"] for option in value.get("options", [])}
                if outcome["outcome"] == "selected" and outcome["optionId"] not in option_ids:
                    self.violation(f"selected an option that was not offered: {outcome}")
        elif kind == "request":
            self.request(value["method"], {"sessionId": self.session_id, **value.get("params", {})})
        elif kind == "raw":
            sys.stdout.write(value + "\n")
            sys.stdout.flush()
        elif kind == "stderr":
            sys.stderr.write(value + "\n")
            sys.stderr.flush()
        elif kind == "sleep":
            time.sleep(float(value))
        elif kind == "spawn_child":
            child = subprocess.Popen(["sleep", "300"])
            (self.cwd / "acp_child.pid").write_text(str(child.pid), encoding="utf-8")
        elif kind == "hang":
            self.hang(value)
        elif kind == "spend":
            self.spend(value)
        elif kind == "exit":
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(value))
        else:
            self.violation(f"scenario error: unknown step {kind!r}")

    def spend(self, spec: dict[str, Any]) -> None:
        """Cumulative cost updates until the client cancels the turn."""
        per_update, interval = float(spec.get("cost", 0.01)), float(spec.get("interval_s", 0.02))
        update = 0
        while True:
            update += 1
            cost = round(per_update * update, 9)
            self.record("acp_spend.jsonl", {"update": update, "cost": cost})
            self.update(
                {
                    "sessionUpdate": "usage_update",
                    "used": 100 * update,
                    "size": 1_000_000,
                    "cost": {"amount": cost, "currency": "USD"},
                }
            )
            # NB: nothing else comes from the client mid-turn, so stdin's buffer is empty and
            # select on its descriptor sees the cancel as soon as it is written.
            readable, _, _ = select.select([sys.stdin.buffer], [], [], interval)
            if not readable:
                continue
            message = self.receive()
            if message is None:
                os._exit(0)
            if message.get("method") != "session/cancel":
                self.violation(f"got {message.get('method') or 'a response'} while spending")
            self.cancelled = True
            self.record("acp_spend.jsonl", {"cancelled_after": update})
            return

    def hang(self, mode: str) -> None:
        """Stop making progress; ``stop_on_cancel`` ends the turn once the client cancels."""
        while True:
            message = self.receive()
            if message is None:
                # NB: a real hung agent would not notice stdin closing either.
                while True:
                    time.sleep(3600)
            if message.get("method") == "session/cancel":
                self.cancelled = True
                if mode == "stop_on_cancel":
                    return
                continue
            self.violation(f"got {message.get('method') or 'a response'} while hanging")


def main() -> None:
    scenario_path = Path(sys.argv[1])
    scenario = json.loads(scenario_path.read_text(encoding="utf-8"))
    Fake(scenario).main()


if __name__ == "__main__":
    main()
