#!/usr/bin/env python3
"""A ``command``-protocol agent that finishes its GitHub issue the way a person would: by label.

Run as ``python github_agent.py`` with the workspace as working directory. It writes down its
prompt and environment in ``$E2E_OUT_DIR/<issue number>/`` (outside the workspace, which Lorenz
removes once the issue is done), then, through GitHub's REST write endpoints, removes every
label named in ``$E2E_FROM_LABELS`` (comma-separated) from issue ``$LORENZ_ISSUE_ID`` and adds
``$E2E_TO_LABEL``.

It authenticates with ``$E2E_AGENT_GITHUB_TOKEN``: a token of its own, handed to it through
``agents.<kind>.env``. The tracker's token never reaches an agent.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    api = os.environ["E2E_GITHUB_API"].rstrip("/")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        api + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {os.environ['E2E_AGENT_GITHUB_TOKEN']}",
            "Accept": "application/vnd.github+json",
            "Content-Type": "application/json",
            "User-Agent": "lorenz-e2e-agent",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def main() -> int:
    number = os.environ["LORENZ_ISSUE_ID"]
    out = Path(os.environ["E2E_OUT_DIR"], number)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompt.txt").write_text(sys.stdin.read(), encoding="utf-8")
    (out / "agent_env.json").write_text(json.dumps(dict(os.environ)), encoding="utf-8")
    repo = os.environ["E2E_GITHUB_REPOSITORY"]
    for label in filter(None, os.environ.get("E2E_FROM_LABELS", "").split(",")):
        quoted = urllib.parse.quote(label, safe="")
        status, _ = call("DELETE", f"/repos/{repo}/issues/{number}/labels/{quoted}")
        print(f"removed label {label}: HTTP {status}", flush=True)
    status, labels = call(
        "POST", f"/repos/{repo}/issues/{number}/labels", {"labels": [os.environ["E2E_TO_LABEL"]]}
    )
    print(f"added label {os.environ['E2E_TO_LABEL']}: HTTP {status}", flush=True)
    if status != 200:
        print(f"could not label the issue: {labels}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
