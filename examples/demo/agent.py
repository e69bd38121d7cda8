#!/usr/bin/env python3
"""The demo "coding agent": shows Lorenz's whole loop without a model or an account.

Lorenz runs it with the ``command`` protocol in the issue's workspace. It reads its prompt (from
stdin, or the file named by ``LORENZ_PROMPT_FILE``), prints a few progress lines (each one is an
agent event on the dashboard), appends a line about the issue to ``NOTES.md`` in the workspace,
and finally moves the issue to a done state by rewriting the ``state:`` line of the issue's
Markdown file — exactly what a person editing the board would do. The next poll sees the issue
in a terminal state, and Lorenz cleans its workspace up.

Environment (set by the Lorenz runtime):

* ``LORENZ_ISSUE_IDENTIFIER`` / ``LORENZ_ISSUE_ID`` — which issue this run is for;
* ``LORENZ_WORKSPACE`` — the workspace (also the working directory);
* ``LORENZ_ISSUE_FILE`` — the issue's file, if known; otherwise it is searched for in
  ``LORENZ_TRACKER_PATH`` (the files tracker's folder) by identifier, id or file name;
* ``LORENZ_DEMO_DONE_STATE`` — the state to move to (default ``Done``);
* ``LORENZ_DEMO_STEP_DELAY`` — seconds between progress lines (default ``0.3``), so a run is
  visible on the dashboard for a moment;
* ``LORENZ_USAGE_FILE`` — where it reports made-up token usage after each step (running
  totals, as a real agent's would grow), priced as ``gpt-5-mini`` by Lorenz's price table: the
  demo's spend column (see docs/budgets.md).

Exit status: 0 on success, 2 when the issue file cannot be found (the message says which
variables to set). Standard library only: it must run with any ``python3``.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

NOT_FOUND_EXIT = 2
_STATE_LINE = re.compile(r"^(?P<indent>\s*)state\s*:.*$")
_KEY_LINE = re.compile(r"^\s*(?P<key>identifier|id)\s*:\s*(?P<value>.*?)\s*(#.*)?$")


def read_prompt() -> str:
    path = os.environ.get("LORENZ_PROMPT_FILE")
    if path and Path(path).is_file():
        return Path(path).read_text(encoding="utf-8")
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return ""


def say(message: str) -> None:
    print(f"[demo-agent] {message}", flush=True)


class Usage:
    """Made-up token usage, reported as running totals through ``LORENZ_USAGE_FILE``."""

    def __init__(self) -> None:
        self.path = os.environ.get("LORENZ_USAGE_FILE")
        self.input_tokens = 0
        self.output_tokens = 0

    def step(self, *, read: int, written: int) -> None:
        self.input_tokens += read
        self.output_tokens += written
        if not self.path:
            return
        line = (
            f'{{"input_tokens": {self.input_tokens}, "output_tokens": {self.output_tokens}, '
            '"model": "gpt-5-mini"}\n'
        )
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line)


def front_matter_bounds(lines: list[str]) -> tuple[int, int] | None:
    """Indexes of the opening and closing ``---`` of the front matter, if there is one."""
    if not lines or lines[0].strip() != "---":
        return None
    for index in range(1, len(lines)):
        if lines[index].strip() in ("---", "..."):
            return 0, index
    return None


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def file_names_issue(path: Path, wanted: set[str]) -> bool:
    if path.stem in wanted:
        return True
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    bounds = front_matter_bounds(lines)
    if bounds is None:
        return False
    for line in lines[bounds[0] + 1 : bounds[1]]:
        match = _KEY_LINE.match(line)
        if match and _unquote(match.group("value")) in wanted:
            return True
    return False


def find_issue_file() -> Path | None:
    explicit = os.environ.get("LORENZ_ISSUE_FILE")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    folder = os.environ.get("LORENZ_TRACKER_PATH")
    wanted = {
        value
        for value in (os.environ.get("LORENZ_ISSUE_IDENTIFIER"), os.environ.get("LORENZ_ISSUE_ID"))
        if value
    }
    if not folder or not wanted or not Path(folder).is_dir():
        return None
    for path in sorted(Path(folder).rglob("*.md")):
        if file_names_issue(path, wanted):
            return path
    return None


def move_issue(path: Path, state: str) -> str | None:
    """Rewrite the ``state:`` line of ``path``'s front matter; returns the previous line."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    bounds = front_matter_bounds([line.rstrip("\r\n") for line in lines])
    if bounds is None:
        raise ValueError(f"{path} has no front matter")
    start, end = bounds
    previous = None
    for index in range(start + 1, end):
        match = _STATE_LINE.match(lines[index].rstrip("\r\n"))
        if match:
            previous = lines[index].strip()
            ending = lines[index][len(lines[index].rstrip("\r\n")) :] or "\n"
            lines[index] = f"{match.group('indent')}state: {state}{ending}"
            break
    else:
        lines.insert(end, f"state: {state}\n")
    # NB: write a sibling temp file and rename it, so the tracker never reads half a file.
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write("".join(lines))
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return previous


def main() -> int:
    identifier = os.environ.get("LORENZ_ISSUE_IDENTIFIER") or os.environ.get("LORENZ_ISSUE_ID")
    identifier = identifier or "UNKNOWN"
    delay = float(os.environ.get("LORENZ_DEMO_STEP_DELAY", "0.3"))
    done_state = os.environ.get("LORENZ_DEMO_DONE_STATE", "Done")
    workspace = Path(os.environ.get("LORENZ_WORKSPACE") or os.getcwd())

    prompt = read_prompt()
    usage = Usage()
    first_line = next((line for line in prompt.splitlines() if line.strip()), "(empty prompt)")
    say(f"working on {identifier}: {first_line[:120]}")
    usage.step(read=len(prompt) * 4 + 8000, written=400)
    time.sleep(delay)

    say("reading the workspace")
    usage.step(read=12000, written=900)
    time.sleep(delay)

    notes = workspace / "NOTES.md"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with notes.open("a", encoding="utf-8") as out:
        out.write(f"- {stamp} {identifier}: handled by the Lorenz demo agent\n")
    say(f"appended a note to {notes.name}")
    usage.step(read=6000, written=1500)
    time.sleep(delay)

    issue_file = find_issue_file()
    if issue_file is None:
        print(
            f"demo agent: cannot find the issue file of {identifier}; set LORENZ_ISSUE_FILE, "
            "or LORENZ_TRACKER_PATH with LORENZ_ISSUE_IDENTIFIER",
            file=sys.stderr,
        )
        return NOT_FOUND_EXIT
    previous = move_issue(issue_file, done_state)
    say(f"moved {identifier} to {done_state} ({previous or 'no state line before'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
