#!/usr/bin/env python3
"""A tiny ``command``-protocol agent for the end-to-end tests: it writes down what it was given.

Run as ``python command_agent.py SCENARIO.json`` with the workspace as working directory. It
reads the prompt from stdin and writes ``prompt.txt`` (stdin), ``prompt_file.txt`` (the file
named by ``$LORENZ_PROMPT_FILE``) and ``agent_env.json`` (its whole environment) into the
workspace, appends ``{"pid", "attempt"}`` to ``runs.jsonl`` there (one line per start), then
follows the scenario, all keys optional::

    {"stdout": ["progress line", ...], "sleep": SECONDS, "stderr": TEXT, "exit": STATUS}

Nothing else: no model, no protocol beyond "prompt on stdin, exit status is the verdict".
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    scenario = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    prompt = sys.stdin.read()
    workspace = Path.cwd()
    (workspace / "prompt.txt").write_text(prompt, encoding="utf-8")
    prompt_file = Path(os.environ["LORENZ_PROMPT_FILE"]).read_text(encoding="utf-8")
    (workspace / "prompt_file.txt").write_text(prompt_file, encoding="utf-8")
    (workspace / "agent_env.json").write_text(json.dumps(dict(os.environ)), encoding="utf-8")
    with (workspace / "runs.jsonl").open("a", encoding="utf-8") as runs:
        start = {"pid": os.getpid(), "attempt": os.environ.get("LORENZ_ATTEMPT")}
        runs.write(json.dumps(start) + "\n")
    for line in scenario.get("stdout", []):
        print(line, flush=True)
    time.sleep(float(scenario.get("sleep", 0)))
    if scenario.get("stderr"):
        print(scenario["stderr"], file=sys.stderr, flush=True)
    return int(scenario.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
