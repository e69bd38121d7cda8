"""A scripted ``claude -p --output-format stream-json --verbose``: the far end of the Claude runner.

Run as ``python claude_agent.py <scenario.json> <claude arguments...>`` with the workspace as
its working directory. Like the real CLI in print mode it reads the prompt from stdin, prints
one JSON event per line on stdout and exits; each Lorenz turn is a separate invocation, the
later ones with ``--resume <session_id>``.

It checks its command line the way the real CLI would, and stricter: ``-p``/``--print``,
``--output-format stream-json`` and ``--max-turns <n>`` are required (stream-json without
``--verbose`` fails with the real CLI's message and status 1), and ``--resume`` must name the
scenario's session on every invocation after the first and be absent on the first. Other
violations print ``CLAUDE FAKE VIOLATION: ...`` on stderr and exit with status 70.

Written to the working directory: ``claude_invocations.jsonl`` (argv, prompt and cwd of each
invocation), ``claude_env_<n>.json`` (the environment of invocation n) and ``claude_child.pid``
(when the scenario spawns a helper process).

The scenario (JSON)::

    {"session_id": "...", "invocations": [{"events": [<event>, ...]}, ...]}

Events are JSON objects printed verbatim (``session_id`` is added when missing), or one of the
pseudo-events ``{"_sleep": s}``, ``{"_raw": "text"}``, ``{"_stderr": "text"}``,
``{"_hang": true}``, ``{"_spawn_child": true}``, ``{"_huge_text_bytes": n}`` (an assistant text
message of n bytes), ``{"_exit": status}`` and ``{"_spend": {"input": n, "output": n,
"interval_s": s}}``: keep spending, one assistant message with that usage every interval, until
killed; each message is appended to ``claude_spend.jsonl`` before it is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VIOLATION_STATUS = 70


def violation(text: str) -> None:
    sys.stderr.write(f"CLAUDE FAKE VIOLATION: {text}\n")
    sys.stderr.flush()
    os._exit(VIOLATION_STATUS)


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value``; ``None`` when absent."""
    for index, arg in enumerate(argv):
        if arg == name:
            if index + 1 >= len(argv):
                violation(f"{name} needs a value")
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def emit(event: dict[str, Any], session_id: str) -> None:
    if "type" in event:
        event = {**event, "session_id": event.get("session_id", session_id)}
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def spend(spec: dict[str, Any], session_id: str, record: Path) -> None:
    """One assistant message with usage every interval, forever (the client kills us)."""
    usage = {
        "input_tokens": int(spec.get("input", 1000)),
        "output_tokens": int(spec.get("output", 100)),
    }
    update = 0
    while True:
        update += 1
        with record.open("a", encoding="utf-8") as file:
            file.write(json.dumps({"update": update, **usage}) + "\n")
        emit(
            {
                "type": "assistant",
                "message": {
                    "id": f"msg_spend_{update}",
                    "role": "assistant",
                    "content": [{"type": "text", "text": f"thinking {update}"}],
                    "usage": usage,
                },
                "parent_tool_use_id": None,
            },
            session_id,
        )
        time.sleep(float(spec.get("interval_s", 0.02)))


def main() -> None:
    scenario = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    argv = sys.argv[2:]
    cwd = Path.cwd()
    session_id = scenario.get("session_id", "00000000-0000-4000-8000-000000000000")

    if "-p" not in argv and "--print" not in argv:
        violation(f"not in print mode (-p): {argv}")
    if option(argv, "--output-format") != "stream-json":
        violation(f"--output-format must be stream-json: {argv}")
    if "--verbose" not in argv:
        sys.stderr.write(
            "Error: When using --print, --output-format=stream-json requires --verbose\n"
        )
        sys.exit(1)
    max_turns = option(argv, "--max-turns")
    if max_turns is None or not max_turns.isdigit() or int(max_turns) < 1:
        violation(f"--max-turns <positive integer> is required: {argv}")
    if argv.count("--max-turns") + sum(a.startswith("--max-turns=") for a in argv) != 1:
        violation(f"--max-turns given more than once: {argv}")

    log = cwd / "claude_invocations.jsonl"
    index = len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0
    resume = option(argv, "--resume")
    if index == 0 and resume is not None:
        violation(f"the first invocation must not resume (got --resume {resume})")
    if index > 0 and resume != session_id:
        violation(f"invocation {index + 1} must --resume {session_id}, got {resume!r}")

    prompt = sys.stdin.read()
    if not prompt.strip():
        violation("no prompt on stdin")
    with log.open("a", encoding="utf-8") as file:
        file.write(json.dumps({"argv": argv, "prompt": prompt, "cwd": str(cwd)}) + "\n")
    (cwd / f"claude_env_{index}.json").write_text(json.dumps(dict(os.environ)), encoding="utf-8")

    invocations = scenario.get("invocations", [])
    if index >= len(invocations):
        violation(f"invocation {index + 1} but the scenario has {len(invocations)}")
    for event in invocations[index].get("events", []):
        if "_sleep" in event:
            time.sleep(float(event["_sleep"]))
        elif "_raw" in event:
            sys.stdout.write(event["_raw"] + "\n")
            sys.stdout.flush()
        elif "_stderr" in event:
            sys.stderr.write(event["_stderr"] + "\n")
            sys.stderr.flush()
        elif "_hang" in event:
            while True:
                time.sleep(3600)
        elif "_spawn_child" in event:
            child = subprocess.Popen(["sleep", "300"])
            (cwd / "claude_child.pid").write_text(str(child.pid), encoding="utf-8")
        elif "_huge_text_bytes" in event:
            text = "y" * int(event["_huge_text_bytes"])
            emit(
                {
                    "type": "assistant",
                    "message": {
                        "id": "msg_huge",
                        "role": "assistant",
                        "content": [{"type": "text", "text": text}],
                        "usage": {"input_tokens": 0, "output_tokens": 0},
                    },
                    "parent_tool_use_id": None,
                },
                session_id,
            )
        elif "_spend" in event:
            spend(event["_spend"], session_id, cwd / "claude_spend.jsonl")
        elif "_exit" in event:
            sys.stdout.flush()
            os._exit(int(event["_exit"]))
        else:
            emit(event, session_id)


if __name__ == "__main__":
    main()
