"""Coding-agent runners: one protocol (:class:`AgentRunner`), one module per wire protocol."""

from lorenz.agents.base import (
    AgentRunError,
    AgentRunner,
    AgentRunRequest,
    AgentRunResult,
    ToolHandler,
)

__all__ = ["AgentRunError", "AgentRunRequest", "AgentRunResult", "AgentRunner", "ToolHandler"]
