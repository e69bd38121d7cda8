"""Token usage and agent progress reports.

Agents report *running totals* for their session (Codex ``thread/tokenUsage/updated``, ACP usage
updates, Claude ``result`` events). The orchestrator turns them into deltas against the last
reported totals so that nothing is counted twice, whichever order updates arrive in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class TokenUsage:
    """Token counts for one session or one run."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )

    def delta_since(self, previous: TokenUsage) -> TokenUsage:
        """What these running totals add over ``previous``; never negative."""
        return TokenUsage(
            input_tokens=max(self.input_tokens - previous.input_tokens, 0),
            output_tokens=max(self.output_tokens - previous.output_tokens, 0),
            total_tokens=max(self.total_tokens - previous.total_tokens, 0),
        )

    def to_dict(self) -> dict[str, int]:
        # NB: not dataclasses.asdict(): it recurses and copies every value, ~40x slower for
        # these flat records (one per finished run and per token report).
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class UsageTotals:
    """Aggregate usage across every run this orchestrator has finished or is running."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    seconds_running: float = 0.0
    cost_usd: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "seconds_running": self.seconds_running,
            "cost_usd": self.cost_usd,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class AgentUpdate:
    """One progress report from a running agent, as the runner hands it to the orchestrator."""

    event: str
    """Short event name (``session_started``, ``turn_completed``, ``notification``, ...)."""
    timestamp_ms: float | None = None
    """Monotonic time of the event; ``None`` means "now" as the orchestrator's clock reads it."""
    message: str | None = None
    """A human-readable summary of the event, shown in the dashboard."""
    session_id: str | None = None
    """Set when the event carries a (new) session id; a new id counts one more turn."""
    usage: TokenUsage | None = None
    """Running totals for the current session, if the event carries them."""
    cost_usd: float | None = None
    """Running cost for the current session, if the agent reports it."""
    rate_limits: Mapping[str, Any] | None = None
    """The latest rate-limit snapshot, if the event carries one."""
    pid: int | None = None
    """The agent process id, once known."""
    payload: Mapping[str, Any] | None = None
    """The raw event, kept for the issue detail view (bounded by the runtime)."""
