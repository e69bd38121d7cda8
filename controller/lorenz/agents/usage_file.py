"""Usage reports of ``command`` agents: JSON lines appended to the file ``LORENZ_USAGE_FILE``.

A ``command`` agent has no protocol to carry token counts, yet budgets need them as they arrive
(a cap stops a run mid-turn). So the runner names a private, empty file in the agent's
environment; the agent appends one JSON object per line whenever it knows more, and the runner
reads the file as it grows (polling: a regular file has no readiness to wait for) and turns each
complete line into an update, the same ones the other protocols give::

    {"input_tokens": 1200, "cached_input_tokens": 800, "output_tokens": 300,
     "cost_usd": 0.0042, "model": "gpt-5.1-codex"}

Every field is optional. Counts and cost are *running totals for the run* (never deltas: a
lost or repeated line then changes nothing). A line that is not such an object is reported as
``malformed`` and skipped. Bounded: a line longer than :data:`MAX_LINE_BYTES` is skipped, and
after :data:`MAX_FILE_BYTES` the file is no longer read (one ``malformed`` update says so).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorenz.agents.base import MODEL_EVENT
from lorenz.model import AgentUpdate, TokenUsage

USAGE_FILE_ENV = "LORENZ_USAGE_FILE"
MAX_LINE_BYTES = 64 * 1024
MAX_FILE_BYTES = 16 * 1024 * 1024
POLL_INTERVAL_S = 0.05
"""How often the file is read while the agent runs (the latency of a usage update)."""
MAX_MODEL_CHARS = 200

_COUNT_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens")


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class UsageFileReader:
    """Reads complete lines appended to one usage file and reports them through ``emit``."""

    def __init__(self, path: Path, *, emit: Callable[[AgentUpdate], None]) -> None:
        self.path = path
        self.emit = emit
        self.offset = 0
        self.pending = b""
        self.skipping = False
        """Inside an overlong line: everything up to its newline is dropped."""
        self.exhausted = False
        self.model: str | None = None
        self.updates = 0
        """Usage updates reported so far."""

    def poll(self) -> None:
        """Read what was appended since the last poll; report each complete line."""
        if self.exhausted:
            return
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(MAX_FILE_BYTES - self.offset + 1)
        except FileNotFoundError:
            return  # NB: the agent removed it; nothing more will come
        self.offset += len(chunk)
        if self.offset > MAX_FILE_BYTES:
            self.exhausted = True
            self.emit(
                AgentUpdate(
                    event="malformed",
                    message=f"{USAGE_FILE_ENV} grew past {MAX_FILE_BYTES} bytes; no longer read",
                )
            )
            return
        data = self.pending + chunk
        *lines, self.pending = data.split(b"\n")
        for line in lines:
            if self.skipping:
                # NB: the end of an overlong line whose start was dropped already.
                self.skipping = False
                continue
            if line.strip():
                self._line(line)
        if len(self.pending) > MAX_LINE_BYTES:
            if not self.skipping:
                self._malformed(f"a line over {MAX_LINE_BYTES} bytes was skipped")
            self.pending = b""
            self.skipping = True

    def _line(self, line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            self._malformed(f"a line over {MAX_LINE_BYTES} bytes was skipped")
            return
        try:
            report = json.loads(line)
        except ValueError:
            self._malformed(f"not JSON: {line[:120]!r}")
            return
        if not isinstance(report, dict):
            self._malformed(f"not a JSON object: {line[:120]!r}")
            return
        counts = {key: _count(report.get(key, 0)) for key in _COUNT_KEYS}
        cost = report.get("cost_usd")
        bad_cost = cost is not None and (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not math.isfinite(cost)
            or cost < 0
        )
        if any(value is None for value in counts.values()) or bad_cost:
            self._malformed(
                "counts must be integers >= 0 and cost_usd a number >= 0: " f"{line[:120]!r}"
            )
            return
        model = report.get("model")
        if isinstance(model, str) and model.strip() and model != self.model:
            self.model = model.strip()[:MAX_MODEL_CHARS]
            self.emit(
                AgentUpdate(
                    event=MODEL_EVENT,
                    message=f"model {self.model}",
                    payload={"model": self.model, "source": USAGE_FILE_ENV},
                )
            )
        if not any(key in report for key in (*_COUNT_KEYS, "cost_usd")):
            return
        input_tokens = counts["input_tokens"] or 0
        output_tokens = counts["output_tokens"] or 0
        self.updates += 1
        self.emit(
            AgentUpdate(
                event="token_usage",
                usage=TokenUsage(
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    total_tokens=input_tokens + output_tokens,
                ),
                cost_usd=float(cost) if cost is not None else None,
                message=f"{input_tokens + output_tokens} tokens in this run",
                payload={"cached_input_tokens": counts["cached_input_tokens"] or 0},
            )
        )

    def _malformed(self, what: str) -> None:
        self.emit(AgentUpdate(event="malformed", message=f"{USAGE_FILE_ENV}: {what}"))
