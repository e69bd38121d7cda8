#!/usr/bin/env python3
"""A minimal controller in its own process: launch (or adopt) one worker and follow it.

``python controller_script.py SPEC.json STATE_ROOT OUT.jsonl [AFTER_SEQ]`` writes one line per
record it collects (``{"seq": N, "kind": ..., "data": ...}``, flushed at once) and answers tool
calls with a handler that holds the tracker token. Tests ``kill -9`` its process group at
chosen points and check what the worker and a successor controller make of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from lorenz.workers.client import CallHandlers
from lorenz.workers.handles import LocalTransport, WorkerHandle
from lorenz.workers.journal import Record
from lorenz.workers.spec import RunSpec, decode_spec


class TokenTools:
    """Answers ``linear_graphql`` with a proof that the call ran here, with the token."""

    def tool_specs(self) -> list[dict[str, Any]]:
        return [{"name": "linear_graphql", "inputSchema": {"type": "object"}}]

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        token = os.environ.get("LINEAR_API_KEY", "")
        return {"success": True, "output": json.dumps({"ran_with_token_len": len(token)})}


async def main(spec: RunSpec, out: TextIO, after_seq: int) -> int:
    transport = LocalTransport(
        state_root=Path(sys.argv[2]), secret_values=[os.environ.get("LINEAR_API_KEY", "")]
    )
    handlers = CallHandlers(tools=TokenTools())
    if after_seq == 0:
        result = await transport.launch(spec)
        out.write(json.dumps({"launched": result.pid}) + "\n")
    handle = WorkerHandle(
        transport=transport, handle=spec.handle, last_seq=after_seq, handlers=handlers
    )

    def collect(record: Record) -> None:
        out.write(json.dumps({"seq": record.seq, "kind": record.kind, "data": record.data}) + "\n")

    async def report_live() -> None:
        while handle.connection is None or not handle.connection.live.is_set():
            await asyncio.sleep(0.02)
        out.write(json.dumps({"live": handle.last_seq}) + "\n")

    reporter = asyncio.create_task(report_live())
    final = await handle.follow(collect)
    reporter.cancel()
    out.write(json.dumps({"done": final.data["outcome"], "final": final.data}) + "\n")
    return 0


if __name__ == "__main__":
    run_spec = decode_spec(Path(sys.argv[1]).read_bytes())
    with open(sys.argv[3], "a", buffering=1) as out_file:  # line-buffered: each line at once
        sys.exit(asyncio.run(main(run_spec, out_file, int(sys.argv[4]))))
