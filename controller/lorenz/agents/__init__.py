"""Coding-agent runners: one protocol (:class:`AgentRunner`), one module per wire protocol.

:func:`build_runner` maps ``agents.<kind>.protocol`` to a runner; modules are imported on demand
so a protocol's dependencies are only needed when it is used.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Collection

from lorenz.agents.base import (
    QUESTION_EVENT,
    AdoptionCanceller,
    AgentAsked,
    AgentRunError,
    AgentRunner,
    AgentRunRequest,
    AgentRunResult,
    DroppedAdoption,
    PlacementFailed,
    RunPlacement,
    ToolHandler,
)
from lorenz.agents.environment import (
    SESSION_STORE_ENV,
    TRACKER_SECRET_ENV,
    agent_environment,
    make_session_stores,
)
from lorenz.codes import ErrorCode
from lorenz.config import AgentProtocol

_RUNNERS: dict[AgentProtocol, tuple[str, str]] = {
    AgentProtocol.CODEX_APP_SERVER: ("lorenz.agents.codex", "CodexAppServerRunner"),
    AgentProtocol.COMMAND: ("lorenz.agents.command", "CommandRunner"),
    AgentProtocol.ACP: ("lorenz.agents.acp", "AcpRunner"),
    AgentProtocol.CLAUDE_STREAM_JSON: ("lorenz.agents.claude", "ClaudeStreamRunner"),
}


def preload_runners(protocols: Collection[str] | None = None) -> None:
    """Import the runner modules of ``protocols`` (``None``: every protocol's) that this build
    has, for a process that forks runs; unknown names are skipped."""
    for protocol, (module_name, _) in _RUNNERS.items():
        if protocols is not None and protocol.value not in protocols:
            continue
        with contextlib.suppress(ImportError):
            importlib.import_module(module_name)


def build_runner(protocol: AgentProtocol | str) -> AgentRunner:
    """A new runner for ``protocol`` (``agents.<kind>.protocol``).

    Raises :class:`AgentRunError` ``agent_protocol_unavailable`` when the protocol is unknown or
    its runner is not installed in this build.
    """
    try:
        key = AgentProtocol(protocol)
    except ValueError:
        known = ", ".join(p.value for p in AgentProtocol)
        raise AgentRunError(
            f"unknown agent protocol {protocol!r}; use one of: {known}",
            code=ErrorCode.AGENT_PROTOCOL_UNAVAILABLE,
        ) from None
    module_name, class_name = _RUNNERS[key]
    try:
        module = importlib.import_module(module_name)
        runner_class = getattr(module, class_name)
    except (ImportError, AttributeError) as exc:
        raise AgentRunError(
            f"the {key.value!r} agent protocol is not available in this build ({exc}); "
            "pick another agents.<kind>.protocol",
            code=ErrorCode.AGENT_PROTOCOL_UNAVAILABLE,
        ) from exc
    runner: AgentRunner = runner_class()
    return runner


__all__ = [
    "QUESTION_EVENT",
    "SESSION_STORE_ENV",
    "TRACKER_SECRET_ENV",
    "AdoptionCanceller",
    "AgentAsked",
    "AgentRunError",
    "AgentRunRequest",
    "AgentRunResult",
    "AgentRunner",
    "DroppedAdoption",
    "PlacementFailed",
    "RunPlacement",
    "ToolHandler",
    "agent_environment",
    "build_runner",
    "make_session_stores",
]
