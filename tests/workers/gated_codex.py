#!/usr/bin/env python3
"""A scripted Codex app-server whose turns wait on gate files, so tests control its progress.

Run as ``python gated_codex.py SCENARIO.json``. It answers ``initialize``, ``thread/start`` and
``turn/start`` like ``codex app-server`` (JSON-RPC without the ``jsonrpc`` member, one message
a line), then plays the turn's steps and sends ``turn/completed``. Steps::

    {"message": TEXT}              an item/agentMessage/delta notification
    {"burst": N}                   N delta notifications
    {"usage": TOTAL}               thread/tokenUsage/updated with that cumulative total
    {"gate": PATH}                 wait until PATH exists (the test opens the gate)
    {"tool": NAME, "arguments": {}} an item/tool/call request; the answer goes to the record
    {"fail": TEXT}                 end the turn with status failed
    {"sleep": SECONDS}             pause (spreads a stream over time)

Every turn's start and end are appended to ``scenario["marks"]`` (``start N`` / ``end N``) and
the agent's pid is written to ``scenario["pid_file"]``, so tests see the agent itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main() -> int:
    with open(sys.argv[1]) as handle:
        scenario: dict[str, Any] = json.loads(handle.read())
    record = scenario.get("record")
    marks = scenario.get("marks")
    if scenario.get("pid_file"):
        with open(scenario["pid_file"], "w") as handle:
            handle.write(str(os.getpid()))
    turns: list[dict[str, Any]] = scenario.get("turns") or [{"steps": []}]
    out = sys.stdout
    stdin = sys.stdin
    next_id = 1000
    turn_number = 0

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    def note(entry: dict[str, Any]) -> None:
        if record:
            with open(record, "a") as handle:
                handle.write(json.dumps(entry) + "\n")

    def mark(text: str) -> None:
        if marks:
            with open(marks, "a") as handle:
                handle.write(text + "\n")

    def receive() -> dict[str, Any] | None:
        line = stdin.readline()
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    while True:
        message = receive()
        if message is None:
            return 0
        method = message.get("method")
        if method == "initialize":
            send({"id": message["id"], "result": {"userAgent": "gated/1"}})
        elif method == "initialized":
            continue
        elif method == "thread/start":
            send({"id": message["id"], "result": {"thread": {"id": "thr-gated"}}})
        elif method == "turn/start":
            turn_number += 1
            turn_id = f"turn-{turn_number}"
            send({"id": message["id"], "result": {"turn": {"id": turn_id, "status": "inProgress"}}})
            mark(f"start {turn_number}")
            turn = turns[min(turn_number, len(turns)) - 1]
            status, error = "completed", None
            for step in turn.get("steps", []):
                base = {"threadId": "thr-gated", "turnId": turn_id}
                if "message" in step:
                    send({"method": "item/agentMessage/delta",
                          "params": {**base, "itemId": "m", "delta": step["message"]}})
                elif "burst" in step:
                    for n in range(int(step["burst"])):
                        send({"method": "item/agentMessage/delta",
                              "params": {**base, "itemId": "m", "delta": f"d{n}"}})
                elif "usage" in step:
                    total = int(step["usage"])
                    usage = {"totalTokens": total, "inputTokens": total - 1, "outputTokens": 1}
                    send({"method": "thread/tokenUsage/updated",
                          "params": {**base, "tokenUsage": {"total": usage, "last": usage}}})
                elif "gate" in step:
                    while not os.path.exists(step["gate"]):
                        time.sleep(0.02)
                elif "tool" in step:
                    next_id += 1
                    send({"id": next_id, "method": "item/tool/call",
                          "params": {**base, "callId": f"c{next_id}", "tool": step["tool"],
                                     "arguments": step.get("arguments", {})}})
                    while True:
                        reply = receive()
                        if reply is None:
                            return 0
                        if reply.get("id") == next_id and "method" not in reply:
                            note({"tool": step["tool"], "answer": reply.get("result")})
                            break
                elif "sleep" in step:
                    time.sleep(float(step["sleep"]))
                elif "fail" in step:
                    status, error = "failed", {"message": step["fail"]}
            mark(f"end {turn_number}")
            send({"method": "turn/completed",
                  "params": {"threadId": "thr-gated",
                             "turn": {"id": turn_id, "status": status, "items": [],
                                      "error": error}}})
        elif "id" in message and method is not None:
            send({"id": message["id"], "error": {"code": -32601, "message": "not here"}})


if __name__ == "__main__":
    sys.exit(main())
